"""The expiring-lease simulator: owners paused past the TTL, takeovers, fencing (PostgreSQL's model)."""

from __future__ import annotations

import pytest

from fusee import sabotage
from fusee.sim.expiry import SWITCHES, ExpiryFailure, run_seed

#: Each sabotage of the expiring lease must be caught within this many seeds.
BOUND = 2000


def test_a_seed_range_passes_and_exercises_pauses_takeovers_and_fencing() -> None:
    owners = pauses = fenced = 0
    for seed in range(60):
        r = run_seed(seed)
        owners += r.takeovers
        pauses += r.pauses
        fenced += r.fenced
    # Owners were paused past their lease, others took over, and the woken owners' writes were refused.
    assert owners > 120 and pauses > 60 and fenced > 10, (owners, pauses, fenced)


def test_same_seed_same_trace() -> None:
    a, b = run_seed(5), run_seed(5)
    assert a.trace == b.trace and a.trace_hash != run_seed(6).trace_hash


@pytest.mark.parametrize("switch", SWITCHES)
def test_each_lease_sabotage_is_caught(switch: str) -> None:
    for seed in range(BOUND):
        try:
            with sabotage.sabotaged(**{switch: True}):
                run_seed(seed)
        except ExpiryFailure as f:
            run_seed(seed)  # the catch counts only if the seed passes without the sabotage
            print(f"{switch} caught by seed {seed}: {f.message}")
            return
    pytest.fail(f"no seed below {BOUND} caught sabotage {switch!r}")
