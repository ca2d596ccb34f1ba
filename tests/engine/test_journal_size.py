"""ctx.journal_size: the operations a run's code has started, the same on every replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import fusee

resume = fusee.signal("resume", bool)
SIZES: list[tuple[int, bool]] = []  # (journal_size, is_replaying) before the wait, per life


@fusee.workflow("sized")
async def sized(ctx: fusee.Ctx) -> list[int]:
    seen = [ctx.journal_size]
    await ctx.step("a", lambda: 1)
    seen.append(ctx.journal_size)
    await ctx.step("b", lambda: 2)
    seen.append(ctx.journal_size)
    SIZES.append((ctx.journal_size, ctx.is_replaying))
    await ctx.wait_for(resume)
    seen.append(ctx.journal_size)
    return seen


async def test_journal_size_counts_operations_and_is_the_same_on_replay(tmp_path: Path) -> None:
    SIZES.clear()
    async with fusee.Engine.open(tmp_path, workflows=[sized]) as engine:
        await engine.start(sized, "s-1")
        while not SIZES:
            await asyncio.sleep(0.001)
    async with fusee.Engine.open(tmp_path, workflows=[sized]) as engine:
        await engine.signal("s-1", resume, True)  # wakes the parked run: its code replays
        assert await asyncio.wait_for(engine.get("s-1").result(), 10) == [0, 1, 2, 3]
    assert [size for size, _ in SIZES] == [2, 2]  # the first life, then the replay of the second


@fusee.workflow("bounded")
async def bounded(ctx: fusee.Ctx, state: list[int]) -> list[int]:
    total, runs = state
    while total < 10:
        if ctx.journal_size >= 3:
            await ctx.continue_as_new([total, runs + 1])
        total += await ctx.step("add", lambda: 1)
    return [total, runs]


async def test_code_continues_as_new_when_its_journal_grows() -> None:
    async with fusee.Engine.open(workflows=[bounded]) as engine:
        assert await asyncio.wait_for(engine.execute(bounded, "b-1", [0, 1]), 10) == [10, 4]
