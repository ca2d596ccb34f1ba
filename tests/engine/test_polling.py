"""Polling a run from the caller's loop lets the engine work (issue 22, finding 3).

``await run.query(...)`` (and ``await engine.schedules()``) is async: each
call yields to the event loop once, so a loop that polls until the run moves
on sees it move on, however fast the answer is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.testing import TestEngine

phase_q = fusee.query("phase", str)
#: Polls at most this many times: a poll that never yields would spin forever (the run
#: never gets a turn); a poll that yields sees the run move on after a handful.
POLLS = 50_000


@fusee.workflow("two-phases")
async def two_phases(ctx: fusee.Ctx) -> str:
    phase = "x"
    ctx.on_query(phase_q, lambda _: phase)
    await ctx.step("work", lambda: 1)
    phase = "y"
    await ctx.sleep("rest", "1h")  # stays running: the query is answered from live code
    return phase


@fusee.workflow("job")
async def job(ctx: fusee.Ctx) -> int:
    return 1


def memory(tmp_path: Path) -> Any:
    return fusee.Engine.open(None, workflows=[two_phases, job])


def directory(tmp_path: Path) -> Any:
    return fusee.Engine.open(tmp_path / "e", workflows=[two_phases, job])


@asynccontextmanager
async def kit_engine(tmp_path: Path) -> AsyncIterator[Any]:
    async with TestEngine(workflows=[two_phases, job], skip_time=False) as env:
        yield env


ENGINES: list[Callable[[Path], Any]] = [memory, directory, kit_engine]


async def polls_until(cond: Callable[[], Any]) -> int:
    for n in range(POLLS):
        if not await cond():
            return n
    raise AssertionError(f"{POLLS} polls and the engine never got a turn")


@pytest.mark.parametrize("opened", ENGINES, ids=["memory", "directory", "TestEngine"])
async def test_a_query_loop_lets_the_run_move_on(opened: Callable[[Path], Any], tmp_path: Path) -> None:
    async with opened(tmp_path) as engine:
        run = await engine.start(two_phases, "w")

        async def still_x() -> bool:
            return await run.query(phase_q) == "x"

        await polls_until(still_x)
        assert await run.query(phase_q) == "y"


@pytest.mark.parametrize("opened", ENGINES, ids=["memory", "directory", "TestEngine"])
async def test_a_schedules_loop_lets_the_scheduled_run_end(opened: Callable[[Path], Any], tmp_path: Path) -> None:
    async with opened(tmp_path) as engine:
        await engine.schedule("s", job, every="1h", paused=True)
        await engine.trigger_schedule("s")

        async def one_runs() -> bool:
            [s] = await engine.schedules()
            return s.last_run is None or s.running is not None

        await polls_until(one_runs)
        [s] = await engine.schedules()
        assert s.fired == 1 and engine.describe(s.last_run).status == "ok"
