"""``fusee.http.app(engine)``: the engine's public API over HTTP, as an ASGI app.

The outer app (Starlette) makes the checks before any handler runs
(``fusee.http.guard``, ``fusee.http.auth``), serves the web UI at ``/ui``, the
probes, ``/metrics`` and the OpenAPI document, and mounts the JSON API at
``/api``: a Litestar app whose route handlers declare each endpoint once
(``fusee.http.api``), from which the document at ``/openapi.json`` is generated.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

import fusee
from fusee import errors
from fusee.http import api as json_api
from fusee.http.api import on_engine
from fusee.http.auth import Authentication, Authenticator, check_tokens
from fusee.http.guard import DEFAULT_MAX_BODY, LOOPBACK_HOSTS, error_response, too_large
from fusee.http.guard import middleware as guards
from fusee.http.paths import encoded_path

__all__ = ["app", "on_engine", "ui_routes"]


def ui_routes(engine: fusee.Engine, secret: bytes | str | None = None) -> list[BaseRoute] | None:
    """The web UI's routes (``fusee.ui.routes``) if the UI is installed, else None."""
    if importlib.util.find_spec("fusee.ui") is None:
        return None
    ui = importlib.import_module("fusee.ui")
    routes: list[BaseRoute] = ui.routes(engine, secret=secret)
    return routes


def app(engine: fusee.Engine, token: str | None = None, *, tokens: Mapping[str, str] | None = None,
        authenticate: Authenticator | None = None, allowed_hosts: Sequence[str] | None = None,
        max_body: int = DEFAULT_MAX_BODY, secret: bytes | str | None = None) -> ASGIApp:
    """The HTTP API of ``engine`` as an ASGI app (Starlette), with the web UI at ``/ui``.

    Endpoints are under ``/api`` (declared in ``fusee.http.api``; the OpenAPI
    document generated from them is at ``/openapi.json``, and they are listed in
    docs/operations.md). With ``token``, every request (the UI's too)
    must carry ``Authorization: Bearer <token>``; others get 401 and nothing
    runs. With ``tokens`` (each person's name → their token) a request
    carries one of them and the audit (``by``) records its holder's name,
    which the request cannot change (a different ``by`` gets 403); with
    ``authenticate`` (a function or coroutine function given the request,
    answering the person's name or None) the host's own check decides, for
    requests no token lets in. The three combine. ``secret`` (16 bytes or
    more, the same on every worker) signs the web UI's form tokens, so that a
    page served by one worker, or before a restart, acts through any other;
    without it each process signs with a key of its own. Bad requests get 4xx with ``{"error": {"type", "message", "field"}}``;
    an unknown workflow ID gets 404. Mount it in your own ASGI app or serve it
    with ``fusee serve``; the engine must stay open while the app serves.

    Before any handler runs: a ``Host`` other than ``allowed_hosts`` (default
    127.0.0.1, localhost and [::1]; ``["*"]`` for any) gets 400; a request that
    changes something and comes from another site (its ``Origin``,
    ``Sec-Fetch-Site`` or ``Referer``) gets 403; a write to ``/api`` that is
    not ``application/json`` gets 415; a body over ``max_body`` bytes gets 413,
    refused as it arrives. IDs in paths are one segment each: send a ``/`` in
    an ID as ``%2F``.
    """
    if not isinstance(engine, fusee.Engine):
        raise TypeError(f"fusee.http.app takes an open fusee.Engine, got {engine!r}")
    people = check_tokens(token, tokens, authenticate)
    authentication = (Middleware(Authentication, token=token, tokens=people, authenticate=authenticate)
                      if token is not None or people or authenticate is not None else None)
    checks = guards(LOOPBACK_HOSTS if allowed_hosts is None else allowed_hosts, max_body, authentication)
    api = json_api.build(engine)
    ui = ui_routes(engine, secret)
    document: list[bytes] = []

    async def spec(request: Request) -> Response:
        # Generated from the API's route handlers (once, on the first request).
        if not document:
            document.append(json.dumps(json_api.document(api)).encode())
        return Response(document[0], media_type="application/json")

    async def index(request: Request) -> Response:
        if ui is not None:
            return RedirectResponse("/ui/")
        return JSONResponse({"fusee": fusee.__version__ if hasattr(fusee, "__version__") else None,
                             "api": "/api", "openapi": "/openapi.json"})

    async def healthz(request: Request) -> Response:
        # Liveness: this process answers HTTP (its engine may still be opening or failed).
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        # Readiness: the engine is open and its log has not failed, so calls can be acknowledged.
        async def check() -> str | None:
            try:
                engine._check_open()
            except errors.FuseeError as e:
                return f"{type(e).__name__}: {e}"
            failure = engine.failure
            return None if failure is None else f"the log failed: {failure}"

        try:
            why = await on_engine(engine, check)
        except RuntimeError as e:  # the engine's loop is gone
            why = f"the engine's loop does not answer: {e}"
        if why is not None:
            return JSONResponse({"status": "not ready", "reason": why}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def prometheus(request: Request) -> Response:
        if importlib.util.find_spec("prometheus_client") is None:
            return error_response(501, "PrometheusUnavailable", "/metrics needs prometheus_client: "
                                  "pip install 'fusee[prometheus]' (GET /api/metrics answers JSON meanwhile)")
        from fusee.http import prometheus as prom

        async def snapshot() -> Any:
            return engine.metrics()

        try:
            m = await on_engine(engine, snapshot)
        except errors.FuseeError as e:
            return error_response(503, type(e).__name__, str(e))
        return Response(prom.render(m), media_type=prom.CONTENT_TYPE)

    routes: list[BaseRoute] = [
        Route("/", index),
        Route("/openapi.json", spec),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        # Routed on the path as sent: each {param} is one segment, decoded by its handler.
        Mount("/api", app=json_api.Gateway(api)),
    ]
    if ui is not None:
        routes.append(Mount("/ui", routes=ui))

    async def not_found(request: Request, exc: Exception) -> Response:
        path = encoded_path(request.scope)
        hint = " (IDs are one path segment: send a '/' in an ID as %2F)" if path.startswith("/api/") else ""
        return error_response(404, "NotFound", f"no such endpoint: {request.method} {path}{hint}", "path")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        allow = (getattr(exc, "headers", None) or {}).get("Allow")
        use = f": use {allow.replace(', ', ' or ')}" if allow else ""
        return error_response(405, "MethodNotAllowed",
                              f"{request.method} is not allowed on {encoded_path(request.scope)}{use}", "method")

    async def too_big(request: Request, exc: Exception) -> Response:
        return too_large(max_body)

    async def crashed(request: Request, exc: Exception) -> Response:
        # A bug, not a bad request: the server logs the traceback, the client gets JSON.
        return error_response(500, type(exc).__name__, f"internal error: {exc}")

    return Starlette(routes=routes, middleware=checks,
                     exception_handlers={404: not_found, 405: not_allowed, 413: too_big, Exception: crashed})

