"""What must never happen, checked against what the client saw and what the disk holds.

Two kinds of input: :class:`Observed`, what the simulated client was told
(acknowledgements, results, update and query answers), recorded as they
arrive; and a :class:`Snapshot` of the engine's durable state taken after a
recovery or at the end. Every check returns a list of violations (empty when
all is well), so checkers run unchanged on synthetic inputs in tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import msgspec

from fusee.core import records as r

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
        """Whether the journal holds more than a finished run's start and result."""
        return self.journal is not None and any(
            not isinstance(rec, (r.Start, r.Done)) for rec in self.journal
        )


@dataclasses.dataclass
class Snapshot:
    """The engine's durable state for the IDs the checkers care about."""

    runs: dict[str, RunView] = dataclasses.field(default_factory=dict)
    #: Runs stopped by a determinism error: workflow ID -> message.
    stuck: dict[str, str] = dataclasses.field(default_factory=dict)


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


def check_starts(obs: Observed, snap: Snapshot) -> list[str]:
    """Every acknowledged start exists on disk."""
    return [
        f"acknowledged start of {wid} was lost"
        for wid in obs.starts
        if wid in snap.runs and not snap.runs[wid].exists
    ]


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


def check_results(obs: Observed, snap: Snapshot) -> list[str]:
    """A result once reported stays: the run is still finished, with the same status."""
    out: list[str] = []
    for wid, outcome in obs.results.items():
        view = snap.runs.get(wid)
        if view is None:
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


def check_stuck(snap: Snapshot) -> list[str]:
    """No run stopped on a determinism error."""
    return [f"{wid} stopped on a determinism error: {why}" for wid, why in sorted(snap.stuck.items())]


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
    out += check_results(obs, snap)
    out += check_updates(obs, snap)
    if final:
        # A query may answer a state whose update record is durable only later
        # (its step is durable, the handler's result not yet): check once all finished.
        out += check_queries(obs, snap)
        out += check_stuck(snap)
        out += check_children(obs, snap)
    return out
