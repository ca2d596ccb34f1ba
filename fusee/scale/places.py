"""Where an engine's ownership lives, as a follower sees it: a local directory or a PostgreSQL namespace.

A follower needs the same five things of either place: a lease to wait for,
how to open the place as its owner once it won that lease, where the current
owner serves, how to connect there, and how to read the place for its
synchronous reads. :class:`DirectoryPlace` answers them with the directory's
``flock``, ``<dir>/owner`` and a Unix socket; :class:`PostgresPlace` with the
namespace's lease row and TCP (authenticated by the namespace's routing
secret, see :mod:`fusee.scale.tcp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from typing import Any, Protocol

from fusee.errors import RoutingRefused
from fusee.scale import tcp
from fusee.scale.lease import DirectoryLease, read_owner
from fusee.scale.server import os_address
from fusee.tls import HANDSHAKE_TIMEOUT_S, RouteTLS


class WaitingLease(Protocol):
    """A lease a follower waits for in a thread (see :class:`fusee.scale.lease.Lease`)."""

    epoch: int

    def wait_acquire(self, stop: threading.Event) -> bool: ...

    def release(self) -> None: ...


class Place(Protocol):
    #: What ``Engine.open`` takes (a path or a DSN).
    target: str
    #: How messages name the place (a DSN without its password).
    label: str
    #: The owner's epoch last seen (0: none yet).
    epoch: int
    #: How often a follower checks that the owner it is connected to still holds the lease
    #: (None: a lease that cannot be taken from a live holder).
    watch_every: float | None

    def new_lease(self) -> WaitingLease:
        """A lease to wait for (called on the waiting thread: it may block)."""
        ...

    def won(self, lease: Any) -> None:
        """The waiting thread won ``lease`` (keep it alive until the engine opens on it)."""
        ...

    def takeover_options(self, lease: Any) -> dict[str, Any]:
        """``Engine._open`` options that open the place on the won ``lease``."""
        ...

    async def owner(self) -> str | None:
        """Where the current owner serves (None: nobody serves yet)."""
        ...

    async def connect(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the owner at ``address``, ready for frames (``OSError`` if it is not there)."""
        ...

    def close(self) -> None: ...


class DirectoryPlace:
    """A local directory: the ``flock`` lease, ``<dir>/owner``, a Unix socket."""

    def __init__(self, path: str) -> None:
        self.target = self.label = path
        self.epoch = 0
        self.watch_every: float | None = None

    def new_lease(self) -> DirectoryLease:
        return DirectoryLease(self.target)

    def won(self, lease: Any) -> None:
        pass

    def takeover_options(self, lease: Any) -> dict[str, Any]:
        return {"_lock": lease.handover(), "_epoch": lease.epoch}

    async def owner(self) -> str | None:
        found = read_owner(self.target)
        if found is None:
            return None
        self.epoch = found[0]
        return found[1]

    async def connect(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(os_address(address), limit=1 << 20)

    def close(self) -> None:
        pass


class PostgresPlace:
    """A PostgreSQL namespace: its lease row (with expiry) and TCP to the address the owner published."""

    def __init__(self, dsn: str, namespace: str, ttl: float, tls: RouteTLS | None = None) -> None:
        from fusee.storage.postgres.connection import describe

        self.target = dsn
        self.namespace = namespace
        self.ttl = ttl
        self.label = f"{describe(dsn)}#{namespace}"
        self.epoch = 0
        self.watch_every: float | None = ttl / 3
        self._probe: Any = None  # a Lease never acquired: it only reads the row (its own connection)
        self._secret: bytes | None = None
        self._ssl = tls.client_context() if tls is not None else None
        self._mutex = threading.Lock()

    def new_lease(self) -> Any:
        from fusee.storage.postgres.lease import Lease

        return Lease(self.target, self.namespace, self.ttl)

    def won(self, lease: Any) -> None:
        # Renew at once: the engine's open (recovery) may take longer than the TTL.
        lease.start_renewing()

    def takeover_options(self, lease: Any) -> dict[str, Any]:
        return {"_pg_lease": lease}

    def _read_owner(self) -> tuple[str | None, bytes]:
        from fusee.storage.postgres.lease import Lease

        with self._mutex:
            if self._probe is None:
                self._probe = Lease(self.target, self.namespace, self.ttl)
            try:
                holder = self._probe.holder()
                if self._secret is None:
                    self._secret = self._probe.routing_secret()
            except Exception:
                # A broken connection: the next look opens a new one.
                probe, self._probe = self._probe, None
                with contextlib.suppress(Exception):
                    probe.release()  # holds no lease: it only closes its connection
                raise
            secret = self._secret
        if holder is None or holder.address is None:
            return None, secret
        self.epoch = holder.epoch
        return holder.address, secret

    async def owner(self) -> str | None:
        try:
            address, _ = await asyncio.get_running_loop().run_in_executor(None, self._read_owner)
        except Exception:
            return None  # the server is unreachable for now: no owner to reach either
        return address

    async def connect(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not tcp.is_tcp(address):
            raise OSError(f"the namespace's owner published {address!r}, not a TCP address")
        secret = self._secret
        assert secret is not None, "owner() reads the secret before connect()"
        host, port = tcp.dial_target(address)
        if tcp.is_tls(address) and self._ssl is None:
            raise RoutingRefused(f"the namespace's owner at {address} routes over TLS only: open this "
                                 "engine with route_tls=fusee.RouteTLS(...) to reach it")
        if self._ssl is not None and not tcp.is_tls(address):
            raise RoutingRefused(f"the namespace's owner at {address} routes in clear, and this engine "
                                 "was opened with route_tls=: it sends nothing without TLS")
        if self._ssl is None:
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        else:
            try:
                reader, writer = await asyncio.open_connection(
                    host, port, limit=1 << 20, ssl=self._ssl, server_hostname=host,
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
            except ssl.SSLError as e:
                raise RoutingRefused(
                    f"TLS with the namespace's owner at {address} failed ({e.reason or e}): its "
                    "certificate must be signed by the authority this engine's RouteTLS(ca=) names, "
                    "and name the host it publishes (its route_address=)") from e
        sock = writer.get_extra_info("socket")
        if sock is not None:  # small multiplexed frames: Nagle's delay would stall each answer
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.wait_for(tcp.client_handshake(reader, writer, secret), 10.0)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError) as e:
            writer.close()
            if self._ssl is not None:
                # TLS 1.3 shows a caller that the owner refused its certificate only by the
                # connection's end, which a dying owner's looks like too: tried again, and said
                # if it lasts.
                raise TLSDropped(address) from e
            raise OSError(f"the owner at {address} did not complete the routing handshake") from e
        except BaseException:
            writer.close()
            raise
        return reader, writer

    def close(self) -> None:
        with self._mutex:
            probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(Exception):
                probe.release()


class TLSDropped(OSError):
    """The owner ended a TLS connection before the routing handshake: most likely it does not
    trust this engine's certificate."""

    def __init__(self, address: str) -> None:
        super().__init__(f"the namespace's owner at {address} ended each TLS connection before the routing "
                         "handshake: it most likely refuses this engine's certificate (it must be signed "
                         "by the authority the owner's RouteTLS(ca=) names)")
