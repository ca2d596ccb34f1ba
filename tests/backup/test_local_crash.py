"""Issue 28: continuous backup to a local directory under load, the engine killed (-9) while it
uploads; restores at the newest point, at an earlier time and at a position, checked against
the ledger of acknowledged starts the app keeps."""

from __future__ import annotations

import time
from pathlib import Path

import fusee.backup as fb
from fusee.errors import NoBackupPoint
from tests.backup.crash import App, Ledger, check_point, run_ids, uploading


def test_backup_survives_a_killed_engine_and_restores_any_point(tmp_path: Path) -> None:
    data, target, control = tmp_path / "data", tmp_path / "target", tmp_path / "control"
    app = App(data, str(target), control)
    app.wait_for(lambda: len(fb.points(target)) >= 5 and len(Ledger(control).acked) >= 300,
                 "points uploaded under load")
    # Kill it inside an upload (a temporary file of the target exists) if one is seen soon.
    deadline = time.monotonic() + 5
    while not uploading(target) and time.monotonic() < deadline:
        pass
    app.kill()
    before_kill = fb.points(target)

    newest = fb.restore(target, tmp_path / "newest")
    assert newest.point == before_kill[-1].key
    check_point(run_ids(tmp_path / "newest"), Ledger(control), newest.time.timestamp())

    # The engine again on its directory: the backup goes on from the target's manifest.
    app = App(data, str(target), control)
    app.wait_for(lambda: (app.status() or {}).get("points", 0) >= 3, "points after the restart")
    app.stop()
    ledger = Ledger(control)
    final = fb.restore(target, tmp_path / "final")
    restored = run_ids(tmp_path / "final")
    # Closed cleanly: the last point holds every acknowledged start.
    assert set(ledger.acked) <= restored, sorted(set(ledger.acked) - restored)[:5]
    check_point(restored, ledger, final.time.timestamp())

    # An earlier time: a point from before the kill.
    early = before_kill[len(before_kill) // 2]
    at = fb.restore(target, tmp_path / "early", at=early.time)
    assert at.point == early.key
    early_ids = run_ids(tmp_path / "early")
    check_point(early_ids, ledger, early.time.timestamp())
    assert early_ids < restored

    # A position between two points: the log is cut there, at a batch boundary. (A position
    # before the checkpoint of every point that holds it cannot be restored: NoBackupPoint.)
    pts = fb.points(target)
    for i in range(1, len(pts)):
        cut = pts[i].position - 1
        if cut <= pts[i - 1].position:
            continue
        try:
            by_position = fb.restore(target, tmp_path / f"cut-{cut}", position=cut)
        except NoBackupPoint:
            continue
        break
    else:
        raise AssertionError("no position between two points could be restored")
    assert by_position.position == cut
    cut_ids = run_ids(tmp_path / f"cut-{cut}")
    assert run_ids_at(tmp_path, pts[i - 1]) <= cut_ids <= run_ids_at(tmp_path, pts[i])
    check_point(cut_ids, ledger, pts[i].time.timestamp(), before=pts[i - 1].time.timestamp())


def run_ids_at(tmp_path: Path, point: fb.PointInfo) -> set[str]:
    where = tmp_path / f"at-{point.position}-{point.time.timestamp()}"
    fb.restore(tmp_path / "target", where, at=point.time)
    return run_ids(where)
