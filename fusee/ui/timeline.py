"""A run's journal as a timeline: its operations as lanes, what came from outside as marks.

Step attempts journal when they began, how long they ran and how long they
queued; sleeps and waits when they began; the run its start and end. With
those the run page draws a waterfall on a time axis (``Operation.began_ms``,
``ended_ms`` and one ``Span`` per attempt): what the journal does not time
(a wait's end, a signal's arrival) is placed at the nearest time journaled
around it (``_place_in_time``).

A journal written before step times records the order of events only, so its
timeline's axis is the journal's order: column ``i`` is the ``i``-th record. An operation's bar runs from when the code issued it to its
outcome record. When it was issued is not journaled for a step that
succeeded first time (its only record is its outcome), so it is inferred:
operations are issued in position order, each no earlier than the one before
it and no later than its own first record (both hold for any code), and an
operation is taken to be issued once every earlier one ended, as code that
awaits each step (or a ``gather`` of them) does. That places sequential and
gathered steps where they really ran; a step left running in a background
task only makes later bars start late, never end wrong.
"""

from __future__ import annotations

import dataclasses

from fusee.core import records as rec
from fusee.flow import schedules, windows
from fusee.ui import present

#: Signals the engine's own runs wait for with a timeout and never send: such a wait is a
#: timer (its timeout is the normal end), not a wait that timed out.
TIMER_SIGNALS = frozenset({schedules.TIMER.name, windows.TIMER.name})

#: How the lanes of the kinds of operations are labelled.
KIND_LABEL = {
    "step": "step",
    "sleep": "sleep",
    "wait": "wait for signal",
    "child": "child",
    "completion": "completion",
    "update": "update",
}


@dataclasses.dataclass
class AttemptMark:
    """A failed attempt of a step: where it is in the journal and why it failed."""

    index: int
    attempt: int
    error: str
    #: When the next attempt is due ("" once retries ran out: paused).
    retry_at: str
    paused: bool


@dataclasses.dataclass
class Span:
    """One attempt of a step on the time axis (engine clock, epoch milliseconds)."""

    attempt: int
    #: "ok", "failed", "cancelled", "timed_out", "retried" or "paused".
    status: str
    began_ms: float
    ended_ms: float
    #: How long it waited for a permit or a pool thread before ``began_ms``.
    queued_ms: float
    error: str = ""

    @property
    def took_ms(self) -> float:
        return self.ended_ms - self.began_ms


@dataclasses.dataclass
class Operation:
    """One operation the run's code issued (a lane of the timeline)."""

    seq: int
    kind: str
    name: str
    #: Journal index of its first record.
    first: int
    #: Journal index of its outcome record (None: not ended).
    end: int | None = None
    #: "ok", "failed", "cancelled", "timed_out", "running", "retrying", "paused", ...
    status: str = "running"
    #: The outcome as short text (result, error, signal value...).
    outcome: str = ""
    attempts: list[AttemptMark] = dataclasses.field(default_factory=list)
    heartbeats: int = 0
    #: The ID of a child workflow (its lane links to it).
    child_id: str | None = None
    #: A due time worth showing (a timer's, a wait's deadline).
    due: str = ""
    #: Journal index after which the code issued it (inferred, see the module's doc).
    issued: int = 0
    #: When it began and ended on the engine's clock (epoch ms), journaled or placed (None: unknown,
    #: or not ended).
    began_ms: float | None = None
    ended_ms: float | None = None
    #: A step's timed attempts, one bar each.
    spans: list[Span] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return KIND_LABEL.get(self.kind, self.kind)


@dataclasses.dataclass
class Mark:
    """Something that reached the run from outside (or left it): a signal, an update, a cancel."""

    index: int
    kind: str
    label: str
    detail: str = ""


@dataclasses.dataclass
class Event:
    """One journal record as a row of the history table."""

    index: int
    kind: str
    summary: str
    #: The record's values as text (payloads decoded).
    detail: str
    css: str = ""


@dataclasses.dataclass
class Timeline:
    """What the run page shows of a run's journal."""

    length: int
    operations: list[Operation]
    marks: list[Mark]
    events: list[Event]
    started_ms: int | None = None
    ended_ms: int | None = None
    #: The run's input and its outcome (result, error or reason) as text.
    input: str = ""
    outcome: str = ""
    outcome_status: str = ""
    traceback: str | None = None
    parent: str | None = None
    streams: list[str] = dataclasses.field(default_factory=list)
    #: Names of the steps a reset may cut before, in journal order.
    step_names: list[str] = dataclasses.field(default_factory=list)
    #: The journal times its operations (written since step times): draw it on a time axis.
    timed: bool = False
    #: Each record's place on the time axis (epoch ms), when ``timed``.
    times: list[float] = dataclasses.field(default_factory=list)

    @property
    def awaited(self) -> list[str]:
        """The signals the run's code waits for now."""
        return [op.name for op in self.operations if op.kind == "wait" and op.end is None]

    @property
    def children(self) -> list[Operation]:
        return [op for op in self.operations if op.child_id is not None]


def _status(status: rec.Status) -> str:
    return status.name.lower()


def _by(by: bytes | None) -> str:
    return f" by {by.decode('utf-8', 'replace')}" if by else ""


def build(journal: list[rec.Record]) -> Timeline:
    """The timeline of a run's journal (its current run's durable records, in order)."""
    ops: dict[int, Operation] = {}
    marks: list[Mark] = []
    events: list[Event] = []
    tl = Timeline(len(journal), [], marks, events)
    # Times the journal gives, by record index (epoch ms), and each sleep's due time by position.
    known: dict[int, float] = {}
    fire_at: dict[int, int] = {}
    # The first and last journal index of every position (operations and values alike).
    span: dict[int, list[int]] = {}
    streams: dict[str, None] = {}
    step_names: dict[str, None] = {}

    def op(seq: int, kind: str, name: str, i: int) -> Operation:
        found = ops.get(seq)
        if found is None:
            found = ops[seq] = Operation(seq, kind, name, i)
        return found

    for i, r in enumerate(journal):
        seq = getattr(r, "seq", None)
        if isinstance(seq, int) and seq != rec.WORKFLOW:
            s = span.setdefault(seq, [i, i])
            s[1] = i
        kind = type(r).__name__
        summary, detail, css = kind, "", ""
        if isinstance(r, rec.Start):
            tl.started_ms = r.started_ms
            known[i] = r.started_ms
            tl.input = present.payload_text(r.input, None)
            if r.parent is not None:
                tl.parent = r.parent.id
            summary = f"started {r.wtype} v{r.version}{_by(r.by)}"
            detail = f"input: {present.payload_text(r.input)}"
            if r.update is not None:
                marks.append(Mark(i, "update", f"update {r.update.name}", present.payload_text(r.update.payload)))
        elif isinstance(r, rec.Step):
            o = op(r.seq, "step", r.name, i)
            o.end, o.status = i, _status(r.status)
            o.outcome = (present.payload_text(r.payload) if r.status == rec.Status.OK
                         else present.error_text(r.payload))
            if r.began_us:
                o.spans.append(Span(r.attempt, o.status, r.began_us / 1000, (r.began_us + r.took_us) / 1000,
                                    r.queued_us / 1000, "" if r.status == rec.Status.OK else o.outcome))
                known[i] = (r.began_us + r.took_us) / 1000
            step_names[r.name] = None
            summary = f"step {r.name} {o.status} (attempt {r.attempt})"
            detail = o.outcome
            css = "bad" if r.status != rec.Status.OK else "good"
        elif isinstance(r, rec.Attempt):
            o = op(r.seq, "step", r.name, i)
            paused = r.retry_at_ms == rec.PAUSED
            err = present.error_text(r.error)
            o.attempts.append(AttemptMark(i, r.attempt, err, "" if paused else present.when(r.retry_at_ms), paused))
            o.status = "paused" if paused else "retrying"
            if r.began_us:
                o.spans.append(Span(r.attempt, "paused" if paused else "retried", r.began_us / 1000,
                                    (r.began_us + r.took_us) / 1000, r.queued_us / 1000, err))
                known[i] = (r.began_us + r.took_us) / 1000
            step_names[r.name] = None
            summary = f"step {r.name} attempt {r.attempt} failed"
            detail = err + (" — retries ran out: paused until resumed" if paused
                            else f" — next attempt at {present.when(r.retry_at_ms)}")
            css = "bad"
        elif isinstance(r, rec.Resume):
            if r.seq in ops:
                ops[r.seq].status = "retrying"
            marks.append(Mark(i, "resume", "resume", _by(r.by).strip()))
            summary = f"resumed after attempt {r.attempt}{_by(r.by)}"
        elif isinstance(r, rec.Timer):
            o = op(r.seq, "sleep", r.name, i)
            o.due = present.when(r.fire_at_ms)
            fire_at[r.seq] = r.fire_at_ms
            if r.began_ms:
                o.began_ms = known[i] = r.began_ms
            summary = f"sleep {r.name} until {o.due}"
        elif isinstance(r, rec.Fired):
            if r.seq in ops:
                o = ops[r.seq]
                o.end, o.status = i, "ok"
                summary = f"timer {o.name} fired"
                if r.seq in fire_at and o.began_ms is not None:
                    known[i] = fire_at[r.seq]
        elif isinstance(r, rec.Wait) and r.name in TIMER_SIGNALS:
            o = op(r.seq, "sleep", "timer", i)
            o.due = present.when(r.deadline_ms) if r.deadline_ms else ""
            if r.deadline_ms:
                fire_at[r.seq] = r.deadline_ms
            if r.began_ms:
                o.began_ms = known[i] = r.began_ms
            summary = f"timer until {o.due}"
        elif isinstance(r, rec.Wait):
            o = op(r.seq, "wait", r.name, i)
            o.due = present.when(r.deadline_ms) if r.deadline_ms else ""
            if r.began_ms:
                o.began_ms = known[i] = r.began_ms
            summary = f"wait for signal {r.name}" + (f" until {o.due}" if o.due else "")
        elif isinstance(r, rec.Waited) and r.seq in ops and ops[r.seq].kind == "sleep":
            o = ops[r.seq]
            o.end = i
            fired = r.outcome == rec.WaitOutcome.TIMED_OUT
            o.status = "ok" if fired else "abandoned"
            if fired and r.seq in fire_at and o.began_ms is not None:
                known[i] = fire_at[r.seq]
            summary = "timer fired" if fired else "timer cut short (a control request came first)"
        elif isinstance(r, rec.Waited):
            if r.seq in ops:
                o = ops[r.seq]
                o.end = i
                o.status = {rec.WaitOutcome.SIGNAL: "ok", rec.WaitOutcome.TIMED_OUT: "timed_out"}.get(
                    r.outcome, "abandoned")
                summary = f"wait for {o.name}: {r.outcome.name.lower()}"
        elif isinstance(r, rec.Signal):
            value = present.payload_text(r.payload)
            marks.append(Mark(i, "signal", f"signal {r.name}", value + _by(r.by)))
            summary = f"signal {r.name} received{_by(r.by)}"
            detail = value
            css = "mark"
        elif isinstance(r, rec.Value):
            summary = f"recorded {r.kind.name.lower()}"
            detail = present.payload_text(r.value)
        elif isinstance(r, rec.Child):
            o = op(r.seq, "child", r.wtype, i)
            o.child_id = r.id
            summary = f"child {r.wtype} {r.id} started"
            detail = f"input: {present.payload_text(r.input)}"
        elif isinstance(r, rec.ChildDone):
            if r.seq in ops:
                o = ops[r.seq]
                o.end, o.status = i, _status(r.status)
                o.outcome = (present.payload_text(r.payload) if r.status == rec.Status.OK
                             else present.error_text(r.payload))
                summary = f"child {o.child_id} {o.status}"
                detail = o.outcome
                css = "bad" if r.status != rec.Status.OK else "good"
        elif isinstance(r, rec.Send):
            marks.append(Mark(i, "send", f"send {r.name} to {r.target}", present.payload_text(r.payload)))
            summary = f"signal {r.name} sent to {r.target}"
            detail = present.payload_text(r.payload)
        elif isinstance(r, rec.CancelRequest):
            reason = r.reason.decode("utf-8", "replace")
            marks.append(Mark(i, "cancel", "cancel requested", reason + _by(r.by)))
            summary = f"cancel requested{_by(r.by)}"
            detail, css = reason, "mark"
        elif isinstance(r, rec.Cancel):
            reason = r.reason.decode("utf-8", "replace")
            summary = f"cancel delivered{_by(r.by)}"
            detail, css = reason, "mark"
        elif isinstance(r, rec.Done):
            tl.ended_ms = r.finished_ms
            known[i] = r.finished_ms
            tl.outcome_status = _status(r.status)
            if r.status in (rec.Status.OK, rec.Status.CONTINUED):
                tl.outcome = present.payload_text(r.payload, None)
            elif r.status == rec.Status.TERMINATED:
                tl.outcome = r.payload.decode("utf-8", "replace")
            else:
                tl.outcome = present.error_text(r.payload, None)
                tl.traceback = present.traceback_of(r.payload)
            summary = f"run ended: {tl.outcome_status}{_by(r.by)}"
            detail = present.clip(tl.outcome, present.SHORT)
            css = "good" if r.status == rec.Status.OK else "bad"
        elif isinstance(r, rec.Update):
            marks.append(Mark(i, "update", f"update {r.name}", present.payload_text(r.payload)))
            summary = f"update {r.name} accepted"
            detail, css = present.payload_text(r.payload), "mark"
        elif isinstance(r, rec.UpdateDone):
            summary = f"update #{r.ordinal} {_status(r.status)}"
            detail = (present.payload_text(r.payload) if r.status == rec.Status.OK
                      else present.error_text(r.payload))
        elif isinstance(r, rec.Heartbeat):
            if r.seq in ops:
                ops[r.seq].heartbeats += 1
            summary = f"heartbeat (attempt {r.attempt})"
            detail = present.payload_text(r.payload)
        elif isinstance(r, rec.Awaiting):
            op(r.seq, "completion", r.name, i)
            summary = f"awaiting completion {r.name} (attempt {r.attempt})"
        elif isinstance(r, rec.Completed):
            if r.seq in ops:
                o = ops[r.seq]
                o.end, o.status = i, _status(r.status)
                o.outcome = (present.payload_text(r.payload) if r.status == rec.Status.OK
                             else present.error_text(r.payload))
                summary = f"completion {o.name} {o.status}{_by(r.by)}"
                detail = o.outcome
        elif isinstance(r, rec.Patch):
            summary = f"patch {r.id}"
        elif isinstance(r, rec.Attributes):
            summary = "search attributes set"
            detail = present.payload_text(r.payload)
        elif isinstance(r, rec.Chunk):
            streams[r.stream] = None
            summary = f"stream {r.stream} chunk {r.offset}"
            detail = present.payload_text(r.payload)
        elif isinstance(r, rec.StreamEnd):
            streams[r.stream] = None
            summary = f"stream {r.stream} ended after {r.chunks} chunks ({_status(r.status)})"
        events.append(Event(i, kind, summary, detail, css))

    _infer_issue(ops, span)
    tl.operations = sorted(ops.values(), key=lambda o: o.seq)
    tl.streams = list(streams)
    tl.step_names = list(step_names)
    tl.timed = any(o.spans or o.began_ms is not None for o in tl.operations)
    if tl.timed:
        _place_in_time(tl, known, fire_at)
    if tl.ended_ms is not None:
        for o in tl.operations:
            if o.end is None and o.status in ("running", "retrying"):
                o.status = "abandoned"  # the run ended around it
    return tl


def _place_in_time(tl: Timeline, known: dict[int, float], fire_at: dict[int, int]) -> None:
    """Gives every record and operation a place on the time axis.

    A record the journal does not time takes the latest time journaled at or
    before it (a signal arrived after what came before it); an end it does not
    time takes the earliest journaled at or after it (the code went on at once:
    a wait's end is when the next step began). Steps begin when their first
    attempt began queueing, sleeps end when they were due.
    """
    n = tl.length
    before: list[float] = [0.0] * n
    after: list[float | None] = [None] * n
    last = float(tl.started_ms or min(known.values(), default=0.0))
    for i in range(n):
        last = max(last, known.get(i, last))
        before[i] = last
    nxt: float | None = None
    for i in range(n - 1, -1, -1):
        if i in known:
            nxt = known[i] if nxt is None else min(nxt, known[i])
        after[i] = nxt
    tl.times = before
    for o in tl.operations:
        if o.spans:
            o.began_ms = o.spans[0].began_ms - o.spans[0].queued_ms
            o.ended_ms = o.spans[-1].ended_ms if o.end is not None else None
            continue
        if o.began_ms is None:
            o.began_ms = before[o.first]
        if o.kind == "sleep" and o.seq in fire_at:
            o.ended_ms = float(fire_at[o.seq])  # due then, fired or not
        elif o.end is not None:
            o.ended_ms = after[o.end] if after[o.end] is not None else before[o.end]


def _infer_issue(ops: dict[int, Operation], span: dict[int, list[int]]) -> None:
    """Sets each operation's ``issued`` index (see the module's doc for the rules)."""
    issued = 0
    ended = 0  # the latest outcome of an earlier position (the run's Start to begin with)
    for seq in sorted(span):
        first, last = span[seq]
        o = ops.get(seq)
        # Code awaiting what it issued before (one step, or a gather of several) issues the
        # next operation once they all ended; never before the previous one was issued; always
        # before its own first record (that bound wins: it is certain).
        issued = min(first - 1, max(issued, min(ended, first - 1)))
        if o is not None:
            o.issued = issued
        ended = max(ended, o.end if o is not None and o.end is not None else last)
    assert all(o.issued < o.first for o in ops.values() if o.first > 0)
