"""What must never happen, checked against what the client saw and what the disk holds.

Two kinds of input: :class:`Observed`, what the simulated client was told
(acknowledgements, results, update and query answers), recorded as they
arrive; and a :class:`Snapshot` of the engine's durable state taken after a
recovery or at the end. Every check returns a list of violations (empty when
all is well), so checkers run unchanged on synthetic inputs in tests.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ParamSpec

import msgspec

from fusee.core import records as r

_P = ParamSpec("_P")

#: How often each checker ran, and how often it found a violation, in this process: the
#: soak's coverage atlas reads them (``fusee.sim.soak``); nothing else depends on them.
runs: collections.Counter[str] = collections.Counter()
fired: collections.Counter[str] = collections.Counter()
#: The names of the checkers ``tallied`` wraps.
known: set[str] = set()


def tallied(fn: Callable[_P, list[str]]) -> Callable[_P, list[str]]:
    """Counts the checker's runs and the runs that found something (in ``runs``, ``fired``)."""
    name = fn.__name__.removeprefix("check_")
    known.add(name)

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> list[str]:
        return tally(name, fn(*args, **kwargs))

    return wrapper


def tally(name: str, problems: list[str]) -> list[str]:
    """Counts one run of checker ``name`` that found ``problems``; returns them."""
    runs[name] += 1
    if problems:
        fired[name] += 1
    return problems


#: Close policies a parent may give a child, as the workload names them.
CLOSE_POLICIES = ("terminate", "request_cancel", "abandon")

#: Statuses a child may end with under its parent's close policy. A child
#: that finished before its parent did is always fine ("ok"); a requested
#: cancellation may also be compensated into a failure by the child's code.
ALLOWED_CHILD_END: dict[str, frozenset[str]] = {
    "terminate": frozenset({"ok", "terminated"}),
    "request_cancel": frozenset({"ok", "cancelled", "failed"}),
    "abandon": frozenset({"ok"}),
}

_json = msgspec.json.Decoder()
_msgpack = msgspec.msgpack.Decoder()


#: What an ended run keeps on an engine opened with ``keep_history=False``.
_KEPT = (r.Start, r.Done, r.Child, r.ChildDone, r.Send)


def decode_payload(payload: bytes) -> Any:
    """The value a record payload holds (JSON or MessagePack), or None if neither decodes."""
    for dec in (_json, _msgpack):
        try:
            return dec.decode(payload)
        except (msgspec.DecodeError, ValueError, TypeError):
            continue
    return None


def status_name(status: r.Status) -> str:
    return status.name.lower()


@dataclasses.dataclass
class RunView:
    """One workflow ID's current run as the disk holds it (None journal: unknown ID)."""

    id: str
    journal: list[r.Record] | None

    @property
    def exists(self) -> bool:
        return self.journal is not None

    @property
    def done(self) -> r.Done | None:
        if self.journal:
            for rec in reversed(self.journal):
                if isinstance(rec, r.Done):
                    return rec
        return None

    @property
    def status(self) -> str:
        """"missing", "running", or how the run ended ("ok", "failed", "cancelled", ...)."""
        if self.journal is None:
            return "missing"
        done = self.done
        return "running" if done is None else status_name(done.status)

    @property
    def full(self) -> bool:
        """Whether the journal holds more than an ended run keeps without history (its start,
        its ending and its outbox: ``fusee.runtime.history``)."""
        return self.journal is not None and any(not isinstance(rec, _KEPT) for rec in self.journal)


@dataclasses.dataclass
class Snapshot:
    """The engine's durable state for the IDs the checkers care about."""

    runs: dict[str, RunView] = dataclasses.field(default_factory=dict)
    #: Runs stopped by a determinism error: workflow ID -> message.
    stuck: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Final states of deleted schedules (schedule ID -> the schedule run's result).
    schedules: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: The runs whose results the client had been told when the snapshot began (None: all).
    #: Reading the journals takes virtual time, during which more results may arrive: a run
    #: read while it ran and reported after is not "running again".
    results_before: frozenset[str] | None = None


@dataclasses.dataclass
class Outcome:
    """How a request or run ended as the client saw it: a status and a value or error text."""

    status: str
    value: Any


@dataclasses.dataclass
class Observed:
    """Everything the simulated client was told. Online checks run as answers arrive."""

    #: Acknowledged starts: workflow ID -> job kind.
    starts: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Acknowledged signals per (workflow ID, signal name): how many.
    signals: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    #: The first result reported per workflow ID.
    results: dict[str, Outcome] = dataclasses.field(default_factory=dict)
    #: The first answer per update ID, and the workflow it went to.
    updates: dict[str, tuple[str, Outcome]] = dataclasses.field(default_factory=dict)
    #: Query answers per workflow ID, in arrival order.
    queries: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: Children per parent: (child ID, close policy).
    children: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    #: Acknowledged (durable) cancels: workflow ID -> virtual time of the acknowledgement.
    cancels: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Calls with effects made before each cancel's acknowledgement (``Service.effects``), which
    #: orders them when they share its virtual time.
    cancel_effects: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Answers to ``engine.complete``/``fail_completion``: (workflow ID, token,
    #: accepted, value; -1 for a failure), in arrival order.
    completions: list[tuple[str, str, bool, int]] = dataclasses.field(default_factory=list)
    #: Signals the engine refused as it must (wrong value, unknown name): (workflow ID, name,
    #: the journal's dedup value of its key); none may be in a journal.
    refused_signals: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    #: Receipts of acknowledged enqueues: event ID -> (window run ID, position).
    receipts: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    #: What stream readers read (``ReadStream``): (workflow ID, stream) -> chunks, and how
    #: each stream ended ("ok", "failed", ...; absent while a reader goes on).
    streams: dict[tuple[str, str], list[Any]] = dataclasses.field(default_factory=dict)
    stream_ends: dict[tuple[str, str], str | None] = dataclasses.field(default_factory=dict)
    #: The first answer per object call ID (``Call``): "ok" with the handler's result, or
    #: "failed" with its recorded error.
    calls: dict[str, Outcome] = dataclasses.field(default_factory=dict)
    #: Online violations (first come first listed).
    violations: list[str] = dataclasses.field(default_factory=list)

    def start_acked(self, wid: str, kind: str) -> None:
        self.starts.setdefault(wid, kind)

    def signal_acked(self, wid: str, name: str) -> None:
        self.signals[(wid, name)] = self.signals.get((wid, name), 0) + 1

    def result(self, wid: str, outcome: Outcome) -> None:
        """A result was reported for ``wid``: it must equal every earlier report."""
        prev = self.results.get(wid)
        if prev is None:
            self.results[wid] = outcome
        elif prev != outcome:
            self.violations.append(
                f"workflow {wid} reported result {prev.status} {prev.value!r} and later "
                f"{outcome.status} {outcome.value!r}: a reported result changed"
            )

    def update_answered(self, wid: str, update_id: str, outcome: Outcome) -> None:
        """Update ``update_id`` was answered: every answer to one ID must be the same."""
        prev = self.updates.get(update_id)
        if prev is None:
            self.updates[update_id] = (wid, outcome)
        elif prev[1] != outcome:
            self.violations.append(
                f"update {update_id} to {wid} answered {prev[1].status} {prev[1].value!r} and "
                f"later {outcome.status} {outcome.value!r}: an update ran twice"
            )

    def receipt(self, event_id: str, receipt: tuple[str, int]) -> None:
        """An enqueue was acknowledged: one event ID, one receipt, however often it was sent."""
        prev = self.receipts.setdefault(event_id, receipt)
        if prev != receipt:
            self.violations.append(
                f"event {event_id} got receipt {prev} and later {receipt}: one event ID, two receipts")

    def call_answered(self, call_id: str, outcome: Outcome) -> None:
        """An object call was answered: every answer to one call ID must be the same."""
        prev = self.calls.setdefault(call_id, outcome)
        if prev != outcome:
            self.violations.append(
                f"object call {call_id} answered {prev.status} {prev.value!r} and later "
                f"{outcome.status} {outcome.value!r}: a call ran twice")

    def completion_answered(self, wid: str, token: str, accepted: bool, value: int = 0) -> None:
        self.completions.append((wid, token, accepted, value))

    def query_answered(self, wid: str, value: int) -> None:
        """A query of a counter answered ``value``: totals only grow, so answers never go back."""
        answers = self.queries.setdefault(wid, [])
        if answers and value < max(answers):
            self.violations.append(
                f"query of {wid} answered {value} after answering {max(answers)}: an answer "
                "left before the state it read was durable"
            )
        answers.append(value)


# --- checks on a snapshot -------------------------------------------------


_UNPOSITIONED = (r.Signal, r.Update, r.Cancel, r.CancelRequest, r.Start, r.Done)


def position(rec: r.Record) -> int | None:
    """The operation position a record belongs to (None: signals, updates, cancels, start, end)."""
    if isinstance(rec, _UNPOSITIONED):
        return None
    if isinstance(rec, r.Patch):
        return rec.at
    if isinstance(rec, r.Chunk | r.StreamEnd) and rec.seq == r.WORKFLOW:
        return None
    seq = getattr(rec, "seq", None)
    return seq if isinstance(seq, int) else None


def _as_run0(rec: r.Record) -> r.Record:
    return msgspec.structs.replace(rec, run=0)


@tallied
def check_reset(wid: str, before: list[r.Record], after: list[r.Record], before_step: str) -> list[str]:
    """A reset run's journal is the prefix before the cut plus new records; later signals arrive once.

    ``before``: the old run's durable journal read just before the reset;
    ``after``: the new run's durable journal right after it was acknowledged.
    The cut is the first step named ``before_step`` (in either journal: the
    new run runs it again at the same position). Every record of the old run
    at a position before the cut must open the new run in the same order
    (renumbered); each signal of the old run (by dedup key) is in the new run
    exactly once; no signal is in the new run twice.
    """
    out: list[str] = []
    if not after:
        return [f"reset of {wid} acknowledged, but the new run has no durable record"]
    if not isinstance(after[0], r.Start) or not before or not isinstance(before[0], r.Start):
        return [f"reset of {wid}: no Start opens the journal before or after: {before[:2]!r} / {after[:2]!r}"]
    if after[0].run == before[0].run:
        out.append(f"reset of {wid} acknowledged but its current run is still run {after[0].run}")
        return out
    cuts = [rec.seq for rec in (*before, *after)
            if isinstance(rec, r.Step | r.Attempt) and rec.name == before_step]
    if cuts:
        cut = min(cuts)
        kept = [_as_run0(x) for x in before[1:] if (p := position(x)) is not None and p < cut]
        new = [_as_run0(x) for x in after[1:] if (p := position(x)) is not None and p < cut]
        if new[:len(kept)] != kept:
            out.append(f"reset of {wid} before position {cut}: the new run does not open with the "
                       f"old run's {len(kept)} record(s) before the cut: {kept!r} vs {new[:len(kept)]!r}")
    old = [(x.name, x.dedup) for x in before if isinstance(x, r.Signal) and x.dedup]
    got: dict[tuple[str, int], int] = {}
    for x in after:
        if isinstance(x, r.Signal) and x.dedup:
            got[(x.name, x.dedup)] = got.get((x.name, x.dedup), 0) + 1
    for sig, n in got.items():
        if n > 1:
            out.append(f"reset of {wid}: signal {sig[0]!r} (dedup {sig[1]}) arrives {n} times in the new run")
    for sig in old:
        if sig not in got:
            out.append(f"reset of {wid}: signal {sig[0]!r} (dedup {sig[1]}) of the old run is not in the new run")
    return out


@tallied
def check_resumes(resumes: Iterable[tuple[str, int, float, Any]],
                  reported: dict[str, list[tuple[float, int]]]) -> list[str]:
    """A heartbeat resume starts only from reported progress.

    Each attempt of a step with heartbeats sees ``info.progress``: None (no
    earlier attempt's progress is durable) or a value some earlier attempt of
    the same step (same idempotency key) reported with ``info.heartbeat``
    before this attempt began. Anything else (a value never reported, or one
    reported only later) is progress the engine made up.
    """
    out: list[str] = []
    for key, attempt, t, progress in resumes:
        if progress is None:
            continue
        before = [p for at, p in reported.get(key, ()) if at <= t]
        if progress not in before:
            out.append(f"attempt {attempt} of step {key} began from progress {progress!r}, "
                       f"which no earlier attempt reported (reported before: {before!r})")
    return out


@tallied
def check_completions(obs: Observed, tokens_returned: Iterable[str]) -> list[str]:
    """One completion accepted per await, and never with a stale token.

    Each workflow ID of the workload awaits one completion. ``engine.complete``
    returns True only once the completion is durable, so at most one True per
    workflow (a duplicate, or a second token, must get False). A token is
    current only if some invocation of its token function returned after
    handing it out; a token whose every invocation failed is stale and must
    never be accepted. A workflow that returns what its await got (the
    workload's approvals) reports the accepted completion's value.
    """
    out: list[str] = []
    current = set(tokens_returned)
    accepted: dict[str, list[str]] = {}
    for wid, token, ok, value in obs.completions:
        if not ok:
            continue
        accepted.setdefault(wid, []).append(token)
        result = obs.results.get(wid)
        if result is not None and result.status == "ok" and result.value != value:
            out.append(f"workflow {wid} returned {result.value!r}, but the completion accepted "
                       f"with token {token!r} was {value!r}")
        if token not in current:
            out.append(f"completion of {wid} with stale token {token!r} was accepted "
                       "(its token function failed after handing it out)")
    for wid, tokens in accepted.items():
        if len(tokens) > 1:
            out.append(f"workflow {wid} accepted {len(tokens)} completions of one await: {tokens!r}")
    return out


@tallied
def check_starts(obs: Observed, snap: Snapshot) -> list[str]:
    """Every acknowledged start exists on disk."""
    return [
        f"acknowledged start of {wid} was lost"
        for wid in obs.starts
        if wid in snap.runs and not snap.runs[wid].exists
    ]


@tallied
def check_signals(obs: Observed, snap: Snapshot) -> list[str]:
    """Every acknowledged signal is in its (unfinished) run's journal."""
    out: list[str] = []
    for (wid, name), n in obs.signals.items():
        view = snap.runs.get(wid)
        if view is None or view.journal is None or (view.done is not None and not view.full):
            continue
        got = sum(1 for rec in view.journal if isinstance(rec, r.Signal) and rec.name == name)
        if got < n:
            out.append(
                f"{n} acknowledged signal(s) {name!r} to {wid}, but its journal holds {got}"
            )
    return out


@tallied
def check_refused_signals(obs: Observed, snap: Snapshot) -> list[str]:
    """A signal refused for its value or name left nothing in its run's journal."""
    out: list[str] = []
    for wid, name, dedup in obs.refused_signals:
        view = snap.runs.get(wid)
        if view is None or view.journal is None:
            continue
        if any(isinstance(x, r.Signal) and str(x.dedup) == dedup for x in view.journal):
            out.append(f"signal {name!r} to {wid} was refused (wrong value or unknown name), yet its journal holds it")
    return out


@tallied
def check_results(obs: Observed, snap: Snapshot) -> list[str]:
    """A result once reported stays: the run is still finished, with the same status."""
    out: list[str] = []
    for wid, outcome in obs.results.items():
        view = snap.runs.get(wid)
        if view is None or (snap.results_before is not None and wid not in snap.results_before):
            continue
        if not view.exists:
            out.append(f"finished workflow {wid} vanished after recovery")
        elif view.status == "running":
            out.append(f"workflow {wid} had reported a result but runs again after recovery")
        elif view.status != outcome.status and view.status != "continued":
            out.append(
                f"workflow {wid} reported {outcome.status} but the disk says {view.status}"
            )
    return out


def check_service(violations: Iterable[str]) -> list[str]:
    """No service key was called with two inputs."""
    return list(violations)


@tallied
def check_updates(obs: Observed, snap: Snapshot) -> list[str]:
    """No update ID was accepted twice by a run."""
    out: list[str] = []
    for wid, view in snap.runs.items():
        seen: dict[str, int] = {}
        for rec in view.journal or ():
            if isinstance(rec, r.Update):
                seen[rec.id] = seen.get(rec.id, 0) + 1
        out.extend(
            f"update {uid} was accepted {n} times by {wid}" for uid, n in seen.items() if n > 1
        )
    return out


def recorded_states(view: RunView) -> set[int]:
    """The totals a counter's journal recorded: 0 and each successful update's answer."""
    states = {0}
    for rec in view.journal or ():
        if isinstance(rec, r.UpdateDone) and rec.status == r.Status.OK:
            v = decode_payload(rec.payload)
            if isinstance(v, int):
                states.add(v)
    return states


@tallied
def check_queries(obs: Observed, snap: Snapshot) -> list[str]:
    """Every query answer is a state the journal recorded."""
    out: list[str] = []
    for wid, answers in obs.queries.items():
        view = snap.runs.get(wid)
        if view is None or not view.full:
            continue
        states = recorded_states(view)
        bad = sorted({a for a in answers if a not in states})
        if bad:
            out.append(
                f"query of {wid} answered {bad[0]}, a state its journal never recorded "
                f"({sorted(states)}): the answer left before that state was durable"
            )
    return out


@tallied
def check_stuck(snap: Snapshot) -> list[str]:
    """No run stopped on a determinism error."""
    return [f"{wid} stopped on a determinism error: {why}" for wid, why in sorted(snap.stuck.items())]


@tallied
def check_children(obs: Observed, snap: Snapshot) -> list[str]:
    """Children ended as their parent's close policy allows (checked once all is finished)."""
    out: list[str] = []
    for parent, kids in obs.children.items():
        pview = snap.runs.get(parent)
        if pview is None or pview.done is None:
            continue
        for kid, policy in kids:
            view = snap.runs.get(kid)
            if view is None or not view.exists:
                continue
            if view.status not in ALLOWED_CHILD_END[policy]:
                out.append(
                    f"child {kid} ({policy}) ended {view.status!r} against its parent close policy"
                )
    return out


def check_all(obs: Observed, snap: Snapshot, service_violations: Iterable[str] = (),
              *, final: bool = False) -> list[str]:
    """Every check that applies (``final``: also those that need everything finished)."""
    out = list(obs.violations)
    out += check_service(service_violations)
    out += check_starts(obs, snap)
    out += check_signals(obs, snap)
    out += check_refused_signals(obs, snap)
    out += check_results(obs, snap)
    out += check_updates(obs, snap)
    out += check_step_times(snap)
    if final:
        # A query may answer a state whose update record is durable only later
        # (its step is durable, the handler's result not yet): check once all finished.
        out += check_queries(obs, snap)
        out += check_stuck(snap)
        out += check_children(obs, snap)
    return out


def check_step_times(snap: Snapshot) -> list[str]:
    """Every timed step attempt in a durable journal ran for a while that is not negative, and
    attempts of one step ran one after the other (an attempt never begins before the one it
    retries ended), across crashes and the clock jumps between lives too."""
    out = []
    for wid, view in snap.runs.items():
        last_end: dict[int, tuple[int, int]] = {}
        for rec in view.journal or ():
            if not isinstance(rec, (r.Step, r.Attempt)) or not rec.began_us:
                continue
            if rec.took_us < 0 or rec.queued_us < 0:
                out.append(f"{wid}: step {rec.name!r} attempt {rec.attempt} journaled a negative time "
                           f"(took {rec.took_us} µs, queued {rec.queued_us} µs)")
            prev = last_end.get(rec.seq)
            if prev is not None and rec.attempt > prev[0] and rec.began_us - rec.queued_us < prev[1]:
                out.append(f"{wid}: step {rec.name!r} attempt {rec.attempt} began at {rec.began_us} µs, "
                           f"before attempt {prev[0]} ended at {prev[1]} µs")
            last_end[rec.seq] = (rec.attempt, rec.began_us + rec.took_us)
    return out


# --- step effects against the journal (issue 9) ------------------------------


def _run_journal(view: RunView | None, run: str) -> list[r.Record] | None:
    """The journal of run ``run`` if the snapshot holds it in full (None: cannot tell)."""
    if view is None or not view.journal:
        return None
    start = view.journal[0]
    if not isinstance(start, r.Start) or str(start.run) != run:
        return None  # another run of the ID (continued as new, or started again)
    if view.done is not None and not view.full:
        return None  # a finished run kept only its start and result
    return view.journal


def _has_outcome(journal: list[r.Record], seq: int) -> bool:
    return any(isinstance(rec, r.Step) and rec.seq == seq for rec in journal)


def _cancelled(journal: list[r.Record]) -> bool:
    return any(isinstance(rec, (r.Cancel, r.CancelRequest)) for rec in journal)



def _without_outcome(effects: Iterable[Any], snap: Snapshot) -> Iterator[tuple[Any, RunView, list[r.Record]]]:
    """The effects that returned whose step has no outcome in its run's journal
    (terminated runs drop what was running: they are left out)."""
    for e in effects:
        if not e.ok:
            continue
        wid, run, seq = e.owner
        view = snap.runs.get(wid)
        journal = _run_journal(view, run)
        if journal is None or _has_outcome(journal, seq):
            continue
        assert view is not None
        if view.status == "terminated":
            continue
        yield e, view, journal


@tallied
def check_step_outcomes(effects: Iterable[Any], snap: Snapshot, crashed_lives: set[int]) -> list[str]:
    """No step effect without its outcome journaled (checked once all is finished).

    An effect is a mock-service call that returned (``fusee.sim.service.Effect``).
    Its step's ``Step`` record must be in the journal, unless a crash took the
    run back (the step then ran again under the same key, or a cancel covers
    it) or the run was terminated (a terminated run drops what was running).
    """
    out: list[str] = []
    for e, view, journal in _without_outcome(effects, snap):
        wid = e.owner[0]
        if e.life in crashed_lives and (_cancelled(journal) or view.status == "cancelled"):
            continue
        why = "its life crashed but" if e.life in crashed_lives else "no crash took it back and"
        out.append(
            f"step {e.name!r} of {wid} ({e.key}) had its effect at {e.begin * 1000:.3f} ms "
            f"(life {e.life}), but {why} its outcome is not in the journal"
        )
    return out


def stalled(stalls: Iterable[tuple[float, float, Any, bool]], end_of_step: float, crash: float) -> float:
    """Seconds of [end_of_step, crash] that do not count against a step's durability deadline.

    ``stalls`` (``SimEnv.stalls``): the loop's thread lent to a step function.
    A stall holds back a step that finished during it (its outcome is
    appended once the loop is free) and records that waited behind a flush
    in flight as it began (they follow that flush). A record already pending
    when a stall began with no flush in flight must have been handed to the
    disk before the function began: such a stall excuses nothing.
    """
    total = 0.0
    for at, seconds, _, busy in stalls:
        if busy or end_of_step >= at:
            total += max(0.0, min(crash, at + seconds) - max(end_of_step, at))
    return total


@tallied
def check_inline_stalls(stalls: Iterable[tuple[float, float, Any, bool]]) -> list[str]:
    """A step function measured as cheap blocks the loop's thread at most twice per process life.

    Its first inline execution past ``syncsteps.DEMOTE_ABOVE_S`` is a strike, which a quick
    probe in the step pool may excuse; a second strike sends it to the pool (lives are short
    of the pooled spell after which it is probed again).
    """
    from fusee.runtime.syncsteps import DEMOTE_ABOVE_S

    seen: dict[Any, list[float]] = {}
    for at, seconds, key, _ in stalls:
        if seconds <= DEMOTE_ABOVE_S:
            continue
        before = seen.setdefault(key, [])
        if len(before) >= 2:
            name = getattr(key, "co_qualname", key)
            return [f"step function {name} blocked the event loop for {seconds * 1000:.1f} ms at "
                    f"{at * 1000:.3f} ms, after it had blocked it at "
                    f"{' and '.join(f'{t * 1000:.3f}' for t in before)} ms: it should run in the step pool by then"]
        before.append(at)
    return []


@tallied
def check_durable(due: Iterable[Any], snap: Snapshot, what: str) -> list[str]:
    """Steps that finished long enough before a crash (or before a graceful close) are durable.

    ``due``: the effects (``Effect``) whose functions returned that long ago.
    """
    out: list[str] = []
    for e, _, _ in _without_outcome(due, snap):
        wid = e.owner[0]
        out.append(
            f"step {e.name!r} of {wid} ({e.key}) finished at {e.end * 1000:.3f} ms, {what}, "
            "but its outcome was not durable"
        )
    return out


@tallied
def check_cancel_gate(effects: Iterable[Any], cancels: dict[str, float],
                      seen: dict[str, list[tuple[int, float]]],
                      before_ack: dict[str, int] | None = None) -> list[str]:
    """After a durable cancel no execution of a step of its run begins until the code saw ``Cancelled``.

    ``cancels``: workflow ID -> virtual time its cancel was acknowledged
    (durable); ``seen``: workflow ID -> [(life, virtual time)] the code
    caught ``Cancelled`` (steps it starts then are compensation);
    ``before_ack``: workflow ID -> how many of ``effects`` began before the
    acknowledgement (a call in the same virtual instant may precede it).
    """
    out: list[str] = []
    for i, e in enumerate(effects):
        wid, _, _ = e.owner
        t_ack = cancels.get(wid)
        if t_ack is None or e.begin < t_ack or (before_ack is not None and i < before_ack.get(wid, 0)):
            continue
        if any(life == e.life and t <= e.begin for life, t in seen.get(wid, ())):
            continue
        out.append(
            f"step {e.name!r} of {wid} ({e.key}) began at {e.begin * 1000:.3f} ms, after its "
            f"cancel was durable ({t_ack * 1000:.3f} ms) and before the code saw Cancelled"
        )
    return out


@tallied
def check_compensation(effects: Iterable[Any], effect: str = "charge",
                       compensation: str = "refund") -> list[str]:
    """A compensation never runs before the effect it follows has finished (or after it begins again)."""
    effs = list(effects)
    done: dict[tuple[str, str], list[Any]] = {}
    for e in effs:
        if e.name == effect:
            wid, run, _ = e.owner
            done.setdefault((wid, run), []).append(e)
    out: list[str] = []
    for c in effs:
        if c.name != compensation:
            continue
        wid, run, _ = c.owner
        for e in done.get((wid, run), ()):
            if e.end > c.begin:
                out.append(
                    f"{compensation} of {wid} ({c.key}) ran at {c.begin * 1000:.3f} ms, before the "
                    f"{effect} it compensates (began {e.begin * 1000:.3f} ms, finished "
                    f"{e.end * 1000:.3f} ms) was over"
                )
    return out


@tallied
def check_refused(refused: Iterable[tuple[str, str, str]], snap: Snapshot) -> list[str]:
    """Requests refused while the engine closed left no trace.

    ``refused``: (kind, workflow ID, detail): kind "start", "cancel",
    "terminate", "update" (detail: update ID) or "signal" (detail: dedup value).
    """
    out: list[str] = []
    for kind, wid, detail in refused:
        view = snap.runs.get(wid)
        journal = view.journal if view is not None else None
        hit = False
        if kind == "start":
            hit = journal is not None
        elif journal is None:
            continue
        elif kind == "cancel":
            hit = _cancelled(journal)
        elif kind == "terminate":
            hit = any(isinstance(rec, r.Done) and rec.status == r.Status.TERMINATED for rec in journal)
        elif kind == "update":
            hit = any(isinstance(rec, r.Update) and rec.id == detail for rec in journal)
        elif kind == "signal":
            hit = any(isinstance(rec, r.Signal) and str(rec.dedup) == detail for rec in journal)
        if hit:
            out.append(f"{kind} of {wid} was refused (EngineClosed) during a close, yet it was applied")
    return out


# --- keyed objects and step limits (issue 12) ----------------------------------


@tallied
def check_object_answers(answers: dict[str, list[Any]], keys: dict[str, str]) -> list[str]:
    """One answer per call ID; exclusive calls of one key (each adds one) answer distinct counts.

    ``answers``: call ID -> every answer the client got for it; ``keys``: call
    ID -> its object key, for the exclusive calls only.
    """
    out = []
    for cid, got in answers.items():
        if any(a != got[0] for a in got):
            out.append(f"object call {cid} was answered {got[0]!r} and later {next(a for a in got if a != got[0])!r}: "
                       "a call ID must be answered once")
    seen: dict[tuple[str, Any], str] = {}
    for cid, key in keys.items():
        first = answers.get(cid)
        if not first:
            continue
        other = seen.setdefault((key, first[0]), cid)
        if other != cid:
            out.append(f"exclusive object calls {other} and {cid} of key {key} both answered {first[0]!r}: "
                       "one of them did not see the other's write")
    return out


@tallied
def check_object_exclusive(events: list[tuple[int, str, str, str, str]]) -> list[str]:
    """Exclusive handlers of one key never overlap each other nor a shared one.

    ``events``: (life, "in"/"out", key, "x" exclusive / "s" shared, call tag) in
    the order the handlers' steps ran; a life's end ends whatever was inside.
    """
    inside: dict[str, dict[str, str]] = {}
    life = None
    for lf, what, key, kind, tag in events:
        if lf != life:
            inside, life = {}, lf
        here = inside.setdefault(key, {})
        if what == "in":
            if kind == "x" and here:
                return [f"exclusive handler {tag} of key {key} began beside {sorted(here)} (life {lf})"]
            if kind == "s" and "x" in here.values():
                return [f"shared handler {tag} of key {key} began beside an exclusive one {sorted(here)} (life {lf})"]
            here[tag] = kind
        else:
            here.pop(tag, None)
    return []


@tallied
def check_limit_concurrency(events: list[tuple[int, str, str]], bound: int) -> list[str]:
    """A limit never has more executions running than its concurrency, in any life.

    ``events``: (life, "b" began / "e" ended, step key) in order; a crash ends the
    executions of its life (they ran in the process that died).
    """
    running: set[str] = set()
    life = None
    for lf, what, key in events:
        if lf != life:
            running, life = set(), lf
        if what == "b":
            running.add(key)
            if len(running) > bound:
                return [f"limit of {bound} over-subscribed: {sorted(running)} ran at once (life {lf})"]
        else:
            running.discard(key)
    return []


@tallied
def check_limit_fairness(grants: list[tuple[int, Any]], weights: dict[str, int]) -> list[str]:
    """Permits go to the highest priority waiting, and by weighted round robin among fairness keys.

    The bound (see ``fusee.limits``): while a key has waiters, the other keys of
    its priority get at most the sum of their weights before its next permit.
    ``grants``: (life, (limit, priority, key, {key: waiters} before, top priority)).
    """
    since: dict[tuple[int, str, int, str], int] = {}
    others: dict[tuple[int, str, int, str], set[str]] = {}
    for life, (limit, prio, key, waiting, top) in grants:
        if prio != top:
            return [f"limit {limit}: a permit went to priority {prio} while priority {top} waited (life {life})"]
        for k in list(since):
            if k[:3] == (life, limit, prio) and k[3] not in waiting:
                del since[k], others[k]  # no longer waiting: its wait starts over
        for k in waiting:
            if k == key:
                continue
            ident = (life, limit, prio, k)
            since[ident] = since.get(ident, 0) + 1
            others.setdefault(ident, set()).add(key)
            bound = sum(weights.get(j, 1) for j in others[ident])
            if since[ident] > bound:
                return [f"limit {limit}: fairness key {k!r} waited through {since[ident]} permits to "
                        f"{sorted(others[ident])} (bound {bound}, life {life})"]
        since[(life, limit, prio, key)] = 0
        others[(life, limit, prio, key)] = set()
    return []
@tallied
def check_live_read(durable: list[int], seen: list[int] | None, refused: str | None, changed: bool) -> list[str]:
    """An operator's read-only open of the directory while the engine lives (``fusee runs DIR``):
    it is not refused, changes nothing on the disk, and sees (per shard) at least every record
    the engine had made durable when it read (``seen``: the end of its scan)."""
    problems = []
    if refused is not None:
        problems.append(f"a read-only inspection of the live directory was refused: {refused}")
    if changed:
        problems.append("a read-only inspection of the live directory changed files on the disk")
    if seen is not None:
        for shard, (d, s) in enumerate(zip(durable, seen, strict=True)):
            if s < d:
                problems.append(f"a read-only inspection of the live directory read shard {shard} up to "
                                f"record {s}, but the engine had made records up to {d} durable")
    return problems


@tallied
def check_view_stuck(view: dict[str, str], live: dict[str, str]) -> list[str]:
    """An operator's read-only view (``fusee runs DIR``, ``Engine.open(read_only=True)``) reports
    no run stuck that the live engine runs healthily (a schedule whose time passed, say)."""
    return [f"a read-only view reports {wid} stuck ({why}) while the live engine runs it"
            for wid, why in sorted(view.items()) if wid not in live]


@tallied
def check_moved(started: Iterable[str], snap: Snapshot) -> list[str]:
    """The directory was renamed and a copy restored at its path while the engine ran: every
    start the engine acknowledged after that (``started``) is in the copy, the directory a
    restart reads. The engine writes on into the directory it locked, so it may acknowledge
    only what it made durable before the move."""
    return [f"the start of {wid}, acknowledged after the directory was renamed and restored "
            "from a copy, is not in the copy a restart reads: the engine acknowledged work into "
            "a directory nobody opens again"
            for wid in started if wid in snap.runs and not snap.runs[wid].exists]


# --- schedules and windows (issue 12) -----------------------------------------


@tallied
def check_schedule_fires(flow: Any, finals: dict[str, dict[str, Any]], *, final: bool) -> list[str]:
    """A scheduled time fires at most once and, within the catch-up window, exactly once.

    At most once: every scheduled run ID ran in one run only, and no two
    run IDs name one scheduled time. Exactly once (once the schedule is
    deleted and its runs ended): every time on the schedule's grid between
    its first time and the next it had not taken either fired or is among
    the times it counted as skipped (overlap policy, catch-up window, pause)
    or still buffered.
    """
    from fusee.sim.flowjobs import fired_time

    out: list[str] = []
    by_time: dict[tuple[str, int], set[str]] = {}
    for wid, runs in sorted(flow.ticks.items()):
        if len(runs) > 1:
            out.append(f"scheduled workflow {wid} was started as runs {sorted(runs)}: one scheduled time fired twice")
    # Started runs: those whose step ran, and those the engine holds (a run
    # cancelled by the next time's cancel_other may end before its first step).
    for wid in sorted(set(flow.ticks) | set(flow.started)):
        at = fired_time(wid)
        if at is None:
            out.append(f"scheduled run {wid} does not name its schedule and time as {{id}}@{{ISO time}}")
            continue
        by_time.setdefault(at, set()).add(wid)
    for (sid, t), wids in sorted(by_time.items()):
        if len(wids) > 1:
            out.append(f"schedule {sid} fired its time {t} as {sorted(wids)}: one scheduled time fired twice")
    if not final:
        return out
    for sid, s in sorted(finals.items()):
        every = s["spec"]["every_ms"]
        first, nxt = s["first_ms"], s["next_ms"]
        if every is None or first is None:
            continue
        grid = set(range(first, nxt, every))
        fired = {t for (fsid, t) in by_time if fsid == sid}
        missing = len(grid - fired)
        counted = s["skipped_overlap"] + s["skipped_catchup"] + s.get("skipped_paused", 0) + len(s["buffered"])
        if missing > counted:
            out.append(
                f"schedule {sid}: {missing} of its {len(grid)} scheduled times neither fired nor were counted "
                f"as skipped ({counted} counted: {s['skipped_overlap']} overlap, {s['skipped_catchup']} "
                f"catch-up, {s.get('skipped_paused', 0)} paused, {len(s['buffered'])} buffered)"
            )
    return out


@tallied
def check_windows(flow: Any, *, final: bool) -> list[str]:
    """Every acknowledged event is in exactly one window, where its receipt says; windows of a key in order."""
    out: list[str] = list(flow.violations)
    for key, order in sorted(flow.order.items()):
        if order != sorted(order) or len(set(order)) != len(order):
            out.append(f"the windows of key {key} ran in the order {order}: windows of one key run in order")
    if not final:
        return out
    where: dict[str, list[tuple[str, int]]] = {}
    for wid, events in flow.windows.items():
        for pos, ev in enumerate(events):
            where.setdefault(str(ev["id"]), []).append((wid, pos))
    for eid, receipt in sorted(flow.receipts.items()):
        found = where.get(eid, [])
        if found != [receipt]:
            out.append(f"acknowledged event {eid} with receipt {receipt} is in windows at {found}: "
                       "every acknowledged event lands in exactly one window, where its receipt says")
    return out


@tallied
def check_window_starts(flow: Any, sent: set[str], *, final: bool) -> list[str]:
    """No window run starts without an acknowledged event.

    Every window run took at least one event, each once, and only events the client sent
    (``sent``: their IDs). At the end (the client resends every event until it is
    acknowledged) each window run holds at least one event whose receipt names it, and
    every event it holds has a receipt naming it at that position: a window that starts
    from an event nobody was told about shows up here.
    """
    out: list[str] = []
    for wid, events in sorted(flow.windows.items()):
        ids = [str(ev["id"]) for ev in events]
        if not ids:
            out.append(f"window run {wid} started with no event")
        if len(set(ids)) != len(ids):
            out.append(f"window run {wid} took one event twice: {ids}")
        strange = [e for e in ids if e not in sent]
        if strange:
            out.append(f"window run {wid} took events {strange} that the client never sent")
        if not final:
            continue
        named = [e for e in ids if flow.receipts.get(e, (None,))[0] == wid]
        if not named:
            out.append(f"window run {wid} started without an acknowledged event: no receipt names it "
                       f"(it took {ids})")
        for pos, e in enumerate(ids):
            if flow.receipts.get(e) != (wid, pos):
                out.append(f"window run {wid} holds event {e} at position {pos}, but its receipt says "
                           f"{flow.receipts.get(e)}")
                break
    return out
