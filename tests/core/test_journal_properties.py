"""Property: a run replayed from any prefix of its journal sees what it saw live.

Random workflow programs (sequences and concurrent branches of every kind of
operation) run live against the journal machine, with live completions,
retries, pauses, updates and cancellations in random order. The journal is
then cut at a random record (a crash) and the same program replays it and runs
on to its end. The code must see the same deliveries in the same order as far
as the cut journal reaches, the replay must append nothing the journal already
holds, and no determinism error may arise. Replaying the finished journal once
more must need no live work at all and see exactly the same. Finally, a
program changed at a recorded position must fail with a determinism error
naming that position.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusee.core import records as r
from fusee.core.journal import (
    IDLE,
    REPLAY,
    STALLED,
    Append,
    AsyncCompleted,
    AwaitWaiting,
    CancelAll,
    ChildResult,
    Deliver,
    Fired,
    Outcome,
    RunMachine,
    SignalTaken,
    StepDone,
    StepRun,
    UpdateTurn,
    WaitTimedOut,
)
from fusee.core.records import DETACHED, PAUSED, Status, ValueKind
from fusee.errors import DeterminismError

# --- programs ------------------------------------------------------------------------
#
# An op is a tuple ``(uid, kind, *args)``; ``uid`` identifies it in the program
# (an update handler's ops run once per accepted update). A branch is a list of
# ops run in order; ``("par", branches)`` runs branches concurrently and waits
# for all of them; ``("race", wait, sleep)`` waits for a signal or a timer,
# whichever comes first, and drops the other.

Op = tuple[Any, ...]
Branch = list[Op]

NAMES = st.sampled_from(["a", "b", "c"])
SIMPLE = st.one_of(
    st.tuples(st.just("step"), NAMES),
    st.tuples(st.just("step"), NAMES),
    st.tuples(st.just("await"), NAMES),
    st.tuples(st.just("sleep"), NAMES),
    st.tuples(st.just("wait"), NAMES),
    st.tuples(st.just("child"), NAMES, st.booleans()),
    st.tuples(st.just("value"), st.sampled_from(list(ValueKind))),
    st.tuples(st.just("send"), NAMES),
    st.tuples(st.just("attrs")),
    st.tuples(st.just("patched"), NAMES),
    st.tuples(st.just("race"), NAMES, NAMES),
)
RAW_BRANCH = st.recursive(
    st.lists(SIMPLE, min_size=1, max_size=6),
    lambda inner: st.lists(
        st.one_of(SIMPLE, st.tuples(st.just("par"), st.lists(inner, min_size=1, max_size=3))),
        min_size=1,
        max_size=6,
    ),
    max_leaves=24,
)
UPDATE_NAMES = ("u1", "u2")


@dataclass
class Program:
    main: Branch
    handlers: dict[str, Branch]
    #: Deliver an update together with the start (``u1``'s handler).
    update_with_start: bool


def number(raw: list[Any], counter: list[int]) -> Branch:
    """Gives every op of ``raw`` a program-wide uid."""
    out: Branch = []
    for op in raw:
        counter[0] += 1
        if op[0] == "par":
            out.append((counter[0], "par", [number(b, counter) for b in op[1]]))
        else:
            out.append((counter[0], *op))
    return out


@st.composite
def programs(draw: st.DrawFn) -> Program:
    counter = [0]
    main = number(draw(RAW_BRANCH), counter)
    handler_names = draw(st.lists(st.sampled_from(UPDATE_NAMES), unique=True, max_size=2))
    handlers = {name: number(draw(RAW_BRANCH), counter) for name in handler_names}
    return Program(main, handlers, "u1" in handlers and draw(st.booleans()))


def replace_op(branch: Branch, uid: int, new: Op) -> Branch:
    out: Branch = []
    for op in branch:
        if op[0] == uid:
            out.append(new)
        elif op[1] == "par":
            out.append((op[0], "par", [replace_op(b, uid, new) for b in op[2]]))
        else:
            out.append(op)
    return out


# --- the code: a deterministic model of workflow code over the machine -------------


@dataclass(eq=False)
class Task:
    gen: Generator[tuple[Any, ...], Any, None]
    parent: Task | None = None
    remaining: int = 0
    race: tuple[int, int] | None = None


class Code:
    """Runs a program's branches as tasks, one delivery at a time, each task
    until it blocks; what the code observes goes to ``trace``."""

    def __init__(self, program: Program, life: Life) -> None:
        self.program = program
        self.life = life
        self.m = life.m
        self.trace: list[tuple[Any, ...]] = []
        self.waiting: dict[int, Task] = {}
        self.alive = 0
        #: Positions each op took, by uid.
        self.seqs_of: dict[int, list[int]] = {}

    def start(self) -> None:
        self.spawn(self.branch(self.program.main))

    def finished(self) -> bool:
        return self.alive == 0

    def spawn(self, gen: Generator[tuple[Any, ...], Any, None], parent: Task | None = None) -> None:
        self.alive += 1
        self.run(Task(gen, parent), None)

    def run(self, task: Task, value: Any) -> None:
        while True:
            try:
                req = task.gen.send(value)
            except StopIteration:
                self.alive -= 1
                parent = task.parent
                if parent is None:
                    return
                parent.remaining -= 1
                if parent.remaining:
                    return
                task, value = parent, None
                continue
            if req[0] == "one":
                self.waiting[req[1]] = task
                return
            if req[0] == "race":
                self.waiting[req[1]] = self.waiting[req[2]] = task
                task.race = (req[1], req[2])
                return
            assert req[0] == "join"
            children = req[1]
            task.remaining = len(children)
            for child in children:
                self.spawn(child, task)
            return

    def resolve(self, seq: int, outcome: Outcome) -> bool:
        """Hands the code ``seq``'s outcome; False if no task waits for it."""
        task = self.waiting.pop(seq, None)
        if task is None:
            return False
        self.trace.append(("d", seq, outcome.status, outcome.payload))
        value: Any = outcome
        if task.race is not None:
            s1, s2 = task.race
            task.race = None
            loser = s2 if seq == s1 else s1
            del self.waiting[loser]
            dropped = self.m.forget(loser)
            if dropped is not None:
                self.life.append(dropped)
            value = (seq, outcome)
        self.run(task, value)
        return True

    def start_update(self, ordinal: int, name: str) -> None:
        self.trace.append(("u", ordinal, name))
        self.spawn(self.handler(ordinal, name))

    def handler(self, ordinal: int, name: str) -> Generator[tuple[Any, ...], Any, None]:
        yield from self.branch(self.program.handlers[name])
        _, done = self.m.update_done(ordinal, Status.OK, f"r{ordinal}".encode())
        if done is not None:
            self.life.append(done)

    def note(self, uid: int, seq: int) -> None:
        self.seqs_of.setdefault(uid, []).append(seq)

    def branch(self, ops: Branch) -> Generator[tuple[Any, ...], Any, None]:
        m, life = self.m, self.life
        for op in ops:
            uid, kind = op[0], op[1]
            if kind == "step":
                seq, start = m.begin_step(op[2])
                self.note(uid, seq)
                life.started(seq, "step", start)
                yield ("one", seq)
            elif kind == "await":
                seq, started = m.begin_await(op[2])
                self.note(uid, seq)
                life.started(seq, "await", started)
                yield ("one", seq)
            elif kind == "sleep":
                seq, arm = m.begin_sleep(op[2], 1_000)
                self.note(uid, seq)
                life.armed(seq, "sleep", arm)
                yield ("one", seq)
            elif kind == "wait":
                seq, arm = m.begin_wait(op[2], 0)
                self.note(uid, seq)
                life.armed(seq, "wait", arm)
                yield ("one", seq)
            elif kind == "child":
                detached = op[3]
                flags = DETACHED if detached else 0
                seq, arm = m.begin_child(op[2], f"{op[2]}-kid", flags, 0, b"in")
                self.note(uid, seq)
                if detached:
                    assert arm is not REPLAY
                    if isinstance(arm, Append):
                        life.append(arm.record)
                    self.trace.append(("c", seq))
                else:
                    life.armed(seq, "child", arm)
                    yield ("one", seq)
            elif kind == "value":
                seq, v, record = m.value(op[2], life.make_value)
                self.note(uid, seq)
                if record is not None:
                    life.append(record)
                self.trace.append(("v", seq, v))
            elif kind == "send":
                seq, sent = m.send("other", op[2], b"x")
                self.note(uid, seq)
                if sent is not None:
                    life.append(sent)
            elif kind == "attrs":
                seq, attrs = m.set_attributes(b"{}")
                self.note(uid, seq)
                if attrs is not None:
                    life.append(attrs)
            elif kind == "patched":
                at = m.next_seq
                on, patch = m.patched(op[2])
                if patch is not None:
                    life.append(patch)
                self.trace.append(("p", at, op[2], on))
            elif kind == "race":
                s1, arm1 = m.begin_wait(op[2], 0)
                life.armed(s1, "wait", arm1)
                s2, arm2 = m.begin_sleep(op[3], 500)
                life.armed(s2, "sleep", arm2)
                self.note(uid, s1)
                yield ("race", s1, s2)
            else:
                assert kind == "par"
                yield ("join", [self.branch(b) for b in op[2]])


# --- the world: a host that appends records and reports live completions ----------


@dataclass
class Life:
    """One life of a run: a machine loaded from ``journal``, the program's code
    on it, and a world making random live decisions (``live=False``: the world
    may not act at all)."""

    program: Program
    journal: list[r.Record]
    rng: random.Random
    live: bool = True
    m: RunMachine = field(init=False)
    code: Code = field(init=False)
    #: Trace length when each journal record was appended (by index).
    marks: list[int] = field(default_factory=list)
    #: Records this life appended, each with whether replay was in progress.
    appended: list[tuple[r.Record, bool]] = field(default_factory=list)
    todo: dict[int, list[Any]] = field(default_factory=dict)
    retries: dict[int, int] = field(default_factory=dict)
    cancels: int = 0
    offers: int = 0

    def __post_init__(self) -> None:
        self.journal = list(self.journal)
        self.marks = [0] * len(self.journal)
        self.m = RunMachine.from_journal(self.journal, len(self.journal))
        self.code = Code(self.program, self)
        self.signals = sum(1 for x in self.journal if type(x) is r.Signal)
        # Timers and children armed in the journal without a result: the
        # shard may complete them before replay reaches them (held early).
        records: list[Any] = self.journal
        resolved = {x.seq for x in records if type(x) in (r.Fired, r.ChildDone)}
        for x in records:
            if type(x) in (r.Timer, r.Child) and x.seq not in resolved:
                if type(x) is r.Child and x.flags & DETACHED:
                    continue
                self.todo[x.seq] = ["early-sleep" if type(x) is r.Timer else "early-child"]

    # -- host side of the code's operations

    def append(self, record: r.Record) -> None:
        self.journal.append(record)
        self.marks.append(len(self.code.trace))
        self.appended.append((record, self.m.is_replaying()))

    def make_value(self) -> bytes:
        return self.rng.randbytes(8)

    def started(self, seq: int, kind: str, start: object) -> None:
        if start is REPLAY:
            return
        if isinstance(start, AwaitWaiting):
            self.todo[seq] = ["result", start.attempt]
        else:
            assert isinstance(start, StepRun)
            state = "paused" if start.not_before_ms == PAUSED else kind
            self.todo[seq] = [state if kind == "step" or state == "paused" else "token"]

    def armed(self, seq: int, kind: str, arm: object) -> None:
        if arm is REPLAY:
            return
        if isinstance(arm, Append):
            self.append(arm.record)
        self.todo[seq] = [kind]

    # -- the loop

    def run(self) -> None:
        m, code = self.m, self.code
        code.start()
        for _ in range(10_000):
            self.deliver()
            if code.finished():
                assert m.take_offered_updates() == [] and m.pending_len() == 0
                if m.recorded_done() is None:
                    self.append(m.finish(Status.OK, b"end", 99))
                else:
                    m.check_end()
                return
            assert self.live, "a finished journal replayed but needed live work"
            self.act()
        raise AssertionError("the run did not end")

    def deliver(self) -> None:
        m, code = self.m, self.code
        while True:
            # Live work ends whenever it ends: before any delivery, replay
            # included, the world may report some.
            if self.live and self.todo and self.rng.random() < 0.3:
                self.act(needed=False)
            n = m.next()
            if isinstance(n, Deliver):
                if n.record is not None:
                    self.append(n.record)
                self.todo.pop(n.seq, None)
                assert code.resolve(n.seq, n.outcome), f"nobody waits for {n.seq}"
            elif isinstance(n, CancelAll):
                if n.record is not None:
                    self.append(n.record)
                for seq in n.seqs:
                    self.todo.pop(seq, None)
                    code.resolve(seq, Outcome(Status.CANCELLED, n.reason))
            elif isinstance(n, UpdateTurn):
                if n.live is None:
                    code.start_update(n.ordinal, n.name)
                elif self.rng.random() < 0.8:
                    ordinal, record = m.accept_update(n.name, n.id, n.payload)
                    assert ordinal == n.ordinal
                    self.append(record)
                    code.start_update(ordinal, n.name)
            elif n is STALLED:
                err = m.stall_error()
                if err is not None:
                    raise err
                return
            else:
                assert n is IDLE
                return

    def act(self, needed: bool = True) -> None:
        """One random live event; ``needed``: the code cannot go on without one."""
        m, rng = self.m, self.rng
        for seq in list(self.todo):
            early = self.todo[seq][0].startswith("early")
            if not early and not m.is_live_pending(seq):
                del self.todo[seq]
        # Cancellations and updates are rare events next to completions, so
        # that runs get far enough to exercise everything else.
        extra: list[Any] = []
        # A run whose journal holds its end takes no new requests.
        ended = m.recorded_done() is not None
        if self.cancels < 2 and not ended:
            extra.append("cancel")
        if self.program.handlers and self.offers < 3 and not ended:
            extra.append("update")
        pick: int | str
        if self.todo and (not extra or rng.random() < 0.9):
            pick = rng.choice(sorted(self.todo))
        elif extra:
            pick = rng.choice(extra)
        else:
            assert not needed, "stuck: the code waits and the world has nothing to do"
            return
        if rng.random() < 0.1 and not ended:
            # A signal nobody waits for: ordinals are not positions in the
            # order waits consume them.
            self.append(r.Signal(m.run, "noise", self.signals, b"noise", None))
            self.signals += 1
        if pick == "cancel":
            self.cancels += 1
            m.request_cancel(b"stop", b"test")
        elif pick == "update":
            self.offers += 1
            name = rng.choice(sorted(self.program.handlers))
            m.offer_update(self.offers, name, f"id{self.offers}", f"p{self.offers}".encode())
        else:
            assert isinstance(pick, int)
            self.work(pick)

    def payload(self, seq: int) -> bytes:
        return f"{seq}:{self.rng.randrange(1000)}".encode()

    def work(self, seq: int) -> None:
        m, rng = self.m, self.rng
        state = self.todo[seq]
        kind = state[0]
        taken = True
        if kind == "step":
            retries = self.retries.get(seq, 0)
            roll = rng.random()
            if roll < 0.15 and retries < 2:
                self.retries[seq] = retries + 1
                record = m.step_retry(seq, 10 * (retries + 1), b"boom")
                assert record is not None
                self.append(record)
                return
            if roll < 0.2 and retries < 2:
                self.retries[seq] = 2
                record = m.step_retry(seq, PAUSED, b"gave up")
                assert record is not None and m.step_paused(seq)
                self.append(record)
                state[0] = "paused"
                return
            if roll < 0.25:
                beat = m.heartbeat(seq, b"progress")
                assert beat is not None
                self.append(beat)
                return
            status = Status.OK if roll < 0.9 else Status.FAILED
            payload = self.payload(seq)
            if rng.random() < 0.5:
                step = m.take_live_step(seq, status, payload)
                if step is not None:
                    self.append(step)
                    del self.todo[seq]
                    assert self.code.resolve(seq, Outcome(status, payload))
                    return
            taken = m.complete(seq, StepDone(status, payload))
        elif kind == "paused":
            for resume in m.resume(b"ops"):
                self.append(resume)
                resumed = self.todo.get(resume.seq)
                if resumed is not None and resumed[0] == "paused":
                    resumed[0] = "token" if m.await_attempt(resume.seq) is not None else "step"
            return
        elif kind == "token":
            if rng.random() < 0.2 and self.retries.get(seq, 0) < 2:
                self.retries[seq] = self.retries.get(seq, 0) + 1
                record = m.step_retry(seq, 5, b"token lost")
                assert record is not None
                self.append(record)
                return
            awaiting = m.awaiting(seq)
            assert awaiting is not None
            self.append(awaiting)
            self.todo[seq] = ["result", awaiting.attempt]
            return
        elif kind == "result":
            attempt = state[1]
            if attempt > 1 and rng.random() < 0.3:
                assert not m.complete(seq, AsyncCompleted(attempt - 1, Status.OK, b"stale"))
            taken = m.complete(seq, AsyncCompleted(attempt, Status.OK, self.payload(seq)))
        elif kind in ("sleep", "early-sleep"):
            taken = m.complete(seq, Fired())
        elif kind == "wait":
            if rng.random() < 0.7 and m.recorded_done() is None:
                payload = self.payload(seq)
                self.append(r.Signal(m.run, "sig", self.signals, payload, None))
                taken = m.complete(seq, SignalTaken(self.signals, payload))
                self.signals += 1
            else:
                taken = m.complete(seq, WaitTimedOut())
        else:
            assert kind in ("child", "early-child")
            status = Status.OK if rng.random() < 0.8 else Status.FAILED
            taken = m.complete(seq, ChildResult(status, self.payload(seq)))
        del self.todo[seq]
        # Refused only when it is no longer wanted: not pending live, already
        # queued (an early report taken when the code reached it), or early.
        assert taken or not m.step_pending(seq) or seq >= m.next_seq


# --- checks ---------------------------------------------------------------------------

_MARKERS = (r.Timer, r.Wait, r.Child)
_POSITIONAL = (r.Value, r.Send, r.Attributes, r.UpdateDone)
_DELIVERIES = (r.Step, r.Fired, r.ChildDone, r.Completed)
#: Records that give a position an entry in the machine's recorded table.
_RECORDED = (
    r.Step, r.Attempt, r.Resume, r.Timer, r.Fired, r.Wait, r.Waited, r.Value, r.Child,
    r.ChildDone, r.Send, r.UpdateDone, r.Awaiting, r.Completed, r.Attributes,
)  # fmt: skip


def fact(x: Any) -> tuple[Any, ...] | None:
    """What ``x`` establishes that must be recorded only once."""
    t = type(x)
    if t in _DELIVERIES:
        return ("delivered", x.seq)
    if t is r.Waited:
        kind = "abandoned" if x.outcome == r.WaitOutcome.ABANDONED else "delivered"
        return (kind, x.seq)
    if t in _MARKERS:
        return ("armed", x.seq)
    if t in _POSITIONAL:
        return ("positional", x.seq)
    if t in (r.Attempt, r.Awaiting, r.Resume):
        return (t.__name__, x.seq, x.attempt)
    if t is r.Patch:
        return ("patch", x.at, x.id)
    if t in (r.Done, r.Start):
        return (t.__name__,)
    return None


def assert_no_duplicates(journal: list[r.Record]) -> None:
    facts = [f for f in map(fact, journal) if f is not None]
    dups = {f for f in facts if facts.count(f) > 1}
    assert not dups, f"recorded twice: {sorted(dups)}"


def start_record(program: Program) -> r.Start:
    update = r.UpdateWithStart("u1", "w0", b"s") if program.update_with_start else None
    return r.Start(1, "wf", "t", 1, 0, 0, 0, None, 0, update, b"in")


@settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(), st.integers(0, 2**32 - 1))
def test_replay_from_any_prefix_sees_what_the_live_run_saw(program: Program, seed: int) -> None:
    rng = random.Random(seed)
    # Life 1: live from the start record.
    live = Life(program, [start_record(program)], random.Random(rng.random()))
    live.run()
    journal, trace = live.journal, live.code.trace
    assert_no_duplicates(journal)

    # A crash: the journal keeps a prefix of its records.
    cut = rng.randint(1, len(journal))
    prefix = journal[:cut]
    agreed = live.marks[cut] if cut < len(journal) else len(trace)
    again = Life(program, prefix, random.Random(rng.random()))
    again.run()
    assert again.code.trace[:agreed] == trace[:agreed]
    for record, replaying in again.appended:
        what = fact(record)
        assert not (replaying and what is not None and what[0] == "delivered"), (
            f"a delivery was appended during replay: {record}"
        )
    assert_no_duplicates(again.journal)
    if cut == len(journal):
        # The world may run operations the journal cancels later (a step or a
        # token function started before a recorded cancellation); nothing else.
        extra = {type(x) for x, _ in again.appended}
        assert extra <= {r.Attempt, r.Awaiting, r.Heartbeat, r.Resume}, extra

    # The journal the second life finished replays with no live work at all.
    final = Life(program, again.journal, random.Random(0), live=False)
    final.run()
    assert final.appended == []
    assert final.code.trace == again.code.trace


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(), st.integers(0, 2**32 - 1), st.data())
def test_a_program_changed_at_a_recorded_position_is_refused(
    program: Program, seed: int, data: st.DataObject
) -> None:
    live = Life(program, [start_record(program)], random.Random(seed))
    live.run()
    records: list[Any] = live.journal
    recorded = {x.seq for x in records if type(x) in _RECORDED}
    kinds: dict[int, str] = {}

    def collect(branch: Branch) -> None:
        for op in branch:
            if op[1] == "par":
                for b in op[2]:
                    collect(b)
            else:
                kinds[op[0]] = op[1]

    collect(program.main)
    for handler in program.handlers.values():
        collect(handler)
    candidates = sorted(
        uid
        for uid, seqs in live.code.seqs_of.items()
        if kinds[uid] != "race" and min(seqs) in recorded
    )
    if not candidates:
        return  # nothing of the program is recorded at a position of its own
    uid = data.draw(st.sampled_from(candidates))
    at = min(live.code.seqs_of[uid])
    changed_op = (uid, "step", "changed")
    changed = Program(
        replace_op(program.main, uid, changed_op),
        {name: replace_op(b, uid, changed_op) for name, b in program.handlers.items()},
        program.update_with_start,
    )
    with pytest.raises(DeterminismError) as e:
        Life(changed, live.journal, random.Random(seed)).run()
    assert e.value.seq == at
    assert f"position {at}:" in str(e.value)
    assert "the code called step 'changed'" in str(e.value)
