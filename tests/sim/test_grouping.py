"""The grouping simulator: a quiet world, N chains taking turns, a crash (fusee.sim.grouping)."""

from __future__ import annotations

import pytest

from fusee import sabotage
from fusee.sim.grouping import SWITCHES, GroupingFailure, run_seed

#: Each sabotage this simulator owns must be caught within this many seeds.
BOUND = 200


def test_a_seed_range_passes_in_every_flush_mode_and_step_kind() -> None:
    seen = set()
    for seed in range(40):
        r = run_seed(seed)
        seen.add((r.mode, r.kind))
        # One flush per round of steps, whatever N: the records of all chains share it.
        assert r.together_records >= r.chains * r.steps
    assert {m for m, _ in seen} == {"inline", "background", "pipeline"}
    assert {k for _, k in seen} == {"sync", "blocking", "async", "suspending"}


def test_same_seed_same_trace() -> None:
    a, b = run_seed(5), run_seed(5)
    assert a.trace == b.trace and a.trace_hash != run_seed(6).trace_hash


@pytest.mark.parametrize("switch", [*SWITCHES, "no_flush_after_direct_step"])
def test_each_grouping_sabotage_is_caught(switch: str) -> None:
    for seed in range(BOUND):
        try:
            with sabotage.sabotaged(**{switch: True}):
                run_seed(seed)
        except GroupingFailure as f:
            run_seed(seed)  # the catch counts only if the seed passes without the sabotage
            print(f"{switch} caught by seed {seed}: {f.message}")
            return
    pytest.fail(f"no seed below {BOUND} caught sabotage {switch!r}")
