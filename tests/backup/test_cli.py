"""Issue 28: ``fusee backup DIR TARGET`` (a one-off copy through the read-only view, of a closed
or a live directory) and ``fusee restore TARGET DIR [--at TIME|--position N]``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import fusee
from tests.backup.crash import ROOT, run_ids


@fusee.workflow("noted")
async def noted(ctx: fusee.Ctx, n: int) -> int:
    return n


def fusee_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fusee.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


async def start(engine: fusee.Engine, prefix: str, n: int) -> None:
    for i in range(n):
        await engine.start(noted, f"{prefix}-{i}", i)


def test_backup_of_a_live_then_closed_directory_and_restores(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"

    async def scenario() -> None:
        engine = await fusee.Engine.open(data, workflows=[noted])
        try:
            await start(engine, "a", 20)
            live = fusee_cli("backup", str(data), str(target))  # while the engine holds it
            assert live.returncode == 0, live.stderr
            assert "position" in live.stdout
            await start(engine, "b", 20)
        finally:
            await engine.close()

    asyncio.run(scenario())
    closed = fusee_cli("backup", str(data), str(target))
    assert closed.returncode == 0, closed.stderr

    listed = fusee_cli("restore", str(target), "--list")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 2, listed
    first_time = listed.stdout.splitlines()[0].split()[0]

    newest = fusee_cli("restore", str(target), str(tmp_path / "newest"))
    assert newest.returncode == 0, newest.stderr
    assert run_ids(tmp_path / "newest") == {f"{p}-{i}" for p in "ab" for i in range(20)}

    early = fusee_cli("restore", str(target), str(tmp_path / "early"), "--at", first_time)
    assert early.returncode == 0, early.stderr
    assert run_ids(tmp_path / "early") == {f"a-{i}" for i in range(20)}

    # A directory that is not empty is refused, and left as it was.
    again = fusee_cli("restore", str(target), str(tmp_path / "newest"))
    assert again.returncode == 1 and "not an empty directory" in again.stderr
    both = fusee_cli("restore", str(target), str(tmp_path / "x"), "--at", first_time, "--position", "3")
    assert both.returncode == 2
    bad = fusee_cli("restore", str(target), str(tmp_path / "y"), "--at", "yesterday")
    assert bad.returncode == 1 and "not a time" in bad.stderr
    none = fusee_cli("restore", str(tmp_path / "empty-target"), str(tmp_path / "z"))
    assert none.returncode == 1 and "no backup point" in none.stderr
