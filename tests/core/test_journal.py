"""The journal machine: live runs, their replay, and every rule between them."""

from __future__ import annotations

import pytest

from fusee.core import records as r
from fusee.core.journal import (
    ARMED,
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
    OpKind,
    Outcome,
    RunMachine,
    SignalTaken,
    StepDone,
    StepRun,
    StreamOpen,
    UpdateTurn,
    WaitTimedOut,
)
from fusee.core.records import PAUSED, WORKFLOW, Status, ValueKind, WaitOutcome
from fusee.errors import DeterminismError, StreamError

OK = Status.OK


def start(update: r.UpdateWithStart | None = None) -> r.Start:
    return r.Start(1, "wf", "t", 1, 10, 0, 0, None, 0, update, b"in")


def ok(payload: bytes) -> StepDone:
    return StepDone(OK, payload)


def drain(m: RunMachine, journal: list[r.Record]) -> list[tuple[int, Outcome]]:
    """Delivers everything deliverable, appending live records to ``journal``."""
    out: list[tuple[int, Outcome]] = []
    while True:
        d = m.next()
        if isinstance(d, Deliver):
            if d.record is not None:
                journal.append(d.record)
            out.append((d.seq, d.outcome))
        elif isinstance(d, CancelAll):
            if d.record is not None:
                journal.append(d.record)
            out.extend((s, Outcome(Status.CANCELLED, d.reason)) for s in d.seqs)
        elif isinstance(d, UpdateTurn):
            continue
        else:
            return out


def appended(arm: object) -> r.Record:
    assert isinstance(arm, Append), arm
    return arm.record


# --- the original's tests -------------------------------------------------------


def test_live_then_replay_in_journal_order() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, sa = m.begin_step("a")
    b, _ = m.begin_step("b")
    assert sa == StepRun(1, 0)
    # b finishes before a.
    assert m.complete(b, ok(b"B"))
    assert m.complete(a, ok(b"A"))
    got = drain(m, journal)
    assert [g[0] for g in got] == [b, a]
    assert journal[1] == r.Step(1, b, "b", 1, OK, b"B")

    # Replay delivers b before a even though a is started first.
    rm = RunMachine.from_journal(journal, 3)
    assert rm.is_replaying()
    assert rm.begin_step("a") == (a, REPLAY)
    assert rm.begin_step("b") == (b, REPLAY)
    scratch: list[r.Record] = []
    got = drain(rm, scratch)
    assert scratch == []
    assert got == [(b, Outcome(OK, b"B")), (a, Outcome(OK, b"A"))]
    assert not rm.is_replaying()


def test_mismatched_name_is_a_determinism_error() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    m.complete(s, ok(b"1"))
    drain(m, journal)
    rm = RunMachine.from_journal(journal, 2)
    with pytest.raises(DeterminismError) as e:
        rm.begin_step("refund")
    assert e.value.seq == 0
    assert "the journal recorded step 'charge' here but the code called step 'refund'" in str(
        e.value
    )
    assert "position 0" in str(e.value)


def test_another_kind_at_a_recorded_position_is_a_determinism_error() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    m.complete(s, ok(b"1"))
    drain(m, journal)
    rm = RunMachine.from_journal(journal, 2)
    with pytest.raises(
        DeterminismError, match="recorded step 'charge' here but the code called sleep 'nap'"
    ):
        rm.begin_sleep("nap", 5)
    rm = RunMachine.from_journal(journal, 2)
    with pytest.raises(DeterminismError, match="called value"):
        rm.value(ValueKind.NOW, lambda: b"x")


def test_live_completions_wait_for_replay() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.begin_step("b")
    m.complete(a, ok(b"A"))
    drain(m, journal)
    # Crash: b never finished. On replay b runs live; its completion waits
    # until a's recorded result has been delivered.
    rm = RunMachine.from_journal(journal, 2)
    assert rm.begin_step("a") == (a, REPLAY)
    b2, sb = rm.begin_step("b")
    assert isinstance(sb, StepRun)
    assert rm.complete(b2, ok(b"B"))
    more: list[r.Record] = []
    got = drain(rm, more)
    assert [g[0] for g in got] == [a, b2]
    assert more == [r.Step(1, b2, "b", 1, OK, b"B")]


def test_retries_resume_from_the_journal() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("flaky")
    journal.append(m.step_retry(s, 500, b"e1") or pytest.fail())
    journal.append(m.step_retry(s, 900, b"e2") or pytest.fail())
    assert journal[1] == r.Attempt(1, s, "flaky", 1, 500, b"e1")
    rm = RunMachine.from_journal(journal, 3)
    assert rm.begin_step("flaky") == (s, StepRun(3, 900))
    assert rm.step_attempt(s) == 3


def test_a_paused_step_resumes_with_a_fresh_budget() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    journal.append(m.step_retry(s, 500, b"e1") or pytest.fail())
    assert not m.is_suspended()
    journal.append(m.step_retry(s, PAUSED, b"e2") or pytest.fail())
    assert m.step_paused(s) and m.is_paused() and m.is_suspended()
    # A crash while paused: the step is still paused.
    rm = RunMachine.from_journal(journal, 3)
    assert rm.is_paused()
    assert rm.begin_step("charge") == (s, StepRun(3, PAUSED))
    assert rm.step_paused(s) and rm.is_suspended()
    # Live: the resume names the last attempt; the next is the 3rd of the
    # journal and the 1st of the new budget.
    resumed = m.resume(b"cli:ana")
    assert resumed == [r.Resume(1, s, 2, b"cli:ana")]
    assert not m.step_paused(s) and not m.is_paused() and m.resume() == []
    journal.extend(resumed)
    journal.append(m.step_retry(s, 900, b"e3") or pytest.fail())
    # Replay: attempts count from the resume; the journal's go on.
    rm = RunMachine.from_journal(journal, 4)
    assert rm.begin_step("charge") == (s, StepRun(2, 900))
    assert rm.step_retry(s, 950, b"e4") == r.Attempt(1, s, "charge", 4, 950, b"e4")


def test_a_resume_before_the_code_reaches_the_step() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    journal.append(m.step_retry(s, PAUSED, b"e1") or pytest.fail())
    # Loaded from the journal; the code has not run yet.
    rm = RunMachine.from_journal(journal, 2)
    assert rm.is_paused()
    assert rm.resume() == [r.Resume(1, s, 1, None)]
    assert not rm.is_paused()
    assert rm.begin_step("charge") == (s, StepRun(1, 0))
    assert not rm.step_paused(s)


def test_a_replayed_paused_step_is_resumed_once() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("charge")
    journal.append(m.step_retry(s, PAUSED, b"e1") or pytest.fail())
    rm = RunMachine.from_journal(journal, 2)
    assert rm.begin_step("charge") == (s, StepRun(2, PAUSED))
    assert rm.resume() == [r.Resume(1, s, 1, None)]
    rm.complete(s, ok(b"paid"))
    assert drain(rm, []) == [(s, Outcome(OK, b"paid"))]
    # Its recorded pause is history now: nothing is paused any more.
    assert not rm.is_paused()
    assert rm.resume() == []


def test_cancellation_replays_at_the_same_point() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    w, arm = m.begin_wait("approve", 0)
    journal.append(appended(arm))
    m.request_cancel(b"stop", b"cli")
    got = drain(m, journal)
    assert got == [(a, Outcome(Status.CANCELLED, b"stop")), (w, Outcome(Status.CANCELLED, b"stop"))]
    assert journal[-1] == r.Cancel(1, b"stop", b"cli")
    # Compensation after cancellation runs normally.
    c, _ = m.begin_step("undo")
    m.complete(c, ok(b"u"))
    drain(m, journal)
    journal.append(m.finish(Status.CANCELLED, b"stop", 99))

    rm = RunMachine.from_journal(journal, 9)
    assert rm.begin_step("a") == (a, StepRun(1, 0))
    assert rm.begin_wait("approve", 0) == (w, ARMED)
    none: list[r.Record] = []
    got = drain(rm, none)
    assert len(got) == 2 and none == []
    assert all(o.status == Status.CANCELLED for _, o in got)
    assert rm.begin_step("undo") == (c, REPLAY)
    assert drain(rm, none) == [(c, Outcome(OK, b"u"))]
    assert rm.recorded_done() == (Status.CANCELLED, b"stop")


def test_repeated_terminal_cancel_replays_without_hiding_other_deliveries() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    m.begin_step("charge")
    m.request_cancel(b"stop")
    assert len(drain(m, journal)) == 1
    # Nothing new to cancel at the same point: no second delivery.
    assert m.cancellation_covers_current_operations()
    m.request_cancel(b"retry")
    assert drain(m, journal) == []
    assert len(journal) == 2
    # An older journal may hold such a repeated cancel anyway.
    journal.append(r.Cancel(1, b"retry", None))
    rm = RunMachine.from_journal(journal, 3)
    rm.begin_step("charge")
    assert isinstance(rm.next(), CancelAll)
    rm.check_end()
    # Compensation started after that cancellation: the recorded cancel must
    # still be delivered before the workflow returns.
    rm.begin_step("undo")
    with pytest.raises(DeterminismError, match="1 more deliveries"):
        rm.check_end()
    assert isinstance(rm.next(), CancelAll)
    rm.check_end()


def test_values_and_waits_replay() -> None:
    journal: list[r.Record] = [start(), r.Signal(1, "go", 0, b"yes", None)]
    m = RunMachine.from_journal(journal, 2)
    _, now, record = m.value(ValueKind.NOW, lambda: b"12345678")
    assert now == b"12345678" and record is not None
    journal.append(record)
    w, arm = m.begin_wait("go", 0)
    journal.append(appended(arm))
    assert m.complete(w, SignalTaken(0, b"yes"))
    drain(m, journal)
    assert journal[-1] == r.Waited(1, w, WaitOutcome.SIGNAL, 0)

    rm = RunMachine.from_journal(journal, 5)
    assert rm.value(ValueKind.NOW, lambda: b"other") == (0, b"12345678", None)
    assert rm.begin_wait("go", 0) == (w, REPLAY)
    assert rm.next() == Deliver(w, Outcome(OK, b"yes"), None)


def test_a_value_of_another_kind_is_a_determinism_error() -> None:
    m = RunMachine.fresh(start(), 1)
    _, _, record = m.value(ValueKind.UUID, lambda: b"u" * 16)
    assert record is not None
    rm = RunMachine.from_journal([start(), record], 2)
    with pytest.raises(
        DeterminismError, match="recorded a uuid value here but the code asked for a random"
    ):
        rm.value(ValueKind.RANDOM, lambda: b"r")


def test_now_records_little_endian_milliseconds() -> None:
    m = RunMachine.fresh(start(), 1)
    t, record = m.now(1_700_000_000_123)
    assert t == 1_700_000_000_123
    assert record == r.Value(1, 0, ValueKind.NOW, (1_700_000_000_123).to_bytes(8, "little"))
    rm = RunMachine.from_journal([start(), record], 2)
    assert rm.now(5) == (1_700_000_000_123, None)


def test_a_timed_out_wait_replays_as_timed_out() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    w, arm = m.begin_wait("go", 50)
    assert appended(arm) == r.Wait(1, w, "go", 50)
    journal.append(appended(arm))
    m.complete(w, WaitTimedOut())
    assert drain(m, journal) == [(w, Outcome(Status.TIMED_OUT, b""))]
    rm = RunMachine.from_journal(journal, 3)
    assert rm.begin_wait("go", 50) == (w, REPLAY)
    assert drain(rm, []) == [(w, Outcome(Status.TIMED_OUT, b""))]


def test_a_wait_on_a_signal_the_journal_lacks_is_refused() -> None:
    journal: list[r.Record] = [
        start(),
        r.Wait(1, 0, "go", 0),
        r.Waited(1, 0, WaitOutcome.SIGNAL, 3),
    ]
    with pytest.raises(DeterminismError, match="signal #3"):
        RunMachine.from_journal(journal, 3)


def test_stall_is_reported_only_when_nothing_live_is_pending() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    m.begin_step("a")
    b, _ = m.begin_step("b")
    m.complete(b, ok(b"B"))
    drain(m, journal)
    # On replay the code starts "a" (live: it never finished) but never
    # starts "b", whose result the journal delivers next.
    rm = RunMachine.from_journal(journal, 2)
    a, _ = rm.begin_step("a")
    assert rm.next() is STALLED
    assert rm.stall_error() is None, "step a is live work"
    rm.forget(a)
    err = rm.stall_error()
    assert err is not None and err.seq == b
    assert "step 'b'" in str(err)


def test_updates_are_deliveries_in_journal_order() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.offer_update(77, "add", "u1", b"5")
    turn = m.next()
    assert turn == UpdateTurn(0, "add", "u1", b"5", 77)
    assert isinstance(turn, UpdateTurn)
    ordinal, record = m.accept_update(turn.name, turn.id, turn.payload)
    assert ordinal == 0
    journal.append(record)
    # The handler runs a step and returns.
    h, _ = m.begin_step("handler-step")
    m.complete(h, ok(b"H"))
    drain(m, journal)
    _, done = m.update_done(ordinal, OK, b"6")
    assert done is not None
    journal.append(done)
    m.complete(a, ok(b"A"))
    drain(m, journal)

    # Replay: the update is delivered at its place, the handler's step and
    # result are recorded, nothing is appended.
    rm = RunMachine.from_journal(journal, 9)
    assert rm.begin_step("a") == (a, REPLAY)
    assert rm.next() == UpdateTurn(0, "add", "u1", b"5", None)
    assert rm.begin_step("handler-step") == (h, REPLAY)
    d = rm.next()
    assert isinstance(d, Deliver) and d.seq == h
    assert rm.update_done(0, OK, b"6") == (2, None)
    d = rm.next()
    assert isinstance(d, Deliver) and d.seq == a
    assert not rm.is_replaying()


def test_an_update_result_of_another_ordinal_is_a_determinism_error() -> None:
    journal: list[r.Record] = [
        start(r.UpdateWithStart("add", "u0", b"1")),
        r.UpdateDone(1, 0, 0, OK, b""),
    ]
    rm = RunMachine.from_journal(journal, 2)
    # The update delivered with the start comes first, without a token.
    assert rm.next() == UpdateTurn(0, "add", "u0", b"1", None)
    with pytest.raises(DeterminismError, match="update #0 here but the code returned update #1"):
        rm.update_done(1, OK, b"")


def test_offered_updates_can_be_taken_back() -> None:
    m = RunMachine.fresh(start(), 1)
    m.offer_update(5, "a", "1", b"")
    m.request_cancel(b"stop")
    m.offer_update(6, "b", "2", b"")
    assert m.take_offered_updates() == [5, 6]
    assert isinstance(m.next(), CancelAll)
    assert m.next() is IDLE


def test_async_completion_checks_the_attempt() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, st = m.begin_await("approval")
    assert st == StepRun(1, 0)
    # The token function failed once and is retried.
    journal.append(m.step_retry(s, 5, b"smtp down") or pytest.fail())
    awaiting = m.awaiting(s)
    assert awaiting == r.Awaiting(1, s, "approval", 2)
    journal.append(awaiting)
    assert m.awaiting(s) is None
    assert m.is_suspended()
    assert m.await_attempt(s) == 2
    # A token of the first attempt is stale.
    assert not m.complete(s, AsyncCompleted(1, OK, b"x"))
    assert m.complete(s, AsyncCompleted(2, OK, b"yes"))
    assert drain(m, journal) == [(s, Outcome(OK, b"yes"))]
    assert journal[-1] == r.Completed(1, s, 2, OK, b"yes")
    # Replay after the token went out waits instead of running again.
    rm = RunMachine.from_journal(journal[:3], 3)
    assert rm.begin_await("approval") == (s, AwaitWaiting(2))
    assert rm.is_suspended()
    rm = RunMachine.from_journal(journal[:2], 2)
    assert rm.begin_await("approval") == (s, StepRun(2, 5))
    rm = RunMachine.from_journal(journal, 4)
    assert rm.begin_await("approval") == (s, REPLAY)


def test_patches_take_no_position() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.complete(a, ok(b"A"))
    drain(m, journal)
    b, _ = m.begin_step("b")
    m.complete(b, ok(b"B"))
    drain(m, journal)
    # Old code ran a then b. New code asks for a patch between them:
    # replaying, it takes the old branch and keeps b at position 1.
    rm = RunMachine.from_journal(journal, 3)
    rm.begin_step("a")
    assert rm.patched("fix") == (False, None)
    assert rm.begin_step("b") == (1, REPLAY)
    # Past the journal the patch applies, and is remembered.
    on, record = rm.patched("later")
    assert on and record == r.Patch(1, 2, "later")
    rm2 = RunMachine.from_journal([*journal, record], 4)
    rm2.begin_step("a")
    rm2.begin_step("b")
    assert rm2.patched("later") == (True, None)
    # A fresh run takes every patch.
    assert RunMachine.fresh(start(), 1).patched("fix")[0]


def test_heartbeat_progress_survives_into_the_retry() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("export")
    beat = m.heartbeat(s, b"page-7")
    assert beat == r.Heartbeat(1, s, 1, b"page-7")
    journal.append(beat)
    assert m.progress(s) == b"page-7"
    rm = RunMachine.from_journal(journal, 2)
    rm.begin_step("export")
    assert rm.progress(s) == b"page-7"
    assert rm.heartbeat(99, b"x") is None


def test_a_queued_completion_is_taken_once_and_in_order() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    seqs = [m.begin_step("s")[0] for _ in range(20_000)]
    # Completed back to front, each reported twice: only the first counts.
    for s in reversed(seqs):
        assert m.complete(s, ok(str(s).encode()))
        assert not m.complete(s, ok(str(s + 1).encode()))
    got = drain(m, journal)
    assert [g[0] for g in got] == list(reversed(seqs))
    assert all(o.payload == str(s).encode() for s, o in got)
    # Delivered: no longer pending, so a late report is ignored.
    assert not m.complete(seqs[0], ok(b"0"))
    assert m.next() is IDLE


# --- beyond the original's tests -------------------------------------------------------


def test_sleep_arms_once_and_replays() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, arm = m.begin_sleep("nap", 1_000)
    assert appended(arm) == r.Timer(1, s, "nap", 1_000)
    journal.append(appended(arm))
    assert m.is_suspended() and m.pending_kind(s) is OpKind.SLEEP
    # A crash before it fired: armed already, nothing to append.
    rm = RunMachine.from_journal(journal, 2)
    assert rm.begin_sleep("nap", 1_000) == (s, ARMED)
    assert rm.is_live_pending(s)
    m.complete(s, Fired())
    assert drain(m, journal) == [(s, Outcome(OK, b""))]
    assert journal[-1] == r.Fired(1, s)
    rm = RunMachine.from_journal(journal, 3)
    assert rm.begin_sleep("nap", 1_000) == (s, REPLAY)
    assert drain(rm, []) == [(s, Outcome(OK, b""))]


def test_a_completion_before_the_code_reaches_its_operation_is_held() -> None:
    journal: list[r.Record] = [start(), r.Step(1, 0, "a", 1, OK, b"A"), r.Timer(1, 1, "nap", 10)]
    rm = RunMachine.from_journal(journal, 3)
    # The shard's timer fires while replay has not reached the sleep yet.
    assert not rm.complete(1, Fired())
    rm.begin_step("a")
    assert rm.begin_sleep("nap", 10) == (1, ARMED)
    got: list[r.Record] = []
    assert drain(rm, got) == [(0, Outcome(OK, b"A")), (1, Outcome(OK, b""))]
    assert got == [r.Fired(1, 1)]


def test_children_resolve_and_detached_children_take_no_delivery() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    c, arm = m.begin_child("ship", "ship-1", 0, 0, b"in")
    assert appended(arm) == r.Child(1, c, "ship", "ship-1", 0, 0, b"in")
    journal.append(appended(arm))
    d, arm = m.begin_child("mail", "mail-1", r.DETACHED, 0, b"")
    journal.append(appended(arm))
    # The detached child resolves at once: nothing pending for it.
    assert m.pending_kind(d) is None and m.pending_len() == 1
    assert m.is_suspended()
    m.complete(c, ChildResult(Status.FAILED, b"lost"))
    assert drain(m, journal) == [(c, Outcome(Status.FAILED, b"lost"))]
    assert journal[-1] == r.ChildDone(1, c, Status.FAILED, b"lost")

    rm = RunMachine.from_journal(journal, 4)
    assert rm.begin_child("ship", "ship-1", 0, 0, b"in") == (c, REPLAY)
    assert rm.begin_child("mail", "mail-1", r.DETACHED, 0, b"") == (d, ARMED)
    assert rm.pending_len() == 1
    assert drain(rm, []) == [(c, Outcome(Status.FAILED, b"lost"))]
    rm.check_end()
    with pytest.raises(DeterminismError, match="recorded child 'ship'"):
        RunMachine.from_journal(journal, 4).begin_child("bill", "b", 0, 0, b"")


def test_send_and_attributes_are_recorded_once() -> None:
    m = RunMachine.fresh(start(), 1)
    s, send = m.send("other", "ping", b"x")
    a, attrs = m.set_attributes(b"{}")
    assert send == r.Send(1, s, "other", "ping", b"x")
    assert attrs == r.Attributes(1, a, b"{}")
    rm = RunMachine.from_journal([start(), send, attrs], 3)
    assert rm.send("other", "ping", b"x") == (s, None)
    assert rm.set_attributes(b"{}") == (a, None)
    assert rm.is_idle()
    with pytest.raises(
        DeterminismError, match="recorded send 'ping' here but the code called send 'pong'"
    ):
        RunMachine.from_journal([start(), send], 2).send("other", "pong", b"")


def test_an_abandoned_wait_is_recorded_once() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    t, arm = m.begin_sleep("timeout", 100)
    journal.append(appended(arm))
    w, arm = m.begin_wait("approve", 0)
    journal.append(appended(arm))
    m.complete(t, Fired())
    drain(m, journal)
    # The sleep won the race; the code drops the wait.
    abandoned = m.forget(w)
    assert abandoned == r.Waited(1, w, WaitOutcome.ABANDONED, 0)
    journal.append(abandoned)
    assert m.forget(w) is None
    assert not m.complete(w, SignalTaken(0, b"late"))
    assert m.is_idle()

    rm = RunMachine.from_journal(journal, 5)
    assert rm.begin_sleep("timeout", 100) == (t, REPLAY)
    # Replay reaches the wait before its result is known: armed, live.
    assert rm.begin_wait("approve", 0) == (w, ARMED)
    assert drain(rm, []) == [(t, Outcome(OK, b""))]
    assert rm.forget(w) is None, "the abandonment is recorded already"
    assert rm.is_idle()
    rm.check_end()


def test_forget_leaves_replayed_operations_alone() -> None:
    journal: list[r.Record] = [start(), r.Step(1, 0, "a", 1, OK, b"A")]
    rm = RunMachine.from_journal(journal, 2)
    rm.begin_step("a")
    assert rm.forget(0) is None
    assert rm.next() == Deliver(0, Outcome(OK, b"A"), None)


def test_the_end_check() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.complete(a, ok(b"A"))
    drain(m, journal)
    done = m.finish(OK, b"r", 7)
    assert done == r.Done(1, OK, 7, b"r", None)
    journal.append(done)
    # Code that returns before consuming its journal's deliveries diverged.
    rm = RunMachine.from_journal(journal, 3)
    assert rm.recorded_done() == (OK, b"r")
    with pytest.raises(DeterminismError) as e:
        rm.finish(OK, b"r", 8)
    assert e.value.seq == a and "1 more deliveries" in str(e.value)
    rm.begin_step("a")
    drain(rm, [])
    rm.check_end()


def test_a_journal_must_begin_with_its_start() -> None:
    with pytest.raises(DeterminismError, match="does not begin with a start record"):
        RunMachine.from_journal([r.Fired(1, 0)], 1)
    with pytest.raises(DeterminismError, match="does not begin with a start record"):
        RunMachine.from_journal([], 0)
    with pytest.raises(DeterminismError, match="second start record"):
        RunMachine.from_journal([start(), start()], 2)
    with pytest.raises(DeterminismError, match="inconsistent"):
        RunMachine.from_journal([start(), r.Timer(1, 0, "a", 1), r.Wait(1, 0, "b", 1)], 3)


def test_rebuild_and_release_reuse_a_machine() -> None:
    m = RunMachine.fresh(start(), 1)
    a, _ = m.begin_step("a")
    m.offer_update(3, "u", "1", b"")
    m.request_cancel(b"x")
    m.complete(a, ok(b"A"))
    assert m.reusable()
    m.release()
    assert m.is_idle() and m.info.id == "" and m.next() is IDLE
    other = r.Start(2, "other", "t", 1, 0, 0, 0, r.ParentRef("p", 9, 4), 3, None, b"x", b"tp")
    m.rebuild([other, r.Step(2, 0, "z", 1, OK, b"Z")], 5)
    assert m.run == 2 and m.gate == 5 and m.next_seq == 0
    assert m.info.parent == r.ParentRef("p", 9, 4) and m.info.trace == b"tp"
    assert m.info.policy == 3 and m.info.input == b"x"
    assert m.key(0) == "other/2/0"
    assert m.begin_step("z") == (0, REPLAY)
    assert m.next() == Deliver(0, Outcome(OK, b"Z"), None)
    assert m.next() is IDLE
    big = RunMachine.fresh(start(), 1)
    for _ in range(100):
        big.begin_step("s")
    assert not big.reusable()


def test_bookkeeping_queries() -> None:
    m = RunMachine.fresh(start(), 1)
    assert m.is_idle() and not m.is_suspended() and m.journal_size() == 0
    s, _ = m.begin_step("charge")
    assert m.pending_name(s) == "charge" and m.pending_len() == 1
    assert m.step_pending(s) and m.has_live_pending() and not m.is_suspended()
    assert m.complete(s, ok(b"1"))
    assert not m.step_pending(s)
    assert m.has_queued_deliveries() and m.delivers_only(s)
    d = m.next()
    assert isinstance(d, Deliver) and d.record == r.Step(1, s, "charge", 1, OK, b"1")
    assert m.journal_size() == 1 and m.key(s) == "wf/1/0"


def test_the_live_step_fast_path() -> None:
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("a")
    assert m.take_live_step(s, OK, b"A") == r.Step(1, s, "a", 1, OK, b"A")
    assert m.is_idle()
    # Not the only possible delivery: nothing is taken.
    s1, _ = m.begin_step("b")
    s2, _ = m.begin_step("c")
    assert m.take_live_step(s1, OK, b"B") is None
    assert m.complete(s1, ok(b"B"))
    m.forget(s2)
    assert m.take_live_step(s1, OK, b"B") is None, "its completion is queued"
    assert not m.delivers_only(s2)
    # During replay nothing is taken either.
    rm = RunMachine.from_journal([start(), r.Step(1, 1, "x", 1, OK, b"")], 2)
    t, _ = rm.begin_step("y")
    assert rm.take_live_step(t, OK, b"") is None


# --- streams -------------------------------------------------------------------------


def test_workflow_stream_chunks_replay_without_appending() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    assert m.stream_open("out", None) == StreamOpen(0, False)
    for payload in (b"a", b"b"):
        chunk = m.stream_append("out", None, payload)
        assert chunk is not None
        journal.append(chunk)
    assert journal[1:] == [
        r.Chunk(1, WORKFLOW, 0, "out", 0, b"a"),
        r.Chunk(1, WORKFLOW, 0, "out", 1, b"b"),
    ]
    rm = RunMachine.from_journal(journal, 3)
    assert rm.stream_open("out", None) == StreamOpen(0, False)
    assert rm.stream_append("out", None, b"a") is None
    assert rm.stream_append("out", None, b"b") is None
    # Past the journal, chunks continue after the recorded ones.
    assert rm.stream_append("out", None, b"c") == r.Chunk(1, WORKFLOW, 0, "out", 2, b"c")
    end = rm.stream_close("out", None)
    assert end == r.StreamEnd(1, WORKFLOW, "out", 3, OK)
    assert rm.stream_close("out", None) is None
    with pytest.raises(StreamError, match="'out' is closed"):
        rm.stream_append("out", None, b"d")
    assert rm.stream_len("out") == 3 and rm.stream_len("nope") is None


def test_a_step_that_runs_again_continues_after_its_recorded_chunks() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("export")
    assert m.stream_open("rows", s) == StreamOpen(0, False)
    for payload in (b"1", b"2"):
        journal.append(m.stream_append("rows", s, payload) or pytest.fail())
    assert journal[-1] == r.Chunk(1, s, 1, "rows", 1, b"2")
    assert m.owns_streams(s)
    journal.append(m.step_retry(s, 10, b"boom") or pytest.fail())
    # A crash; the step runs again and skips what it wrote before.
    rm = RunMachine.from_journal(journal, 4)
    assert rm.begin_step("export") == (s, StepRun(2, 10))
    assert rm.stream_open("rows", s) == StreamOpen(2, False)
    assert rm.stream_append("rows", s, b"3") == r.Chunk(1, s, 2, "rows", 2, b"3")
    # Its final result ends the stream with the result's status.
    assert rm.stream_ends(s, Status.FAILED) == [r.StreamEnd(1, s, "rows", 3, Status.FAILED)]
    assert not rm.owns_streams(s)
    assert rm.stream_ends(s, OK) == []


def test_a_step_whose_earlier_attempt_closed_its_stream_appends_nothing() -> None:
    journal: list[r.Record] = [start()]
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("export")
    m.stream_open("rows", s)
    journal.append(m.stream_append("rows", s, b"1") or pytest.fail())
    journal.append(m.stream_close("rows", s) or pytest.fail())
    assert not m.owns_streams(s)
    journal.append(m.step_retry(s, 10, b"boom") or pytest.fail())
    rm = RunMachine.from_journal(journal, 4)
    rm.begin_step("export")
    assert rm.stream_open("rows", s) == StreamOpen(1, True)
    assert rm.stream_append("rows", s, b"1") is None
    assert rm.stream_close("rows", s) is None


def test_stream_owner_rules() -> None:
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("a")
    t, _ = m.begin_step("b")
    m.stream_open("mine", s)
    with pytest.raises(StreamError, match="written by the step at journal position 0"):
        m.stream_open("mine", t)
    with pytest.raises(StreamError, match="written by the step at journal position 0"):
        m.stream_open("mine", None)
    with pytest.raises(StreamError, match="written by the step at journal position 0"):
        m.stream_append("mine", None, b"")
    with pytest.raises(StreamError, match="written by the step at journal position 0"):
        m.stream_close("mine", t)
    # A workflow's stream accepts its steps' chunks too.
    m.stream_open("shared", None)
    assert m.stream_append("shared", t, b"x") == r.Chunk(1, t, 1, "shared", 0, b"x")
    assert m.stream_append("shared", None, b"y") == r.Chunk(1, WORKFLOW, 0, "shared", 1, b"y")
    # A step that no longer runs may not write.
    m.complete(t, ok(b""))
    m.next()
    with pytest.raises(StreamError, match="no longer running"):
        m.stream_append("shared", t, b"z")
    assert isinstance(StreamError("x"), ValueError)
    # A live step that owns a stream takes the queued path, not the fast one.
    assert m.take_live_step(s, OK, b"") is None


def test_cancellation_during_replay_keeps_live_completions_for_later() -> None:
    journal: list[r.Record] = [
        start(),
        r.Timer(1, 0, "nap", 10),
        r.Cancel(1, b"stop", None),
    ]
    rm = RunMachine.from_journal(journal, 3)
    s, arm = rm.begin_sleep("nap", 10)
    assert arm is ARMED
    # The timer fires live while the recorded cancel is still to come.
    assert rm.complete(s, Fired())
    d = rm.next()
    assert isinstance(d, CancelAll) and d.seqs == [s] and d.record is None
    # The cancel resolved the sleep: its live completion is dropped.
    assert rm.next() is IDLE


def test_a_live_completion_of_the_wrong_kind_is_a_host_bug() -> None:
    m = RunMachine.fresh(start(), 1)
    s, _ = m.begin_step("a")
    with pytest.raises(AssertionError):
        m.complete(s, Fired())
    assert m.complete(s, StepDone(Status.FAILED, b"err"))
    d = m.next()
    assert isinstance(d, Deliver) and d.outcome == Outcome(Status.FAILED, b"err")
