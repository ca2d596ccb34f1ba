"""Issue 28: the simulator's backup world (``fusee.sim.backup``): a target that fails, stalls
and loses the upload a crash interrupts, while the log is written and checkpointed during the
uploads; every restore holds a prefix of the acknowledged history. And its checker can fail."""

from __future__ import annotations

from fusee import sabotage
from fusee.sim.backup import BackupWorld


def test_restores_at_any_moment_hold_a_prefix_of_the_acknowledged_history() -> None:
    for seed in range(12):
        world = BackupWorld(seed)
        assert world.run() == [], seed
        assert world.target.list("points/"), seed


def test_a_backup_that_skips_the_checkpoint_recheck_is_caught() -> None:
    with sabotage.sabotaged(backup_no_recheck=True):
        caught = [seed for seed in range(20) if BackupWorld(seed).run()]
    assert caught, "no seed caught a point written without reading the checkpoint again"
