"""TLS for routing between machines: a PostgreSQL namespace's owner and the engines that follow it.

Without it, routed calls (workflow inputs, signals, results) travel in clear
after the routing-secret handshake of :mod:`fusee.scale.tcp`. With
``Engine.open(dsn, route_tls=fusee.RouteTLS(cert=..., ca=...))`` every engine of
the namespace speaks TLS 1.2 or newer, from the standard library's :mod:`ssl`:

- the owner listens with its certificate and requires each caller to present
  one signed by ``ca`` (mutual TLS);
- a caller checks the owner's certificate against ``ca`` and, unless
  ``check_hostname=False``, against the host name it dials (the one the owner
  published: give ``route_address=`` a name its certificate holds);
- the routing-secret handshake still runs inside the TLS session: a certificate
  alone does not make a process a member of the namespace.

The owner publishes ``tls:HOST:PORT`` instead of ``tcp:HOST:PORT``. An engine
opened with ``route_tls`` never routes to an owner that serves in clear (no
downgrade), and one opened without it is told that the owner requires TLS.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

from fusee.errors import InvalidRouteTLS

#: Each side's TLS handshake must end within this many seconds.
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True)
class RouteTLS:
    """The certificates an engine routes with (``Engine.open(..., route_tls=)``).

    ``cert``: a PEM file with this engine's certificate chain (and its private key, unless
    ``key`` names the key's own file); the engine presents it as owner and as caller.
    ``ca``: a PEM file of the authority (or authorities) that signed the other engines'
    certificates. ``check_hostname``: whether a caller checks that the owner's certificate
    names the host it dials (keep it on; turn it off only where engines reach each other
    by addresses no certificate can name). Files are read once, at open.
    """

    cert: str | os.PathLike[str]
    ca: str | os.PathLike[str]
    key: str | os.PathLike[str] | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        for name in ("cert", "ca", "key"):
            value = getattr(self, name)
            if value is None and name == "key":
                continue
            if not isinstance(value, (str, os.PathLike)):
                raise InvalidRouteTLS(f"RouteTLS({name}=) must be a path to a PEM file, got {value!r}")
        if not isinstance(self.check_hostname, bool):
            raise InvalidRouteTLS(f"RouteTLS(check_hostname=) must be a bool, got {self.check_hostname!r}")

    def _load(self, ctx: ssl.SSLContext) -> ssl.SSLContext:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        cert, ca = os.fspath(self.cert), os.fspath(self.ca)
        key = None if self.key is None else os.fspath(self.key)
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise InvalidRouteTLS(f"cannot load the certificate chain {cert!r}"
                                  f"{f' with the key {key!r}' if key else ''}: {e}") from e
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise InvalidRouteTLS(f"cannot load the certificate authority {ca!r}: {e}") from e
        return ctx

    def server_context(self) -> ssl.SSLContext:
        """The owner's side: presents ``cert`` and requires a caller certificate ``ca`` signed."""
        ctx = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The caller's side: presents ``cert`` and checks the owner's against ``ca`` (and its name)."""
        ctx = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        ctx.check_hostname = self.check_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def checked(route_tls: object) -> RouteTLS | None:
    """``route_tls`` as given to ``Engine.open``, its files loaded once so a bad one fails the open."""
    if route_tls is None:
        return None
    if not isinstance(route_tls, RouteTLS):
        raise InvalidRouteTLS(f"route_tls must be a fusee.RouteTLS, got {route_tls!r}")
    route_tls.server_context()
    route_tls.client_context()
    return route_tls
