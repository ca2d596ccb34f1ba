"""Read-only views of a closed directory whose schedule came due meanwhile (issue 22, finding 2).

Closing parks the schedule's run with a wake-up at its next time. A read-only
open must show it as it is (running, waiting for that time) and never wake it:
waking it replays its code in a view that can run nothing, which diverged and
showed a healthy schedule as stuck.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import fusee

FUSEE = str(Path(sys.executable).parent / "fusee")
WID = "fusee:schedule:tick"


@fusee.workflow("tock")
async def tock(ctx: fusee.Ctx) -> int:
    return 1


def fusee_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FUSEE, *args], capture_output=True, text=True, timeout=120)


async def make_directory_past_due(d: Path) -> None:
    """A closed directory holding a schedule whose next time has passed since the close."""
    async with fusee.Engine.open(d, workflows=[tock]) as engine:
        await engine.schedule("tick", tock, every="1s")
        # It fires once, so its journal holds a child start (what a replay without
        # the workflow registered diverged on).
        while not any(r.workflow_id.startswith("tick@") and r.status == "ok" for r in engine.runs()):
            await asyncio.sleep(0.005)
        info = await engine.describe_schedule("tick")
        assert info.next_time is not None
        due = info.next_time.timestamp()
    # The engine is closed: wait (on the wall clock, which the schedule reads) until its next time passed.
    while time.time() < due + 0.05:
        await asyncio.sleep(0.01)


async def test_a_read_only_open_shows_a_due_schedule_running_and_wakes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "e"
    await make_directory_past_due(d)
    async with fusee.Engine.open(d, read_only=True, park_after=None) as view:
        for _ in range(5):
            await asyncio.sleep(0)  # turns of the loop: a wake-up that came due would fire now
        s = view.describe(WID)
        assert (s.status, s.stuck_reason) == ("running", None)
        assert [r.status for r in view.runs() if r.workflow_id == WID] == ["running"]
        assert view.stats["woken"] == 0 and view.stats["replays"] == 0
    # With the workflow registered too (a follower's view has it).
    async with fusee.Engine.open(d, workflows=[tock], read_only=True, park_after=None) as view:
        for _ in range(5):
            await asyncio.sleep(0)
        assert view.describe(WID).status == "running"
        assert view.stats["woken"] == 0
    # The live engine still fires the time that passed.
    async with fusee.Engine.open(d, workflows=[tock]) as engine:
        fired = (await engine.describe_schedule("tick")).fired
        while (await engine.describe_schedule("tick")).fired == fired:
            await asyncio.sleep(0.005)
        assert engine.describe(WID).status == "running"


def test_the_cli_shows_a_due_schedule_offline(tmp_path: Path) -> None:
    d = tmp_path / "e"
    asyncio.run(make_directory_past_due(d))

    p = fusee_cmd("runs", str(d), "--json")
    assert p.returncode == 0, p.stderr
    assert [s["status"] for s in json.loads(p.stdout)["items"] if s["workflow_id"] == WID] == ["running"]

    p = fusee_cmd("show", str(d), WID)
    assert p.returncode == 0, p.stderr
    assert "stuck" not in p.stdout and "determinism" not in p.stdout

    p = fusee_cmd("schedules", str(d), "--json")
    assert p.returncode == 0, p.stderr
    [s] = json.loads(p.stdout)["schedules"]
    assert (s["schedule_id"], s["workflow"], s["every"]) == ("tick", "tock", 1.0)
    assert s["fired"] >= 1
