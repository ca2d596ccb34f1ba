"""Client spans around the engine's calls, when telemetry is on.

``@traced("signal")`` on an ``Engine`` method: with the engine's telemetry
off (``engine._telemetry is None``) the call goes straight to the method; on,
it runs inside a client span named ``fusee.signal`` whose attributes come from
the call's arguments (see ``fusee.otel``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def traced(op: str) -> Callable[[F], F]:
    """Wraps an async engine method in the client span of operation ``op``."""

    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)

        async def in_span(self: Any, tel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            arguments = signature.bind_partial(self, *args, **kwargs).arguments
            with tel.client_span(op, arguments) as span:
                result = await fn(self, *args, **kwargs)
                tel.client_done(span, op, result)
                return result

        @functools.wraps(fn)
        async def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            # A coroutine function still (``inspect.iscoroutinefunction`` holds for the API).
            tel = self._telemetry
            if tel is None:
                return await fn(self, *args, **kwargs)
            return await in_span(self, tel, args, kwargs)

        return cast(F, call)

    return wrap
