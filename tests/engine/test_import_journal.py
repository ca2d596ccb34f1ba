"""engine.import_journal: an exported run replays in another engine and continues there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

import fusee
from fusee.cli.commands import cli

CALLS: dict[str, int] = {}
BROKEN = {"x": True}


def called(name: str, value: int) -> int:
    CALLS[name] = CALLS.get(name, 0) + 1
    return value


def x_step() -> int:
    called("x", 0)
    if BROKEN["x"]:
        raise ValueError("bug in x")
    return 10


@fusee.workflow("pipeline")
async def pipeline(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("a", lambda: called("a", n))
    b = await ctx.step("b", lambda: called("b", a + 1))
    x = await ctx.step("X", x_step, retry=fusee.Retry(attempts=1))
    return int(a + b + x)


async def export_failed_run(tmp_path: Path) -> Path:
    CALLS.clear()
    BROKEN["x"] = True
    path = tmp_path / "p-1.fjnl"
    async with fusee.Engine.open(tmp_path / "prod", workflows=[pipeline]) as engine:
        with pytest.raises(fusee.WorkflowFailed, match="bug in x"):
            await asyncio.wait_for(engine.execute(pipeline, "p-1", 1), 10)
        await engine.export("p-1", path)
    assert CALLS == {"a": 1, "b": 1, "x": 1}
    return path


async def test_an_imported_run_cut_before_the_failed_step_continues_with_fixed_code(tmp_path: Path) -> None:
    path = await export_failed_run(tmp_path)
    BROKEN["x"] = False  # the fix
    async with fusee.Engine.open(tmp_path / "local", workflows=[pipeline]) as engine:
        handle = await engine.import_journal(path, before_step="X")
        assert handle.workflow_id == "p-1"
        assert await asyncio.wait_for(handle.result(), 10) == 1 + 2 + 10
        assert CALLS == {"a": 1, "b": 1, "x": 2}  # a and b replayed, not run again
        # Under another ID, and refused under one that exists.
        copy = await engine.import_journal(path, workflow_id="p-2", before_step="b")
        assert await asyncio.wait_for(copy.result(), 10) == 13
        assert CALLS == {"a": 1, "b": 2, "x": 3}
        with pytest.raises(fusee.AlreadyExists, match="p-1"):
            await engine.import_journal(path)
        with pytest.raises(ValueError, match="no step named 'nope'"):
            await engine.import_journal(path, workflow_id="p-3", before_step="nope")
    # It was durable: a reopened engine still knows it, finished.
    async with fusee.Engine.open(tmp_path / "local", workflows=[pipeline]) as engine:
        assert await engine.get("p-1").result() == 13


async def test_importing_without_a_cut_keeps_all_but_the_ending(tmp_path: Path) -> None:
    path = await export_failed_run(tmp_path)
    async with fusee.Engine.open(workflows=[pipeline]) as engine:
        handle = await engine.import_journal(path, workflow_id="again")
        # Every step replays, the recorded failure of X too: the code fails the same way, nothing runs.
        with pytest.raises(fusee.WorkflowFailed, match="bug in x"):
            await asyncio.wait_for(handle.result(), 10)
        assert CALLS == {"a": 1, "b": 1, "x": 1}


async def test_a_file_that_is_no_journal_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.fjnl"
    bad.write_bytes(b"not a journal")
    async with fusee.Engine.open(workflows=[pipeline]) as engine:
        with pytest.raises(fusee.CorruptRecord):
            await engine.import_journal(bad)
        assert engine.runs() == []


async def test_fusee_import_into_a_directory(tmp_path: Path) -> None:
    path = await export_failed_run(tmp_path)
    BROKEN["x"] = False
    runner = CliRunner()
    args = ["import", str(path), "--into", str(tmp_path / "local"), "--workflows",
            f"{__name__}:WORKFLOWS", "--before-step", "X", "--workflow-id", "p-9"]
    result = await asyncio.to_thread(runner.invoke, cli, args)
    assert result.exit_code == 0, result.output
    assert "p-9" in result.output
    async with fusee.Engine.open(tmp_path / "local", workflows=[pipeline]) as engine:
        assert await asyncio.wait_for(engine.get("p-9").result(), 10) == 13
    assert CALLS == {"a": 1, "b": 1, "x": 2}
    # The timeline view of the file is unchanged.
    result = await asyncio.to_thread(runner.invoke, cli, ["import", str(path), "--json"])
    assert result.exit_code == 0 and '"timeline"' in result.output
    result = await asyncio.to_thread(runner.invoke, cli, ["import", str(path), "--before-step", "X"])
    assert result.exit_code != 0 and "--into" in result.output


WORKFLOWS = [pipeline]
