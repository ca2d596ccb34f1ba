"""The runtime: every workflow of an engine directory, their runs, and what connects them.

It routes signals, children and messages between runs, runs step functions
once their gates are durable, arms timers, and decides when results and
acknowledgements may be released (only from durable state). Everything outside
the process (the log, the clock, threads, randomness) comes from the Env and the
group committer it was given.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec

from fusee import codec, sabotage
from fusee.core import journal as jm
from fusee.core import records as rec
from fusee.declarations import WorkflowDef
from fusee.encryption import Codec
from fusee.errors import (
    AlreadyExists,
    CodecError,
    DeterminismError,
    EngineClosed,
    FuseeError,
    NotFound,
    StorageError,
    UnknownWorkflow,
    UpdateFailed,
    WorkflowEnded,
)
from fusee.limits import Limiter
from fusee.retry import Retry
from fusee.runtime import budget, history, index, parking, recovery
from fusee.runtime import reset as reset_journal
from fusee.runtime.env import Env
from fusee.runtime.index import AttributeIndex
from fusee.runtime.outcomes import workflow_error
from fusee.runtime.run import Run, StepCall
from fusee.runtime.sealing import Sealer
from fusee.runtime.snapshot import first_record, unpack
from fusee.runtime.steps import StepRunner
from fusee.runtime.table import WorkflowState, dedup_key, shard_of
from fusee.runtime.telemetry import TelemetryHooks, log_fields
from fusee.runtime.timers import (
    CHILD_DEADLINE,
    DEADLINE,
    EXPIRE,
    FIRE,
    PARK,
    RUN_DEADLINE,
    WAKE,
    TimerQueue,
)
from fusee.runtime.verify import check_parked, code_fingerprint

log = logging.getLogger("fusee")

RUNNING, FINISHED = "running", "finished"

#: Runs recovery loads and replays per batch at open (``Engine.open(recovery_batch=...)``).
DEFAULT_LOAD_ROOM = 1000

IF_RUNNING = ("fail", "attach", "terminate")
IF_FINISHED = ("fail", "attach", "start")


#: The messages one runtime sends another run (each a method of :class:`Runtime` that the
#: receiver applies), with the types of their arguments: what a part encodes to send to another.
MAIL_TYPES: dict[str, Any] = {
    "_start_child": tuple[rec.ParentRef, rec.Child],
    "_child_finished": tuple[rec.ParentRef, rec.Status | None, bytes],
    "_signal_quiet": tuple[str, str, bytes, int],
    "_close_child": tuple[rec.ParentRef, rec.Child],
    "_parent_closed": tuple[str, int, rec.Child],
    "_cancel_quiet": tuple[str, str],
    "_terminate_quiet": tuple[str, str],
}


def mail_target(kind: str, args: tuple[Any, ...]) -> str:
    """The workflow ID a message is for."""
    if kind in ("_start_child", "_close_child"):
        return args[1].id  # type: ignore[no-any-return]
    if kind == "_child_finished":
        return args[0].id  # type: ignore[no-any-return]
    if kind == "_parent_closed":
        return args[2].id  # type: ignore[no-any-return]
    return args[0]  # type: ignore[no-any-return]


class Mail(Protocol):
    """Carries messages to runs this runtime does not hold (they live on other parts)."""

    def elsewhere(self, workflow_id: str) -> bool:
        """Whether ``workflow_id`` lives on another part."""
        ...

    async def send(self, kind: str, args: tuple[Any, ...]) -> bool:
        """Delivers the message; returns True once its receiver made what it journaled durable
        (sent again until then, for as long as this runtime is open), False if it gave up
        (this runtime closed, or the receiver refused this part's holder as fenced)."""
        ...

    def fenced(self, part: int, epoch: int) -> bool:
        """Whether a sender holding part ``part`` under ``epoch`` has been replaced since."""
        ...


class Runtime:
    """All workflows of one engine, driven on one asyncio loop."""

    def __init__(
        self,
        env: Env,
        committer: Any,
        shards: int,
        workflows: dict[str, WorkflowDef[Any, Any]] | list[WorkflowDef[Any, Any]],
        default_retry: Retry,
        *,
        park_after: float | None = 60.0,
        max_loaded: int | None = None,
        memory_budget: int | None = None,
        retention: float | None = None,
        checkpoint_every: int = 200_000,
        codec: Codec | None = None,
    ) -> None:
        self.env = env
        #: Records to and from their bytes at rest, through the payload codec if any.
        self.sealer = Sealer(codec)
        self._encode = self.sealer.encode
        #: Journal a failure's traceback with it (a simulation leaves them out:
        #: they hold file paths, which differ from one checkout to another).
        self.tracebacks: bool = getattr(env, "record_tracebacks", True)
        self.checkpoint_every = checkpoint_every
        self._since_checkpoint = 0
        self._checkpoint_scheduled = False
        self.park_after_ms = None if park_after is None else int(park_after * 1000)
        self.max_loaded = max_loaded
        #: Bytes the loaded runs may hold before suspended ones park (``fusee.runtime.budget``).
        self.memory_budget = memory_budget
        #: What the loaded runs are counted as holding, and the encoded size of the latest append.
        self.loaded_bytes = 0
        self.last_append_bytes = 0
        #: Suspended loaded runs, longest quiet first, while a budget is set (the sweep's candidates).
        self.quiet: dict[Run, None] = {}
        self.sweep_scheduled = False
        #: Unfinished runs recovery has still to load, and how many it loads per batch (``recovery.py``).
        self.load_queue: collections.deque[WorkflowState] = collections.deque()
        self.to_load: dict[str, int] = {}
        self.load_room = DEFAULT_LOAD_ROOM
        self.retention_ms = None if retention is None else int(retention * 1000)
        self.loaded_runs = 0
        self.committer = committer
        self.log = committer.log
        self._flush_scheduled = False
        self.steps_started = False
        self._outbox_at_open: set[str] = set()
        self.steps = StepRunner(self)
        self.shards = shards
        defs = list(workflows.values()) if isinstance(workflows, dict) else list(workflows)
        #: Every registered (name, version), and the newest version of each name (what new starts take).
        self.versions: dict[tuple[str, int], WorkflowDef[Any, Any]] = {(w.name, w.version): w for w in defs}
        self.workflows: dict[str, WorkflowDef[Any, Any]] = {}
        for w in sorted(defs, key=lambda d: d.version):
            self.workflows[w.name] = w
        self.default_retry: Retry = default_retry
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.timers = TimerQueue(self.loop, env.now_ms, self._timer_event)
        #: Permits of limited steps (fusee.limits); the engine declares the limits.
        self.limiter = Limiter(self.loop, lambda: env.now_ms() / 1000)
        self._push = self.timers.push
        self.wf: dict[str, WorkflowState] = {}
        self.by_run: dict[int, WorkflowState] = {}
        self.stuck: dict[str, str] = {}
        self.stuck_errors: dict[str, FuseeError] = {}
        self._token = 0
        self._codes: dict[tuple[str, int], int] = {}
        #: Called once at the first append after a checkpoint (a periodic checkpoint that
        #: found nothing to do sleeps until then, so an idle engine has no ticking timer).
        self.on_first_append: Callable[[], None] | None = None
        #: The latest query answer of each workflow not yet released: answers leave in order.
        self.query_order: dict[str, asyncio.Future[None]] = {}
        #: Stream readers waiting for the next flush.
        self.stream_readers: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        #: Closing: running step functions finish, no new one starts.
        self.closing = False
        #: Latest search attributes per workflow (see ``fusee.runtime.index``).
        self.index = AttributeIndex()
        #: False: runs that end keep only their start, ending and outbox (see ``fusee.runtime.history``).
        self.keep_history = True
        self.stats = {"steps": 0, "replays": 0, "runs_started": 0, "parked": 0, "woken": 0, "checkpoints": 0,
                      "signals_dropped": 0, "budget_parks": 0, "recovery_batches": 0}
        #: Where messages for runs on other parts go (``fusee.scale.parts``); None: every run is here.
        self.mail: Mail | None = None
        #: Spans and metrics (``fusee.runtime.telemetry``); None: off, and each hook costs one test.
        self.telemetry: TelemetryHooks | None = None

    def use_telemetry(self, hooks: TelemetryHooks | None) -> None:
        """Reports runs, steps and flushes to ``hooks`` from now on (before recovery: recovered runs too)."""
        self.telemetry = self.steps.telemetry = hooks
        self.committer.on_flush = hooks.flushed if hooks is not None else None

    # --- log ------------------------------------------------------------

    def append(self, shard: int, r: rec.Record) -> int:
        self._since_checkpoint += 1
        if self._since_checkpoint == 1 and self.on_first_append is not None:
            wake, self.on_first_append = self.on_first_append, None
            wake()
        if self._since_checkpoint >= self.checkpoint_every and not self._checkpoint_scheduled:
            self._checkpoint_scheduled = True
            self.loop.call_soon(self.checkpoint)
        if type(r) is rec.Attributes or type(r) is rec.Start:
            index.on_append(self, r)
        data = self._encode(r)
        self.last_append_bytes = len(data)
        return self.committer.append(shard, data)  # type: ignore[no-any-return]

    def appended_since_checkpoint(self) -> bool:
        """Whether records were appended since the last checkpoint (else one would change nothing)."""
        return self._since_checkpoint > 0

    def checkpoint(self) -> None:
        """Writes a checkpoint of every workflow: recovery then reads only the log after it."""
        self._checkpoint_scheduled = False
        if self.closed or self.log.failed is not None:
            return
        self._since_checkpoint = 0
        try:
            self.committer.checkpoint(self.checkpoint_state())
        except FuseeError as e:
            # The log failed: every waiter hears of it; the next open recovers.
            log.error("a checkpoint failed: %s", e)
        else:
            self.stats["checkpoints"] += 1
        # The checkpoint flushed what was pending: steps gated on it may start.
        self.on_durable(self.log.durable_lsns())

    def durable(self, shard: int) -> int:
        return self.log.durable(shard)  # type: ignore[no-any-return]

    async def wait_durable(self, shard: int, lsn: int) -> None:
        """Returns once the shard's log is durable through ``lsn``."""
        if lsn <= self.log.durable(shard):
            return
        await self.committer.wait_durable(shard, lsn)

    def after_delivery(self) -> None:
        """A delivery was journaled and the run's code goes on (pipeline mode writes meanwhile)."""
        self.committer.after_delivery()

    def flush_soon(self) -> None:
        """Gets what was appended on disk even if nobody waits for it (a timer, a delivery).

        Not needed when a step with effects was started meanwhile: it waits
        for its gate, which flushes.
        """
        if self.steps_started:
            self.steps_started = False
            return
        if not self._flush_scheduled and self.log.has_pending():
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        if not self.closed and self.log.failed is None:
            self.committer.request_flush()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """A background task of the engine, kept referenced until it ends."""
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        if t.cancelled():
            return
        exc = t.exception()
        # A failed log ends background work: the failure reaches callers on their own paths.
        if exc is not None and not isinstance(exc, StorageError):
            log.error("an engine task failed: %s: %s", type(exc).__name__, exc, exc_info=exc)

    def next_token(self) -> int:
        self._token += 1
        return self._token

    def new_run_id(self) -> int:
        while True:
            rid = self.env.rng.getrandbits(62) + 1
            if rid not in self.by_run:
                return rid

    def definition(self, wtype: str, version: int) -> WorkflowDef[Any, Any] | None:
        """The registered code of version ``version`` of workflow ``wtype``."""
        return self.versions.get((wtype, version))

    def unregistered(self, wtype: str, version: int) -> UnknownWorkflow:
        """Why a run of ``wtype`` version ``version`` cannot go on here."""
        have = sorted(v for (name, v) in self.versions if name == wtype)
        if have:
            return UnknownWorkflow(
                f"workflow '{wtype}' version {version} is not registered (this engine has version"
                f"{'s' if len(have) > 1 else ''} {', '.join(map(str, have))}): reopen the engine with "
                f"version {version} in workflows=[...] to continue this run"
            )
        return UnknownWorkflow(
            f"workflow type '{wtype}' is not registered: reopen the engine with it "
            "in workflows=[...] to continue this run"
        )

    def code_of(self, wtype: str, version: int) -> int:
        """The fingerprint of the registered code of ``wtype`` ``version`` (0 if not registered)."""
        code = self._codes.get((wtype, version))
        if code is None:
            wdef = self.definition(wtype, version)
            code = self._codes[(wtype, version)] = code_fingerprint(wdef) if wdef is not None else 0
        return code

    def check_parked_code(self) -> None:
        """Checks, in the background, the parked runs whose workflow code changed since they parked."""
        stale = []
        for st in self.wf.values():
            if st.packed is None or st.status is not None or st.id in self.stuck:
                continue
            if (st.wtype, st.version) not in self.versions:
                # Its code is not here at all: it waits, and says why, until an engine that has it opens.
                self.mark_stuck(st.id, self.unregistered(st.wtype, st.version))
            elif st.code != self.code_of(st.wtype, st.version):
                stale.append(st)
        if stale:
            log.info("checking %d parked runs whose workflow code changed", len(stale))
            self.spawn(check_parked(self, stale))

    def check_registered(self, wdef: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]:
        name = wdef if isinstance(wdef, str) else getattr(wdef, "name", None)
        found = self.workflows.get(name) if isinstance(name, str) else None
        if found is None:
            raise UnknownWorkflow(
                f"no workflow named {name!r} is registered with this engine "
                f"(registered: {', '.join(sorted(n for n in self.workflows if not n.startswith('fusee:'))) or 'none'}); "
                "pass it in Engine.open(..., workflows=[...])"
            )
        return found

    # --- recovery --------------------------------------------------------

    def _load_run(self, st: WorkflowState) -> None:
        start = st.journal[0] if st.journal else None
        if isinstance(start, rec.Start):
            st.version = start.version
        wdef = self.definition(st.wtype, st.version)
        if wdef is None:
            # The run waits, stuck, until an engine with its version opens.
            self.mark_stuck(st.id, self.unregistered(st.wtype, st.version))
            return
        try:
            machine = jm.RunMachine.from_journal(st.journal, st.lsns[-1])
        except DeterminismError as e:
            self.mark_stuck(st.id, e)
            return
        run = Run(self, st.shard, wdef, machine, st.journal, st.lsns)
        st.run = run
        st.code = self.code_of(st.wtype, st.version)
        budget.counted_in(self, run)
        if len(st.journal) > 1:
            self.stats["replays"] += 1
        if self.telemetry is not None:
            run.span = self.telemetry.run_begin(run, len(st.journal) - 1)
        run.start()

    # --- starting workflows ------------------------------------------------

    def start_workflow(
        self,
        wdef: WorkflowDef[Any, Any],
        wid: str,
        payload: bytes,
        *,
        parent: rec.ParentRef | None = None,
        policy: int = 0,
        if_running: str = "fail",
        if_finished: str = "fail",
        deadline_ms: int = 0,
        update: rec.UpdateWithStart | None = None,
        trace: bytes | None = None,
    ) -> tuple[WorkflowState, int, bool]:
        """Starts ``wid`` (or attaches to it, per the policies).

        ``trace`` is the caller's trace context, journaled in the Start record
        (see ``fusee.runtime.telemetry``). Returns the state, the LSN to await
        before acknowledging, and whether a new run was started.
        """
        st = self.wf.get(wid)
        if st is not None:
            if st.running:
                if if_running == "attach":
                    return st, self._ack_lsn(st), False
                if if_running == "terminate":
                    self.terminate(wid, "replaced by a new start", None)
                else:
                    raise AlreadyExists(
                        f"workflow '{wid}' is already running (run {st.run_id}); pass "
                        "if_running='attach' to get its handle or 'terminate' to replace it"
                    )
            elif if_finished == "attach":
                return st, self._ack_lsn(st), False
            elif if_finished != "start":
                raise AlreadyExists(
                    f"workflow '{wid}' already ran (it ended {st.status.name.lower() if st.status is not None else ''}); "
                    "pass if_finished='attach' to get its result or 'start' to run it again"
                )
        else:
            st = self.wf[wid] = WorkflowState(wid, shard_of(wid, self.shards))
        st.parent = parent
        lsn = self._new_run(st, wdef, payload, policy, deadline_ms, update, trace)
        return st, lsn, True

    def _ack_lsn(self, st: WorkflowState) -> int:
        return st.lsns[-1] if st.lsns else 0

    def _new_run(
        self,
        st: WorkflowState,
        wdef: WorkflowDef[Any, Any],
        payload: bytes,
        policy: int,
        deadline_ms: int = 0,
        update: rec.UpdateWithStart | None = None,
        trace: bytes | None = None,
    ) -> int:
        rid = self.new_run_id()
        start = rec.Start(
            run=rid,
            id=st.id,
            wtype=wdef.name,
            version=wdef.version,
            codec=0,
            started_ms=self.env.now_ms(),
            deadline_ms=deadline_ms,
            parent=st.parent,
            policy=policy,
            update=update,
            input=payload,
            trace=trace,
        )
        if st.run_id:
            self.by_run.pop(st.run_id, None)
        st.wtype = wdef.name
        st.run_id = rid
        st.status = None
        st.payload = b""
        st.final = False
        st.journal = []
        st.lsns = []
        self.by_run[rid] = st
        lsn = self.append(st.shard, start)
        st.journal.append(start)
        st.lsns.append(lsn)
        machine = jm.RunMachine.fresh(start, lsn)
        run = Run(self, st.shard, wdef, machine, st.journal, st.lsns)
        st.run = run
        st.packed = None
        st.version = wdef.version
        st.code = self.code_of(wdef.name, wdef.version)
        budget.counted_in(self, run)
        self.stats["runs_started"] += 1
        if self.telemetry is not None:
            run.span = self.telemetry.run_begin(run, 0)
        run.start()
        return lsn

    def _continue(self, st: WorkflowState) -> None:
        """Starts the next run of a chain whose run ended with continue-as-new."""
        wdef = self.workflows.get(st.wtype)
        if wdef is None:
            self.mark_stuck(st.id, UnknownWorkflow(
                f"workflow type '{st.wtype}' is not registered: reopen the engine with it "
                "in workflows=[...] to continue this run"
            ))
            return
        journal, _ = self.journal_of(st)
        start = journal[0]
        policy = start.policy if isinstance(start, rec.Start) else 0
        # A chain's timeout spans its runs, and so does its trace.
        deadline = start.deadline_ms if isinstance(start, rec.Start) else 0
        trace = start.trace if isinstance(start, rec.Start) else None
        self._new_run(st, wdef, st.payload, policy, deadline, trace=trace)

    # --- run endings -----------------------------------------------------------

    def on_run_done(self, run: Run, done: rec.Done, lsn: int) -> None:
        st = self.by_run.get(run.run_id)
        if st is None:
            return
        st.run = None
        st.status = done.status
        st.payload = done.payload
        st.done_lsn = lsn
        budget.counted_out(self, run)
        self._report_end(st, done.status, done.payload, run)
        run.kill()
        if done.status == rec.Status.CONTINUED:
            self._continue(st)
            return
        self.spawn(self._after_done(st, run.run_id, lsn))

    def _report_end(self, st: WorkflowState, status: rec.Status, payload: bytes, run: Run | None) -> None:
        """Logs how a run ended (a failure at WARNING) and reports it to telemetry."""
        tel = self.telemetry
        if tel is None and (status == rec.Status.OK or status == rec.Status.CONTINUED):
            return  # the common case: nothing to say
        name = status.name.lower()
        error = None
        if status == rec.Status.FAILED:
            info = codec.decode_error(payload)
            error = info.type
            log.warning("workflow %r: run %d failed: %s: %s", st.id, st.run_id, info.type, info.message,
                        extra=log_fields(st.id, st.wtype, st.run_id))
        elif status != rec.Status.OK and status != rec.Status.CONTINUED:
            log.info("workflow %r: run %d ended %s", st.id, st.run_id, name,
                     extra=log_fields(st.id, st.wtype, st.run_id))
        if tel is not None:
            tel.run_ended(name)
            if run is not None and run.span is not None:
                tel.run_end(run, name, error)

    async def _after_done(self, st: WorkflowState, run_id: int, lsn: int) -> None:
        await self.wait_durable(st.shard, lsn)
        if st.run_id != run_id:
            return
        st.final = True
        for fut in st.waiters or ():
            if not fut.done():
                fut.set_result(None)
        st.waiters = None
        if st.parent is not None:
            start = self.journal_of(st)[0][0]
            if not (isinstance(start, rec.Start) and start.policy & rec.DETACHED):
                self.report_to_parent(st)
        self._apply_close_policy(st)
        if not self.keep_history:
            history.trim(self, st)
        if st.packed is None and st.run is None:
            parking.pack_state(self, st)
        if self.retention_ms is not None:
            self._push(self.env.now_ms() + self.retention_ms, EXPIRE, st.id, st.run_id)

    def _apply_close_policy(self, st: WorkflowState) -> None:
        """The parent ended: its children still running follow their close policy."""
        journal, _ = self.journal_of(st)
        # Children whose end the parent journaled need no policy (a timed-out wait does: the
        # child may still run); asking another part about them could restart one retention removed.
        ended = {r.seq for r in journal if isinstance(r, rec.ChildDone) and r.status != rec.Status.TIMED_OUT}
        for r in journal:
            if type(r) is not rec.Child:
                continue
            assert isinstance(r, rec.Child)
            if self.mail is not None and self.mail.elsewhere(r.id):
                if r.seq not in ended and r.flags & rec.CLOSE_POLICY_MASK in (
                        rec.ClosePolicy.TERMINATE, rec.ClosePolicy.REQUEST_CANCEL):
                    self._send(self._parent_closed, st.id, st.run_id, r)
                continue
            child = self.wf.get(r.id)
            if child is None or not child.running or child.parent is None:
                continue
            if child.parent.id != st.id or child.parent.run != st.run_id:
                continue
            policy = r.flags & rec.CLOSE_POLICY_MASK
            if policy == rec.ClosePolicy.TERMINATE:
                self._send(self._terminate_quiet, child.id, f"parent '{st.id}' closed")
            elif policy == rec.ClosePolicy.REQUEST_CANCEL:
                self._send(self._cancel_quiet, child.id, f"parent '{st.id}' closed")

    def _parent_closed(self, parent_id: str, parent_run: int, r: rec.Child) -> None:
        """A parent on another part ended: its child here follows the close policy ``r`` names.

        The child's start may still be on its way (mail is reordered): it starts now, as a
        start that reaches a part after its parent ended does, and follows the policy at once.
        """
        child = self.wf.get(r.id)
        if child is None:
            self._start_child(rec.ParentRef(id=parent_id, run=parent_run, seq=r.seq), r)
            child = self.wf.get(r.id)
        if child is None or not child.running or child.parent is None:
            return
        if child.parent.id != parent_id or child.parent.run != parent_run:
            return
        policy = r.flags & rec.CLOSE_POLICY_MASK
        if policy == rec.ClosePolicy.TERMINATE:
            self._terminate_quiet(child.id, f"parent '{parent_id}' closed")
        elif policy == rec.ClosePolicy.REQUEST_CANCEL:
            self._cancel_quiet(child.id, f"parent '{parent_id}' closed")

    def _terminate_quiet(self, wid: str, reason: str) -> None:
        st = self.wf.get(wid)
        if st is not None and st.running and not self.closed:
            self.terminate(wid, reason, None)

    def _cancel_quiet(self, wid: str, reason: str) -> None:
        st = self.wf.get(wid)
        if st is not None and st.status is None and wid not in self.stuck and not self.closed:
            self.cancel(wid, reason, None)

    def on_stuck(self, run: Run, err: FuseeError) -> None:
        if run.span is not None and self.telemetry is not None:
            self.telemetry.run_end(run, "stuck", type(err).__name__)
        self.mark_stuck(run.workflow_id, err)

    def mark_stuck(self, wid: str, err: FuseeError) -> None:
        """The run cannot go on with this code: say so, and fail its waiters at once.

        Reopening the engine with fixed code (or the missing workflow) replays it again.
        """
        self.stuck[wid] = str(err)
        self.stuck_errors[wid] = err
        log.error("workflow %r is stuck: %s", wid, err)
        st = self.wf.get(wid)
        if st is not None and st.waiters:
            for fut in st.waiters:
                if not fut.done():
                    fut.set_exception(err)
            st.waiters = None

    # --- messages between runs ------------------------------------------------

    def _send(self, fn: Callable[..., None], *args: Any) -> None:
        """Delivers a message to another run after the Env's message delay."""
        if sabotage.active.drop_outbox_message and self.env.rng.random() < 0.5:
            return
        if self.mail is not None and self.mail.elsewhere(mail_target(fn.__name__, args)):
            self.spawn(self.mail.send(fn.__name__, args))
            return
        delay = self.env.message_delay()
        if delay > 0:
            self.loop.call_later(delay, self._deliver, fn, args)
        else:
            self.loop.call_soon(self._deliver, fn, args)

    def _deliver(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        # A failed log takes no record a delivery would journal; the message goes again from
        # its record when the reopened engine replays its sender.
        if not self.closed and self.log.failed is None:
            fn(*args)
            # Nobody may wait for what a message journaled (a close policy's cancel, say).
            self.committer.request_flush()

    def ensure_child(self, parent: Run, child: rec.Child) -> None:
        """Makes sure the child a Child record names exists; resends its result if it ended."""
        gate = parent.machine.gate
        ref = rec.ParentRef(id=parent.workflow_id, run=parent.run_id, seq=child.seq)
        parent.add_delivery(self.spawn(self._ensure_child(parent.shard, gate, ref, child)))

    async def _ensure_child(self, shard: int, gate: int, ref: rec.ParentRef, child: rec.Child) -> None:
        if not sabotage.active.ack_before_durable:
            await self.wait_durable(shard, gate)
        await self._send_durably(self._start_child, ref, child)

    async def _send_durably(self, fn: Callable[..., None], *args: Any) -> None:
        """:meth:`_send` as a task: done once delivered (what it journaled is then below each
        shard's end, see :meth:`appended_durable`)."""
        if sabotage.active.drop_outbox_message and self.env.rng.random() < 0.5:
            return
        if self.mail is not None and self.mail.elsewhere(mail_target(fn.__name__, args)):
            await self.mail.send(fn.__name__, args)
            return
        await asyncio.sleep(self.env.message_delay())
        self._deliver(fn, args)

    async def receive(self, kind: str, args: tuple[Any, ...]) -> None:
        """Applies a message another part's runtime sent (see :data:`MAIL_TYPES`); returns once
        what it journaled here is durable, so that its sender may count it delivered."""
        assert kind in MAIL_TYPES, f"not a message kind: {kind!r}"
        if self.closed or self.log.failed is not None:
            raise EngineClosed("this part is closed or its log failed: the message was not applied")
        if sabotage.active.relay_drops_dedup_key and kind == "_signal_quiet":
            args = (*args[:3], 0)
        self._deliver(getattr(self, kind), args)
        if not sabotage.active.mail_acked_before_durable:
            await self.appended_durable()

    async def appended_durable(self) -> None:
        """Returns once everything appended so far, on every shard, is durable."""
        for shard, lsn in enumerate(self.log.appended_lsns()):
            await self.wait_durable(shard, lsn)

    def _start_child(self, ref: rec.ParentRef, child: rec.Child) -> None:
        """Starts the child a Child record names, unless it exists; tells an attached parent how it ended.

        A detached child's parent waits for nothing: it is never woken for it.
        """
        detached = bool(child.flags & rec.DETACHED)
        st = self.wf.get(child.id)
        if st is None:
            wdef = self.workflows.get(child.wtype)
            if wdef is None:
                err = codec.encode_error(UnknownWorkflow(f"no workflow named {child.wtype!r} is registered"))
                self._tell_parent(ref, rec.Status.FAILED, err)
                return
            self.start_workflow(wdef, child.id, child.input, parent=ref, policy=child.flags,
                                trace=self.trace_of(ref.id))
            parent = self.wf.get(ref.id)
            if parent is not None and (parent.run_id != ref.run or parent.final):
                # The parent ended while the start was on its way: the policy applies now.
                self._apply_close_policy(parent)
            return
        if st.parent is not None and st.parent != ref and st.parent.id == ref.id and st.parent.seq == ref.seq \
                and self._reset_from(ref, st.parent.run):
            st.parent = ref  # the parent was reset (or continued) past this child's start: it adopts it
        if st.parent != ref:
            if detached:
                # Its parent waits for nothing: waking it (a parked parent replays) would
                # resend this start at every wake, forever.
                return
            err = codec.encode_error(
                AlreadyExists(f"child workflow id '{child.id}' is in use by another workflow")
            )
            self._tell_parent(ref, rec.Status.FAILED, err)
            return
        if st.final and st.status is not None and not detached:
            self.report_to_parent(st)

    def report_to_parent(self, st: WorkflowState, *, again: bool = False) -> None:
        """Tells a child's parent how the child's run ended.

        A parent on another part is told by mail; until its part acknowledges, the child
        owes it the result (``owes_parent``, kept in checkpoints), and whoever holds this
        part after a crash or a handover sends it again at open (``again``: only then, a
        parent on this part replays and asks for itself).
        """
        assert st.parent is not None and st.final, "only a finished child reports to its parent"
        if self.mail is not None and self.mail.elsewhere(st.parent.id):
            st.owes_parent = True
            self.spawn(self._pay_parent(self.mail, st, st.run_id, st.parent, st.status, st.payload))
        elif not again:
            self._send(self._child_finished, st.parent, st.status, st.payload)

    async def _pay_parent(self, mail: Mail, st: WorkflowState, run_id: int, ref: rec.ParentRef,
                          status: rec.Status | None, payload: bytes) -> None:
        if sabotage.active.drop_outbox_message and self.env.rng.random() < 0.5:
            return
        if await mail.send("_child_finished", (ref, status, payload)) and st.run_id == run_id:
            st.owes_parent = False

    def _tell_parent(self, ref: rec.ParentRef, status: rec.Status | None, payload: bytes) -> None:
        """How a child ended, to its parent: here at once, or by mail when the parent lives on
        another part (the child's part answers a start sent again by the parent's replay)."""
        if self.mail is not None and self.mail.elsewhere(ref.id):
            self.spawn(self.mail.send("_child_finished", (ref, status, payload)))
            return
        self._child_finished(ref, status, payload)

    def trace_of(self, wid: str) -> bytes | None:
        """The trace context journaled in ``wid``'s current Start (a child joins its parent's trace)."""
        st = self.wf.get(wid)
        if st is None:
            return None
        if st.packed is not None:
            start = first_record(st.packed, self.sealer)
        else:
            start = st.journal[0] if st.journal else None
        return start.trace if isinstance(start, rec.Start) else None

    def _reset_from(self, ref: rec.ParentRef, old_run: int) -> bool:
        """Whether the parent run ``ref`` names replaced run ``old_run`` of the same workflow."""
        parent = self.wf.get(ref.id)
        return parent is not None and parent.run_id == ref.run and old_run != ref.run

    def _child_finished(self, ref: rec.ParentRef, status: rec.Status | None, payload: bytes) -> None:
        st = self.wf.get(ref.id)
        if st is None or st.run_id != ref.run or status is None:
            return
        run = self.loaded(st)
        if run is None:
            return
        c = run.children.get(ref.seq)
        if c is None or c.flags & rec.DETACHED:
            return
        if run.machine.complete(ref.seq, jm.ChildResult(status, payload)):
            run.pump()

    def send_signal(self, run: Run, seq: int, target: str, name: str, payload: bytes, lsn: int) -> None:
        """A run's ``signal_workflow``: delivered once its Send record is durable, deduplicated by position."""
        key = dedup_key(f"send:{run.run_id}:{seq}")
        run.add_delivery(self.spawn(self._send_after(run.shard, lsn, target, name, payload, key)))

    async def _send_after(self, shard: int, lsn: int, target: str, name: str, payload: bytes, key: int) -> None:
        if not sabotage.active.ack_before_durable:
            await self.wait_durable(shard, lsn)
        await self._send_durably(self._signal_quiet, target, name, payload, key)

    def _signal_quiet(self, target: str, name: str, payload: bytes, key: int) -> None:
        st = self.wf.get(target)
        run = self.loaded(st) if st is not None else None
        if run is not None:
            run.offer_signal(name, payload, key, None)

    # --- client operations -------------------------------------------------

    def current(self, wid: str) -> WorkflowState:
        st = self.wf.get(wid)
        if st is None:
            raise NotFound(f"no workflow with id '{wid}' exists")
        return st

    def running_run(self, wid: str) -> Run:
        st = self.current(wid)
        run = self.loaded(st)
        if run is None:
            if wid in self.stuck:
                raise NotFound(f"workflow '{wid}' is stopped: {self.stuck[wid]}")
            raise WorkflowEnded(wid, st.status.name.lower() if st.status is not None else "ended")
        return run

    def signal(self, wid: str, name: str, payload: bytes, dedup: int, by: bytes | None) -> int:
        run = self.running_run(wid)
        lsn = run.offer_signal(name, payload, dedup, by)
        return lsn if lsn is not None else run.machine.gate

    def cancel(self, wid: str, reason: str, by: bytes | None) -> int:
        return self.running_run(wid).request_cancel(reason.encode(), by)

    def ended_resend(self, st: WorkflowState, dedup: int | None) -> int | None:
        """A resent signal (``dedup``: its key) or cancel (``dedup`` None) to an ended run: the LSN of
        the record the first try made, if its journal holds one, else None (the run ended first).

        A client that retries after its first, durable try ended the run gets the same answer
        as that first try, not :class:`WorkflowEnded`. Without ``keep_history`` an ended run
        keeps no signals or cancel requests, so only a run that ended cancelled is matched.
        """
        if st.running:
            return None
        journal, lsns = self.journal_of(st)
        for r, lsn in zip(journal, lsns, strict=True):
            if dedup is None:
                if isinstance(r, rec.CancelRequest | rec.Cancel) or (
                        isinstance(r, rec.Done) and r.status == rec.Status.CANCELLED):
                    return lsn
            elif isinstance(r, rec.Signal) and r.dedup == dedup:
                return lsn
        return None

    def terminate(self, wid: str, reason: str, by: bytes | None) -> int:
        st = self.current(wid)
        if not st.running:
            raise WorkflowEnded(wid, st.status.name.lower() if st.status is not None else "ended", "terminate")
        return self.end_run(wid, rec.Status.TERMINATED, reason, by)

    def end_run(self, wid: str, status: rec.Status, reason: str, by: bytes | None) -> int:
        """Ends the current run at once with ``status``, without running more of its code."""
        st = self.current(wid)
        run = st.run
        if run is None and st.packed is not None:
            st.journal, st.lsns = unpack(st.packed, self.sealer)
            st.packed = None
        done = rec.Done(
            run=st.run_id,
            status=status,
            finished_ms=self.env.now_ms(),
            payload=reason.encode(),
            by=by,
        )
        if run is not None:
            if run.span is not None and self.telemetry is not None:
                self.telemetry.run_end(run, status.name.lower(), None)  # not "suspended", as kill says
            run.kill()
            run.finished = True
            lsn = run.append(done)
            self.stuck.pop(wid, None)
            self.stuck_errors.pop(wid, None)
            self.on_run_done(run, done, lsn)
            return lsn
        # A stuck run (no code loaded) ends too.
        lsn = self.append(st.shard, done)
        st.journal.append(done)
        st.lsns.append(lsn)
        if self.to_load.pop(wid, None) == st.run_id or wid in self.stuck:
            # Its replay in this life did not reach the end (not loaded yet, or stopped at a
            # divergence): children to start and signals to send may still be owed (seed 2938).
            recovery.redo_outbox(self, st)
        self.stuck.pop(wid, None)
        self.stuck_errors.pop(wid, None)
        st.status, st.payload, st.done_lsn = done.status, done.payload, lsn
        self._report_end(st, done.status, done.payload, None)
        self.spawn(self._after_done(st, st.run_id, lsn))
        return lsn

    def reset(
        self,
        wid: str,
        new_id: str | None,
        *,
        before_step: str | None,
        before_position: int | None,
        reapply_signals: bool,
        version: int | None,
        by: bytes | None,
    ) -> tuple[WorkflowState, int]:
        """A new run from the journal prefix before the cut: of ``wid`` itself (reset, which
        ends the current run) or of ``new_id`` (fork, which leaves ``wid`` alone).

        Returns the new run's state and the LSN to await before acknowledging.
        """
        st = self.current(wid)
        journal, _ = self.journal_of(st)
        journal = list(journal)
        start = journal[0]
        assert isinstance(start, rec.Start)
        live = {s: op.name for s, op in st.run.ops.items() if op.kind in (0, 5)} if st.run is not None else {}
        cut = reset_journal.find_cut(journal, before_step, before_position, live)
        prefix, later = reset_journal.split(journal, cut)
        wdef = self.definition(st.wtype, version if version is not None else start.version)
        if wdef is None:
            raise self.unregistered(st.wtype, version if version is not None else start.version)
        if new_id is None:
            target = st
            if st.running:
                self.end_run(wid, rec.Status.TERMINATED, f"reset to position {cut}", by)
        else:
            if new_id in self.wf:
                raise AlreadyExists(f"workflow '{new_id}' exists already: fork into a new ID")
            target = self.wf[new_id] = WorkflowState(new_id, shard_of(new_id, self.shards))
            target.parent = None
        lsn = self._run_from(target, start, prefix, later if reapply_signals else [], wdef, target.parent, by)
        log.info("workflow %r: new run %d from %d records of %r (cut at position %d)",
                 target.id, target.run_id, len(target.journal), wid, cut)
        return target, lsn

    def import_run(
        self, journal: list[rec.Record], new_id: str | None, before_step: str | None, *,
        before_position: int | None = None, reapply_signals: bool = True, version: int | None = None,
        fork: bool = False, by: bytes | None = None,
    ) -> tuple[WorkflowState, int]:
        """A new run (of ``new_id``, or the journal's own workflow ID) from an exported
        journal, cut before the first step named ``before_step`` or at ``before_position``
        (else all of it but its ending): it replays what the journal holds and runs live from
        there. Returns the new run's state and the LSN to await before acknowledging.

        ``fork=True`` is a fork whose original lives in another engine (another part): the
        new run is that fork's, of ``version`` (default the journal's) and started ``by``;
        the signals after the cut come again only when ``reapply_signals``."""
        start = journal[0] if journal else None
        if not isinstance(start, rec.Start):
            raise ValueError("the journal does not begin with its run's Start record: it is no run's journal")
        wid = start.id if new_id is None else new_id
        if wid in self.wf:
            raise AlreadyExists(f"workflow '{wid}' exists already: fork into a new ID" if fork else
                                f"workflow '{wid}' exists already: import the journal under a new "
                                "workflow_id, or into another engine directory")
        wanted = version if version is not None else start.version
        wdef = self.definition(start.wtype, wanted)
        if wdef is None:
            raise self.unregistered(start.wtype, wanted)
        if fork or before_step is not None or before_position is not None:  # a fork always cuts
            prefix, later = reset_journal.split(journal, reset_journal.find_cut(journal, before_step, before_position))
        else:
            prefix, later = [r for r in journal if not isinstance(r, rec.Done)], []
        target = self.wf[wid] = WorkflowState(wid, shard_of(wid, self.shards))
        # No parent here (the one it had lives in the other engine).
        lsn = self._run_from(target, start, prefix, later if reapply_signals else [], wdef, None,
                             by if fork else start.by)
        log.info("workflow %r: new run %d imported from %d records of run %d of %r",
                 wid, target.run_id, len(target.journal), start.run, start.id)
        return target, lsn

    def _run_from(self, target: WorkflowState, start: rec.Start, prefix: list[rec.Record],
                  signals: list[rec.Signal], wdef: Any, parent: rec.ParentRef | None, by: bytes | None) -> int:
        """Journals ``target``'s new run (of ``wdef``, started now) from ``prefix`` (a journal's
        start and what it keeps) and ``signals`` delivered again; returns the LSN to await."""
        rid = self.new_run_id()
        new_start = msgspec.structs.replace(
            start, run=rid, id=target.id, wtype=wdef.name, version=wdef.version,
            started_ms=self.env.now_ms(), parent=parent, by=by,
        )
        records: list[rec.Record] = [new_start, *reset_journal.renumber(prefix[1:], rid)]
        records += [msgspec.structs.replace(s, run=rid) for s in signals * (1 + sabotage.active.reapply_signal_twice)]
        return self.adopt(target, records)

    def adopt(self, target: WorkflowState, records: list[rec.Record]) -> int:
        """Journals ``records`` (a Start and what follows it) as ``target``'s current run and
        replays it, as recovery would; returns the LSN to await before acknowledging."""
        start = records[0]
        assert isinstance(start, rec.Start) and start.id == target.id
        if target.run_id:
            self.by_run.pop(target.run_id, None)
        target.wtype, target.run_id, target.version = start.wtype, start.run, start.version
        target.status, target.payload, target.final = None, b"", False
        target.journal, target.lsns, target.packed = [], [], None
        self.by_run[start.run] = target
        lsn = 0
        for r in records:
            lsn = self.append(target.shard, r)
            target.journal.append(r)
            target.lsns.append(lsn)
        self._load_run(target)
        return lsn

    def resume(self, wid: str, by: bytes | None) -> int:
        run = self.running_run(wid)
        records = run.machine.resume(by)
        lsn = run.machine.gate
        for r in records:
            lsn = run.append(r)
            call = run.steps.get(r.seq)
            if call is not None and run.machine.step_pending(r.seq):
                call.attempt = 1
                call.not_before = 0
                call.gate = lsn
                self.run_step(run, r.seq, call)
        run.pump()
        return lsn

    def release_update(
        self, shard: int, lsn: int, waiters: list[asyncio.Future[Any]], status: rec.Status, payload: bytes
    ) -> None:
        self.spawn(self._release_update(shard, lsn, waiters, status, payload))

    async def _release_update(
        self, shard: int, lsn: int, waiters: list[asyncio.Future[Any]], status: rec.Status, payload: bytes
    ) -> None:
        if not sabotage.active.ack_before_durable:
            await self.wait_durable(shard, lsn)
        for fut in waiters:
            if fut.done():
                continue
            if status == rec.Status.OK:
                fut.set_result(codec.decode(payload))
            else:
                info = codec.decode_error(payload)
                fut.set_exception(UpdateFailed(f"update handler failed: {info.type}: {info.message}"))

    async def result_of(self, wid: str) -> tuple[rec.Status, bytes]:
        """Waits for the final, durable ending of ``wid``'s chain of runs."""
        st = self.current(wid)
        while not st.final:
            err = self.stuck_errors.get(wid)
            if err is not None:
                raise err
            fut: asyncio.Future[None] = self.loop.create_future()
            if st.waiters is None:
                st.waiters = []
            st.waiters.append(fut)
            await fut
        assert st.status is not None
        return st.status, st.payload

    def raise_for(self, wid: str, status: rec.Status, payload: bytes, result_type: Any) -> Any:
        if status == rec.Status.OK:
            return codec.decode(payload, result_type)
        raise workflow_error(wid, status, payload)

    # --- timers ---------------------------------------------------------------

    def arm_timer(self, run: Run, seq: int, fire_at_ms: int) -> None:
        self._push(fire_at_ms, FIRE, run.workflow_id, run.run_id, seq)

    def arm_deadline(self, run: Run, seq: int, deadline_ms: int) -> None:
        self._push(deadline_ms, DEADLINE, run.workflow_id, run.run_id, seq)

    def _timer_event(self, kind: int, wid: str, run_id: int, seq: int, extra: int) -> None:
        if self.closed:
            return
        try:
            self._timer_event_for(kind, wid, run_id, seq, extra)
        except FuseeError:
            pass  # the log failed: callers see it; timers have nobody to tell

    def arm_child_deadline(self, run: Run, seq: int, deadline_ms: int) -> None:
        self._push(deadline_ms, CHILD_DEADLINE, run.workflow_id, run.run_id, seq)

    def arm_run_deadline(self, run: Run, deadline_ms: int) -> None:
        self._push(deadline_ms, RUN_DEADLINE, run.workflow_id, run.run_id)

    def child_timed_out(self, run: Run, child: rec.Child, lsn: int) -> None:
        """The parent's wait for ``child`` timed out: once that is durable, the child's close policy applies."""
        ref = rec.ParentRef(id=run.workflow_id, run=run.run_id, seq=child.seq)
        self.spawn(self._close_child_after(run.shard, lsn, ref, child))

    async def _close_child_after(self, shard: int, lsn: int, ref: rec.ParentRef, child: rec.Child) -> None:
        if lsn and not sabotage.active.ack_before_durable:
            await self.wait_durable(shard, lsn)
        self._send(self._close_child, ref, child)

    def _close_child(self, ref: rec.ParentRef, child: rec.Child) -> None:
        st = self.wf.get(child.id)
        if st is None or not st.running or st.parent != ref:
            return
        policy = child.flags & rec.CLOSE_POLICY_MASK
        reason = f"parent '{ref.id}' stopped waiting for it (timeout)"
        if policy == rec.ClosePolicy.TERMINATE:
            self._terminate_quiet(child.id, reason)
        elif policy == rec.ClosePolicy.REQUEST_CANCEL:
            self._cancel_quiet(child.id, reason)

    def _timer_event_for(self, kind: int, wid: str, run_id: int, seq: int, extra: int) -> None:
        st = self.wf.get(wid)
        if st is None or st.run_id != run_id:
            return
        if kind == RUN_DEADLINE:
            if st.status is None:
                log.info("workflow %r timed out", wid)
                self.end_run(wid, rec.Status.TIMED_OUT, "the run did not finish within its timeout", None)
            return
        if kind == EXPIRE:
            if st.final and st.run is None:
                del self.wf[wid]
                self.index.forget(wid)
                self.by_run.pop(run_id, None)
            return
        if kind == PARK:
            parking.on_park_check(self, st)
            return
        if st.status is not None:
            return
        run = self.loaded(st)
        if run is None or kind == WAKE:
            return
        m = run.machine
        if kind == FIRE:
            if m.complete(seq, jm.Fired()):
                run.pump()
        elif kind == CHILD_DEADLINE:
            reason = b"the child did not finish within the parent's timeout"
            if m.complete(seq, jm.ChildResult(rec.Status.TIMED_OUT, reason)):
                run.pump()
        elif kind == DEADLINE:
            op = run.ops.get(seq)
            if op is None:
                return
            seqs = run.waiting.get(op.name)
            if not seqs or seq not in seqs:
                return  # a signal got there first
            seqs.remove(seq)
            if m.complete(seq, jm.WaitTimedOut()):
                run.pump()

    # --- parking ------------------------------------------------------------------

    def journal_of(self, st: WorkflowState) -> tuple[list[rec.Record], list[int]]:
        """The current run's records and their LSNs, wherever they are kept."""
        if st.packed is not None:
            return unpack(st.packed, self.sealer)
        return st.journal, st.lsns

    def loaded(self, st: WorkflowState) -> Run | None:
        """The run's code in memory: a parked run is woken (replayed) first, and a run recovery has
        not loaded yet is loaded now. None once it ended. Raises ``LogFailed`` (or ``DiskFull``)
        for a run not in memory once the log failed: nothing can be woken until the reopen."""
        if st.run is not None:
            return st.run
        if self.log.failed is not None and st.status is None:
            # Waking replays, and replay appends. A wake whose append failed would park the run
            # again, and its replay would resend what woke it: the same instant, forever.
            raise self.log.failure()
        if st.status is None and st.packed is not None and st.id not in self.stuck:
            try:
                st.journal, st.lsns = unpack(st.packed, self.sealer)
            except CodecError as e:
                # Parked under a key the codec lacks: stopped (a reopen with the key wakes it).
                self.mark_stuck(st.id, e)
                return None
            st.packed = None
            self.stats["woken"] += 1
            self._load_run(st)
        elif st.id in self.to_load:
            recovery.load_now(self, st)  # recovery had not got to it yet
        return st.run

    # --- recovery and parking (see recovery.py and parking.py) ---------------------

    def load(self, records: Iterable[tuple[int, int, rec.Record]]) -> None:
        """Rebuilds the workflow table from recovered records, in log order."""
        recovery.load_records(self, records)

    def load_checkpoint(self, state: bytes) -> None:
        """Rebuilds the workflow table from a checkpoint (before the log after it is loaded)."""
        recovery.load_checkpoint(self, state)

    def resume_all(self) -> None:
        """Replays every loaded unfinished run (in batches of :attr:`load_room`: the first now, the
        rest in the background); redoes what parked and finished ones owe others."""
        recovery.resume_all(self)

    def set_load_room(self, room: int) -> None:
        """How many runs recovery loads and replays per batch (at least 1)."""
        self.load_room = max(1, room)

    def checkpoint_state(self) -> bytes:
        """Every workflow's current run, as a checkpoint holds it."""
        return recovery.checkpoint_state(self)

    def after_pump(self, run: Run) -> None:
        """A run went quiet: park it once it has stayed suspended for ``park_after``."""
        parking.after_pump(self, run)

    def signal_passed_over(self, run: Run, seq: int, ordinal: int, name: str, error: FuseeError) -> None:
        """A wait passed over a journaled signal its type cannot decode: warn and count it."""
        self.stats["signals_dropped"] += 1
        log.warning(
            "workflow %r (run %d): signal %r #%d in its journal does not decode as the wait at "
            "position %d expects (%s); it is passed over and the wait keeps waiting. Send it again "
            "with a value of the declared type",
            run.workflow_id, run.run_id, name, ordinal, seq, error,
        )

    def parkable(self, run: Run) -> bool:
        """Whether ``run`` may park now (suspended, nothing of it in flight)."""
        return parking.parkable(self, run)

    def park(self, st: WorkflowState) -> None:
        """Parks ``st``'s loaded run (it must be :meth:`parkable`)."""
        parking.park(self, st)

    def park_all(self) -> None:
        """Parks every suspended run (at close: the checkpoint keeps them parked)."""
        parking.park_all(self)

    def release_table(self) -> None:
        """Lets go of every loaded run and waiting caller, once this runtime is done with.

        The table's entries are invisible to the cycle collector (``gc=False``), so a
        run an entry still holds (and through it this runtime, its loop and every
        coroutine) would never be freed: a closed or crashed engine must cut those
        references. The table itself stays readable.
        """
        for st in self.wf.values():
            st.run = None
            st.waiters = None
        self.quiet.clear()
        self.load_queue.clear()

    # --- steps ----------------------------------------------------------------------

    def run_step(self, run: Run, seq: int, call: StepCall) -> None:
        """Runs a live step's function once its gate is durable and its time has come."""
        self.steps.run_step(run, seq, call)

    def step_retried(self, run: Run, call: StepCall, error: BaseException, retry_at: int) -> None:
        """A step's attempt failed: it runs again at ``retry_at`` (or waits for a resume)."""
        if retry_at == rec.PAUSED:
            log.warning("workflow %r: step %r paused after attempt %d failed (%s: %s); "
                        "engine.resume(%r) retries it", run.workflow_id, call.name, call.attempt,
                        type(error).__name__, error, run.workflow_id,
                        extra=log_fields(run.workflow_id, run.machine.info.wtype, run.run_id, call.name))
        else:
            log.info("workflow %r: step %r attempt %d failed (%s: %s); retrying",
                     run.workflow_id, call.name, call.attempt - 1, type(error).__name__, error,
                     extra=log_fields(run.workflow_id, run.machine.info.wtype, run.run_id, call.name))
        call.last_error = f"{type(error).__name__}: {error}"

    def on_durable(self, durable: list[int]) -> None:
        """The committer made more of the log durable."""
        self.steps.on_durable(durable)
        self.wake_stream_readers()

    def wake_stream_readers(self) -> None:
        """Wakes every stream reader waiting in :meth:`stream_changed` (more is durable, or
        nothing more will be: the log failed or the engine closed; each reader looks again)."""
        if self.stream_readers:
            readers, self.stream_readers = self.stream_readers, []
            for fut in readers:
                if not fut.done():
                    fut.set_result(None)

    async def stream_changed(self, timeout: float | None) -> None:
        """Waits until more of the log is durable (new chunks may be there), at most ``timeout`` s."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self.stream_readers.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass

    # --- checkpoints --------------------------------------------------------------

