"""What the UI's page modules (``flow``, ``objects``) take from the UI that mounts them.

They get a :class:`Pages` (the UI's ``_UI`` is one) and call the engine through
:func:`on_engine`; they never import the UI back.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

import fusee


class Pages(Protocol):
    """The UI's rendering and checks, as a page module uses them."""

    @property
    def engine(self) -> fusee.Engine: ...

    def guard(self, page: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """``page``, answering 503 with the reason when the engine cannot answer."""
        ...

    def render(self, request: Request, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        """The template ``name`` rendered as a page (with the CSRF token and base path)."""
        ...

    async def refused(self, request: Request) -> Response | None:
        """The answer to a form that may not act (size, CSRF, origin), or None if it may."""
        ...

    async def form(self, request: Request) -> dict[str, str]:
        """An action's form fields (ValueError past the form size limit)."""
        ...


async def on_engine(engine: fusee.Engine, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls ``fn`` (an engine method, sync or async) on the engine's loop and returns its result."""

    async def call() -> Any:
        out = fn(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    loop = engine.loop
    if asyncio.get_running_loop() is loop:
        return await call()
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), loop))
