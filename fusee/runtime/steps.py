"""Running step functions: gates, retries, timeouts, and the fast path without tasks.

A step with effects starts only once its run's journal is durable through
its gate. Steps wait in one gated list that each completed flush releases;
a function that returns without suspending runs on the host loop's turn with
no task of its own, and only one that suspends, must wait, or has a timeout
gets a task.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any

from fusee import codec, sabotage
from fusee.core import journal as jm
from fusee.core import records as rec
from fusee.errors import FuseeError, SerializationError
from fusee.runtime.context import StepInfo
from fusee.runtime.run import Run, StepCall

if TYPE_CHECKING:
    from fusee.runtime.runtime import Runtime


class _Continue:
    """Awaits the rest of a coroutine that already ran to its first suspension.

    A step function that returns without suspending needs no task at all;
    one that suspends is handed to a task through this, from where it is.
    """

    __slots__ = ("coro", "first")

    def __init__(self, coro: Any, first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Any:
        coro, pending = self.coro, self.first
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:
                try:
                    pending = coro.throw(e)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as done:
                    return done.value


class StepTimeout(FuseeError, TimeoutError):
    """A step's function ran longer than its ``timeout``; the attempt counts as failed."""


#: Steps a lone chain may start in a row before it lets the loop take a turn.
_DIRECT_STREAK = 32


class StepRunner:
    """Runs the live steps of every run of one runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: Steps with effects waiting for their gates to become durable.
        self._gated: list[tuple[Run, int, StepCall]] = []
        self._release_scheduled = False
        #: Steps started in a row without a turn of the loop, and whether one is starting.
        self._streak = 0
        self._direct = False

    def run_step(self, run: Run, seq: int, call: StepCall) -> None:
        """Runs a live step's function once its gate is durable and its time has come."""
        if call.not_before == rec.PAUSED:
            return  # waits for a resume
        if call.read_only or sabotage.active.step_before_gate:
            self.rt.loop.call_soon(self._start_step, run, seq, call)
            return
        self.rt.steps_started = True
        if call.gate > self.rt.log.durable(run.shard) and not self.rt.committer.flush_if_alone():
            # Gated: it starts when a flush makes its gate durable (see _release_gated).
            self._gated.append((run, seq, call))
            self.rt.committer.request_flush()
            return
        if self._streak < _DIRECT_STREAK and not self._direct:
            # Its gate is durable now (a lone chain just flushed): run it at once,
            # sparing a turn of the loop (and its poll) per step.
            self._streak += 1
            self._run_now(run, seq, call)
            return
        # Every so many steps the function waits for the loop's next turn, so a
        # long chain never keeps the loop from other work.
        self._streak = 0
        self.rt.loop.call_soon(self._start_step, run, seq, call)

    def _run_now(self, run: Run, seq: int, call: StepCall) -> None:
        """Starts a step from inside its workflow's code, as the host loop would."""
        events = asyncio.events
        outer = events._get_running_loop()
        events._set_running_loop(self.rt.loop)  # the function runs on the host loop, not the workflow's
        self._direct = True
        try:
            self._start_step(run, seq, call)
        finally:
            self._direct = False
            events._set_running_loop(outer)

    def on_durable(self, durable: list[int]) -> None:
        """The committer made more of the log durable (called from inside it: defer the work)."""
        if self._gated and not self._release_scheduled:
            self._release_scheduled = True
            self.rt.loop.call_soon(self._release_gated)

    def _release_gated(self) -> None:
        self._release_scheduled = False
        if self.rt.closed:
            return
        durable = self.rt.log.durable_lsns()
        ready: list[tuple[Run, int, StepCall]] = []
        waiting: list[tuple[Run, int, StepCall]] = []
        for item in self._gated:
            (ready if item[2].gate <= durable[item[0].shard] else waiting).append(item)
        self._gated = waiting
        if waiting:
            self.rt.committer.request_flush()
        for run, seq, call in ready:
            self._start_step(run, seq, call)

    def _start_step(self, run: Run, seq: int, call: StepCall) -> None:
        """Runs the function now; only one that suspends (or must wait, or has a timeout) gets a task."""
        if (call.not_before > 0 and call.not_before > self.rt.env.now_ms()) or call.timeout_s is not None:
            self.rt.spawn(self._step(run, seq, call))
            return
        m = run.machine
        if run.dead or self.rt.closed or not m.step_pending(seq):
            return
        args = self._step_args(run, seq, call, call.attempt)
        try:
            if call.is_async:
                coro = call.fn(*args)
                try:
                    yielded = coro.send(None)
                except StopIteration as done:
                    value = done.value
                else:
                    # It suspended: a task carries it on from where it is.
                    self.rt.spawn(self._step(run, seq, call, _Continue(coro, yielded)))
                    return
            elif self.rt.env.inline_sync_steps:
                value = call.fn(*args)
                if inspect.isawaitable(value):
                    self.rt.spawn(self._step(run, seq, call, value))
                    return
            else:
                self.rt.spawn(self._step(run, seq, call, self.rt.env.run_blocking(lambda: call.fn(*args))))
                return
        except Exception as e:
            self.rt.spawn(self._step(run, seq, call, e))
            return
        self._step_result(run, seq, value)

    def _step_result(self, run: Run, seq: int, value: Any) -> None:
        m = run.machine
        if run.dead or self.rt.closed or not m.step_pending(seq):
            return
        try:
            status, payload = rec.Status.OK, codec.encode_step_result(run.ops.get(seq), value)
        except SerializationError as e:
            status, payload = rec.Status.FAILED, codec.encode_error(e, traceback=self.rt.tracebacks)
        self.rt.stats["steps"] += 1
        run.steps.pop(seq, None)
        if m.complete(seq, jm.StepDone(status, payload)):
            run.pump()

    async def _step(self, run: Run, seq: int, call: StepCall, first: Any = None) -> None:
        """A step's attempts with retries, timeouts and waits.

        ``first`` is how the first attempt already began: an exception it
        raised, or an awaitable carrying it on.
        """
        m = run.machine
        env = self.rt.env
        while True:
            if first is None:
                if not call.read_only and not sabotage.active.step_before_gate:
                    await self.rt.wait_durable(run.shard, call.gate)
                wait_ms = call.not_before - env.now_ms()
                if wait_ms > 0 and call.not_before != rec.PAUSED:
                    await asyncio.sleep(wait_ms / 1000)
                if run.dead or self.rt.closed or not m.step_pending(seq):
                    return
            attempt = call.attempt
            try:
                if first is None:
                    value = await self._invoke(run, seq, call, attempt)
                elif isinstance(first, BaseException):
                    raise first
                else:
                    value = await first
            except Exception as e:
                first = None
                if run.dead or self.rt.closed or not m.step_pending(seq):
                    return
                err = codec.encode_error(e, traceback=self.rt.tracebacks)
                retry = call.retry
                if retry.should_retry(attempt, e):
                    retry_at = env.now_ms() + retry.delay_ms(attempt, env.rng.random())
                    r = m.step_retry(seq, retry_at, err)
                    if r is None:
                        return
                    call.gate = run.append(r)
                    call.attempt = attempt + 1
                    call.not_before = retry_at
                    continue
                if retry.pause_when_exhausted and not isinstance(e, retry.non_retryable):
                    r = m.step_retry(seq, rec.PAUSED, err)
                    if r is not None:
                        call.not_before = rec.PAUSED
                        run.append(r)
                        run.pump()
                    return
                if run.dead or self.rt.closed or not m.step_pending(seq):
                    return
                self.rt.stats["steps"] += 1
                run.steps.pop(seq, None)
                if m.complete(seq, jm.StepDone(rec.Status.FAILED, err)):
                    run.pump()
                return
            self._step_result(run, seq, value)
            return

    def _step_args(self, run: Run, seq: int, call: StepCall, attempt: int) -> tuple[Any, ...]:
        if not call.takes_info:
            return ()
        progress_raw = run.machine.progress(seq)
        progress = codec.decode(progress_raw) if progress_raw is not None else None
        info = StepInfo(
            call.name,
            run.machine.key(seq),
            attempt,
            run.workflow_id,
            run.run_id,
            progress,
            lambda p: self._heartbeat(run, seq, p),
        )
        return (info,)

    async def _invoke(self, run: Run, seq: int, call: StepCall, attempt: int) -> Any:
        fn = call.fn
        args = self._step_args(run, seq, call, attempt)
        if call.is_async:
            coro = fn(*args)
            if call.timeout_s is None:
                return await coro
            try:
                return await asyncio.wait_for(coro, call.timeout_s)
            except TimeoutError:
                raise StepTimeout(f"step '{call.name}' took longer than {call.timeout_s}s") from None
        if self.rt.env.inline_sync_steps:
            result = fn(*args)
        else:
            fut = self.rt.env.run_blocking(lambda: fn(*args))
            if call.timeout_s is None:
                result = await fut
            else:
                try:
                    result = await asyncio.wait_for(fut, call.timeout_s)
                except TimeoutError:
                    raise StepTimeout(f"step '{call.name}' took longer than {call.timeout_s}s") from None
        if inspect.isawaitable(result):
            result = await result
        return result

    def _heartbeat(self, run: Run, seq: int, progress: Any) -> None:
        if run.dead or self.rt.closed:
            return
        r = run.machine.heartbeat(seq, codec.encode(progress))
        if r is not None:
            run.append(r)
