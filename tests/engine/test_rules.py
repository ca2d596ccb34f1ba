"""Two rules checked through the API: an update recorded for a handler the code no longer
registers stops the run as a determinism error; if_running='terminate' replaces the run."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import fusee

bump = fusee.update("bump", int)
done = fusee.signal("done", bool)


@fusee.workflow("counter_v")
async def with_handler(ctx: fusee.Ctx) -> int:
    total = {"n": 0}

    def on_bump(by: int) -> int:
        total["n"] += by
        return total["n"]

    ctx.on_update(bump, on_bump)
    await ctx.wait_for(done)
    return total["n"]


@fusee.workflow("counter_v")
async def without_handler(ctx: fusee.Ctx) -> int:
    await ctx.wait_for(done)  # the same operations, but bump is no longer handled
    return 0


async def test_a_recorded_update_whose_handler_is_gone_stops_the_run(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[with_handler]) as engine:
        await engine.start(with_handler, "u-1")
        assert await asyncio.wait_for(engine.update("u-1", bump, 5), 10) == 5
    async with fusee.Engine.open(tmp_path, workflows=[without_handler]) as engine:
        assert "determinism error" in engine.stuck()["u-1"]
        assert "update 'bump' but the code registered no handler" in engine.stuck()["u-1"]
        with pytest.raises(fusee.NotFound, match="is stopped: determinism error"):
            await engine.signal("u-1", done, True)  # a stopped run takes nothing
    # The code that handles it again carries the run on: nothing was lost.
    async with fusee.Engine.open(tmp_path, workflows=[with_handler]) as engine:
        await engine.signal("u-1", done, True)
        assert await asyncio.wait_for(engine.get("u-1").result(), 10) == 5


@fusee.workflow("replaceable")
async def replaceable(ctx: fusee.Ctx, n: int) -> int:
    await ctx.wait_for(done)
    return n


async def test_if_running_terminate_ends_the_running_run_and_starts_the_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "fusee")
    async with fusee.Engine.open(workflows=[replaceable]) as engine:
        first = await engine.start(replaceable, "r-1", 1)
        with pytest.raises(fusee.AlreadyExists):
            await engine.start(replaceable, "r-1", 2)  # the default refuses
        second = await engine.start(replaceable, "r-1", 2, if_running="terminate")
        assert second.run_id != first.run_id
        assert engine.describe("r-1").run_id == second.run_id
        assert engine.describe("r-1").status == "running"
        assert f"run {first.run_id} ended terminated" in caplog.text
        await engine.signal("r-1", done, True)
        assert await asyncio.wait_for(second.result(), 10) == 2  # the new run's input
