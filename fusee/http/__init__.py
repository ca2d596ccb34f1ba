"""The HTTP API (``pip install 'fusee[http]'``): ``fusee.http.app(engine, token=None)``.

See docs/operations.md for the endpoints; the OpenAPI document, generated from
the route handlers of ``fusee.http.api`` (Litestar), is served at ``/openapi.json``.
"""

from __future__ import annotations

try:
    import litestar  # noqa: F401
    import starlette  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError("fusee.http needs the http extra: pip install 'fusee[http]'") from e

from fusee.http.app import app, on_engine
from fusee.http.guard import DEFAULT_MAX_BODY, LOOPBACK_HOSTS
from fusee.http.serve import DEFAULT_HOST, DEFAULT_PORT, serve

__all__ = ["DEFAULT_HOST", "DEFAULT_MAX_BODY", "DEFAULT_PORT", "LOOPBACK_HOSTS", "app", "on_engine", "serve"]
