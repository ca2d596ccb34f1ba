"""One loaded workflow run: its code, its journal machine and its deliveries.

A ``Run`` owns a per-run :class:`WorkflowLoop` on which the workflow's code
runs as ordinary asyncio tasks. Operations the code starts go through the
journal machine; results come back one delivery at a time (``pump``), the code
running until quiescent in between, so replay sees the same interleaving.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from fusee import codec, sabotage
from fusee.core import journal as jm
from fusee.core import records as rec
from fusee.declarations import QueryDef, SignalDef, UpdateDef, WorkflowDef
from fusee.durations import to_ms
from fusee.errors import (
    Cancelled,
    CompletionFailed,
    DeterminismError,
    FuseeError,
    InvalidWorkflowId,
    NondeterministicCall,
    QueryFailed,
    SerializationError,
    UpdateFailed,
)
from fusee.retry import Retry
from fusee.runtime import footprint
from fusee.runtime.context import (
    ChildHandle,
    ContinueAsNew,
    Ctx,
    OutsideWorkflow,
    describe_fn,
    takes_argument,
)
from fusee.runtime.wfloop import WorkflowLoop

if TYPE_CHECKING:
    from fusee.runtime.env import Env
    from fusee.runtime.telemetry import TelemetryHooks

#: Kinds of operations whose futures the run resolves.
STEP, SLEEP, WAIT, CHILD, UPDATE, AWAIT = range(6)

_CLOSE_POLICIES = {
    "terminate": rec.ClosePolicy.TERMINATE,
    "request_cancel": rec.ClosePolicy.REQUEST_CANCEL,
    "abandon": rec.ClosePolicy.ABANDON,
}


class Op:
    """A pending operation's future and how to turn its outcome into a value."""

    __slots__ = ("fut", "kind", "name", "type")

    def __init__(self, fut: asyncio.Future[Any], kind: int, name: str, type: Any) -> None:
        self.fut = fut
        self.kind = kind
        self.name = name
        self.type = type


class StepCall(Op):
    """A live step: one object from ``ctx.step`` to its durable result.

    It is the run's pending operation (its future, name and result type, as
    every ``Op``) and carries the function, its options and its attempt state
    through the step runner, kept while the step may still run (or resume).
    """

    __slots__ = (
        "attempt",
        "began_us",
        "fn",
        "gate",
        "heartbeat_s",
        "is_async",
        "is_await",
        "last_error",
        "limit",
        "not_before",
        "queued_us",
        "read_only",
        "retry",
        "takes_info",
        "timeout_s",
        "turns_waited",
        "waited_after",
    )

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        retry: Retry,
        timeout_s: float | None,
        read_only: bool,
        attempt: int,
        not_before: int,
        gate: int,
        described: tuple[bool, bool, Any] | None = None,
        fut: asyncio.Future[Any] | None = None,
        kind: int = STEP,
        type: Any = Any,
    ) -> None:
        self.fut = fut  # type: ignore[assignment]  # None only for a call no code awaits (tests)
        self.kind = kind
        self.type = type
        self.name = name
        self.fn = fn
        self.retry = retry
        self.timeout_s = timeout_s
        self.read_only = read_only
        self.attempt = attempt
        self.not_before = not_before
        self.gate = gate
        #: When the current attempt's function began (engine clock, Unix µs), and how long it
        #: waited for a permit or a pool thread before: the times its record journals.
        self.began_us = 0
        self.queued_us = 0
        #: The latest failed attempt's error (for describe()), or None.
        self.last_error: str | None = None
        #: The limit whose permit each attempt takes (fusee.limits.LimitRequest), or None.
        self.limit: Any = None
        #: An async completion's token function (its success hands out the token).
        self.is_await = False
        #: An attempt that reports no heartbeat for this long fails (None: no limit).
        self.heartbeat_s: float | None = None
        #: Turns of the loop the next inline execution waited for what was ready since the loop's
        #: thread was last lent (that lend's number, ``StepRunner.lends``): see StepRunner.
        self.turns_waited = 0
        self.waited_after = -1
        self.takes_info, self.is_async, _ = described if described is not None else describe_fn(fn)


class RunHost(Protocol):
    """The runtime as one run sees it: all a run may ask of its host.

    It lives beside ``Run`` (its methods take one), so the run imports nothing
    above it; ``fusee.runtime.host`` re-exports it.
    """

    env: Env
    loop: asyncio.AbstractEventLoop
    tracebacks: bool
    default_retry: Retry
    limiter: Any  # fusee.limits.Limiter: checks a step's limit= at ctx.step
    telemetry: TelemetryHooks | None
    steps_started: bool  # a gated step started since the last pump began (see flush_soon)
    loaded_bytes: int  # what loaded runs are counted as holding (fusee.runtime.budget)
    last_append_bytes: int  # the encoded size of the latest append

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
    def spawn(self, coro: Any) -> asyncio.Task[Any]: ...
    def appended_durable(self) -> Coroutine[Any, Any, None]: ...
    def release_update(
        self, shard: int, lsn: int, waiters: list[asyncio.Future[Any]], status: rec.Status, payload: bytes
    ) -> None: ...
    def next_token(self) -> int: ...

    # what became of the run
    def on_run_done(self, run: Run, done: rec.Done, lsn: int) -> None: ...
    def on_stuck(self, run: Run, err: FuseeError) -> None: ...
    def after_pump(self, run: Run) -> None: ...
    def signal_passed_over(self, run: Run, seq: int, ordinal: int, name: str, error: FuseeError) -> None: ...


class Run:
    """A workflow run loaded in memory, with its code running or replaying."""

    def __init__(
        self,
        rt: RunHost,
        shard: int,
        wdef: WorkflowDef[Any, Any],
        machine: jm.RunMachine,
        journal: list[rec.Record],
        lsns: list[int],
    ) -> None:
        self.rt = rt
        self.shard = shard
        self.wdef = wdef
        self.machine = machine
        info = machine.info
        self.workflow_id: str = info.id
        self.run_id: int = info.run
        self.journal = journal
        self.lsns = lsns
        self.loop = WorkflowLoop(f"{info.id}/{info.run}", self)
        self.ctx = Ctx(self)
        self.ops: dict[int, Op] = {}
        self.task: asyncio.Task[Any] | None = None
        self.finished = False
        self.dead = False
        self.stuck: FuseeError | None = None
        self.pumping = False
        # Signals as the journal holds them (ordinal = index), which ordinals
        # a wait took, dedup keys seen, and live waits by signal name.
        self.signals: list[tuple[str, bytes]] = []
        self.consumed: set[int] = set()
        self.dedup: set[int] = set()
        self.waiting: dict[str, list[int]] = {}
        #: The type the code waits for each signal name with (its latest wait, replayed or live):
        #: a signal sent by name only is checked against it (``fusee.engine.signals``).
        self.signal_types: dict[str, Any] = {}
        #: (wait position, signal ordinal) pairs whose payload the wait's type cannot decode.
        self.passed_over: set[tuple[int, int]] = set()
        # Times and targets recorded by earlier lives, for operations armed then.
        self.timer_at: dict[int, int] = {}
        self.wait_deadline: dict[int, int] = {}
        self.children: dict[int, rec.Child] = {}
        #: Child starts and signals this life sent, each done once durable where it went:
        #: continue-as-new waits for them (the next run does not owe what this one sent).
        self.deliveries: list[asyncio.Future[None]] = []
        self.steps: dict[int, StepCall] = {}
        self.query_handlers: dict[str, Callable[..., Any]] = {}
        self.update_handlers: dict[str, tuple[UpdateDef[Any], Callable[..., Any], Callable[..., Any] | None]] = {}
        self.update_ids: dict[int, str] = {}
        self.update_results: dict[str, tuple[rec.Status, bytes]] = {}
        self.update_waiters: dict[int, asyncio.Future[Any]] = {}  # token -> caller
        self.update_by_ordinal: dict[int, list[asyncio.Future[Any]]] = {}
        self.update_inflight: dict[str, asyncio.Future[Any]] = {}
        #: CancelRequest and Cancel records in the journal: a cancellation is
        #: pending (asked, not yet delivered) while there are more of the first.
        self.cancel_requests = 0
        self.cancels = 0
        self.cancel_request_lsn = 0
        self._cancel_ask: tuple[bytes, bytes | None] = (b"", None)
        #: A cancellation reached the code (its Cancelled may end the run as cancelled).
        self.cancel_requested = False
        #: The code returned while step functions ran: the run ends once they settle.
        self.finishing = False
        #: Steps whose function runs now: seq -> the task carrying an async
        #: function (asyncio cancellation reaches it), or None (a thread's).
        self.executing: dict[int, asyncio.Task[Any] | None] = {}
        #: This run's telemetry span while loaded (see ``fusee.runtime.telemetry``), else None.
        self.span: Any = None
        #: When the run last went quiet (Env ms), and whether a park check is queued for it.
        self.quiet_since = 0
        self.park_queued = False
        #: What the run is counted as holding (``fusee.runtime.budget``), and whether the
        #: runtime's total counts it (from its load until it parks or ends).
        self.held_bytes = footprint.RUN_BYTES + footprint.journal_bytes(journal)
        self.counted = False
        for r, lsn in zip(journal, lsns, strict=True):
            self._index(r)
            if type(r) is rec.CancelRequest:
                self.cancel_request_lsn = lsn

    # --- journal bookkeeping --------------------------------------------

    def _index(self, r: rec.Record) -> None:
        """Remembers what a recorded record tells the host (not the machine)."""
        t = type(r)
        if t is rec.Signal:
            assert isinstance(r, rec.Signal)
            self.signals.append((r.name, r.payload))
            if r.dedup:
                self.dedup.add(r.dedup)
        elif t is rec.Waited:
            assert isinstance(r, rec.Waited)
            if r.outcome == rec.WaitOutcome.SIGNAL:
                self.consumed.add(r.ordinal)
        elif t is rec.Timer:
            assert isinstance(r, rec.Timer)
            self.timer_at[r.seq] = r.fire_at_ms
        elif t is rec.Wait:
            assert isinstance(r, rec.Wait)
            self.wait_deadline[r.seq] = r.deadline_ms
        elif t is rec.Child:
            assert isinstance(r, rec.Child)
            self.children[r.seq] = r
        elif t is rec.Update:
            assert isinstance(r, rec.Update)
            self.update_ids[len(self.update_ids)] = r.id
        elif t is rec.UpdateDone:
            assert isinstance(r, rec.UpdateDone)
            uid = self.update_ids.get(r.ordinal)
            if uid is not None:
                self.update_results[uid] = (r.status, r.payload)
        elif t is rec.CancelRequest:
            assert isinstance(r, rec.CancelRequest)
            self.cancel_requests += 1
            self._cancel_ask = (r.reason, r.by)
        elif t is rec.Cancel:
            self.cancels += 1
        elif t is rec.Start:
            assert isinstance(r, rec.Start)
            if r.update is not None:
                self.update_ids[0] = r.update.id

    def append(self, r: rec.Record) -> int:
        """Appends ``r`` to the log as this run's next record; returns its LSN."""
        lsn = self.rt.append(self.shard, r)
        held = footprint.RECORD_BYTES + self.rt.last_append_bytes
        self.held_bytes += held
        if self.counted:
            self.rt.loaded_bytes += held
        self.journal.append(r)
        self.lsns.append(lsn)
        self.machine.gate = lsn
        self._index(r)
        return lsn

    # --- driving the code -------------------------------------------------

    def start(self) -> None:
        """Starts (or replays) the workflow's code and delivers what is deliverable."""
        if self.machine.info.deadline_ms:
            self.rt.arm_run_deadline(self, self.machine.info.deadline_ms)
        self.task = self.loop.create_task(self._main())
        self.pump()
        # A cancel asked for before a crash and not delivered: nothing of this
        # life runs yet, so it reaches the code now.
        self.deliver_cancel_if_settled()

    # --- cancellation -------------------------------------------------------

    @property
    def cancel_pending(self) -> bool:
        """A cancellation was asked for and has not reached the code yet: no step starts."""
        return self.cancel_requests > self.cancels

    def request_cancel(self, reason: bytes, by: bytes | None) -> int:
        """Journals a cancel request; returns the LSN that acknowledges it.

        The ``Cancel`` delivery follows once the steps running now have
        settled (their outcomes journaled first), so compensation always runs
        after the effects it compensates. Async step functions are interrupted
        with asyncio cancellation; synchronous ones run to their end.
        """
        if self.cancel_pending:
            return self.cancel_request_lsn
        if self.machine.cancellation_covers_current_operations():
            return self.machine.gate  # delivered already, and nothing started since
        lsn = self.append(rec.CancelRequest(run=self.run_id, reason=reason, by=by))
        self.cancel_request_lsn = lsn
        for task in list(self.executing.values()):
            if task is not None:
                # On the loop's next turn: a task made this turn has not begun
                # yet, and cancelling it now would skip its step function's cleanup.
                self.rt.loop.call_soon(task.cancel)
        self.deliver_cancel_if_settled()
        return lsn

    def cancel_reason(self) -> bytes:
        """The reason of the latest cancel request."""
        return self._cancel_ask[0]

    def deliver_cancel_if_settled(self) -> None:
        """Hands a pending cancel to the code once no step function of the run is running."""
        if not self.cancel_pending or self.dead or self.finished or self.stuck is not None:
            return
        if self.executing and not sabotage.active.step_after_cancel:
            return
        m = self.machine
        if m.cancellation_covers_current_operations():
            self.cancels = self.cancel_requests  # nothing left that it could cancel
            return
        reason, by = self._cancel_ask
        m.request_cancel(reason, by)
        self.pump()

    async def _main(self) -> Any:
        wdef = self.wdef
        if wdef.takes_input:
            value = codec.decode(self.machine.info.input, wdef.input_type)
            return await wdef.fn(self.ctx, value)
        return await wdef.fn(self.ctx)

    def pump(self) -> None:
        """Runs the code until quiescent, handing it deliveries one at a time."""
        if self.pumping or self.dead or self.finished or self.stuck is not None:
            return
        self.pumping = True
        try:
            self._pump()
        finally:
            self.pumping = False

    def _pump(self) -> None:
        m = self.machine
        loop = self.loop
        # Only a gated step started by this pump spares its flush request (see Runtime.flush_soon):
        # one started earlier may have been flushed already, leaving this pump's records behind.
        self.rt.steps_started = False
        loop.run_until_quiescent()
        while self.stuck is None and not self.dead:
            n = m.next()
            t = type(n)
            if t is jm.Deliver:
                assert isinstance(n, jm.Deliver)
                if n.record is not None:
                    lsn = self.append(n.record)
                    self.rt.after_delivery()
                else:
                    lsn = 0
                if n.outcome.status == rec.Status.TIMED_OUT and n.seq in self.children:
                    # The parent stopped waiting: the child follows its close policy
                    # (again on replay: a crash may have come between).
                    self.rt.child_timed_out(self, self.children[n.seq], lsn)
                self._resolve(n.seq, n.outcome)
            elif t is jm.CancelAll:
                assert isinstance(n, jm.CancelAll)
                if n.record is not None:
                    self.append(n.record)
                self.cancel_requested = True
                for seq in n.seqs:
                    self._cancel_op(seq, n.reason)
            elif t is jm.UpdateTurn:
                assert isinstance(n, jm.UpdateTurn)
                self._update_turn(n)
            elif n is jm.STALLED:
                if not loop.has_ready():
                    err = m.stall_error()
                    if err is not None:
                        self._fail_determinism(err)
                break
            else:
                break
            loop.run_until_quiescent()
        self.rt.flush_soon()
        if self.stuck is not None or self.dead:
            return
        task = self.task
        if task is not None and task.done() and not self.finished:
            if self.executing:
                # Step functions (an update handler's, say) still run: their outcomes
                # are journaled before the run's end, and no new one starts meanwhile.
                self.finishing = True
                return
            self._finish(task)
        elif not self.finished:
            self.rt.after_pump(self)

    def _resolve(self, seq: int, outcome: jm.Outcome) -> None:
        op = self.ops.pop(seq, None)
        if op is None:
            return
        fut = op.fut
        if fut.done():
            return
        status = outcome.status
        kind = op.kind
        if kind == WAIT:
            self._unwait(op.name, seq)
        if status == rec.Status.CANCELLED:
            fut.set_exception(Cancelled(_reason(outcome.payload)))
            return
        try:
            if kind == STEP:
                if status == rec.Status.OK:
                    exact = codec.EXACT_DECODERS.get(op.type) if type(op.type) is type else None
                    if exact is not None:
                        try:
                            fut.set_result(exact(outcome.payload))
                            return
                        except codec.ExactDecodeError:
                            pass  # the slow path below says why, as SerializationError
                    fut.set_result(codec.decode(outcome.payload, op.type))
                else:
                    fut.set_exception(codec.decode_error(outcome.payload).step_failed(op.name))
            elif kind == AWAIT:
                if status == rec.Status.OK:
                    fut.set_result(codec.decode(outcome.payload, op.type))
                else:
                    info = codec.decode_error(outcome.payload)
                    if info.type == "CompletionFailed":
                        fut.set_exception(CompletionFailed(info.message))
                    else:
                        fut.set_exception(info.step_failed(op.name))
            elif kind == SLEEP:
                fut.set_result(None)
            elif kind == WAIT:
                if status == rec.Status.OK:
                    fut.set_result(codec.decode(outcome.payload, op.type))
                else:
                    fut.set_result(None)
            elif kind == CHILD:
                if status == rec.Status.OK:
                    fut.set_result(codec.decode(outcome.payload, op.type))
                else:
                    fut.set_exception(_workflow_error(op.name, status, outcome.payload))
            else:
                raise AssertionError(f"unknown op kind {kind}")
        except SerializationError as e:
            fut.set_exception(e)

    def _cancel_op(self, seq: int, reason: bytes) -> None:
        op = self.ops.pop(seq, None)
        self.steps.pop(seq, None)
        if op is None:
            return
        if op.kind == WAIT:
            self._unwait(op.name, seq)
        if not op.fut.done():
            op.fut.set_exception(Cancelled(_reason(reason)))

    def _unwait(self, name: str, seq: int) -> None:
        seqs = self.waiting.get(name)
        if seqs and seq in seqs:
            seqs.remove(seq)

    def _fail_determinism(self, err: FuseeError) -> None:
        if self.stuck is None:
            self.stuck = err
            self.rt.on_stuck(self, err)

    def _finish(self, task: asyncio.Task[Any]) -> None:
        m = self.machine
        now = self.rt.env.now_ms()
        try:
            if task.cancelled():
                status, payload = rec.Status.CANCELLED, b""
            else:
                exc = task.exception()
                if exc is None:
                    status = rec.Status.OK
                    try:
                        payload = codec.encode_result(self.wdef, task.result())
                    except SerializationError as e:
                        status, payload = rec.Status.FAILED, codec.encode_error(e, traceback=self.rt.tracebacks)
                elif isinstance(exc, ContinueAsNew):
                    status, payload = rec.Status.CONTINUED, exc.payload
                elif isinstance(exc, DeterminismError | NondeterministicCall | OutsideWorkflow):
                    self._fail_determinism(exc)
                    return
                elif isinstance(exc, Cancelled) and (self.cancel_requested or self.cancel_pending):
                    status, payload = rec.Status.CANCELLED, str(exc).encode()
                else:
                    status, payload = rec.Status.FAILED, codec.encode_error(exc, traceback=self.rt.tracebacks)
            done = m.finish(status, payload, now)
        except DeterminismError as e:
            self._fail_determinism(e)
            return
        self.finished = True
        lsn = self.append(done)
        self._reject_pending_updates()
        self.rt.on_run_done(self, done, lsn)

    def _reject_pending_updates(self) -> None:
        """The run ended: callers of updates it will never answer hear so now."""
        for token in self.machine.take_offered_updates():
            fut = self.update_waiters.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_exception(UpdateFailed(f"workflow '{self.workflow_id}' ended before the update ran"))
        for futs in self.update_by_ordinal.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(
                        UpdateFailed(f"workflow '{self.workflow_id}' ended before the update's handler finished")
                    )
        self.update_by_ordinal.clear()
        self.update_inflight.clear()

    def kill(self) -> None:
        """Stops the code for good (ended, parked, engine closing): nothing more is journaled.

        The code's tasks are cancelled now rather than whenever the garbage
        collector would get to them: ``finally`` blocks in workflow code run
        here, and any ctx call they make is refused. Its memory goes at once.
        """
        self.dead = True
        if self.span is not None:
            tel = self.rt.telemetry
            assert tel is not None  # only telemetry gives a run a span
            tel.run_end(self, "suspended", None)  # parked, or the engine closed
        for fut in self.update_waiters.values():
            if not fut.done():
                fut.set_exception(UpdateFailed(f"workflow '{self.workflow_id}' ended before the update ran"))
        self.update_waiters.clear()
        self._reject_pending_updates()
        if self.loop.is_running():
            self.rt.loop.call_soon(self._dispose)
        else:
            self._dispose()

    def _dispose(self) -> None:
        self.loop.close()
        self.loop.owner = None
        # Break the cycles between the run, its ctx and its operations.
        self.ops.clear()
        self.steps.clear()
        self.waiting.clear()
        self.query_handlers.clear()
        self.update_handlers.clear()
        self.task = None
        self.ctx._run = _EndedRun(self.workflow_id)


    # --- operations, called from workflow code ------------------------------

    def _check(self) -> None:
        if self.dead or self.finished:
            raise OutsideWorkflow(
                f"workflow '{self.workflow_id}' has ended; its ctx can no longer start operations"
            )
        if asyncio.events._get_running_loop() is not self.loop:
            raise OutsideWorkflow(
                "ctx methods may only be called from the workflow's own code "
                "(not from step functions, other tasks or threads)"
            )

    def _new_op(self, seq: int, kind: int, name: str, type: Any) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        self.ops[seq] = Op(fut, kind, name, type)
        return fut

    def _determinism(self, e: DeterminismError) -> DeterminismError:
        self._fail_determinism(e)
        return e

    def _check_step_args(self, what: str, name: object, fn: object, retry: object) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {what} name must be a non-empty string, got {name!r}")
        if not callable(fn):
            raise TypeError(f"{what} '{name}': fn must be callable, got {type(fn).__name__}")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"{what} '{name}': retry must be a fusee.Retry, got {type(retry).__name__}")

    def _run_live(
        self, seq: int, start: jm.StepRun, name: str, fn: Callable[..., Any], retry: Retry | None,
        timeout: Any, read_only: bool, heartbeat_timeout: Any = None, is_await: bool = False,
        described: tuple[bool, bool, Any] | None = None, limit: Any = None,
        fut: asyncio.Future[Any] | None = None, kind: int = STEP, type: Any = Any,
    ) -> None:
        """Hands a live step's (or a completion token's) function to the step runner: its one object."""
        call = StepCall(
            name,
            fn,
            retry if retry is not None else self.rt.default_retry,
            to_ms(timeout) / 1000 if timeout is not None else None,
            read_only,
            start.attempt,
            start.not_before_ms,
            self.machine.gate,
            described,
            fut,
            kind,
            type,
        )
        call.is_await = is_await
        call.limit = limit
        if heartbeat_timeout is not None:
            call.heartbeat_s = to_ms(heartbeat_timeout) / 1000
        self.steps[seq] = call
        if fut is not None:
            self.ops[seq] = call
        self.rt.run_step(self, seq, call)

    def op_step(
        self,
        name: str,
        fn: Callable[..., Any],
        retry: Retry | None,
        timeout: Any,
        read_only: bool,
        result_type: Any,
        heartbeat_timeout: Any = None,
        limit: Any = None,
    ) -> asyncio.Future[Any]:
        if self.dead or self.finished or asyncio.events._get_running_loop() is not self.loop:
            self._check()
        if type(name) is not str or not name or not callable(fn) or (retry is not None and not isinstance(retry, Retry)):
            self._check_step_args("step", name, fn, retry)
        if timeout is not None:
            to_ms(timeout)  # a bad duration fails here, before the journal moves
        try:
            seq, start = self.machine.begin_step(name)
        except DeterminismError as e:
            raise self._determinism(e) from None
        described = describe_fn(fn)
        fut = self.loop.create_future()
        tp = described[2] if result_type is None else result_type
        if start is jm.REPLAY:
            self.ops[seq] = Op(fut, STEP, name, tp)
            return fut
        assert isinstance(start, jm.StepRun)
        self._run_live(seq, start, name, fn, retry, timeout, read_only, heartbeat_timeout,
                       described=described, limit=limit, fut=fut, kind=STEP, type=tp)
        return fut

    def op_await(
        self,
        name: str,
        fn: Callable[..., Any],
        retry: Retry | None,
        timeout: Any,
        result_type: Any,
    ) -> asyncio.Future[Any]:
        self._check()
        self._check_step_args("completion", name, fn, retry)
        if timeout is not None:
            to_ms(timeout)
        try:
            seq, start = self.machine.begin_await(name)
        except DeterminismError as e:
            raise self._determinism(e) from None
        fut = self.loop.create_future()
        tp = Any if result_type is None else result_type
        if isinstance(start, jm.StepRun):
            # The token is not out yet: its function runs like a step's.
            self._run_live(seq, start, name, fn, retry, timeout, False, is_await=True, fut=fut, kind=AWAIT, type=tp)
        else:
            self.ops[seq] = Op(fut, AWAIT, name, tp)
        return fut

    def op_sleep(self, name: str, duration: Any) -> asyncio.Future[Any]:
        self._check()
        ms = to_ms(duration)
        try:
            now = self.rt.env.now_ms()
            seq, arm = self.machine.begin_sleep(name, now + ms, now)
        except DeterminismError as e:
            raise self._determinism(e) from None
        fut = self._new_op(seq, SLEEP, name, None)
        if arm is jm.REPLAY:
            return fut
        if type(arm) is jm.Append:
            assert isinstance(arm, jm.Append)
            self.append(arm.record)
        fire_at = self.timer_at.get(seq, 0)
        self.rt.arm_timer(self, seq, fire_at)
        return fut

    def op_wait(self, signal: SignalDef[Any], timeout: Any) -> asyncio.Future[Any]:
        self._check()
        if not isinstance(signal, SignalDef):
            raise TypeError(f"wait_for takes a signal made with fusee.signal(...), got {signal!r}")
        now = self.rt.env.now_ms()
        deadline = now + to_ms(timeout) if timeout is not None else 0
        try:
            seq, arm = self.machine.begin_wait(signal.name, deadline, now)
        except DeterminismError as e:
            raise self._determinism(e) from None
        fut = self._new_op(seq, WAIT, signal.name, signal.type)
        self.signal_types[signal.name] = signal.type
        if arm is jm.REPLAY:
            return fut
        if type(arm) is jm.Append:
            assert isinstance(arm, jm.Append)
            self.append(arm.record)
        fut.add_done_callback(functools.partial(self._wait_dropped, seq))
        self.waiting.setdefault(signal.name, []).append(seq)
        self._match_signals(signal.name)
        deadline = self.wait_deadline.get(seq, 0)
        if deadline and self.machine.is_live_pending(seq):
            self.rt.arm_deadline(self, seq, deadline)
        return fut

    def _wait_dropped(self, seq: int, fut: asyncio.Future[Any]) -> None:
        """The code cancelled a wait (a race it lost): record that it was abandoned."""
        if not fut.cancelled() or self.dead or self.finished:
            return
        op = self.ops.pop(seq, None)
        if op is not None:
            self._unwait(op.name, seq)
        r = self.machine.forget(seq)
        if r is not None:
            self.append(r)

    def _match_signals(self, name: str) -> None:
        """Hands buffered signals of ``name`` to the live waits for it, oldest first.

        A signal goes to the oldest wait whose type decodes it. One that a wait cannot
        decode (journaled by an older version, or sent by a workflow that declared
        another type) is passed over: logged, counted, left in the journal untaken,
        and the wait keeps waiting. The choice depends only on the journal and the
        code's waits, and takes nothing from the signal, so a replay makes it again.
        """
        seqs = self.waiting.get(name)
        if not seqs:
            return
        for ordinal, (sname, payload) in enumerate(self.signals):
            if not seqs:
                break
            if sname != name or ordinal in self.consumed:
                continue
            for i, seq in enumerate(seqs):
                if self._decodes(seq, ordinal, payload):
                    del seqs[i]
                    self.consumed.add(ordinal)
                    self.machine.complete(seq, jm.SignalTaken(ordinal, payload))
                    break

    def _decodes(self, seq: int, ordinal: int, payload: bytes) -> bool:
        """Wait ``seq``'s type decodes signal ``ordinal``; reports it (once) when not."""
        op = self.ops.get(seq)
        if op is None or codec.is_undeclared(op.type) or sabotage.active.undecodable_signal_taken:
            return True
        if (seq, ordinal) in self.passed_over:
            return False
        try:
            codec.decode(payload, op.type)
        except SerializationError as e:
            self.passed_over.add((seq, ordinal))
            self.rt.signal_passed_over(self, seq, ordinal, op.name, e)
            return False
        return True

    def offer_signal(self, name: str, payload: bytes, dedup: int, by: bytes | None) -> int | None:
        """A signal arrived: journal it and hand it to a waiting operation. None if a duplicate."""
        if dedup and dedup in self.dedup:
            return None
        lsn = self.append(rec.Signal(run=self.run_id, name=name, dedup=dedup, payload=payload, by=by))
        self._match_signals(name)
        self.pump()
        return lsn

    def op_child(
        self,
        workflow: WorkflowDef[Any, Any],
        workflow_id: str,
        input: Any,
        close_policy: str,
        timeout: Any,
        detached: bool,
    ) -> asyncio.Future[Any]:
        self._check()
        if not isinstance(workflow, WorkflowDef):
            raise TypeError(f"child workflow must be a @fusee.workflow, got {workflow!r}")
        if not isinstance(workflow_id, str) or not workflow_id:
            raise TypeError(f"a workflow id must be a non-empty string, got {workflow_id!r}")
        try:
            workflow_id.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidWorkflowId(
                f"child workflow id {workflow_id!r} is not valid Unicode text (a lone surrogate)"
            ) from None
        policy = _CLOSE_POLICIES.get(close_policy)
        if policy is None:
            raise ValueError(
                f"close_policy must be one of {sorted(_CLOSE_POLICIES)}, got {close_policy!r}"
            )
        self.rt.check_registered(workflow)
        payload = codec.encode_input(workflow, input)
        flags = int(policy) | (rec.DETACHED if detached else 0)
        deadline = self.rt.env.now_ms() + to_ms(timeout) if timeout is not None else 0
        try:
            seq, arm = self.machine.begin_child(workflow.name, workflow_id, flags, deadline, payload)
        except DeterminismError as e:
            raise self._determinism(e) from None
        if type(arm) is jm.Append:
            assert isinstance(arm, jm.Append)
            self.append(arm.record)
        if arm is not jm.REPLAY or detached:
            child = self.children.get(seq)
            if child is not None:
                self.rt.ensure_child(self, child)
                if child.deadline_ms and not detached and self.machine.is_live_pending(seq):
                    self.rt.arm_child_deadline(self, seq, child.deadline_ms)
        if detached:
            fut = self.loop.create_future()
            fut.set_result(ChildHandle(workflow_id))
            return fut
        return self._new_op(seq, CHILD, workflow_id, workflow.result_type)

    def op_send(self, target: str, signal: SignalDef[Any], value: Any) -> asyncio.Future[Any]:
        self._check()
        if not isinstance(signal, SignalDef):
            raise TypeError(f"signal_workflow takes a signal made with fusee.signal(...), got {signal!r}")
        payload = codec.encode_signal(signal, value)
        try:
            seq, r = self.machine.send(target, signal.name, payload)
        except DeterminismError as e:
            raise self._determinism(e) from None
        lsn = self.append(r) if r is not None else self.machine.gate
        self.rt.send_signal(self, seq, target, signal.name, payload, lsn)
        fut = self.loop.create_future()
        fut.set_result(None)
        return fut

    def _value(self, kind: rec.ValueKind, make: Callable[[], bytes]) -> bytes:
        self._check()
        try:
            _, value, r = self.machine.value(kind, make)
        except DeterminismError as e:
            raise self._determinism(e) from None
        if r is not None:
            self.append(r)
        return value

    def op_stream(self, name: str) -> Any:
        self._check()
        from fusee.runtime.streams import WorkflowStream

        return WorkflowStream(self, name)

    def op_now(self) -> datetime.datetime:
        self._check()
        try:
            ms, r = self.machine.now(self.rt.env.now_ms())
        except DeterminismError as e:
            raise self._determinism(e) from None
        if r is not None:
            self.append(r)
        return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)

    def op_random(self) -> float:
        rng = self.rt.env.rng
        v = self._value(rec.ValueKind.RANDOM, lambda: rng.getrandbits(64).to_bytes(8, "little"))
        return (int.from_bytes(v, "little") >> 11) * (1.0 / (1 << 53))

    def op_uuid(self) -> uuid.UUID:
        rng = self.rt.env.rng
        v = self._value(rec.ValueKind.UUID, lambda: rng.getrandbits(128).to_bytes(16, "little"))
        return uuid.UUID(bytes=bytes(v), version=4)

    def op_patched(self, patch_id: str) -> bool:
        self._check()
        on, r = self.machine.patched(patch_id)
        if r is not None:
            self.append(r)
        return on

    def op_attributes(self, attributes: dict[str, Any]) -> None:
        self._check()
        if not isinstance(attributes, dict):
            raise TypeError("set_attributes takes a dict of JSON values")
        try:
            _, r = self.machine.set_attributes(codec.encode(attributes))
        except DeterminismError as e:
            raise self._determinism(e) from None
        if r is not None:
            self.append(r)

    def op_continue_as_new(self, input: Any) -> Awaitable[None]:
        self._check()
        payload = codec.encode_input(self.wdef, input)
        if not self.deliveries:
            raise ContinueAsNew(payload)
        return self._continue_after(input)

    async def _continue_after(self, input: Any) -> None:
        # The ended run's journal is not read again after a crash, so what it sent must have
        # arrived (durably) before its end is written, or a crash would lose it.
        while self.deliveries:  # a handler may send more while it waits
            await self.deliveries_settled()
        self._check()
        # Encoded again now: handlers that ran meanwhile may have changed it (an update
        # accepted into the state the next run takes over must not be dropped).
        raise ContinueAsNew(codec.encode_input(self.wdef, input))

    async def deliveries_settled(self) -> None:
        """Returns once every child start and signal this run sent so far is durable where it went."""
        if not self.deliveries:
            return
        pending = [f for f in self.deliveries if not f.done()]
        if pending:
            await self._all_done(pending)
        # Delivered: what they journaled lies below each shard's end; durable once that is.
        self.deliveries = []
        await self._all_done([self.rt.spawn(self.rt.appended_durable())])

    def _all_done(self, pending: list[asyncio.Future[None]]) -> asyncio.Future[None]:
        """A future of the code's own loop, done (and the code pumped) once the engine's
        futures ``pending`` all are: the code cannot await the engine's loop directly."""
        fut: asyncio.Future[None] = self.loop.create_future()
        left = [len(pending)]

        def one_done(_: object) -> None:
            left[0] -= 1
            if left[0] == 0 and not fut.done() and not self.dead:
                fut.set_result(None)
                self.pump()

        for f in pending:
            f.add_done_callback(one_done)
        return fut

    def add_delivery(self, fut: asyncio.Future[None]) -> None:
        """Keeps a child start or signal this run sent until it is durable where it went."""
        ds = self.deliveries
        if len(ds) >= 64:
            ds[:] = [f for f in ds if not f.done()]
        ds.append(fut)

    # --- queries and updates -------------------------------------------------

    def set_query_handler(self, query: QueryDef[Any], handler: Callable[..., Any]) -> None:
        if not isinstance(query, QueryDef):
            raise TypeError(f"on_query takes a query made with fusee.query(...), got {query!r}")
        if not callable(handler):
            raise TypeError("a query handler must be callable")
        self.query_handlers[query.name] = handler

    def set_update_handler(
        self, update: UpdateDef[Any], handler: Callable[..., Any], validator: Callable[..., Any] | None
    ) -> None:
        if not isinstance(update, UpdateDef):
            raise TypeError(f"on_update takes an update made with fusee.update(...), got {update!r}")
        if not callable(handler) or (validator is not None and not callable(validator)):
            raise TypeError("update handlers and validators must be callable")
        self.update_handlers[update.name] = (update, handler, validator)

    def attach_update(self, update_id: str, fut: asyncio.Future[Any]) -> bool:
        """Makes ``fut`` a waiter of an update the journal accepted already; False if it did not."""
        for ordinal, uid in self.update_ids.items():
            if uid == update_id:
                self.update_by_ordinal.setdefault(ordinal, []).append(fut)
                self.update_inflight[update_id] = fut
                return True
        return False

    def offer_update(self, name: str, update_id: str, payload: bytes, fut: asyncio.Future[Any]) -> None:
        token = self.rt.next_token()
        self.update_waiters[token] = fut
        self.update_inflight[update_id] = fut
        self.machine.offer_update(token, name, update_id, payload)
        self.pump()

    def _update_turn(self, n: jm.UpdateTurn) -> None:
        entry = self.update_handlers.get(n.name)
        if n.live is not None:
            fut = self.update_waiters.pop(n.live, None)
            if entry is None:
                self.update_inflight.pop(n.id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(
                        UpdateFailed(
                            f"workflow '{self.workflow_id}' has no handler for update '{n.name}' "
                            "(register it with ctx.on_update before the update arrives)"
                        )
                    )
                return
            udef, handler, validator = entry
            try:
                arg = codec.decode(n.payload, udef.arg_type)
                if validator is not None:
                    validator(arg)
            except Exception as e:
                self.update_inflight.pop(n.id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(e)
                return
            ordinal, r = self.machine.accept_update(n.name, n.id, n.payload)
            self.append(r)
            if fut is not None:
                self.update_by_ordinal.setdefault(ordinal, []).append(fut)
        else:
            if entry is None:
                self._fail_determinism(
                    DeterminismError(
                        f"the journal delivers update '{n.name}' but the code registered no handler for it"
                    )
                )
                return
            udef, handler, _ = entry
            ordinal = n.ordinal
            try:
                arg = codec.decode(n.payload, udef.arg_type)
            except SerializationError as e:
                self._fail_determinism(e)
                return
        self.update_ids[ordinal] = n.id
        self.loop.create_task(self._run_update(ordinal, n.id, handler, arg, udef))

    async def _run_update(
        self, ordinal: int, update_id: str, handler: Callable[..., Any], arg: Any, udef: UpdateDef[Any]
    ) -> None:
        try:
            result = handler(arg)
            if inspect.isawaitable(result):
                result = await result
            status, payload = rec.Status.OK, codec.encode_update_result(udef, result)
        except (ContinueAsNew, DeterminismError, NondeterministicCall):
            raise
        except Exception as e:
            status, payload = rec.Status.FAILED, codec.encode_error(e, traceback=self.rt.tracebacks)
        try:
            _, r = self.machine.update_done(ordinal, status, payload)
        except DeterminismError as e:
            self._fail_determinism(e)
            return
        lsn = self.append(r) if r is not None else self.machine.gate
        self.update_results[update_id] = (status, payload)
        self.update_inflight.pop(update_id, None)
        waiters = self.update_by_ordinal.pop(ordinal, [])
        if waiters:
            self.rt.release_update(self.shard, lsn, waiters, status, payload)

    def answer_query(self, query: QueryDef[Any], arg: Any) -> Any:
        handler = self.query_handlers.get(query.name)
        if handler is None:
            raise QueryFailed(
                f"workflow '{self.workflow_id}' has no handler for query '{query.name}' "
                f"(handlers: {sorted(self.query_handlers) or 'none'})"
            )
        value = handler(arg) if takes_argument(handler) else handler()
        # A copy through JSON, so later changes of the state do not show through.
        return codec.query_answer(query, value)


def _reason(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return repr(payload)


def _workflow_error(wid: str, status: rec.Status, payload: bytes) -> FuseeError:
    from fusee.runtime.outcomes import workflow_error

    return workflow_error(wid, status, payload)


class _EndedRun:
    """What a ctx points to once its run's code is gone: every use is refused clearly."""

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id

    def __getattr__(self, name: str) -> Any:
        raise OutsideWorkflow(
            f"workflow '{self.workflow_id}' has ended (or left memory); its ctx can no longer be used"
        )
