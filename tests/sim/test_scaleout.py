"""The scale-out simulator: several processes on one simulated directory, owners dying in turn."""

from __future__ import annotations

import pytest

from fusee import sabotage
from fusee.sim.scaleout import SWITCHES, ScaleFailure, run_seed

#: Each scale-out sabotage must be caught within this many seeds.
BOUND = 200


def test_a_seed_range_passes_and_exercises_takeovers() -> None:
    owners = resent = 0
    for seed in range(20):
        r = run_seed(seed)
        owners += r.owners
        resent += r.resent
    assert owners > 40 and resent > 0  # takeovers happened, with answers lost on the way


def test_same_seed_same_trace() -> None:
    a, b = run_seed(3), run_seed(3)
    assert a.trace == b.trace and a.trace_hash != run_seed(4).trace_hash


@pytest.mark.parametrize("switch", SWITCHES)
def test_each_scale_out_sabotage_is_caught(switch: str) -> None:
    for seed in range(BOUND):
        try:
            with sabotage.sabotaged(**{switch: True}):
                run_seed(seed)
        except ScaleFailure as f:
            run_seed(seed)  # the catch counts only if the seed passes without the sabotage
            print(f"{switch} caught by seed {seed}: {f.message}")
            return
    pytest.fail(f"no seed below {BOUND} caught sabotage {switch!r}")
