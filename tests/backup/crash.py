"""Helpers of the backup crash tests: the app in a subprocess, its ledger, restored contents."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fusee

APP = Path(__file__).with_name("backup_app.py")
ROOT = Path(__file__).resolve().parents[2]


class App:
    def __init__(self, data: Path, target: str, control: Path, env: dict[str, str] | None = None) -> None:
        control.mkdir(exist_ok=True)
        (control / "stop").unlink(missing_ok=True)
        (control / "status").unlink(missing_ok=True)
        self.control = control
        self.p = subprocess.Popen(
            [sys.executable, str(APP), str(data), target, str(control)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})

    def wait_for(self, cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.p.poll() is not None:
                raise AssertionError(f"the app exited before {what}: {self.p.communicate()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not reached in time (status {self.status()})")
            time.sleep(0.005)

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.control / "status").read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, ValueError):
            return None

    def kill(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(60)

    def stop(self) -> None:
        (self.control / "stop").touch()
        out, err = self.p.communicate(timeout=60)
        assert self.p.returncode == 0, err
        assert '"closed": true' in out


class Ledger:
    """The app's ledger: when each start was asked for, and when acknowledged."""

    def __init__(self, control: Path) -> None:
        self.asked: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        for line in (control / "ledger").read_text().splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue  # the line a kill cut short
            kind, wid, when = parts
            (self.asked if kind == "A" else self.acked)[wid] = float(when)

    def acked_by(self, t: float) -> set[str]:
        return {w for w, at in self.acked.items() if at <= t}

    def asked_after(self, t: float) -> set[str]:
        return {w for w, at in self.asked.items() if at > t}


def run_ids(directory: Path) -> set[str]:
    async def read() -> set[str]:
        async with fusee.Engine.open(directory, read_only=True) as engine:
            return {r.workflow_id for r in engine.runs()}

    return asyncio.run(read())


def check_point(restored: set[str], ledger: Ledger, point_time: float, before: float | None = None) -> None:
    """A restore at a point holds every start acknowledged by then and none asked for after
    (a restore between two points: every one acknowledged by the ``before`` point's time)."""
    missing = ledger.acked_by(point_time if before is None else before) - restored
    assert not missing, f"acknowledged before the point but not restored: {sorted(missing)[:5]}"
    late = restored & ledger.asked_after(point_time)
    assert not late, f"restored although asked for after the point: {sorted(late)[:5]}"
    unknown = restored - set(ledger.asked)
    assert not unknown, f"restored runs nobody started: {sorted(unknown)[:5]}"


def uploading(target: Path) -> bool:
    """Whether an upload into the local target is under way (its temporary file exists)."""
    return any(".tmp-" in f for _folder, _dirs, files in os.walk(target) for f in files)
