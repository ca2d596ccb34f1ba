"""Simulator knobs and checkers of issue 26: keep_history, early_blobs, log counters, windows."""

from __future__ import annotations

import pytest

from fusee import sabotage
from fusee.core import records as rec
from fusee.sim import checkers
from fusee.sim.config import SimConfig
from fusee.sim.flowjobs import FlowObserver
from fusee.sim.world import SimFailure, World, run_seed

#: A seed that writes blobs (blob_threshold 64) and crashes: early_blobs shows at its first crash.
EARLY_BLOBS_SEED = 3


def test_early_blobs_is_caught_by_the_log_integrity_checker() -> None:
    assert SimConfig.for_seed(EARLY_BLOBS_SEED).blob_threshold < 1024
    result = run_seed(EARLY_BLOBS_SEED)  # passes as it is: the catch below is the sabotage's
    assert result.report.offloaded > 0 and result.report.log_batches > 0
    checkers.fired.clear()
    with sabotage.sabotaged(early_blobs=True), pytest.raises(SimFailure) as caught:
        run_seed(EARLY_BLOBS_SEED)
    assert "log integrity" in caught.value.message
    assert "references is missing or damaged" in caught.value.message
    assert checkers.fired["log_integrity"] == 1


def test_keep_history_is_off_on_half_the_seeds_and_reaches_the_engine() -> None:
    assert [SimConfig.for_seed(s).keep_history for s in range(4)] == [True, False, True, False]
    world = World(SimConfig.for_seed(1))
    try:
        result = world.run()
        assert world.engine._rt.keep_history is False
        assert "keep_history=off" in result.trace[0]
        # Ended runs kept only their start, ending and outbox, and the checkers judged them so.
        ended = [wid for wid, o in result.observed.results.items() if o.status == "ok"]
        assert ended
        assert all({type(r) for r in world.engine._rt.journal_of(world.engine._rt.current(wid))[0]}
                   <= {rec.Start, rec.Done, rec.Child, rec.ChildDone, rec.Send} for wid in ended)
    finally:
        world.bury()


def _flow(windows: dict[str, list[str]], receipts: dict[str, tuple[str, int]]) -> FlowObserver:
    return FlowObserver(windows={w: [{"id": e, "v": 0} for e in evs] for w, evs in windows.items()},
                        receipts=dict(receipts))


def test_window_start_checker_passes_windows_of_acknowledged_events() -> None:
    flow = _flow({"echo:k#1": ["a", "b"], "echo:k#2": ["c"]},
                 {"a": ("echo:k#1", 0), "b": ("echo:k#1", 1), "c": ("echo:k#2", 0)})
    assert checkers.check_window_starts(flow, {"a", "b", "c"}, final=True) == []


def test_window_start_checker_catches_a_window_nobody_was_told_about() -> None:
    # Run "echo:k#2" took event c, whose enqueue was never acknowledged with a receipt naming it.
    flow = _flow({"echo:k#1": ["a"], "echo:k#2": ["c"]}, {"a": ("echo:k#1", 0), "c": ("echo:k#1", 1)})
    assert checkers.check_window_starts(flow, {"a", "c"}, final=False) == []
    problems = checkers.check_window_starts(flow, {"a", "c"}, final=True)
    assert any("started without an acknowledged event" in p for p in problems), problems
    # An empty window, and one holding an event the client never sent, show at once.
    flow = _flow({"echo:k#3": [], "echo:k#4": ["zz"]}, {})
    problems = checkers.check_window_starts(flow, {"a"}, final=False)
    assert any("started with no event" in p for p in problems)
    assert any("never sent" in p for p in problems)
