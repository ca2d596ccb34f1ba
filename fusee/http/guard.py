"""What the HTTP API and the web UI refuse before any handler runs: requests a page of another
site could make.

Loopback is not a security boundary: any page the operator opens can POST to
127.0.0.1 (a form, or ``fetch`` with ``text/plain``), and a DNS-rebinding page
reaches the server under its own host name and reads the answers. So:

- the ``Host`` must be one the server answers to (starlette's
  ``TrustedHostMiddleware``; default: the loopback names), which leaves a
  rebinding page nothing to read, the UI's CSRF token included;
- a request that changes something (any method but GET, HEAD, OPTIONS) whose
  ``Origin``, ``Sec-Fetch-Site`` or ``Referer`` shows another site is refused
  (403);
- the API's writes must be ``application/json`` (415): a page cannot send that
  to another origin without a CORS preflight, and no answer here grants one;
- a body over the limit is refused (413) as it arrives: on its
  ``Content-Length``, or once the chunks read pass it (starlette's
  ``RequestBodyLimitMiddleware``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

#: The Host names a server on this machine answers to unless told otherwise.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
#: The largest request body taken by default (bytes); a start's input or a signal's value is in it.
DEFAULT_MAX_BODY = 16 << 20
#: Methods that read only: the Origin checks leave them alone.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The Sec-Fetch-Site values of a request the page of this very origin made (or the user typed).
_SAME = frozenset({"same-origin", "none"})


def error_body(type: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The body of the API's error answers: ``{"error": {"type", "message", "field"}}``."""
    return {"error": {"type": type, "message": message, "field": field}}


def error_response(status: int, type: str, message: str, field: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The API's error answer (:func:`error_body`), from the checks before the API's handlers."""
    return JSONResponse(error_body(type, message, field), status_code=status, headers=headers)


def host_names(hosts: Sequence[str]) -> list[str]:
    """``hosts`` as the names ``TrustedHostMiddleware`` compares (lower case, no port, IPv6 in
    brackets); ValueError naming ``allowed_hosts`` for anything else."""
    if isinstance(hosts, str) or not isinstance(hosts, Sequence):
        raise ValueError(f"allowed_hosts takes a list of host names (e.g. ['fusee.internal']), got {hosts!r}")
    names = []
    for entry in hosts:
        if not isinstance(entry, str) or not entry.strip():
            raise ValueError(f"allowed_hosts takes non-empty host names, got {entry!r}")
        name = entry.strip().lower()
        if name.startswith("["):
            name = name.partition("]")[0] + "]"
        elif name.count(":") == 1:
            name = name.partition(":")[0]  # the port is not compared: the name is what a rebinding changes
        elif ":" in name:
            name = f"[{name}]"  # a bare IPv6 address
        if "*" in name[1:] or (name.startswith("*") and name != "*" and not name.startswith("*.")):
            raise ValueError(f"allowed_hosts: a wildcard must be '*' or lead a domain ('*.example.com'), "
                             f"got {entry!r}")
        names.append(name)
    return names


def cross_site(scope: Scope) -> str | None:
    """Why a state-changing request came from another site, or None when it did not.

    Browsers say where a request comes from (``Sec-Fetch-Site``, ``Origin``, else
    ``Referer``); a client that is no browser (the CLI, curl) sends none of them
    and is not refused here. ``Origin: null`` (a sandboxed frame, a file) is
    another site.
    """
    headers = Headers(scope=scope)
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in _SAME:
        return ("cross-origin request refused: the browser says it comes from another site "
                f"(Sec-Fetch-Site: {site})")
    host = headers.get("host", "").lower()
    origin = headers.get("origin")
    if origin is not None:
        if origin == "null" or urlsplit(origin).netloc.lower() != host:
            return f"cross-origin request refused (Origin {origin!r}, this server is {host!r})"
        return None
    referer = headers.get("referer")
    if referer and urlsplit(referer).netloc.lower() != host:
        return f"cross-origin request refused (Referer {referer!r}, this server is {host!r})"
    return None


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class WriteChecks:
    """Refuses, before any handler runs (nothing is read or recorded), state-changing requests
    from another site (403), API writes that are not JSON (415) and bodies whose declared
    ``Content-Length`` is over ``max_body`` (413)."""

    def __init__(self, app: ASGIApp, max_body: int, api_prefix: str = "/api/") -> None:
        self.app = app
        self.max_body = max_body
        self.api_prefix = api_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> JSONResponse | None:
        why = cross_site(scope)
        if why is not None:
            return error_response(403, "CrossOriginRequest", why, "Origin")
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            return too_large(self.max_body)
        if _route_path(scope).startswith(self.api_prefix):
            kind = headers.get("content-type", "")
            if kind.partition(";")[0].strip().lower() != "application/json":
                shown = f"Content-Type {kind!r}" if kind else "no Content-Type"
                return error_response(415, "UnsupportedMediaType",
                                      f"the API takes JSON bodies: send 'Content-Type: application/json' "
                                      f"(this request has {shown})", "Content-Type")
        return None


#: Liveness and readiness probes: answered without the token (they say nothing but "up" or
#: "not ready"), since an orchestrator's probe often carries no credentials.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})


def is_probe(scope: Scope) -> bool:
    """A liveness or readiness probe (answered without credentials)."""
    return scope["type"] == "http" and scope["method"] in ("GET", "HEAD") and _route_path(scope) in PROBE_PATHS


def check_max_body(max_body: object) -> int:
    """``max_body`` if it is a positive int; ValueError naming it otherwise."""
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError(f"max_body must be a positive number of bytes, got {max_body!r}")
    return max_body


def too_large(max_body: int) -> JSONResponse:
    """The 413 answer to a body over ``max_body`` bytes."""
    return error_response(413, "RequestTooLarge",
                          f"the request body is over {max_body} bytes, the most this server takes "
                          "(raise it with fusee serve --max-body, or max_body= of fusee.http.app)", "body")


def middleware(allowed_hosts: Sequence[str], max_body: int, authentication: Middleware | None) -> list[Middleware]:
    """The checks, outermost first: the Host (400), who asks when authentication is configured
    (401, ``fusee.http.auth``), where a write comes from and its media type (403, 415), the body's
    size (413, as it streams)."""
    stack = [Middleware(TrustedHostMiddleware, allowed_hosts=host_names(allowed_hosts), www_redirect=False)]
    if authentication is not None:
        stack.append(authentication)
    limit = check_max_body(max_body)
    # The declared size is refused up front; a chunked body is cut once it passes the limit.
    stack += [Middleware(WriteChecks, max_body=limit), Middleware(RequestBodyLimitMiddleware, max_body_size=limit)]
    return stack
