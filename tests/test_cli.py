"""The ``fusee`` command."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import fusee
from fusee.cli import main


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    return await ctx.step("hello", lambda: f"hello {name}")


def test_runs_and_journal_show_an_engine_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def setup() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[greet]) as engine:
            await engine.execute(greet, "g-1", "ada")

    asyncio.run(setup())
    assert main(["runs", str(tmp_path), "--json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert [(s["workflow_id"], s["workflow"], s["status"]) for s in items] == [("g-1", "greet", "ok")]
    assert main(["journal", str(tmp_path), "g-1"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in records] == ["Start", "Step", "Done"]
    assert records[1]["payload"] == "hello ada"


def test_disk_check_prints_the_floor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["disk-check", str(tmp_path), "--count", "20"]) == 0
    assert "fdatasync" in capsys.readouterr().out
