"""The testing kit: an in-memory engine whose clock skips idle time."""

from __future__ import annotations

import asyncio
import time

import fusee
from fusee.testing import TestEngine

go = fusee.signal("go", int)


@fusee.workflow("subscription")
async def subscription(ctx: fusee.Ctx, months: int) -> list[str]:
    bills = []
    for m in range(months):
        bills.append(await ctx.step(f"bill-{m}", lambda m=m: f"month {m}"))
        await ctx.sleep(f"wait-{m}", "30d")
    return bills


@fusee.workflow("reminder")
async def reminder(ctx: fusee.Ctx) -> str:
    got = await ctx.wait_for(go, timeout="7d")
    return "answered" if got is not None else "reminded"


async def test_a_year_of_sleeps_takes_milliseconds() -> None:
    t0 = time.monotonic()
    async with TestEngine(workflows=[subscription]) as env:
        start = env.now()
        out = await asyncio.wait_for(env.execute(subscription, "sub-1", 12), 10)
        assert out == [f"month {m}" for m in range(12)]
        assert (env.now() - start).days >= 360
    assert time.monotonic() - t0 < 10


async def test_timeouts_fire_and_skip_moves_time_by_hand() -> None:
    async with TestEngine(workflows=[reminder], skip_time=False) as env:
        h = await env.start(reminder, "r-1")
        await env.skip("6d")
        assert env.describe("r-1").status == "running"
        await env.skip("1d")
        assert await asyncio.wait_for(h.result(), 10) == "reminded"
        h2 = await env.start(reminder, "r-2")
        await env.signal("r-2", go, 1)
        assert await h2.result() == "answered"


async def test_it_opens_fast() -> None:
    t0 = time.perf_counter()
    async with TestEngine(workflows=[reminder]):
        assert time.perf_counter() - t0 < 0.5  # typically about a millisecond
