"""Config, service and checkers on synthetic inputs (no engine needed)."""

from __future__ import annotations

import dataclasses

import pytest

from fusee.core import records as r
from fusee.sim import checkers
from fusee.sim.checkers import Observed, Outcome, RunView, Snapshot
from fusee.sim.config import JOB_KINDS, SimConfig
from fusee.sim.report import Report, Totals
from fusee.sim.service import Service, TransientError


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
