"""Running step functions: gates, retries, timeouts, cancellation, and the fast path without tasks.

A step with effects starts only once its run's journal is durable through
its gate. Steps wait in one gated list that each completed flush releases;
a function that returns without suspending runs on the host loop's turn with
no task of its own, and only one that suspends, must wait, or has a timeout
gets a task.

An execution is one call of a step's function, from the moment it is handed
to the pool (or called) until its outcome is known. A run tracks its
executions (``Run.executing``): a requested cancel waits for them to settle,
no execution starts while a cancel is pending or the engine is closing, and a
step never has two executions at once (a timed-out synchronous function is
waited for before the next attempt). Nor does one start once the engine's
expiring lease lapsed by its own clock (``log.may_act``): a stopped owner whose
flush came back committed after a takeover would run the steps that flush
released, which the new owner recovered and runs too; the log fails instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from fusee import codec, sabotage
from fusee.core import journal as jm
from fusee.core import records as rec
from fusee.errors import SerializationError, StepTimeout, WrongEventLoop
from fusee.runtime.context import CURRENT_STEP, StepInfo
from fusee.runtime.run import Run, StepCall
from fusee.runtime.streams import StepStream
from fusee.runtime.syncsteps import SyncStepPolicy
from fusee.runtime.tokens import make_token

if TYPE_CHECKING:
    from fusee.runtime.host import StepHost
    from fusee.runtime.telemetry import TelemetryHooks

log = logging.getLogger("fusee")


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


#: Results that are never awaitable: checked by type, sparing ``inspect.isawaitable``'s ABC check.
_PLAIN = frozenset({int, str, float, bool, type(None), bytes, dict, list, tuple})


def _awaitable(value: Any) -> bool:
    return type(value) not in _PLAIN and inspect.isawaitable(value)


def _has_work(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the loop has callbacks ready or timers due (asyncio's own queues, looked at, not changed)."""
    if getattr(loop, "_ready", None):
        return True
    timers: list[asyncio.TimerHandle] = getattr(loop, "_scheduled", None) or []  # a heap: earliest first
    return bool(timers) and timers[0].when() <= loop.time()


#: Steps a lone chain may start in a row before it lets the loop take a turn.
_DIRECT_STREAK = 32
#: Turns of the loop a step function waits at most, after long ones, for what became ready.
_YIELDS = 16


class StepRunner:
    """Runs the live steps of every run of one runtime."""

    def __init__(self, rt: StepHost) -> None:
        self.rt = rt
        #: Steps with effects waiting for their gates to become durable.
        self._gated: list[tuple[Run, int, StepCall]] = []
        self._release_scheduled = False
        #: Steps that let the loop take a turn before they are lent its thread (``_wait_for_ready``).
        self._deferred: list[tuple[Run, int, StepCall]] = []
        #: Steps started in a row without a turn of the loop, and whether one is starting.
        self._streak = 0
        self._direct = False
        #: Executions in progress in every run (closing waits for them).
        self.executing = 0
        self._idle: asyncio.Future[None] | None = None
        #: Heartbeats: the latest not yet journaled, and the LSN of the last one journaled, per step.
        self._hb_next: dict[tuple[Run, int], rec.Heartbeat] = {}
        self._hb_lsn: dict[tuple[Run, int], int] = {}
        #: Every execution begun, as (workflow ID, position), when a test asks (None: not kept).
        self.started: list[tuple[str, int]] | None = None
        #: When a supervised attempt last reported a heartbeat (loop time).
        self._hb_seen: dict[tuple[Run, int], float] = {}
        #: Where synchronous step functions run (the loop's thread or the pool).
        self.sync_policy = SyncStepPolicy(rt.env.inline_sync_steps, rt.env.monotonic)
        #: Whether any limited step ever ran (settling then gives its permit back).
        self.limited = False
        #: Spans and metrics of attempts (set by ``Runtime.use_telemetry``); None: off.
        self.telemetry: TelemetryHooks | None = None
        #: Step functions lent the loop's thread so far.
        self.lends = 0

    # --- starting ----------------------------------------------------------------

    def run_step(self, run: Run, seq: int, call: StepCall) -> None:
        """Runs a live step's function once its gate is durable and its time has come."""
        if call.not_before == rec.PAUSED:
            return  # waits for a resume
        if call.read_only or sabotage.active.step_before_gate:
            self.rt.loop.call_soon(self._start_step, run, seq, call)
            return
        if (call.gate > self.rt.log.durable(run.shard)
                and not self.rt.committer.flush_if_alone(run.shard, call.gate)):
            # Gated: it starts when a flush makes its gate durable (see _release_gated),
            # and that flush takes whatever else is pending (flush_soon need not ask).
            self._gated.append((run, seq, call))
            self.rt.committer.request_flush()
            self.rt.steps_started = True
            return
        if sabotage.active.no_flush_after_direct_step:
            self.rt.steps_started = True
        if self._streak < _DIRECT_STREAK and not self._direct and not run.machine.is_replaying():
            # Its gate is durable now (a lone chain just flushed): run it at once,
            # sparing a turn of the loop (and its poll) per step.
            self._streak += 1
            self._run_now(run, seq, call)
            return
        # Every so many steps the function waits for the loop's next turn, so a
        # long chain never keeps the loop from other work. During replay it
        # waits too: a cancel further on in the journal may still cover it.
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
        if (self._gated or self._hb_next) and not self._release_scheduled:
            self._release_scheduled = True
            self.rt.loop.call_soon(self._release_gated)

    def _release_gated(self) -> None:
        self._release_scheduled = False
        if self.rt.closed:
            return
        durable = self.rt.log.durable_lsns()
        if self._hb_next:
            self._journal_heartbeats(durable)
        ready: list[tuple[Run, int, StepCall]] = []
        waiting: list[tuple[Run, int, StepCall]] = []
        for item in self._gated:
            (ready if item[2].gate <= durable[item[0].shard] else waiting).append(item)
        self._gated = waiting
        if waiting:
            self.rt.committer.request_flush()
        # Each released step appends its outcome (or its next gate) in this callback: none
        # may flush for itself meanwhile, so the flush that follows carries them all.
        committer = self.rt.committer
        committer.expect(len(ready))
        for run, seq, call in ready:
            try:
                self._start_step(run, seq, call)
            finally:
                committer.landed()

    def has_gated(self) -> bool:
        """Steps wait for their gates to become durable."""
        return bool(self._gated)

    def may_start(self, run: Run, seq: int) -> bool:
        """Whether an execution of step ``seq`` may begin now."""
        if run.dead or self.rt.closed or self.rt.closing or run.finishing or not run.machine.step_pending(seq):
            return False
        if seq in run.executing:
            return False  # one execution of a step at a time
        if run.cancel_pending and not sabotage.active.step_after_cancel:
            return False
        return self.rt.log.may_act() or self._lease_held()

    def _lease_held(self) -> bool:
        """Whether the engine may act now (its lease, if it expires, is still its own by its clock);
        if not, the log fails: another engine may serve the runs and run their steps."""
        log = self.rt.log
        if log.may_act() or sabotage.active.step_ignores_lease_deadline:
            return True
        log.lease_lapsed()
        return False

    def _begin(self, run: Run, seq: int, task: asyncio.Task[Any] | None) -> None:
        run.executing[seq] = task
        self.executing += 1
        if self.telemetry is not None:
            self.telemetry.step_begin(run, seq)
        if self.started is not None:
            self.started.append((run.workflow_id, seq))

    def _settle(self, run: Run, seq: int) -> None:
        """An execution's outcome is known (and, if it has one, handed to the machine)."""
        if run.executing.pop(seq, ...) is ...:
            return
        self.executing -= 1
        if self.limited:
            self.rt.limiter.release((run, seq))
        if self.telemetry is not None:
            self.telemetry.step_end(run, seq, "abandoned", None)  # unless its outcome came first
        if self._hb_lsn:
            self._hb_next.pop((run, seq), None)
            self._hb_lsn.pop((run, seq), None)
        if run.cancel_requests:
            run.deliver_cancel_if_settled()
        if run.finishing and not run.executing:
            run.pump()  # the code had returned: now the run ends
        if self.executing == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def wait_idle(self) -> None:
        """Returns once no step function runs anywhere (new ones are not started while closing)."""
        while self.executing:
            if self._idle is None or self._idle.done():
                self._idle = self.rt.loop.create_future()
            await self._idle

    def _start_step(self, run: Run, seq: int, call: StepCall) -> None:
        """Runs the function now; only one that suspends (or must wait, or has a timeout) gets a task."""
        if (
            (call.not_before > 0 and call.not_before > self.rt.env.now_ms())
            or call.timeout_s is not None
            or call.heartbeat_s is not None
            or call.limit is not None  # waits for a permit in its task
        ):
            if self.may_start(run, seq):
                self.rt.spawn(self._step(run, seq, call))
            return
        if not self.may_start(run, seq):
            return
        if (not call.is_async and run.pumping and run.machine.has_queued_deliveries()
                and self.sync_policy.runs_inline(call.fn)):
            # An outcome of this run (a step gathered with this one) waits for the pump
            # going on to journal it: lending the loop's thread now would hold that record
            # back for as long as this function runs. After the pump, then.
            self.rt.loop.call_soon(self._start_step, run, seq, call)
            return
        if not call.is_async and self._wait_for_ready(call) and self.sync_policy.runs_inline(call.fn):
            if not self._deferred:
                self.rt.loop.call_soon(self._start_deferred)
            self._deferred.append((run, seq, call))
            return
        args = (self._info(run, seq, call, call.attempt),) if call.takes_info else ()
        run.executing[seq] = None
        self.executing += 1
        if self.telemetry is not None:
            self.telemetry.step_begin(run, seq)
        if self.started is not None:
            self.started.append((run.workflow_id, seq))
        entered = CURRENT_STEP.set(partial(self._info, run, seq, call, call.attempt))
        # The attempt's span is the function's current trace context (its tasks and thread inherit it).
        traced = self.telemetry.enter_step(run, seq) if self.telemetry is not None else None
        # One clock read here and one at its outcome time the attempt (see records.Step).
        call.began_us = self.rt.env.now_us()
        call.queued_us = 0
        try:
            if call.is_async:
                coro = call.fn(*args)
                try:
                    yielded = coro.send(None)
                except StopIteration as done:
                    value = done.value
                else:
                    # It suspended: a task carries it on from where it is.
                    self._carry(run, seq, call, _Continue(coro, yielded))
                    return
            elif self.sync_policy.runs_inline(call.fn):
                try:
                    value = self._call_inline(call.fn, args)
                except WrongEventLoop:
                    # It waits for the engine's loop (engine.run_threadsafe): only a thread
                    # can run it. In the pool from now on, this execution included.
                    self.sync_policy.needs_thread(call.fn)
                    self.rt.spawn(self._step(run, seq, call, self._in_pool(run, call, call.fn, args)))
                    return
                if _awaitable(value):
                    self._carry(run, seq, call, value)
                    return
            else:
                self.rt.spawn(self._step(run, seq, call, self._in_pool(run, call, call.fn, args)))
                return
        except Exception as e:
            self.rt.spawn(self._step(run, seq, call, e))
            return
        finally:
            CURRENT_STEP.reset(entered)
            if traced is not None:
                self.telemetry.leave_step(traced)  # type: ignore[union-attr]
        self._step_result(run, seq, value)

    def _start_deferred(self) -> None:
        """The steps that let the loop take a turn, tried again, all in one callback."""
        batch, self._deferred = self._deferred, []
        # A turn the loop took without lending its thread counts as a short lend: the guess that
        # lends are long decays, so one long function makes the steps behind it wait a few
        # turns (about log2 of how many flush times it held the thread), not _YIELDS each.
        self.rt.committer.lent(0.0)
        for run, seq, call in batch:
            self._start_step(run, seq, call)

    def _wait_for_ready(self, call: StepCall) -> bool:
        """Whether a step function about to be lent the loop's thread should let what is ready run first.

        While step functions held the thread longer than a flush (``lends_are_long``), and
        ``_YIELDS`` turns of the loop at most since the thread was last lent: an outcome from
        the pool or a flush's end, a few callbacks away, is then journaled and handed to the
        disk instead of waiting behind this function (and every other one lent the thread in
        the same turn).
        """
        if not self.rt.committer.lends_are_long or not _has_work(self.rt.loop):
            return False
        if call.waited_after != self.lends:
            # The thread was lent since this step last waited: its turns count anew.
            call.waited_after, call.turns_waited = self.lends, 0
        if call.turns_waited >= _YIELDS:
            return False
        call.turns_waited += 1
        return True

    async def _after_ready(self, call: StepCall) -> bool:
        """``_wait_for_ready`` for an attempt in a task; returns whether the loop took a turn."""
        waited = False
        while self._wait_for_ready(call):
            waited = True
            await asyncio.sleep(0)
        return waited

    def _call_inline(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Calls a synchronous step function on the loop's thread, timed (see ``syncsteps``).

        Whatever waits to be flushed is handed to the log's thread first, so
        no record waits for this call to begin its way to the disk.
        """
        if not sabotage.active.inline_step_holds_flush:
            self.rt.committer.hand_off()
        env = self.rt.env
        began = env.monotonic()
        try:
            return env.call_inline(fn, *args)
        finally:
            took = env.monotonic() - began
            self.lends += 1
            self.rt.committer.lent(took)
            self.sync_policy.observe(fn, took, True)

    async def _permit(self, run: Run, seq: int, call: StepCall) -> bool:
        """Waits for the step's permit (fusee.limits); False if the step may no longer start."""
        self.limited = True
        limiter = self.rt.limiter
        ident = (run.workflow_id, run.run_id, seq)
        if not await limiter.acquire((run, seq), ident, call.limit, lambda: self.may_start(run, seq),
                                     lambda: self.rt.after_pump(run)):
            return False
        if not self.may_start(run, seq):
            limiter.release((run, seq))
            return False
        return True

    def waits_for_permit(self, run: Run, seq: int) -> bool:
        """Step ``seq`` waits only for a limit's permit (its run may be parked meanwhile)."""
        return self.limited and seq not in run.executing and self.rt.limiter.waits((run, seq))

    def _info_maker(self, run: Run, seq: int, call: StepCall, attempt: int) -> Callable[[], StepInfo]:
        return partial(self._info, run, seq, call, attempt)

    def _carry(self, run: Run, seq: int, call: StepCall, awaitable: Any) -> None:
        """Hands a suspended async execution to a task, which a cancel of the run may interrupt."""
        task = self.rt.spawn(self._step(run, seq, call, awaitable))
        if seq in run.executing:
            run.executing[seq] = task
            task.add_done_callback(lambda t: self._carrier_done(run, seq, t))

    def _carrier_done(self, run: Run, seq: int, task: asyncio.Task[Any]) -> None:
        # A task cancelled before it began never ran its own settling code.
        if run.executing.get(seq) is task:
            self._settle(run, seq)

    def _in_pool(self, run: Run, step: StepCall, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Runs a synchronous function in the step pool, unless a cancel came first.

        The pool may hold it back for a while (every thread busy): the check
        happens when a thread takes it, so no execution begins after a cancel.
        The wait counts as the attempt's queue delay (``step.began_us`` is when
        it was handed over, and becomes when a thread began it).
        """

        context = contextvars.copy_context()  # fusee.step_info() works in the thread too
        clock, observe = self.rt.env.monotonic, self.sync_policy.observe
        wall = self.rt.env.now_us
        log = self.rt.log

        def call() -> Any:
            if run.cancel_pending and not sabotage.active.step_after_cancel:
                raise _NotStarted()
            if self.rt.closing:
                raise _NotStarted()
            if not log.may_act() and not sabotage.active.step_ignores_lease_deadline:
                raise _NotStarted()  # held back past the lease (see may_start): the loop fails the log
            # Read by the loop's thread once the pool's future is done, which orders the writes.
            now = wall()
            step.queued_us += max(0, now - step.began_us)
            step.began_us = now
            began = clock()
            try:
                return context.run(fn, *args)
            finally:
                # From the pool's thread: the policy's state is a dict, safe under the GIL.
                observe(fn, clock() - began, False)

        return self.rt.env.run_step(call)

    # --- outcomes ------------------------------------------------------------------

    def _step_result(self, run: Run, seq: int, value: Any) -> None:
        m = run.machine
        if run.dead or self.rt.closed or not m.step_pending(seq):
            self._settle(run, seq)
            return
        call = run.steps.get(seq)
        if call is not None and call.is_await:
            # The token function returned: its token is out; the run waits for engine.complete.
            r = m.awaiting(seq)
            run.steps.pop(seq, None)
            if self.telemetry is not None:
                self.telemetry.step_end(run, seq, "ok", None)
            if r is not None:
                run.append(r)
                run.pump()
            self._settle(run, seq)
            return
        try:
            status, payload = rec.Status.OK, codec.encode_step_result(run.ops.get(seq), value)
        except SerializationError as e:
            status, payload = rec.Status.FAILED, codec.encode_error(e, traceback=self.rt.tracebacks)
        self._complete(run, seq, status, payload)

    def _complete(self, run: Run, seq: int, status: rec.Status, payload: bytes) -> None:
        """Journals the step's outcome (delivered before any cancel waiting for it), then settles."""
        self.rt.stats["steps"] += 1
        call = run.steps.pop(seq, None)
        if call is not None and call.began_us:
            done = jm.StepDone(status, payload, call.began_us, max(0, self.rt.env.now_us() - call.began_us),
                               call.queued_us)
        else:
            done = jm.StepDone(status, payload)
        tel = self.telemetry
        if tel is not None:
            name = status.name.lower()
            tel.step_done(name)
            tel.step_end(run, seq, name, codec.decode_error(payload).type if status == rec.Status.FAILED else None)
        if run.machine.owns_streams(seq):
            for end in run.machine.stream_ends(seq, status):
                run.append(end)  # the result completes the step's streams, just before it
        if run.machine.complete(seq, done):
            run.pump()
        self._settle(run, seq)

    def _cancelled_by_run(self, run: Run) -> bool:
        return run.cancel_pending and not run.dead and not self.rt.closed

    async def _step(self, run: Run, seq: int, call: StepCall, first: Any = None) -> None:
        """A step's attempts with retries, timeouts and waits.

        ``first`` is how the first attempt already began (its execution is
        counted): an exception it raised, or an awaitable carrying it on.
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
                if not self.may_start(run, seq):
                    return
                ready = env.now_us()
                if call.limit is not None:
                    if not await self._permit(run, seq, call):
                        return
                    call.began_us = env.now_us()
                    call.queued_us = max(0, call.began_us - ready)  # a wall clock may step back
                else:
                    call.began_us, call.queued_us = ready, 0
                self._begin(run, seq, asyncio.current_task() if call.is_async else None)
            attempt = call.attempt
            try:
                value = await self._attempt(run, seq, call, attempt, first)
            except asyncio.CancelledError:
                if not self._cancelled_by_run(run):
                    self._settle(run, seq)
                    raise  # the engine is closing
                # The run's cancel interrupted the function: that is its outcome.
                if m.step_pending(seq):
                    self._complete(run, seq, rec.Status.CANCELLED, run.cancel_reason())
                else:
                    self._settle(run, seq)
                return
            except _NotStarted:
                self._settle(run, seq)  # a cancel (or close, or the lease's end) came before a thread took it
                self._lease_held()
                return
            except Exception as e:
                first = None
                if run.dead or self.rt.closed or not m.step_pending(seq):
                    self._settle(run, seq)
                    return
                if run.cancel_pending:
                    # No new attempt after a cancel: the step stays pending and the cancel covers it.
                    self._settle(run, seq)
                    return
                # Attempts journal the error without its traceback: a step retrying
                # for days must not fill the log; the final failure keeps it.
                err = codec.encode_error(e, traceback=False)
                retry = call.retry
                ended = env.now_us()
                began, queued = call.began_us, call.queued_us
                took = max(0, ended - began) if began else 0
                if retry.should_retry(attempt, e):
                    retry_at = env.now_ms() + retry.delay_ms(attempt, env.rng.random())
                    r = m.step_retry(seq, retry_at, err, began, took, queued)
                    if r is None:
                        self._settle(run, seq)
                        return
                    call.gate = run.append(r)
                    # On disk during the delay, not at the next attempt's gate: the disk is idle now.
                    self.rt.committer.request_flush()
                    call.attempt = attempt + 1
                    call.not_before = retry_at
                    self.rt.step_retried(run, call, e, retry_at)
                    if self.telemetry is not None:
                        self.telemetry.step_end(run, seq, "retry", type(e).__name__)
                    self._settle(run, seq)
                    continue
                if retry.pause_when_exhausted and not isinstance(e, retry.non_retryable):
                    r = m.step_retry(seq, rec.PAUSED, err, began, took, queued)
                    if r is not None:
                        call.not_before = rec.PAUSED
                        run.append(r)
                        self.rt.committer.request_flush()
                        self.rt.step_retried(run, call, e, rec.PAUSED)
                        if self.telemetry is not None:
                            self.telemetry.step_end(run, seq, "paused", type(e).__name__)
                        run.pump()
                    self._settle(run, seq)
                    return
                log.warning("workflow %r: step %r failed for good at attempt %d (%s: %s)",
                            run.workflow_id, call.name, attempt, type(e).__name__, e)
                self._complete(run, seq, rec.Status.FAILED, codec.encode_error(e, traceback=self.rt.tracebacks))
                return
            self._step_result(run, seq, value)
            return

    async def _attempt(self, run: Run, seq: int, call: StepCall, attempt: int, first: Any) -> Any:
        """One attempt's outcome; while it is in flight the committer counts it as a producer.

        Its outcome is journaled right after, so a flush about to start waits
        for it (bounded) rather than leaving it for the next one.
        """
        committer = self.rt.committer
        committer.expect()
        try:
            if first is None:
                return await self._invoke(run, seq, call, attempt)
            if isinstance(first, BaseException):
                raise first
            value = await first
            if inspect.isawaitable(value):
                # A synchronous callable that returned an awaitable (``lambda: fetch(url)``).
                if seq in run.executing:
                    run.executing[seq] = asyncio.current_task()
                value = await value
            return value
        finally:
            committer.landed()

    def _step_args(self, run: Run, seq: int, call: StepCall, attempt: int) -> tuple[Any, ...]:
        if not call.takes_info:
            return ()
        return (self._info(run, seq, call, attempt),)

    def _info(self, run: Run, seq: int, call: StepCall, attempt: int) -> StepInfo:
        progress_raw = run.machine.progress(seq)
        progress = codec.decode(progress_raw) if progress_raw is not None else None
        progress = progress + 1 if sabotage.active.resume_unreported_progress and isinstance(progress, int) else progress
        info = StepInfo(
            call.name,
            run.machine.key(seq),
            attempt,
            run.workflow_id,
            run.run_id,
            progress,
            lambda p: self._heartbeat(run, seq, p),
            lambda: run.cancel_pending,
            make_token(run.workflow_id, run.run_id, seq, attempt) if call.is_await else None,
            lambda name: StepStream(run, seq, name, self.rt.loop),
        )
        return info

    async def _invoke(self, run: Run, seq: int, call: StepCall, attempt: int) -> Any:
        fn = call.fn
        args = self._step_args(run, seq, call, attempt)
        # This task's own context: tasks and threads started from here inherit it.
        CURRENT_STEP.set(self._info_maker(run, seq, call, attempt))
        if self.telemetry is not None:
            self.telemetry.enter_step(run, seq)  # this task's context: never left, the task ends
        if call.is_async:
            return await self._supervise(run, seq, call, asyncio.ensure_future(fn(*args)), False)
        inline = call.timeout_s is None and call.heartbeat_s is None and self.sync_policy.runs_inline(fn)
        if inline and await self._after_ready(call):
            if ((run.cancel_pending and not sabotage.active.step_after_cancel) or self.rt.closing
                    or not (self.rt.log.may_act() or sabotage.active.step_ignores_lease_deadline)):
                raise _NotStarted()  # a cancel (or close, or the lease's end) came meanwhile: as in _in_pool
            inline = self.sync_policy.runs_inline(fn)  # another execution may have sent it to the pool
        if inline:
            try:
                result = self._call_inline(fn, args)
            except WrongEventLoop:
                self.sync_policy.needs_thread(fn)  # see _start_step
                inline = False
        if not inline:
            result = await self._supervise(run, seq, call, self._in_pool(run, call, fn, args), True)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            if seq in run.executing:
                run.executing[seq] = asyncio.current_task()
            result = await self._supervise(run, seq, call, task, False)
        return result

    async def _supervise(
        self, run: Run, seq: int, call: StepCall, fut: asyncio.Future[Any], in_thread: bool
    ) -> Any:
        """Awaits one attempt, failing it past its ``timeout`` or ``heartbeat_timeout``.

        An async attempt is cancelled then. A thread cannot be interrupted:
        the attempt still fails, but only once the function returned, so the
        next attempt never overlaps it.
        """
        if call.timeout_s is None and call.heartbeat_s is None:
            return await fut
        loop = self.rt.loop
        start = loop.time()
        key = (run, seq)
        self._hb_seen[key] = start
        try:
            while True:
                limit = start + call.timeout_s if call.timeout_s is not None else None
                why = f"took longer than {call.timeout_s}s"
                if call.heartbeat_s is not None:
                    silent = self._hb_seen.get(key, start) + call.heartbeat_s
                    if limit is None or silent < limit:
                        limit, why = silent, f"reported no heartbeat for {call.heartbeat_s}s"
                assert limit is not None
                remaining = limit - loop.time()
                if remaining > 0:
                    done, _ = await asyncio.wait({fut}, timeout=remaining)
                    if done:
                        return fut.result()
                    continue  # a heartbeat may have moved the limit: look again
                if in_thread:
                    try:
                        await fut
                    except Exception:
                        pass
                    why += " (its function ran to its end; the result was discarded)"
                else:
                    fut.cancel()
                    try:
                        await fut
                    except BaseException:
                        pass
                raise StepTimeout(f"step '{call.name}' {why}")
        finally:
            self._hb_seen.pop(key, None)
            if not fut.done():
                fut.cancel()  # the task carrying us was cancelled: so is the attempt

    # --- heartbeats ---------------------------------------------------------------

    def _heartbeat(self, run: Run, seq: int, progress: Any) -> None:
        payload = codec.encode(progress)
        if asyncio.events._get_running_loop() is not self.rt.loop:
            # From a step function's thread: the journal is the loop's alone.
            self.rt.loop.call_soon_threadsafe(self._heartbeat_on_loop, run, seq, payload)
            return
        self._heartbeat_on_loop(run, seq, payload)

    def _heartbeat_on_loop(self, run: Run, seq: int, payload: bytes) -> None:
        if run.dead or self.rt.closed or seq not in run.executing:
            return
        if (run, seq) in self._hb_seen:
            self._hb_seen[(run, seq)] = self.rt.loop.time()
        r = run.machine.heartbeat(seq, payload)
        if r is None:
            return
        key = (run, seq)
        lsn = self._hb_lsn.get(key)
        if lsn is not None and lsn > self.rt.log.durable(run.shard):
            # The last one is not durable yet: only the latest of this flush is journaled.
            self._hb_next[key] = r
            return
        self._hb_lsn[key] = run.append(r)
        self.rt.flush_soon()

    def _journal_heartbeats(self, durable: list[int]) -> None:
        for key, r in list(self._hb_next.items()):
            run, seq = key
            if self._hb_lsn.get(key, 0) > durable[run.shard]:
                continue
            del self._hb_next[key]
            if run.dead or seq not in run.executing:
                continue
            self._hb_lsn[key] = run.append(r)
        self.rt.flush_soon()


class _NotStarted(Exception):
    """A queued synchronous execution found a cancel (or a closing engine) when a thread took it."""
