"""A plain script on SyncEngine, killed with SIGKILL mid-run and started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).with_name("script_app.py")
ROOT = Path(__file__).resolve().parents[2]


def run(d: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def test_killed_script_restarts_and_recorded_steps_do_not_run_again(tmp_path: Path) -> None:
    p = run(tmp_path)
    assert p.stdout is not None
    line = p.stdout.readline()  # blocks until s0 and s1 are durable, with s2 running
    assert json.loads(line) == {"ready": True}, p.stderr.read() if p.stderr else ""
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    ledger = (tmp_path / "ledger.txt").read_text().splitlines()
    assert ledger[:2] == ["s0", "s1"] and "s3" not in ledger

    (tmp_path / "release").touch()
    p = run(tmp_path)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert json.loads(out.splitlines()[-1]) == {"result": 5}
    ledger = (tmp_path / "ledger.txt").read_text().splitlines()
    # s0 and s1 were durable: never run again. s2 was running at the kill: it runs again.
    assert ledger == ["s0", "s1", "s2", "s2", "s3", "s4"]
