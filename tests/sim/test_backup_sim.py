"""Issue 28: the simulator's backup world (``fusee.sim.backup``): a target that fails, stalls
and loses the upload a crash interrupts, while the log is written and checkpointed during the
uploads; every restore holds a prefix of the acknowledged history. And its checker can fail."""

from __future__ import annotations

import pytest

from fusee import sabotage
from fusee.sim.backup import SWITCHES, BackupWorld


def test_restores_at_any_moment_hold_a_prefix_of_the_acknowledged_history() -> None:
    for seed in range(12):
        world = BackupWorld(seed)
        assert world.run() == [], seed
        assert world.target.list("points/"), seed


@pytest.mark.parametrize("switch", SWITCHES)
def test_each_backup_sabotage_is_caught(switch: str) -> None:
    with sabotage.sabotaged(**{switch: True}):
        caught = [seed for seed in range(20) if BackupWorld(seed).run()]
    assert caught, f"no seed caught {switch}"
