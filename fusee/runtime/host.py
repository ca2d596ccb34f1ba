"""What the step runner may ask of the runtime that drives it.

Control flows one way: the runtime owns runs and the step runner, and they
reach back only through narrow interfaces, never through the runtime's whole
surface: ``StepHost`` here (below the runtime and the step runner), and
``RunHost`` in ``fusee.runtime.run`` (beside ``Run``, whose methods it names;
re-exported here). A read-only replay (``fusee.runtime.ended``) provides
``RunHost`` with every action a no-op.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from fusee.runtime.env import Env
from fusee.runtime.run import RunHost as RunHost

if TYPE_CHECKING:
    from fusee.runtime.run import Run, StepCall


class StepHost(Protocol):
    """The runtime as the step runner sees it."""

    env: Env
    loop: asyncio.AbstractEventLoop
    tracebacks: bool
    log: Any  # the shared log: durable LSNs
    committer: Any  # the group committer: flush requests
    closed: bool
    closing: bool
    steps_started: bool
    stats: dict[str, int]
    limiter: Any  # fusee.limits.Limiter: permits of limited steps

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...
    def flush_soon(self) -> None: ...
    async def wait_durable(self, shard: int, lsn: int) -> None: ...
    def step_retried(self, run: Run, call: StepCall, error: BaseException, retry_at: int) -> None: ...
    def after_pump(self, run: Run) -> None: ...
