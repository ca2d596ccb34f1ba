"""A SyncEngine on PostgreSQL opened before a fork: the child fails at once or opens its own,
never uses the parent's sessions, and does not keep them open after the parent died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import fusee
from tests.storage.postgres.pg_fork_app import go, waiter
from tests.storage.postgres.test_pg_engine import rows
from tests.sync.servers import wait_for

APP = Path(__file__).with_name("pg_fork_app.py")
ROOT = Path(__file__).resolve().parents[3]


def sessions(dsn: str) -> int:
    """The engines' sessions open on this database (each names itself 'fusee <purpose>')."""
    return int(rows(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND application_name LIKE 'fusee %'")[0][0])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_forked_after_open_fails_at_once_opens_its_own_and_frees_the_sessions(
    pg_dsn: str, tmp_path: Path
) -> None:
    hold_r, hold_w = os.pipe()
    log = tmp_path / "stderr.txt"
    with open(log, "wb") as err:  # a file, not a pipe: the second child keeps its copy
        p = subprocess.Popen([sys.executable, str(APP), pg_dsn, str(hold_r)], stdout=subprocess.PIPE,
                             stderr=err, text=True, pass_fds=(hold_r,),
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    os.close(hold_r)
    second = 0
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line, log.read_text()
        got = json.loads(line)
        second = got["second_pid"]
        assert got["child"] == {"start": "EngineForked", "signal": "EngineForked",
                                "describe": "EngineForked", "close": "EngineForked",
                                "own_is_owner": False, "own_start": "ok"}, log.read_text()
        assert got["first_exit"] == 0
        assert got["a"] == 42  # the parent's engine went on after the child's exit
        assert got["from_child"] == "running"  # the child's own engine started it on the parent's
        assert sessions(pg_dsn) > 0

        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
        assert alive(second)
        # The dead parent's sessions end although the second child lives on with its copies.
        wait_for("the killed parent's sessions ending", lambda: sessions(pg_dsn) == 0)
        with fusee.SyncEngine.open(pg_dsn, workflows=[waiter], lease_ttl=1) as engine:
            engine.signal("from-child", go, 5)  # routed or local: after the takeover it runs here
            assert engine.get("from-child").result(timeout=60) == 10
            assert engine.get("a").result(timeout=60) == 42
    finally:
        os.close(hold_w)
        p.stdout.close()  # type: ignore[union-attr]
        if p.poll() is None:
            p.kill()
            p.wait(timeout=60)
        if second and alive(second):
            os.kill(second, signal.SIGKILL)
