"""Steps declared on plain functions: ``@fusee.step``, and ``fusee.step_info()``.

A decorated function called from workflow code runs as a durable step named
after it (its arguments passed on); called anywhere else (a test, a script,
another step's function) it is the plain function. Inside a step function,
``fusee.step_info()`` gives the running step's :class:`StepInfo` (its
idempotency key, attempt, progress), however the function was called.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from fusee.errors import NotInAStep
from fusee.retry import Retry
from fusee.runtime import syncsteps
from fusee.runtime.context import CURRENT_STEP, Duration, StepInfo
from fusee.runtime.wfloop import WorkflowLoop

P = ParamSpec("P")
R = TypeVar("R")


def step_info() -> StepInfo:
    """The :class:`StepInfo` of the step whose function is running here.

    Raises :class:`NotInAStep` outside a step function (in workflow code, or
    in a plain call of a ``@fusee.step`` function).
    """
    make = CURRENT_STEP.get()
    if make is None:
        raise NotInAStep(
            "fusee.step_info() is only available while a step's function runs "
            "(ctx.step(...), or a @fusee.step function called from workflow code)"
        )
    return make()


class StepDecorator(Protocol):
    """What ``@fusee.step(...)`` with options applies (see :func:`step`)."""

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Callable[P, Awaitable[R]]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, Awaitable[R]]: ...


# How type checkers see a step function: as workflow code uses it (``await charge(order)``),
# a synchronous one too. Called outside workflow code it returns the plain result at run
# time; ``charge.__wrapped__`` is the undecorated function for such calls.
@overload
def step(fn: Callable[P, Awaitable[R]], /) -> Callable[P, Awaitable[R]]: ...


@overload
def step(fn: Callable[P, R], /) -> Callable[P, Awaitable[R]]: ...


@overload
def step(
    *,
    name: str | None = None,
    retry: Retry | None = None,
    timeout: Duration | None = None,
    read_only: bool = False,
    heartbeat_timeout: Duration | None = None,
    blocking: bool | None = None,
) -> StepDecorator: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retry: Retry | None = None,
    timeout: Duration | None = None,
    read_only: bool = False,
    heartbeat_timeout: Duration | None = None,
    blocking: bool | None = None,
) -> Any:
    """Makes a plain (sync or async) function a step when workflow code calls it.

    Called from workflow code, ``charge(order)`` then means
    ``ctx.step("charge", charge, order, retry=..., ...)``: journaled, run once
    to success, its result typed by the function's return annotation (await
    it). Called anywhere else it is the plain function. The options are those
    of :meth:`fusee.Ctx.step`, and for a synchronous function ``blocking``:
    ``True`` runs it in the step pool always (it waits on I/O), ``False`` on
    the event loop's thread always (it is cheap and never blocks); by default
    the engine measures it (see ``docs/operations.md``).
    """
    if blocking is not None and not isinstance(blocking, bool):
        raise TypeError(f"blocking must be True, False or None, got {blocking!r}")

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TypeError(f"@fusee.step decorates a function, got {f!r}")
        step_name = name if name is not None else f.__name__
        if blocking is not None:
            syncsteps.declare(f, blocking)

        @functools.wraps(f)
        def call(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.events._get_running_loop()
            run = loop.owner if isinstance(loop, WorkflowLoop) else None
            if run is None:
                return f(*args, **kwargs)
            return run.ctx.step(
                step_name, f, *args, retry=retry, timeout=timeout, read_only=read_only,
                heartbeat_timeout=heartbeat_timeout, **kwargs,
            )

        return call

    return wrap(fn) if fn is not None else wrap
