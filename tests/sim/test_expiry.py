"""The expiring-lease simulator: owners paused past the TTL, takeovers, fencing (PostgreSQL's model)."""

from __future__ import annotations

import pytest

from fusee import sabotage
from fusee.sim.expiry import SWITCHES, ExpiryFailure, run_seed

#: Each sabotage of the expiring lease must be caught within this many seeds.
BOUND = 2000


def test_a_seed_range_passes_and_exercises_pauses_takeovers_and_fencing() -> None:
    owners = pauses = fenced = committed = effects = 0
    for seed in range(60):
        r = run_seed(seed)
        owners += r.takeovers
        pauses += r.pauses
        fenced += r.fenced
        committed += r.committed_while_paused
        effects += r.effects
    # Owners were paused past their lease, others took over, and the woken owners' writes were refused.
    assert owners > 120 and pauses > 60 and fenced > 10, (owners, pauses, fenced)
    # Flushes on their way when an owner stopped committed meanwhile; it heard of them when it
    # woke, and began none of the steps they released (every step's function ran in the holder).
    assert committed > 20 and effects > 1000, (committed, effects)


def test_a_woken_owner_begins_no_step_its_committed_flush_released() -> None:
    """Seed 0 (without the check, it fails so): p0 stops with a flush on its way, which commits;
    p2 takes over, recovers it and runs the steps it released; p0 wakes and runs none of them."""
    r = run_seed(0)
    assert r.committed_while_paused >= 1 and r.takeovers >= 2
    with sabotage.sabotaged(step_ignores_lease_deadline=True), pytest.raises(ExpiryFailure) as caught:
        run_seed(0)
    assert "no longer held the lease acted" in caught.value.message


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
