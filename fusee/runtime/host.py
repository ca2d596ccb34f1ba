"""What a run and the step runner may ask of the runtime that drives them.

Control flows one way: the runtime owns runs and the step runner, and they
reach back only through these narrow interfaces (defined here, below all
three), never through the runtime's whole surface. A read-only replay
(``fusee.runtime.ended``) provides the same interface with every action a
no-op.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from fusee.core import records as rec
from fusee.definitions import WorkflowDef
from fusee.errors import FuseeError
from fusee.retry import Retry
from fusee.runtime.env import Env
from fusee.runtime.telemetry import TelemetryHooks

if TYPE_CHECKING:
    from fusee.runtime.run import Run, StepCall


class RunHost(Protocol):
    """The runtime as one run sees it."""

    env: Env
    loop: asyncio.AbstractEventLoop
    tracebacks: bool
    default_retry: Retry
    limiter: Any  # fusee.limits.Limiter: checks a step's limit= at ctx.step
    telemetry: TelemetryHooks | None
    steps_started: bool  # a gated step started since the last pump began (see flush_soon)

    # the log
    def append(self, shard: int, r: rec.Record) -> int: ...
    def flush_soon(self) -> None: ...
    def after_delivery(self) -> None: ...

    # operations the run starts
    def run_step(self, run: Run, seq: int, call: StepCall) -> None: ...
    def arm_timer(self, run: Run, seq: int, fire_at_ms: int) -> None: ...
    def arm_deadline(self, run: Run, seq: int, deadline_ms: int) -> None: ...
    def arm_child_deadline(self, run: Run, seq: int, deadline_ms: int) -> None: ...
    def arm_run_deadline(self, run: Run, deadline_ms: int) -> None: ...
    def check_registered(self, wdef: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]: ...
    def ensure_child(self, parent: Run, child: rec.Child) -> None: ...
    def child_timed_out(self, run: Run, child: rec.Child, lsn: int) -> None: ...
    def send_signal(self, run: Run, seq: int, target: str, name: str, payload: bytes, lsn: int) -> None: ...
    def release_update(
        self, shard: int, lsn: int, waiters: list[asyncio.Future[Any]], status: rec.Status, payload: bytes
    ) -> None: ...
    def next_token(self) -> int: ...

    # what became of the run
    def on_run_done(self, run: Run, done: rec.Done, lsn: int) -> None: ...
    def on_stuck(self, run: Run, err: FuseeError) -> None: ...
    def after_pump(self, run: Run) -> None: ...
    def signal_passed_over(self, run: Run, seq: int, ordinal: int, name: str, error: FuseeError) -> None: ...


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
