"""The per-run journal machine: what workflow code sees, in what order, and what to record.

Every operation the code starts (a step, a sleep, a wait, a child, a value...)
takes the next sequence number, so an operation's identity is the order in
which the code *called* it plus its name. Results come back as deliveries, one
at a time, the code running until quiescent in between; the journal records
deliveries in the order they were handed to the code. Replay hands recorded
results back in exactly that order, and live completions that arrive while
replay is still in progress wait until it is done. Parallel branches therefore
observe the same interleaving after a crash. Signals, accepted updates and
cancellation are deliveries too, so they land at the same point on every run.

The machine does no I/O and keeps no clock: it tells the host which records to
append and when a step function may run; the host does the rest.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Container, Sequence
from typing import Final, Literal

import msgspec

from fusee.core import records as rec
from fusee.core.records import (
    DETACHED,
    PAUSED,
    WORKFLOW,
    Record,
    Status,
    ValueKind,
    WaitOutcome,
)
from fusee.errors import DeterminismError, StreamError

__all__ = [
    "ARMED",
    "IDLE",
    "REPLAY",
    "STALLED",
    "Append",
    "AsyncCompleted",
    "AwaitWaiting",
    "CancelAll",
    "ChildResult",
    "Completion",
    "Deliver",
    "Fired",
    "Marker",
    "OpKind",
    "Outcome",
    "RunInfo",
    "RunMachine",
    "SignalTaken",
    "StepDone",
    "StepRun",
    "StreamOpen",
    "UpdateTurn",
    "WaitTimedOut",
]


class OpKind(enum.IntEnum):
    """The kinds of journal operations workflow code can start."""

    STEP = 0
    SLEEP = 1
    WAIT = 2
    CHILD = 3
    VALUE = 4
    SEND = 5
    #: A step whose result is reported from outside (``ctx.await_completion``).
    AWAIT = 6
    #: An update handler returned.
    UPDATE_DONE = 7
    ATTRIBUTES = 8


_KIND_NAMES: Final = (
    "step",
    "sleep",
    "wait",
    "child",
    "value",
    "send",
    "async completion",
    "update result",
    "set_attributes",
)

# Kinds bound to module names: hot paths compare with ``is`` on these.
_STEP: Final = OpKind.STEP
_SLEEP: Final = OpKind.SLEEP
_WAIT: Final = OpKind.WAIT
_CHILD: Final = OpKind.CHILD
_VALUE: Final = OpKind.VALUE
_SEND: Final = OpKind.SEND
_AWAIT: Final = OpKind.AWAIT
_UPDATE_DONE: Final = OpKind.UPDATE_DONE
_ATTRIBUTES: Final = OpKind.ATTRIBUTES
#: Kinds whose identity is position alone: their name is not checked on replay.
_UNNAMED: Final = frozenset((_VALUE, _UPDATE_DONE, _ATTRIBUTES))


class Marker(enum.Enum):
    """Answers that carry no data."""

    #: The result is recorded: wait for its delivery, run nothing.
    REPLAY = "replay"
    #: The sleep, wait or child was set up in an earlier life: wait for it.
    ARMED = "armed"
    #: Replay waits for the code to start the operation it delivers next.
    STALLED = "stalled"
    #: Nothing to deliver.
    IDLE = "idle"


REPLAY: Final = Marker.REPLAY
ARMED: Final = Marker.ARMED
STALLED: Final = Marker.STALLED
IDLE: Final = Marker.IDLE


# --- what the machine tells the host ----------------------------------------


class StepRun(msgspec.Struct, frozen=True, gc=False):
    """Run the function once the log is durable through the gate and the clock
    reached ``not_before_ms`` (``PAUSED``: wait for a resume instead).

    ``attempt`` counts from the step's last resume (its retry budget does).
    """

    attempt: int
    not_before_ms: int


class AwaitWaiting(msgspec.Struct, frozen=True, gc=False):
    """The token of ``attempt`` is out already: wait for its completion."""

    attempt: int


class Append(msgspec.Struct, frozen=True, gc=False):
    """Append ``record``; the shard arms the timer, wait or child from it."""

    record: Record


class Outcome(msgspec.Struct, frozen=True, gc=False):
    """What an operation resolves to."""

    status: Status
    payload: bytes


class StreamOpen(msgspec.Struct, frozen=True, gc=False):
    """What :meth:`RunMachine.stream_open` tells the writer."""

    #: Chunks earlier attempts of the opening step recorded (0 for workflow
    #: code): the prefix a step that runs again continues after.
    recorded: int
    #: The stream is complete: appends of the opening step are dropped (it
    #: completed the stream in an earlier attempt) or refused.
    closed: bool


class Deliver(msgspec.Struct, frozen=True, gc=False):
    """Resolve operation ``seq`` with ``outcome``.

    When ``record`` is set this is a live delivery: append the record first
    (it is how the journal remembers the delivery), then resolve.
    """

    seq: int
    outcome: Outcome
    record: Record | None


class CancelAll(msgspec.Struct, frozen=True, gc=False):
    """Cancellation reached the code: resolve each of ``seqs`` (ascending) as
    cancelled with ``reason``, after appending ``record`` when it is set."""

    seqs: list[int]
    reason: bytes
    record: Record | None


class UpdateTurn(msgspec.Struct, frozen=True, gc=False):
    """An update reached its turn: start its handler now.

    ``live is None``: the update is recorded (replay, or delivered with the
    start); start the handler, append nothing. ``live`` set: a new request with
    that token; run its validator now, then call
    :meth:`RunMachine.accept_update` (and append its record) or drop it.
    """

    ordinal: int
    name: str
    id: str
    payload: bytes
    live: int | None


class RunInfo(msgspec.Struct, frozen=True, gc=False):
    """Identity and input of a run, from its ``Start`` record."""

    run: int
    id: str
    wtype: str
    version: int
    codec: int
    started_ms: int
    deadline_ms: int
    parent: rec.ParentRef | None
    policy: int
    input: bytes
    #: The W3C ``traceparent`` the run was started under, if any.
    trace: bytes | None


# --- completions the host reports --------------------------------------------


class StepDone(msgspec.Struct, frozen=True, gc=False):
    """A step's function returned (or failed for good); the times are the
    ``Step`` record's (see ``records.Step``), 0 when the host took none."""

    status: Status
    payload: bytes
    began_us: int = 0
    took_us: int = 0
    queued_us: int = 0


class Fired(msgspec.Struct, frozen=True, gc=False):
    """A sleep's timer fired (not to be confused with the ``Fired`` record)."""


class SignalTaken(msgspec.Struct, frozen=True, gc=False):
    """A wait took signal number ``ordinal`` of the run."""

    ordinal: int
    payload: bytes


class WaitTimedOut(msgspec.Struct, frozen=True, gc=False):
    """A wait's deadline passed."""


class ChildResult(msgspec.Struct, frozen=True, gc=False):
    """A child run ended."""

    status: Status
    payload: bytes


class AsyncCompleted(msgspec.Struct, frozen=True, gc=False):
    """An async completion's result arrived with the token of ``attempt``."""

    attempt: int
    status: Status
    payload: bytes
    #: Who reported it (journaled for the audit).
    by: bytes | None = None


Completion = StepDone | Fired | SignalTaken | WaitTimedOut | ChildResult | AsyncCompleted

#: Which completions resolve which kind of operation (an invariant of the host).
_COMPLETES: Final[dict[OpKind, tuple[type, ...]]] = {
    _STEP: (StepDone,),
    _AWAIT: (StepDone, AsyncCompleted),
    _SLEEP: (Fired,),
    _WAIT: (SignalTaken, WaitTimedOut),
    _CHILD: (ChildResult,),
}

_EMPTY_OK: Final = Outcome(Status.OK, b"")
_TIMED_OUT: Final = Outcome(Status.TIMED_OUT, b"")
#: The answer for a step's first attempt: shared, it never changes.
_FIRST_RUN: Final = StepRun(1, 0)


# --- internal state ------------------------------------------------------------


class _Op(msgspec.Struct, gc=False):
    """An operation, as the journal recorded it or as the code started it.

    A recorded entry whose result the journal holds doubles as the pending
    entry while the code waits for that result (``live`` false): replaying a
    step allocates no state of its own.
    """

    kind: OpKind
    name: str
    #: Recorded: the last failed attempt (steps), the token's attempt
    #: (async completions), the value kind (values) or the update ordinal
    #: (update results). Pending live: the attempt running now.
    attempt: int = 0
    #: Recorded steps: when the next attempt may run (``PAUSED``: never).
    retry_at_ms: int = 0
    #: Recorded steps: attempts made before the last resume; the code's retry
    #: budget counts from here.
    base: int = 0
    #: A begin marker (timer, wait, child, awaiting, send...) is recorded.
    marked: bool = False
    #: A recorded value.
    value: bytes = b""
    #: The journal holds this operation's final delivery.
    delivered: bool = False
    #: Pending, resolved by live work (not by replay).
    live: bool = False
    #: Async completion whose token is out: waits on the outside world.
    waiting: bool = False
    #: A live completion for it is queued, not delivered yet.
    queued: bool = False
    #: A step whose retries ran out, waiting for a resume.
    paused: bool = False


class _Stream(msgspec.Struct, gc=False):
    """One of the run's streams, as its journal and this life's code made it.

    Ownership is not journaled: workflow code opens its streams again as it
    replays, and a step when it runs again.
    """

    name: str
    #: Chunks recorded or appended so far: the next chunk's offset.
    len: int = 0
    #: Completed, and by whom (``WORKFLOW`` or a step's position).
    closed: int | None = None
    #: Workflow chunks the journal holds that this life's code has not
    #: appended again yet: replay matches appends to them and appends nothing.
    replay_left: int = 0
    #: Chunks per writing step's position.
    by_step: dict[int, int] = msgspec.field(default_factory=dict)
    #: Who writes it in this life: None, ``WORKFLOW`` or a step's position.
    owner: int | None = None


class _ReplayCancel(msgspec.Struct, frozen=True, gc=False):
    reason: bytes


class _LiveCancel(msgspec.Struct, frozen=True, gc=False):
    reason: bytes
    by: bytes | None


class _LiveUpdate(msgspec.Struct, frozen=True, gc=False):
    token: int
    name: str
    id: str
    payload: bytes


_ReplayItem = Deliver | _ReplayCancel | UpdateTurn
#: A queued completion is a ``(seq, completion)`` pair.
_LiveItem = tuple[int, Completion] | _LiveCancel | _LiveUpdate

_NO_RUN: Final = RunInfo(0, "", "", 0, 0, 0, 0, None, 0, b"", None)


def _describe(kind: OpKind, name: str) -> str:
    label = _KIND_NAMES[kind]
    return f"{label} '{name}'" if name or kind not in _UNNAMED else label


def _mismatch(seq: int, recorded: _Op, kind: OpKind, name: str) -> DeterminismError:
    return DeterminismError(
        f"the journal recorded {_describe(recorded.kind, recorded.name)} here "
        f"but the code called {_describe(kind, name)}",
        seq,
    )


def _compatible(recorded: _Op, kind: OpKind) -> bool:
    # A step's failed attempts are recorded before anything tells whether it
    # was a plain step or an async completion.
    return recorded.kind is kind or (
        recorded.kind is _STEP and kind is _AWAIT and not recorded.delivered and not recorded.marked
    )


class RunMachine:
    """The journal machine of one loaded run.

    Call the ``begin_*`` methods as the code starts operations, ``complete``
    as live results arrive, and ``next`` whenever the code is quiescent to get
    the one delivery to hand it. Any method may raise :class:`DeterminismError`
    where the code departs from its journal.
    """

    __slots__ = (
        "_abandoned",
        "_cancel_queued",
        "_done",
        "_early",
        "_info",
        "_last_cancel_position",
        "_live",
        "_max_recorded",
        "_next_seq",
        "_patches",
        "_pending",
        "_progress",
        "_recorded",
        "_replay",
        "_signals",
        "_streams",
        "_updates",
        "gate",
    )

    def __init__(self) -> None:
        """An empty machine holding no run: :meth:`rebuild` it before use."""
        self._info = _NO_RUN
        self._next_seq = 0
        self._recorded: dict[int, _Op] = {}
        #: Highest position the loaded journal mentions (-1: none).
        self._max_recorded = -1
        self._replay: deque[_ReplayItem] = deque()
        self._pending: dict[int, _Op] = {}
        self._live: deque[_LiveItem] = deque()
        #: Completions reported before the code started their operation.
        self._early: dict[int, Completion] = {}
        #: The run's signal payloads in journal order (index = ordinal).
        self._signals: list[bytes] = []
        #: Latest heartbeat progress per step.
        self._progress: dict[int, bytes] = {}
        #: ``(position, patch id)`` decisions taken.
        self._patches: set[tuple[int, str]] = set()
        #: Updates accepted so far (the next one's ordinal).
        self._updates = 0
        #: Waits the code dropped, as recorded.
        self._abandoned: set[int] = set()
        self._cancel_queued = False
        self._last_cancel_position: int | None = None
        self._done: tuple[Status, bytes] | None = None
        self._streams: dict[str, _Stream] = {}
        #: LSN of the run's latest record: a step with effects runs only once
        #: the log is durable through it. The host sets it after each append.
        self.gate = 0

    # --- building ----------------------------------------------------------

    @classmethod
    def from_journal(cls, journal: Sequence[Record], gate: int) -> RunMachine:
        """A machine for the run whose records, in log order, are ``journal``
        (the first being its ``Start``); ``gate`` is the LSN of the last one.

        Raises :class:`DeterminismError` for a journal that contradicts itself.
        """
        m = cls()
        m.rebuild(journal, gate)
        return m

    @classmethod
    def fresh(cls, start: rec.Start, lsn: int) -> RunMachine:
        """A new run's machine: its journal is just ``start``, at ``lsn``."""
        return cls.from_journal((start,), lsn)

    def rebuild(self, journal: Sequence[Record], gate: int) -> None:
        """Makes this machine ``journal``'s run's, as :meth:`from_journal` does,
        so a shard can reuse machines. After an error it holds part of the
        journal and must be rebuilt again before use."""
        if not journal or type(journal[0]) is not rec.Start:
            raise DeterminismError("the journal does not begin with a start record")
        start = journal[0]
        assert isinstance(start, rec.Start)
        self._reset(start, gate)
        load = self._load
        for i in range(1, len(journal)):
            load(journal[i])

    def _reset(self, start: rec.Start, gate: int) -> None:
        self._info = RunInfo(
            start.run,
            start.id,
            start.wtype,
            start.version,
            start.codec,
            start.started_ms,
            start.deadline_ms,
            start.parent,
            start.policy,
            start.input,
            start.trace,
        )
        self._next_seq = 0
        self._recorded.clear()
        self._max_recorded = -1
        self._replay.clear()
        self._pending.clear()
        self._live.clear()
        self._early.clear()
        self._signals.clear()
        self._progress.clear()
        self._patches.clear()
        self._updates = 0
        self._abandoned.clear()
        self._cancel_queued = False
        self._last_cancel_position = None
        self._done = None
        self._streams.clear()
        self.gate = gate
        if start.update is not None:
            u = start.update
            self._replay.append(UpdateTurn(0, u.name, u.id, u.payload, None))
            self._updates = 1

    def release(self) -> None:
        """Lets go of the run: the machine holds nothing of it afterwards (keep
        it for :meth:`rebuild`)."""
        self._info = _NO_RUN
        self._recorded.clear()
        self._replay.clear()
        self._pending.clear()
        self._live.clear()
        self._early.clear()
        self._signals.clear()
        self._progress.clear()
        self._patches.clear()
        self._abandoned.clear()
        self._streams.clear()
        self._done = None
        self._next_seq = 0
        self._max_recorded = -1
        self._updates = 0
        self._cancel_queued = False
        self._last_cancel_position = None
        self.gate = 0

    def reusable(self) -> bool:
        """Whether the machine is small enough to be worth keeping for
        :meth:`rebuild` (a huge run's state is better left to the collector)."""
        limit = 64
        return (
            len(self._recorded) <= limit
            and len(self._replay) <= limit
            and len(self._pending) <= limit
            and len(self._live) <= limit
            and len(self._signals) <= limit
            and len(self._streams) <= limit
        )

    def _mark(self, seq: int, kind: OpKind, name: str) -> _Op:
        """The recorded entry at ``seq``, created or checked against ``kind``."""
        if seq > self._max_recorded:
            self._max_recorded = seq
        entry = self._recorded.get(seq)
        if entry is None:
            entry = self._recorded[seq] = _Op(kind, name)
            return entry
        if entry.kind is _STEP and kind is _AWAIT and not entry.delivered and not entry.marked:
            # Attempts came first; the operation turned out to be an async completion.
            entry.kind = _AWAIT
        if not _compatible(entry, kind) or (name and entry.name and entry.name != name):
            raise DeterminismError(
                f"the journal is inconsistent: {_describe(entry.kind, entry.name)} and "
                f"{_describe(kind, name)} share a position",
                seq,
            )
        if name and not entry.name:
            entry.name = name
        return entry

    def _load(self, r: Record) -> None:
        t = type(r)
        if t is rec.Step:
            assert isinstance(r, rec.Step)
            self._mark(r.seq, _STEP, r.name).delivered = True
            self._replay.append(Deliver(r.seq, Outcome(r.status, r.payload), None))
        elif t is rec.Attempt:
            assert isinstance(r, rec.Attempt)
            e = self._mark(r.seq, _STEP, r.name)
            e.attempt = r.attempt
            e.retry_at_ms = r.retry_at_ms
        elif t is rec.Resume:
            assert isinstance(r, rec.Resume)
            e = self._mark(r.seq, _STEP, "")
            e.retry_at_ms = 0
            e.base = r.attempt
        elif t is rec.Timer:
            assert isinstance(r, rec.Timer)
            self._mark(r.seq, _SLEEP, r.name).marked = True
        elif t is rec.Fired:
            assert isinstance(r, rec.Fired)
            self._mark(r.seq, _SLEEP, "").delivered = True
            self._replay.append(Deliver(r.seq, _EMPTY_OK, None))
        elif t is rec.Signal:
            assert isinstance(r, rec.Signal)
            self._signals.append(r.payload)
        elif t is rec.Wait:
            assert isinstance(r, rec.Wait)
            self._mark(r.seq, _WAIT, r.name).marked = True
        elif t is rec.Waited:
            assert isinstance(r, rec.Waited)
            self._load_waited(r)
        elif t is rec.Value:
            assert isinstance(r, rec.Value)
            e = self._mark(r.seq, _VALUE, "")
            e.marked = True
            e.value = r.value
            e.attempt = int(r.kind)
        elif t is rec.Child:
            assert isinstance(r, rec.Child)
            self._mark(r.seq, _CHILD, r.wtype).marked = True
        elif t is rec.ChildDone:
            assert isinstance(r, rec.ChildDone)
            self._mark(r.seq, _CHILD, "").delivered = True
            self._replay.append(Deliver(r.seq, Outcome(r.status, r.payload), None))
        elif t is rec.Send:
            assert isinstance(r, rec.Send)
            self._mark(r.seq, _SEND, r.name).marked = True
        elif t is rec.Cancel:
            assert isinstance(r, rec.Cancel)
            self._replay.append(_ReplayCancel(r.reason))
        elif t is rec.Done:
            assert isinstance(r, rec.Done)
            self._done = (r.status, r.payload)
        elif t is rec.Update:
            assert isinstance(r, rec.Update)
            self._replay.append(UpdateTurn(self._updates, r.name, r.id, r.payload, None))
            self._updates += 1
        elif t is rec.UpdateDone:
            assert isinstance(r, rec.UpdateDone)
            e = self._mark(r.seq, _UPDATE_DONE, "")
            e.marked = True
            e.attempt = r.ordinal
        elif t is rec.Heartbeat:
            assert isinstance(r, rec.Heartbeat)
            self._progress[r.seq] = r.payload
        elif t is rec.Awaiting:
            assert isinstance(r, rec.Awaiting)
            e = self._mark(r.seq, _AWAIT, r.name)
            e.marked = True
            e.attempt = r.attempt
        elif t is rec.Completed:
            assert isinstance(r, rec.Completed)
            self._mark(r.seq, _AWAIT, "").delivered = True
            self._replay.append(Deliver(r.seq, Outcome(r.status, r.payload), None))
        elif t is rec.Patch:
            assert isinstance(r, rec.Patch)
            self._patches.add((r.at, r.id))
        elif t is rec.Attributes:
            assert isinstance(r, rec.Attributes)
            self._mark(r.seq, _ATTRIBUTES, "").marked = True
        elif t is rec.Chunk:
            assert isinstance(r, rec.Chunk)
            st = self._stream_state(r.stream)
            st.len = max(st.len, r.offset + 1)
            if r.seq == WORKFLOW:
                st.replay_left += 1
            else:
                st.by_step[r.seq] = st.by_step.get(r.seq, 0) + 1
        elif t is rec.StreamEnd:
            assert isinstance(r, rec.StreamEnd)
            st = self._stream_state(r.stream)
            if st.closed is None:
                st.closed = r.seq
        elif t is rec.CancelRequest:
            pass  # the host's business: it holds steps back until the Cancel is delivered
        elif t is rec.Start:
            raise DeterminismError("the journal holds a second start record")
        else:  # pragma: no cover - every record kind is handled above
            raise AssertionError(f"unknown record {r!r}")

    def _load_waited(self, r: rec.Waited) -> None:
        if r.outcome == WaitOutcome.ABANDONED:
            self._mark(r.seq, _WAIT, "")
            self._abandoned.add(r.seq)
            return
        self._mark(r.seq, _WAIT, "").delivered = True
        if r.outcome == WaitOutcome.SIGNAL:
            if not 0 <= r.ordinal < len(self._signals):
                raise DeterminismError(
                    f"the wait consumed signal #{r.ordinal}, which the journal does not hold",
                    r.seq,
                )
            outcome = Outcome(Status.OK, self._signals[r.ordinal])
        else:
            outcome = _TIMED_OUT
        self._replay.append(Deliver(r.seq, outcome, None))

    # --- what the host asks ------------------------------------------------------

    @property
    def info(self) -> RunInfo:
        """The run's identity and input."""
        return self._info

    @property
    def run(self) -> int:
        """The run's numeric ID."""
        return self._info.run

    @property
    def next_seq(self) -> int:
        """The position the code's next operation takes."""
        return self._next_seq

    def journal_size(self) -> int:
        """Operations the code has started so far. Deterministic, so code may
        decide on it (for example, when to continue as new)."""
        return self._next_seq

    def recorded_done(self) -> tuple[Status, bytes] | None:
        """The recorded result, if the journal already holds ``Done``."""
        return self._done

    def is_replaying(self) -> bool:
        """The journal still holds deliveries the code has not been handed."""
        return bool(self._replay)

    def pending_len(self) -> int:
        """Operations started and not yet resolved."""
        return len(self._pending)

    def has_queued_deliveries(self) -> bool:
        """Completions, updates or a cancellation wait to be delivered."""
        return bool(self._live)

    def has_live_pending(self) -> bool:
        """Some started operation will be resolved by live work, or a live
        delivery is queued."""
        if self._live:
            return True
        return any(p.live for p in self._pending.values())

    def is_idle(self) -> bool:
        """Nothing is pending, queued or left to replay."""
        return not self._replay and not self._live and not self._pending

    def is_suspended(self, waiting_steps: Container[int] = ()) -> bool:
        """Replay is done, nothing is queued, and every pending operation waits
        on time, a signal, a child, an outside completion or a resume (or is a
        step in ``waiting_steps``: the host says it waits for a permit): the run
        may be parked out of memory."""
        if self._replay or self._live or not self._pending:
            return False
        for seq, p in self._pending.items():
            k = p.kind
            if not (
                k is _SLEEP or k is _WAIT or k is _CHILD or (k is _AWAIT and p.waiting) or p.paused
                or (k is _STEP and seq in waiting_steps)
            ):
                return False
        return True

    def key(self, seq: int) -> str:
        """The idempotency key of operation ``seq``: stable across retries and
        recovery, distinct across runs that reuse a workflow ID."""
        return f"{self._info.id}/{self._info.run}/{seq}"

    def pending_name(self, seq: int) -> str | None:
        """The name of a started, unresolved operation (for logs)."""
        p = self._pending.get(seq)
        return None if p is None else p.name

    def is_live_pending(self, seq: int) -> bool:
        """``seq`` is pending a live result."""
        p = self._pending.get(seq)
        return p is not None and p.live

    def pending_kind(self, seq: int) -> OpKind | None:
        """The kind of pending operation ``seq``."""
        p = self._pending.get(seq)
        return None if p is None else p.kind

    def delivers_only(self, seq: int) -> bool:
        """The next delivery is live step ``seq``'s queued result and nothing
        could come before or with it."""
        if self._replay or self._cancel_queued or len(self._pending) != 1 or len(self._live) != 1:
            return False
        item = self._live[0]
        if type(item) is not tuple or item[0] != seq or type(item[1]) is not StepDone:
            return False
        p = self._pending.get(seq)
        return p is not None and p.live and p.kind is _STEP

    def take_live_step(
        self, seq: int, status: Status, payload: bytes, began_us: int = 0, took_us: int = 0, queued_us: int = 0
    ) -> rec.Step | None:
        """Live step ``seq`` ended with ``(status, payload)``; if that result is
        the only delivery the run could take next (nothing to replay, no
        cancellation, no other operation pending, nothing queued, no stream of
        the step to end), it is taken at once: append the returned record, then
        resolve the step. ``None`` changes nothing: use :meth:`complete`."""
        pending = self._pending
        if self._replay or self._live or self._cancel_queued or len(pending) != 1:
            return None
        p = pending.get(seq)
        if p is None or not p.live or p.kind is not _STEP or p.queued:
            return None
        if self._streams and self.owns_streams(seq):
            return None
        del pending[seq]
        return rec.Step(self._info.run, seq, p.name, p.attempt, status, payload, began_us, took_us, queued_us)

    # --- starting operations ------------------------------------------------------

    def _check(self, seq: int, kind: OpKind, name: str) -> _Op | None:
        """The recorded entry at ``seq`` if any, after checking that the code's
        operation is the one recorded there."""
        r = self._recorded.get(seq)
        if r is not None and (
            not _compatible(r, kind) or (kind not in _UNNAMED and r.name != name)
        ):
            raise _mismatch(seq, r, kind, name)
        return r

    def _register(self, seq: int, p: _Op) -> None:
        self._pending[seq] = p
        if self._early:
            self._take_early(seq)

    def begin_step(self, name: str) -> tuple[int, StepRun | Literal[Marker.REPLAY]]:
        """The code starts step ``name``: its position, and whether to run its
        function (:class:`StepRun`) or wait for its recorded result (REPLAY)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        r = self._recorded.get(seq) if self._recorded else None
        if r is None:
            self._pending[seq] = _Op(_STEP, name, 1, live=True)
            if self._early:
                self._take_early(seq)
            return seq, _FIRST_RUN
        if r.kind is not _STEP or r.name != name:
            raise _mismatch(seq, r, _STEP, name)
        if r.delivered:
            self._pending[seq] = r
            return seq, REPLAY
        # The journal numbers attempts across resumes; the code counts them from
        # its last resume, as its retry budget does.
        attempt = r.attempt + 1
        paused = r.retry_at_ms == PAUSED
        self._register(seq, _Op(_STEP, name, attempt, live=True, paused=paused))
        return seq, StepRun(attempt - r.base, r.retry_at_ms)

    def begin_await(self, name: str) -> tuple[int, StepRun | AwaitWaiting | Literal[Marker.REPLAY]]:
        """The code starts an async completion ``name``: like a step whose result
        comes from outside; the function that hands out the token runs as a
        step's does (StepRun), unless its token is out already (AwaitWaiting)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        r = self._check(seq, _AWAIT, name)
        start: StepRun | AwaitWaiting | Literal[Marker.REPLAY]
        if r is None:
            start = _FIRST_RUN
            p = _Op(_AWAIT, name, 1, live=True)
        elif r.delivered:
            self._pending[seq] = r
            return seq, REPLAY
        elif r.marked and r.kind is _AWAIT:
            start = AwaitWaiting(r.attempt)
            p = _Op(_AWAIT, name, r.attempt, live=True, waiting=True)
        else:
            start = StepRun(r.attempt + 1, r.retry_at_ms)
            p = _Op(_AWAIT, name, r.attempt + 1, live=True, paused=r.retry_at_ms == PAUSED)
        self._register(seq, p)
        return seq, start

    def awaiting(self, seq: int) -> rec.Awaiting | None:
        """The token function of async completion ``seq`` returned: its current
        attempt's token is out. Returns the ``Awaiting`` record to append."""
        p = self._pending.get(seq)
        if p is None or not p.live or p.kind is not _AWAIT or p.waiting:
            return None
        p.waiting = True
        return rec.Awaiting(self._info.run, seq, p.name, p.attempt)

    def await_attempt(self, seq: int) -> int | None:
        """The attempt the current token of async completion ``seq`` names."""
        p = self._pending.get(seq)
        if p is None or p.kind is not _AWAIT or not p.live:
            return None
        return p.attempt

    def step_retry(
        self, seq: int, retry_at_ms: int, error: bytes, began_us: int = 0, took_us: int = 0, queued_us: int = 0
    ) -> rec.Attempt | None:
        """An attempt of live step ``seq`` failed and will be retried at
        ``retry_at_ms`` (``PAUSED``: retries ran out, wait for a resume);
        the times are the attempt's (see ``records.Step``). Returns the
        ``Attempt`` record to append; the shard arms the retry timer from it."""
        p = self._pending.get(seq)
        if p is None or not p.live:
            return None
        record = rec.Attempt(self._info.run, seq, p.name, p.attempt, retry_at_ms, error, began_us, took_us, queued_us)
        p.attempt += 1
        p.waiting = False
        p.paused = retry_at_ms == PAUSED
        return record

    def step_paused(self, seq: int) -> bool:
        """Step ``seq`` is paused (retries ran out, no resume yet)."""
        p = self._pending.get(seq)
        return p is not None and p.paused

    def step_pending(self, seq: int) -> bool:
        """Step ``seq`` still waits for its function to run (not resolved, by a
        cancellation for example)."""
        p = self._pending.get(seq)
        return p is not None and p.live and not p.queued

    def step_attempt(self, seq: int) -> int | None:
        """The journal's number of the attempt step ``seq`` runs next."""
        p = self._pending.get(seq)
        return None if p is None else p.attempt

    def _recorded_paused(self) -> list[int]:
        """Recorded paused steps the code has not reached yet, by position."""
        # Once the code reached a step, its pending entry says whether it is
        # paused: the recorded entry would still say so after a resume.
        reached = self._next_seq
        return sorted(
            seq
            for seq, r in self._recorded.items()
            if seq >= reached and r.kind is _STEP and r.retry_at_ms == PAUSED and not r.delivered
        )

    def is_paused(self) -> bool:
        """Some step of the run is paused, whether or not the code reached it."""
        return any(p.paused for p in self._pending.values()) or bool(self._recorded_paused())

    def resume(self, by: bytes | None = None) -> list[rec.Resume]:
        """Resumes every paused step with a fresh retry budget; each runs its
        next attempt at once. Returns the ``Resume`` records to append, by
        position (none when nothing was paused)."""
        run = self._info.run
        out: list[tuple[int, int]] = []
        for seq, p in self._pending.items():
            if p.paused:
                p.paused = False
                out.append((seq, p.attempt - 1))
        for seq in self._recorded_paused():
            r = self._recorded[seq]
            r.retry_at_ms = 0
            r.base = r.attempt
            out.append((seq, r.attempt))
        out.sort()
        return [rec.Resume(run, seq, attempt, by) for seq, attempt in out]

    def heartbeat(self, seq: int, payload: bytes) -> rec.Heartbeat | None:
        """Running step ``seq`` reported progress. Returns the ``Heartbeat``
        record (the host may coalesce: only the latest per step matters)."""
        p = self._pending.get(seq)
        if p is None or not p.live or (p.kind is not _STEP and p.kind is not _AWAIT):
            return None
        self._progress[seq] = payload
        return rec.Heartbeat(self._info.run, seq, p.attempt, payload)

    def progress(self, seq: int) -> bytes | None:
        """The latest progress step ``seq`` reported, in this life or an earlier one."""
        return self._progress.get(seq)

    # --- streams -----------------------------------------------------------------

    def _stream_state(self, name: str) -> _Stream:
        st = self._streams.get(name)
        if st is None:
            st = self._streams[name] = _Stream(name)
        return st

    def _stream_step(self, seq: int, what: str) -> int:
        """The attempt of live step ``seq``, which must be running."""
        p = self._pending.get(seq)
        if p is None or not p.live or (p.kind is not _STEP and p.kind is not _AWAIT) or p.waiting:
            raise StreamError(
                f"{what} was called from the step at journal position {seq}, which is no "
                "longer running: write a step's stream from inside its function only"
            )
        return p.attempt

    @staticmethod
    def _owned_elsewhere(name: str, owner: int) -> StreamError:
        return StreamError(
            f"stream '{name}' is written by the step at journal position {owner}: "
            "a stream a step opened belongs to that step until its result"
        )

    def stream_open(self, name: str, step: int | None) -> StreamOpen:
        """Workflow code (``step`` None) or the function of the step at ``step``
        opens stream ``name``. A stream belongs to whoever opens it first in this
        life: workflow code, whose steps may append to it too, or one step,
        whose final result completes it. Raises :class:`StreamError` on misuse."""
        if step is not None:
            self._stream_step(step, "stream open")
        st = self._stream_state(name)
        owner = st.owner
        if step is None:
            if owner is not None and owner != WORKFLOW:
                raise self._owned_elsewhere(name, owner)
            st.owner = WORKFLOW
            return StreamOpen(0, st.closed is not None)
        if owner is not None and owner != WORKFLOW and owner != step:
            raise self._owned_elsewhere(name, owner)
        if owner is None and st.closed is None:
            st.owner = step
        return StreamOpen(st.by_step.get(step, 0), st.closed is not None)

    def stream_append(self, name: str, step: int | None, payload: bytes) -> rec.Chunk | None:
        """Appends a chunk to stream ``name`` from workflow code (``step`` None)
        or from the function of the step at ``step``. Returns the ``Chunk`` to
        append, or None when there is nothing to append: workflow code replaying
        a chunk its journal holds, or a step whose earlier attempt completed the
        stream. Raises :class:`StreamError` on misuse."""
        attempt = 0 if step is None else self._stream_step(step, "stream append")
        st = self._stream_state(name)
        if step is None:
            if st.replay_left > 0:
                st.replay_left -= 1
                return None
            if st.owner is not None and st.owner != WORKFLOW:
                raise self._owned_elsewhere(name, st.owner)
            writer = WORKFLOW
        else:
            if st.closed == step:
                return None
            if st.owner is not None and st.owner != WORKFLOW and st.owner != step:
                raise self._owned_elsewhere(name, st.owner)
            writer = step
        if st.closed is not None:
            raise StreamError(f"stream '{name}' is closed: no chunk can be appended to it")
        if writer == WORKFLOW:
            st.owner = WORKFLOW
        else:
            if st.owner is None:
                st.owner = writer
            st.by_step[writer] = st.by_step.get(writer, 0) + 1
        offset = st.len
        st.len = offset + 1
        return rec.Chunk(self._info.run, writer, attempt, name, offset, payload)

    def stream_close(self, name: str, step: int | None) -> rec.StreamEnd | None:
        """Completes stream ``name`` from workflow code (``step`` None) or a
        step. Returns the ``StreamEnd`` to append, or None when the stream is
        complete already (replay included). Raises :class:`StreamError` on misuse."""
        if step is not None:
            self._stream_step(step, "stream close")
        st = self._stream_state(name)
        if st.closed is not None:
            return None
        owner = st.owner
        if owner is not None and owner != WORKFLOW and owner != step:
            raise self._owned_elsewhere(name, owner)
        writer = WORKFLOW if step is None else step
        st.closed = writer
        if owner == writer:
            st.owner = None
        return rec.StreamEnd(self._info.run, writer, name, st.len, Status.OK)

    def stream_ends(self, seq: int, status: Status) -> list[rec.StreamEnd]:
        """Step ``seq`` got its final result ``status``: the streams it opened
        and did not close are complete. Returns their ``StreamEnd`` records, to
        append just before the result's record."""
        out: list[rec.StreamEnd] = []
        for st in self._streams.values():
            if st.owner != seq:
                continue
            st.owner = None
            if st.closed is None:
                st.closed = seq
                out.append(rec.StreamEnd(self._info.run, seq, st.name, st.len, status))
        return out

    def owns_streams(self, seq: int) -> bool:
        """Some stream belongs to the step at ``seq`` in this life."""
        if not self._streams:
            return False
        return any(st.owner == seq for st in self._streams.values())

    def stream_len(self, name: str) -> int | None:
        """Chunks of stream ``name`` the journal and this life hold so far."""
        st = self._streams.get(name)
        return None if st is None else st.len

    # --- sleeps, waits, children ---------------------------------------------------

    def _arm(
        self, seq: int, kind: OpKind, name: str, make: Callable[[], Record], register: bool
    ) -> Append | Literal[Marker.REPLAY, Marker.ARMED]:
        r = self._check(seq, kind, name)
        arm: Append | Literal[Marker.REPLAY, Marker.ARMED]
        if r is not None and r.delivered:
            if register:
                self._register(seq, r)
            return REPLAY
        arm = ARMED if r is not None and r.marked else Append(make())
        if register:
            self._register(seq, _Op(kind, name, live=True))
        return arm

    def begin_sleep(
        self, name: str, fire_at_ms: int, began_ms: int = 0
    ) -> tuple[int, Append | Literal[Marker.REPLAY, Marker.ARMED]]:
        """The code starts sleep ``name`` at ``began_ms`` until ``fire_at_ms``."""
        seq = self._next_seq
        self._next_seq = seq + 1
        run = self._info.run
        return seq, self._arm(
            seq, _SLEEP, name, lambda: rec.Timer(run, seq, name, fire_at_ms, began_ms), True
        )

    def begin_wait(
        self, name: str, deadline_ms: int, began_ms: int = 0
    ) -> tuple[int, Append | Literal[Marker.REPLAY, Marker.ARMED]]:
        """The code starts waiting for signal ``name`` at ``began_ms`` until
        ``deadline_ms`` (0: no deadline). Which signal it takes is the host's
        decision."""
        seq = self._next_seq
        self._next_seq = seq + 1
        run = self._info.run
        return seq, self._arm(seq, _WAIT, name, lambda: rec.Wait(run, seq, name, deadline_ms, began_ms), True)

    def begin_child(
        self, wtype: str, id: str, flags: int, deadline_ms: int, input: bytes
    ) -> tuple[int, Append | Literal[Marker.REPLAY, Marker.ARMED]]:
        """The code starts child run ``id`` of type ``wtype``. A detached child
        (``flags & DETACHED``) resolves at once with nothing: it takes no
        pending entry and gets no delivery."""
        seq = self._next_seq
        self._next_seq = seq + 1
        run = self._info.run
        return seq, self._arm(
            seq,
            _CHILD,
            wtype,
            lambda: rec.Child(run, seq, wtype, id, flags, deadline_ms, input),
            not flags & DETACHED,
        )

    def _take_early(self, seq: int) -> None:
        c = self._early.pop(seq, None)
        if c is None or not self.is_live_pending(seq):
            return
        if type(c) is AsyncCompleted and self.await_attempt(seq) != c.attempt:
            return
        self._pending[seq].queued = True
        self._live.append((seq, c))

    # --- positional operations without a delivery --------------------------------------

    def value(
        self, kind: ValueKind, make: Callable[[], bytes]
    ) -> tuple[int, bytes, rec.Value | None]:
        """A recorded nondeterministic value: the recorded one on replay, else
        ``make()``'s, returned with the ``Value`` record to append."""
        seq = self._next_seq
        self._next_seq = seq + 1
        r = self._check(seq, _VALUE, "")
        if r is not None:
            if r.attempt != kind:
                raise DeterminismError(
                    f"the journal recorded a {ValueKind(r.attempt).name.lower()} value here "
                    f"but the code asked for a {ValueKind(kind).name.lower()} value",
                    seq,
                )
            return seq, r.value, None
        v = make()
        return seq, v, rec.Value(self._info.run, seq, kind, v)

    def now(self, now_ms: int) -> tuple[int, rec.Value | None]:
        """``ctx.now()``: the recorded time on replay, else ``now_ms``, stored
        as 8 little-endian bytes; returned with the record to append."""
        _, v, record = self.value(ValueKind.NOW, lambda: now_ms.to_bytes(8, "little"))
        return (int.from_bytes(v, "little") if len(v) == 8 else 0), record

    def send(self, target: str, name: str, payload: bytes) -> tuple[int, rec.Send | None]:
        """Sends signal ``name`` to workflow ``target`` once the returned record
        is durable (None on replay: it was sent, or will be, from the journal)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        if self._check(seq, _SEND, name) is not None:
            return seq, None
        return seq, rec.Send(self._info.run, seq, target, name, payload)

    def set_attributes(self, payload: bytes) -> tuple[int, rec.Attributes | None]:
        """Records search attributes; the record to append (None on replay)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        if self._check(seq, _ATTRIBUTES, "") is not None:
            return seq, None
        return seq, rec.Attributes(self._info.run, seq, payload)

    def patched(self, patch_id: str) -> tuple[bool, rec.Patch | None]:
        """``ctx.patched(patch_id)``: true for new runs and for running ones
        reaching this point past their journal; false while replaying a journal
        that passed this point before the patch. Takes no position. Returns the
        ``Patch`` marker to append when the decision is new."""
        at = self._next_seq
        key = (at, patch_id)
        if key in self._patches:
            return True, None
        if self._max_recorded < at:
            self._patches.add(key)
            return True, rec.Patch(self._info.run, at, patch_id)
        return False, None

    # --- updates -------------------------------------------------------------------

    def update_done(
        self, ordinal: int, status: Status, payload: bytes
    ) -> tuple[int, rec.UpdateDone | None]:
        """The handler of update ``ordinal`` returned. Returns the
        ``UpdateDone`` record to append (None on replay, after checking that
        the journal recorded this update's result here)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        r = self._check(seq, _UPDATE_DONE, "")
        if r is not None:
            if r.attempt != ordinal:
                raise DeterminismError(
                    f"the journal recorded the result of update #{r.attempt} here "
                    f"but the code returned update #{ordinal}",
                    seq,
                )
            return seq, None
        return seq, rec.UpdateDone(self._info.run, seq, ordinal, status, payload)

    def offer_update(self, token: int, name: str, id: str, payload: bytes) -> None:
        """Queues a new update request; it reaches the code at its turn
        (an :class:`UpdateTurn` with ``live=token``), where the host runs its
        validator."""
        self._live.append(_LiveUpdate(token, name, id, payload))

    def accept_update(self, name: str, id: str, payload: bytes) -> tuple[int, rec.Update]:
        """The validator accepted the live update :meth:`next` handed out.
        Returns its ordinal and the ``Update`` record to append before the
        handler starts."""
        ordinal = self._updates
        self._updates = ordinal + 1
        return ordinal, rec.Update(self._info.run, name, id, payload, None)

    def take_offered_updates(self) -> list[int]:
        """Removes the update requests still queued and returns their tokens
        (their callers are told the run ended)."""
        tokens: list[int] = []
        kept: deque[_LiveItem] = deque()
        for item in self._live:
            if type(item) is _LiveUpdate:
                tokens.append(item.token)
            else:
                kept.append(item)
        self._live = kept
        return tokens

    # --- completions and cancellation ------------------------------------------------

    def complete(self, seq: int, completion: Completion) -> bool:
        """Reports a live completion of operation ``seq``. One the code has not
        started yet (replay is behind) is held until it does; one for an
        operation not pending live (dropped, resolved, replayed), a repeated one
        or a stale attempt's is ignored. Returns whether it was queued now."""
        if seq >= self._next_seq:
            self._early[seq] = completion
            return False
        p = self._pending.get(seq)
        if p is None or not p.live or p.queued:
            return False
        if type(completion) is AsyncCompleted and (
            p.kind is not _AWAIT or p.attempt != completion.attempt
        ):
            return False
        assert isinstance(completion, _COMPLETES[p.kind]), (p.kind, completion)
        p.queued = True
        self._live.append((seq, completion))
        return True

    def cancellation_covers_current_operations(self) -> bool:
        """A cancellation was delivered at the current position and nothing
        was started since: a repeated request has nothing new to cancel.
        (A compensation step takes a new position and can be cancelled again.)"""
        return not self._pending and self._last_cancel_position == self._next_seq

    def request_cancel(self, reason: bytes, by: bytes | None = None) -> None:
        """Queues cancellation (``by``: who asked, for the audit). It reaches
        the code at its turn like any delivery, so replay cancels exactly the
        same operations. At most one is queued at a time."""
        if not self._cancel_queued and not self.cancellation_covers_current_operations():
            self._cancel_queued = True
            self._live.append(_LiveCancel(reason, by))

    def forget(self, seq: int) -> rec.Waited | None:
        """The code dropped live operation ``seq`` (the losing side of a race):
        its result will never be delivered. For a wait, returns the abandoned
        ``Waited`` record to append (once: None when it is recorded)."""
        p = self._pending.get(seq)
        if p is None or not p.live:
            return None
        del self._pending[seq]
        if p.kind is not _WAIT or seq in self._abandoned:
            return None
        self._abandoned.add(seq)
        return rec.Waited(self._info.run, seq, WaitOutcome.ABANDONED, 0)

    def _drain_pending(self) -> list[int]:
        seqs = sorted(self._pending)
        self._pending.clear()
        return seqs

    def next(self) -> Deliver | CancelAll | UpdateTurn | Literal[Marker.STALLED, Marker.IDLE]:
        """The one delivery to hand the code now. Call only when the code is
        quiescent; resolve what it returns, let the code run, then call again.
        STALLED: replay waits for the code to start the operation the journal
        delivers next. IDLE: nothing to deliver."""
        replay = self._replay
        if replay:
            front = replay[0]
            if type(front) is Deliver:
                seq = front.seq
                p = self._pending.get(seq)
                if p is None or p.live:
                    return STALLED
                del self._pending[seq]
                replay.popleft()
                return front
            replay.popleft()
            if type(front) is _ReplayCancel:
                self._last_cancel_position = self._next_seq
                return CancelAll(self._drain_pending(), front.reason, None)
            assert type(front) is UpdateTurn
            return front
        live = self._live
        pending = self._pending
        while live:
            item = live.popleft()
            if type(item) is tuple:
                seq, c = item
                p = pending.get(seq)
                if p is None or not p.live:
                    continue  # resolved meanwhile (cancelled or forgotten)
                del pending[seq]
                run = self._info.run
                t = type(c)
                record: Record
                if t is StepDone:
                    assert isinstance(c, StepDone)
                    if p.kind is _STEP:
                        record = rec.Step(run, seq, p.name, p.attempt, c.status, c.payload,
                                          c.began_us, c.took_us, c.queued_us)
                    else:
                        record = rec.Completed(run, seq, p.attempt, c.status, c.payload)
                    return Deliver(seq, Outcome(c.status, c.payload), record)
                if t is Fired:
                    return Deliver(seq, _EMPTY_OK, rec.Fired(run, seq))
                if t is SignalTaken:
                    assert isinstance(c, SignalTaken)
                    record = rec.Waited(run, seq, WaitOutcome.SIGNAL, c.ordinal)
                    return Deliver(seq, Outcome(Status.OK, c.payload), record)
                if t is WaitTimedOut:
                    return Deliver(seq, _TIMED_OUT, rec.Waited(run, seq, WaitOutcome.TIMED_OUT, 0))
                if t is ChildResult:
                    assert isinstance(c, ChildResult)
                    record = rec.ChildDone(run, seq, c.status, c.payload)
                    return Deliver(seq, Outcome(c.status, c.payload), record)
                assert isinstance(c, AsyncCompleted)
                record = rec.Completed(run, seq, c.attempt, c.status, c.payload, c.by)
                return Deliver(seq, Outcome(c.status, c.payload), record)
            if type(item) is _LiveCancel:
                self._cancel_queued = False
                self._last_cancel_position = self._next_seq
                record = rec.Cancel(self._info.run, item.reason, item.by)
                return CancelAll(self._drain_pending(), item.reason, record)
            assert type(item) is _LiveUpdate
            return UpdateTurn(self._updates, item.name, item.id, item.payload, item.token)
        return IDLE

    # --- the end ---------------------------------------------------------------------

    def stall_error(self) -> DeterminismError | None:
        """Explains a stall the host confirmed (the code is quiescent and
        :meth:`next` said STALLED): None while live work is pending, which
        may still let the code reach the operation."""
        if self.has_live_pending() or not self._replay:
            return None
        front = self._replay[0]
        if type(front) is not Deliver:
            return None
        r = self._recorded.get(front.seq)
        what = "an operation" if r is None else _describe(r.kind, r.name)
        return DeterminismError(
            f"the journal delivers {what} next, but the code is waiting without having started it",
            front.seq,
        )

    def check_end(self) -> None:
        """Checks that the code may return here: its journal has nothing left to
        deliver. Raises :class:`DeterminismError` otherwise."""
        replay = self._replay
        if not replay:
            return
        # Repeated cancels can sit between the delivery that settled the
        # workflow's last future and the return of its code.
        if self.cancellation_covers_current_operations() and all(
            type(item) is _ReplayCancel for item in replay
        ):
            return
        front = replay[0]
        seq = front.seq if type(front) is Deliver else None
        raise DeterminismError(
            f"the workflow returned but its journal holds {len(replay)} more deliveries",
            seq,
        )

    def finish(self, status: Status, payload: bytes, finished_ms: int) -> rec.Done:
        """The code returned: checks the end (:meth:`check_end`) and returns the
        ``Done`` record to append."""
        self.check_end()
        return rec.Done(self._info.run, status, finished_ms, payload, None)
