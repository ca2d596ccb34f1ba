"""The testing kit: an in-memory engine whose clock skips idle time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import fusee
from fusee import testing
from fusee.core import records as rec
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


# --- recorded histories against new code ---------------------------------------------------


@fusee.workflow("checkout", version=1)
async def checkout_v1(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("price", lambda: n * 10)
    await ctx.sleep("hold", "1h")
    return int(await ctx.step("charge", lambda: a + 1))


@fusee.workflow("checkout", version=1)
async def checkout_renamed(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("quote", lambda: n * 10)  # renamed without ctx.patched: breaks old runs
    await ctx.sleep("hold", "1h")
    return int(await ctx.step("charge", lambda: a + 1))


@fusee.workflow("checkout", version=1)
async def checkout_patched(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("price", lambda: n * 10)
    await ctx.sleep("hold", "1h")
    if ctx.patched("loyalty"):
        a -= 1
    return int(await ctx.step("charge", lambda: a + 1))


async def test_export_and_replay_against_new_code(tmp_path: Path) -> None:
    async with TestEngine(workflows=[checkout_v1]) as env:
        assert await env.execute(checkout_v1, "c-1", 4) == 41
        await env.start(checkout_v1, "c-2", 5)  # still sleeping: exported mid-way
        await asyncio.sleep(0)
        assert await env.export("c-1", tmp_path / "c-1.fjnl") == len(await env.journal("c-1"))
        await env.export("c-2", tmp_path / "c-2.fjnl")
    journal = testing.load_journal(tmp_path / "c-1.fjnl")
    assert isinstance(journal[0], rec.Start) and journal[0].id == "c-1"
    await testing.replay(tmp_path / "c-1.fjnl", [checkout_v1])
    await testing.replay(journal, [checkout_patched])  # a patched change replays old runs fine
    assert await testing.replay_dir(tmp_path, [checkout_v1]) == 2
    with pytest.raises(fusee.DeterminismError, match="position 0"):
        await testing.replay(tmp_path / "c-1.fjnl", [checkout_renamed])
    with pytest.raises(fusee.DeterminismError, match=r"c-1\.fjnl"):
        await testing.replay_dir(tmp_path, [checkout_renamed])


async def test_journal_json_is_the_same_for_equivalent_runs(tmp_path: Path) -> None:
    async with TestEngine(workflows=[checkout_v1]) as env:
        await env.execute(checkout_v1, "a", 4)
        await env.execute(checkout_v1, "b", 4)
        ja = testing.journal_json(await env.journal("a"))
        jb = testing.journal_json(await env.journal("b"))
    strip = [{k: v for k, v in r.items() if k != "id"} for r in ja]
    assert strip == [{k: v for k, v in r.items() if k != "id"} for r in jb]
    assert ja[0]["kind"] == "Start" and ja[-1] == {"kind": "Done", "status": "ok", "payload": 41, "by": None}


def test_a_damaged_journal_file_is_refused(tmp_path: Path) -> None:
    from fusee import journal_file

    start = rec.Start(1, "w", "t", 1, 0, 0, 0, None, 0, None, b"null")
    data = bytearray(journal_file.dumps([start]))
    assert journal_file.loads(bytes(data)) == [start]
    data[12] ^= 1
    with pytest.raises(fusee.CorruptRecord, match="checksum"):
        journal_file.loads(bytes(data))
    (tmp_path / "x.fjnl").write_bytes(b"not a journal")
    with pytest.raises(fusee.CorruptRecord, match="not a Fusee journal"):
        testing.load_journal(tmp_path / "x.fjnl")


@fusee.workflow("durable_sum")
async def durable_sum(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(f"add-{i}", lambda i=i: i)
        await ctx.sleep(f"pause-{i}", "1h")
    return total


LEAKED = {"total": 0}


def leaky_add(i: int) -> int:
    LEAKED["total"] += i  # state outside the journal: a restart sees a different total
    return LEAKED["total"]


@fusee.workflow("leaky_sum")
async def leaky_sum(ctx: fusee.Ctx, n: int) -> int:
    last = 0
    for i in range(n):
        last = await ctx.step(f"add-{i}", lambda i=i: leaky_add(i))
    return int(last + LEAKED["total"] * 0 + (1 if LEAKED["total"] > 10 else 0))


async def test_crash_everywhere_passes_a_durable_workflow() -> None:
    cuts = await testing.crash_everywhere(durable_sum, 4)
    assert cuts >= 8  # a cut after every record but the last


async def test_crash_everywhere_finds_state_kept_outside_the_journal() -> None:
    LEAKED["total"] = 0
    with pytest.raises(testing.CrashCheckFailed, match="crash at record"):
        await testing.crash_everywhere(leaky_sum, 4)
