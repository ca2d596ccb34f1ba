"""Schedules and windows in a real process killed with SIGKILL, then reopened."""

from __future__ import annotations

import datetime
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import finish, ledger, wait_for

APP = Path(__file__).with_name("flow_app.py")
ROOT = Path(__file__).resolve().parents[2]


def start(d: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), str(d), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def test_a_schedule_fires_each_time_once_across_a_sigkill(tmp_path: Path) -> None:
    p = start(tmp_path, "schedule")
    wait_for(lambda: len(ledger(tmp_path)) >= 5, p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    out = finish(start(tmp_path, "schedule-2"))
    assert out[-1]["skipped"] == 0
    runs: dict[str, set[str]] = {}
    for line in ledger(tmp_path):
        _, wid, run = line.split()
        runs.setdefault(wid, set()).add(run)
    # At most once: no scheduled time started twice (a step may rerun, in the same run).
    assert all(len(r) == 1 for r in runs.values()), runs
    # Exactly once inside the catch-up window: no time missing between the first and the last.
    times = sorted(datetime.datetime.fromisoformat(w.split("@")[1].replace("Z", "+00:00")) for w in runs)
    steps = {(b - a) for a, b in itertools.pairwise(times)}
    assert steps == {datetime.timedelta(milliseconds=100)}, sorted(steps)
    assert len(times) >= 30


def test_acknowledged_events_are_delivered_exactly_once_across_a_sigkill(tmp_path: Path) -> None:
    p = start(tmp_path, "enqueue")
    assert p.stdout is not None
    acked: dict[str, list[Any]] = {}
    while len(acked) < 12:
        line = json.loads(p.stdout.readline())
        acked[line["acked"]] = line["receipt"]
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    # The client sends every event again (same event IDs), as after any lost connection.
    out = finish(start(tmp_path, "enqueue-2"))
    receipts = out[-1]["receipts"]
    for eid, receipt in acked.items():
        assert receipts[eid] == receipt, eid  # the same receipt as before the kill
    windows: dict[str, list[str]] = {}
    for line in ledger(tmp_path):
        _, wid, events = line.split()
        assert windows.setdefault(wid, events.split(",")) == events.split(","), wid
    seen = [e for events in windows.values() for e in events]
    assert sorted(seen) == sorted(receipts) and len(seen) == len(set(seen))  # each event in one window
    for eid, (wid, pos) in receipts.items():
        assert windows[wid][pos] == eid
