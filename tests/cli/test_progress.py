"""Long CLI operations show progress and counts on stderr when asked (or on a terminal), and
leave piped output alone; the engine logs what an open read."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

import fusee
from tests.cli.test_commands import fusee_cmd

RUNS = 23


@fusee.workflow("counted")
async def counted(ctx: fusee.Ctx, i: int) -> int:
    return await ctx.step("double", lambda: i * 2)


async def _fill(d: Path) -> None:
    async with fusee.Engine.open(d, workflows=[counted]) as engine:
        for i in range(RUNS):
            await engine.start(counted, f"c-{i}", i)
        for i in range(RUNS):
            await engine.get(f"c-{i}").result()


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("progress") / "data"
    asyncio.run(_fill(d))
    return d


def test_piped_output_is_unchanged_and_stderr_quiet(directory: Path) -> None:
    p = fusee_cmd("runs", str(directory), "--all", "--limit", "5", "--json")
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["items"]) == RUNS
    assert p.stderr == ""  # piped: no progress unless asked
    p = fusee_cmd("--no-progress", "runs", str(directory), "--all", "--limit", "5")
    assert p.returncode == 0 and p.stderr == "" and "c-22" in p.stdout


def test_asked_for_progress_shows_counts_on_stderr_only(directory: Path) -> None:
    p = fusee_cmd("--progress", "runs", str(directory), "--all", "--limit", "5", "--json")
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["items"]) == RUNS  # stdout still parses
    assert f"read {directory}: {RUNS} runs" in p.stderr and "log records after the checkpoint" in p.stderr
    assert "listing runs" in p.stderr and f"{RUNS}/{RUNS}" in p.stderr  # the bar's final state
    assert f"listed {RUNS} runs in " in p.stderr


def test_export_and_import_report_their_counts(directory: Path, tmp_path: Path) -> None:
    out = tmp_path / "c-3.fjnl"
    p = fusee_cmd("--progress", "export", str(directory), "c-3", str(out))
    assert p.returncode == 0, p.stderr
    n = int(p.stdout.split()[0])
    assert p.stdout.strip() == f"{n} records of c-3 written to {out}"
    assert f"exported {n} records (" in p.stderr
    p = fusee_cmd("--progress", "import", str(out), "--json")
    assert p.returncode == 0, p.stderr
    assert [e["kind"] for e in json.loads(p.stdout)["timeline"]] == ["start", "step", "end"]
    assert f"read {n} records of {out} in " in p.stderr
    p = fusee_cmd("import", str(out), "--json")
    assert p.returncode == 0 and p.stderr == ""


async def test_the_engine_logs_what_an_open_read(directory: Path, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fusee"):
        async with fusee.Engine.open(directory, workflows=[counted], read_only=True):
            pass
    opened = [r.getMessage() for r in caplog.records if r.getMessage().startswith("opened ")]
    assert len(opened) == 1 and f"; {RUNS} workflows" in opened[0], opened
