"""Config, service and checkers on synthetic inputs (no engine needed)."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from fusee.core import records as r
from fusee.sim import checkers
from fusee.sim.checkers import Observed, Outcome, RunView, Snapshot
from fusee.sim.config import JOB_KINDS, SimConfig
from fusee.sim.report import Report, Totals
from fusee.sim.service import Effect, Service, TransientError, stable_hash


def test_config_is_a_function_of_the_seed() -> None:
    a, b = SimConfig.for_seed(17), SimConfig.for_seed(17)
    assert a == b and a.describe() == b.describe()
    configs = [SimConfig.for_seed(s) for s in range(200)]
    assert len({c.describe() for c in configs}) == 200
    # The range covers every knob's interesting values.
    assert {c.shards for c in configs} == {1, 2, 3, 4}
    assert any(c.crash_every_ms == 0 for c in configs) and any(c.crash_every_ms for c in configs)
    assert any(c.flush_fail_per_mille for c in configs)
    assert any(c.crash_after_io_per_mille for c in configs)
    assert all(set(c.mix) == set(JOB_KINDS) and c.mix["order"] > 0 for c in configs)
    for kind in JOB_KINDS:
        assert any(c.mix[kind] > 0 for c in configs)
    # The step pool, blocking steps and graceful closes vary too.
    assert {c.step_slots for c in configs} == {1, 2, 4, 8}
    assert {c.sync_steps_per_mille for c in configs} == {0, 300, 700, 1000}
    assert any(c.close_every_ms for c in configs) and any(not c.close_every_ms for c in configs)
    assert all(c.close_grace_ms > c.max_step_ms for c in configs)
    assert all(c.durable_within_ms > c.max_io_ms for c in configs)


def test_engine_options_keep_only_accepted_names() -> None:
    cfg = SimConfig.for_seed(3)
    opts = cfg.engine_options(frozenset({"shards", "segment_bytes"}))
    assert opts == {"shards": cfg.shards, "segment_bytes": cfg.segment_bytes}


def test_service_answers_differ_per_call_and_flag_a_second_input() -> None:
    svc = Service(seed=5)
    first = svc.call("k1", 10)
    assert svc.call("k1", 10) != first  # a rerun gets a new answer
    assert not svc.violations
    svc.call("k1", 11)
    assert len(svc.violations) == 1 and "k1" in svc.violations[0]
    assert Service(seed=5).call("k1", 10) == first  # deterministic per seed


def test_service_transient_failures_and_reads() -> None:
    svc = Service(seed=1)
    with pytest.raises(TransientError):
        svc.call("k", 1, fail_first=2)
    with pytest.raises(TransientError):
        svc.call("k", 1, fail_first=2)
    assert isinstance(svc.call("k", 1, fail_first=2), int)
    assert svc.failures == 2
    svc.read("r", 1)
    svc.read("r", 2)  # a read may run again on another input: counted, not a violation
    svc.read("r", 2)
    assert svc.reads_rerun == 1 and not svc.violations


def _start(wid: str) -> r.Start:
    return r.Start(run=1, id=wid, wtype="t", version=1, codec=0, started_ms=0, deadline_ms=0,
                   parent=None, policy=0, update=None, input=b"null")


def _done(status: r.Status = r.Status.OK, payload: bytes = b"1") -> r.Done:
    return r.Done(run=1, status=status, finished_ms=5, payload=payload)


def test_lost_start_and_lost_signal_are_caught() -> None:
    obs = Observed()
    obs.start_acked("a", "order")
    obs.start_acked("b", "order")
    obs.signal_acked("b", "approve")
    snap = Snapshot(runs={"a": RunView("a", None), "b": RunView("b", [_start("b")])})
    problems = checkers.check_all(obs, snap)
    assert any("start of a was lost" in p for p in problems)
    assert any("'approve' to b" in p for p in problems)
    sig = r.Signal(run=1, name="approve", dedup=0, payload=b"7")
    snap.runs = {"a": RunView("a", [_start("a")]), "b": RunView("b", [_start("b"), sig])}
    assert checkers.check_all(obs, snap) == []


def test_results_must_not_change() -> None:
    obs = Observed()
    obs.result("a", Outcome("ok", 3))
    obs.result("a", Outcome("ok", 3))
    assert obs.violations == []
    obs.result("a", Outcome("ok", 4))
    assert "changed" in obs.violations[0]
    obs2 = Observed()
    obs2.start_acked("a", "x")
    obs2.result("a", Outcome("ok", 3))
    running = Snapshot(runs={"a": RunView("a", [_start("a")])})
    assert "runs again" in checkers.check_all(obs2, running)[0]
    failed = Snapshot(runs={"a": RunView("a", [_start("a"), _done(r.Status.FAILED)])})
    assert "disk says failed" in checkers.check_all(obs2, failed)[0]
    assert checkers.check_all(obs2, Snapshot(runs={"a": RunView("a", [_start("a"), _done()])})) == []


def test_update_answers_and_double_acceptance() -> None:
    obs = Observed()
    obs.update_answered("c", "u1", Outcome("ok", 5))
    obs.update_answered("c", "u1", Outcome("ok", 5))
    assert obs.violations == []
    obs.update_answered("c", "u1", Outcome("ok", 9))
    assert "ran twice" in obs.violations[0]
    upd = r.Update(run=1, name="add", id="u2", payload=b"3")
    snap = Snapshot(runs={"c": RunView("c", [_start("c"), upd, upd])})
    assert any("accepted 2 times" in p for p in checkers.check_updates(Observed(), snap))


def test_query_answers_never_go_back_and_were_recorded() -> None:
    obs = Observed()
    for v in (0, 12, 12, 40):
        obs.query_answered("c", v)
    assert obs.violations == []
    obs.query_answered("c", 30)
    assert "after answering 40" in obs.violations[0]
    obs = Observed()
    obs.query_answered("c", 12)
    obs.query_answered("c", 41)
    ud = r.UpdateDone(run=1, seq=3, ordinal=0, status=r.Status.OK, payload=b"12")
    snap = Snapshot(runs={"c": RunView("c", [_start("c"), ud])})
    problems = checkers.check_queries(obs, snap)
    assert len(problems) == 1 and "answered 41" in problems[0]


def test_stuck_runs_and_close_policies() -> None:
    obs = Observed()
    obs.children["p"] = [("p/kid0", "terminate"), ("p/kid1", "request_cancel"), ("p/kid2", "abandon")]
    snap = Snapshot(
        runs={
            "p": RunView("p", [_start("p"), _done()]),
            "p/kid0": RunView("p/kid0", [_start("p/kid0"), _done(r.Status.TERMINATED)]),
            "p/kid1": RunView("p/kid1", [_start("p/kid1"), _done(r.Status.CANCELLED)]),
            "p/kid2": RunView("p/kid2", [_start("p/kid2"), _done(r.Status.TERMINATED)]),
        },
        stuck={"x": "position 3: recorded step 'a', called step 'b'"},
    )
    problems = checkers.check_all(obs, snap, final=True)
    assert problems == [
        "x stopped on a determinism error: position 3: recorded step 'a', called step 'b'",
        "child p/kid2 (abandon) ended 'terminated' against its parent close policy",
    ]
    assert checkers.check_all(obs, snap, final=False) == []


def test_service_violations_are_reported() -> None:
    assert checkers.check_all(Observed(), Snapshot(), ["key k called twice"]) == ["key k called twice"]


def test_payload_decoding() -> None:
    assert checkers.decode_payload(b"12") == 12
    assert checkers.decode_payload(b"\x0c") == 12  # msgpack
    assert checkers.decode_payload(b"\xc1") is None


def test_totals_name_counters_never_exercised() -> None:
    t = Totals()
    t.add(dataclasses.replace(Report(seed=1), crashes=2, updates=1))
    t.add(Report(seed=2))
    assert t.seeds == 2 and t.counters["crashes"] == 2
    missing = t.missing(("crashes", "updates", "queries"))
    assert missing == ["queries"]


# --- step effects (issue 9) -------------------------------------------------------


def _eff(key: str, name: str, begin: float, end: float | None = None, life: int = 1,
         ok: bool = True) -> Effect:
    return Effect(key, name, 1, begin, begin if end is None else end, life, ok)


def _step(seq: int) -> r.Step:
    return r.Step(run=1, seq=seq, name="s", attempt=1, status=r.Status.OK, payload=b"1")


def test_service_records_effects_with_virtual_times() -> None:
    svc = Service(seed=1)
    now = [0.5]
    svc.clock = lambda: now[0]
    svc.life = lambda: 3
    svc.next_hold = 0.25
    svc.call("w/1/0", 7, name="charge", hold=svc.take_hold())
    with pytest.raises(TransientError):
        svc.call("w/1/1", 7, 1, name="x")
    a, b = svc.effects
    assert (a.name, a.begin, a.end, a.life, a.ok, a.owner) == ("charge", 0.5, 0.75, 3, True, ("w", "1", 0))
    assert not b.ok and svc.next_hold == 0.0
    svc.life_ended(3, 0.6)  # the process died mid-call
    assert a.end == 0.6
    svc.saw_cancel("w")
    assert svc.cancels_seen == {"w": [(3, 0.5)]}
    assert stable_hash(1, "a", 2) == stable_hash(1, "a", 2) != stable_hash(2, "a", 2)


def test_an_effect_needs_its_outcome_journaled() -> None:
    effects = [_eff("w/1/2", "charge", 0.1), _eff("w/1/3", "x", 0.2, ok=False)]
    snap = Snapshot(runs={"w": RunView("w", [_start("w")])})
    problems = checkers.check_step_outcomes(effects, snap, crashed_lives=set())
    assert len(problems) == 1 and "'charge' of w (w/1/2)" in problems[0] and "no crash" in problems[0]
    # Its outcome journaled, or its life crashed and a cancel covers it, or another run: fine.
    assert checkers.check_step_outcomes(effects, Snapshot(runs={"w": RunView("w", [_start("w"), _step(2)])}), set()) == []
    cancelled = [_start("w"), r.CancelRequest(run=1, reason=b""), _done(r.Status.CANCELLED)]
    assert checkers.check_step_outcomes(effects, Snapshot(runs={"w": RunView("w", cancelled)}), {1}) == []
    assert checkers.check_step_outcomes(effects, Snapshot(runs={"w": RunView("w", cancelled)}), set()) != []
    assert checkers.check_step_outcomes([_eff("w/9/2", "c", 0.1)], snap, set()) == []
    terminated = [_start("w"), _done(r.Status.TERMINATED)]
    assert checkers.check_step_outcomes(effects, Snapshot(runs={"w": RunView("w", [*terminated[:1], _step(1), terminated[1]])}), set()) == []


def test_finished_work_is_durable_after_a_crash() -> None:
    due = [_eff("a/1/0", "leg0", 0.1), _eff("a/1/1", "leg1", 0.1)]
    snap = Snapshot(runs={"a": RunView("a", [_start("a"), _step(0)])})
    problems = checkers.check_durable(due, snap, "before the crash")
    assert len(problems) == 1 and "a/1/1" in problems[0] and "not durable" in problems[0]
    snap.runs["a"] = RunView("a", [_start("a"), _step(0), _step(1)])
    assert checkers.check_durable(due, snap, "x") == []


def test_no_step_begins_between_a_durable_cancel_and_its_delivery() -> None:
    effects = [_eff("o/1/1", "charge", 0.10), _eff("o/1/4", "refund", 0.30), _eff("p/1/1", "x", 0.5)]
    # Cancel acknowledged at 0.2; the code saw Cancelled at 0.3 (life 1): the refund is compensation.
    assert checkers.check_cancel_gate(effects, {"o": 0.2}, {"o": [(1, 0.3)]}) == []
    problems = checkers.check_cancel_gate(effects, {"o": 0.2}, {"o": [(1, 0.35)]})
    assert len(problems) == 1 and "'refund' of o" in problems[0]
    # Seen in another life (before a crash) does not count for this one.
    assert checkers.check_cancel_gate(effects, {"o": 0.2}, {"o": [(0, 0.25)]}) != []


def test_compensation_never_runs_before_its_effect_finished() -> None:
    charge = _eff("s/1/0", "charge", 0.10, 0.40)
    early = _eff("s/1/2", "refund", 0.20)
    late = _eff("s/1/2", "refund", 0.40)
    assert "before the charge" in checkers.check_compensation([charge, early])[0]
    assert checkers.check_compensation([charge, late]) == []
    # A charge begun again after its refund is caught too; other runs do not count.
    again = _eff("s/1/0", "charge", 0.5, 0.6)
    assert checkers.check_compensation([charge, late, again]) != []
    assert checkers.check_compensation([_eff("s/2/0", "charge", 0.1, 0.9), late]) == []


def test_requests_refused_during_a_close_leave_no_trace() -> None:
    sig = r.Signal(run=1, name="approve", dedup=77, payload=b"1")
    journal = [_start("w"), sig, r.Update(run=1, name="add", id="u1", payload=b"3"),
               r.CancelRequest(run=1, reason=b"")]
    snap = Snapshot(runs={"w": RunView("w", journal), "n": RunView("n", None)})
    refused = [("start", "n", ""), ("signal", "w", "78"), ("update", "w", "u2")]
    assert checkers.check_refused(refused, snap) == []
    bad = [("start", "w", ""), ("signal", "w", "77"), ("update", "w", "u1"), ("cancel", "w", "")]
    assert len(checkers.check_refused(bad, snap)) == 4


def test_one_completion_per_await_and_stale_tokens_refused() -> None:
    svc = Service()
    svc.hand_out("a", "t1")
    svc.hand_out("a", "t2")
    svc.hand_out("a", "t2")  # handed out again (a crash ran the attempt again)
    svc.token_returned("t2")
    assert svc.tokens == {"a": ["t1", "t2"]}
    obs = Observed()
    obs.completion_answered("a", "t1", False)
    obs.completion_answered("a", "t2", True)
    obs.completion_answered("a", "t2", False)  # a duplicate, refused
    assert checkers.check_completions(obs, svc.tokens_returned) == []
    stale = Observed()
    stale.completion_answered("a", "t1", True)
    assert "stale token 't1' was accepted" in checkers.check_completions(stale, svc.tokens_returned)[0]
    got = Observed()
    got.completion_answered("a", "t2", True, 7)
    got.result("a", Outcome("ok", 8))
    assert "returned 8, but the completion accepted with token 't2' was 7" in \
        checkers.check_completions(got, {"t2"})[0]
    twice = Observed()
    twice.completion_answered("a", "t2", True)
    twice.completion_answered("a", "t2", True)
    assert any("accepted 2 completions" in p for p in checkers.check_completions(twice, {"t2"}))


def test_a_heartbeat_resume_starts_only_from_reported_progress() -> None:
    reported = {"k": [(1.0, 10), (2.0, 20)]}
    ok = [("k", 1, 0.5, None), ("k", 2, 2.5, 20), ("k", 3, 3.0, 10)]
    assert checkers.check_resumes(ok, reported) == []
    ahead = checkers.check_resumes([("k", 2, 2.5, 21)], reported)
    assert "began from progress 21, which no earlier attempt reported" in ahead[0]
    # Reported only after the attempt began: not something it could resume from.
    assert checkers.check_resumes([("k", 2, 1.5, 20)], reported) != []
    assert checkers.check_resumes([("other", 2, 9.0, 10)], reported) != []


def _sig(run: int, dedup: int) -> r.Signal:
    return r.Signal(run=run, name="nudge", dedup=dedup, payload=b"1")


def test_a_reset_run_is_the_prefix_plus_new_records_and_signals_arrive_once() -> None:
    prep = r.Step(run=1, seq=0, name="prep", attempt=1, status=r.Status.OK, payload=b"3")
    mark = r.Step(run=1, seq=2, name="mark", attempt=1, status=r.Status.OK, payload=b"4")
    wait = r.Wait(run=1, seq=1, name="nudge", deadline_ms=5)
    before = [_start("a"), prep, wait, _sig(1, 7), mark, _sig(1, 8)]
    start2 = msgspec.structs.replace(_start("a"), run=2)

    def renum(x: r.Record) -> r.Record:
        return msgspec.structs.replace(x, run=2)

    good = [start2, renum(prep), renum(wait), renum(_sig(1, 7)), renum(_sig(1, 8))]
    assert checkers.check_reset("a", before, good, "mark") == []
    twice = [*good, renum(_sig(1, 8))]
    assert "arrives 2 times" in checkers.check_reset("a", before, twice, "mark")[0]
    lost = [start2, renum(prep), renum(wait), renum(_sig(1, 7))]
    assert "not in the new run" in checkers.check_reset("a", before, lost, "mark")[0]
    no_prefix = [start2, renum(wait), renum(_sig(1, 7)), renum(_sig(1, 8))]
    assert "does not open with the old run's 2 record(s)" in checkers.check_reset("a", before, no_prefix, "mark")[0]
    assert "still run 1" in checkers.check_reset("a", before, before, "mark")[0]
