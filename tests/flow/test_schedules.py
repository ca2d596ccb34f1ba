"""Schedules: deterministic run IDs, every overlap policy, catch-up, control requests."""

from __future__ import annotations

import asyncio
import datetime

import pytest

import fusee
from fusee.testing import TestEngine

finish = fusee.signal("finish")
started: list[str] = []


@fusee.workflow("job")
async def job(ctx: fusee.Ctx, n: int) -> int:
    started.append(ctx.workflow_id)
    return n


@fusee.workflow("slow")
async def slow(ctx: fusee.Ctx, n: int) -> int:
    """Runs until it is signalled: it overlaps the next scheduled times."""
    started.append(ctx.workflow_id)
    await ctx.wait_for(finish)
    return n


@pytest.fixture(autouse=True)
def _clear() -> None:
    started.clear()


def at(env: TestEngine, ms: int) -> str:
    """The ID of the run scheduled at ``ms`` of schedule 's'."""
    return "s@" + datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{ms % 1000:03d}Z" if ms % 1000 else "Z")


def grid(env: TestEngine, every_ms: int) -> int:
    now = int(env.now().timestamp() * 1000)
    return (now // every_ms + 1) * every_ms


async def test_every_fires_each_time_once_under_its_deterministic_id() -> None:
    async with TestEngine(workflows=[job]) as env:
        first = grid(env, 60_000)
        await env.schedule("s", job, 7, every="1m")
        await env.until(lambda: len(started) >= 3)
        assert started[:3] == [at(env, first + i * 60_000) for i in range(3)]
        assert await env.get(started[0]).result() == 7
        info = await env.delete_schedule("s")
        assert info.fired >= 3 and info.skipped_overlap == 0
        assert len(set(started)) == len(started)
        assert env.schedules() == []


async def test_same_spec_again_is_a_no_op_and_another_spec_is_refused() -> None:
    async with TestEngine(workflows=[job]) as env:
        await env.schedule("s", job, 1, every="1h", paused=True)
        await env.schedule("s", job, 1, every="1h", paused=True)
        with pytest.raises(fusee.ScheduleExists, match="delete_schedule"):
            await env.schedule("s", job, 2, every="1h")
        [info] = await env.schedules()
        assert info.schedule_id == "s" and info.paused and info.every == datetime.timedelta(hours=1)
        await env.delete_schedule("s")
        await env.schedule("s", job, 2, every="1h", paused=True)  # the ID is free again
        with pytest.raises(fusee.ScheduleNotFound):
            await env.pause_schedule("nope")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({}, "exactly one"),
        ({"every": "1m", "cron": "* * * * *"}, "exactly one"),
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"every": "1m", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"every": "1m", "overlap": "sometimes"}, "overlap must be one of"),
        ({"every": 0}, "must be positive"),
    ],
)
async def test_a_bad_spec_is_refused_before_anything_is_recorded(kw: dict[str, object], match: str) -> None:
    async with TestEngine(workflows=[job]) as env:
        with pytest.raises(fusee.InvalidSchedule, match=match):
            await env.schedule("s", job, 1, **kw)  # type: ignore[arg-type]
        assert env.runs() == []


async def test_missed_times_inside_the_catchup_window_run_and_older_ones_are_counted() -> None:
    async with TestEngine(workflows=[job], skip_time=False) as env:
        first = grid(env, 600_000)
        await env.schedule("s", job, 1, every="10m", catchup_window="30m", overlap="allow_all")
        # The clock jumps (downtime): 2 h after the first time, 13 times passed.
        await env.skip(f"{first - int(env.now().timestamp() * 1000) + 7_200_000 + 1}ms")
        # Inside the window (the last 30 min): 1h40, 1h50 and 2h after the first time.
        await env.until(lambda: len(started) == 3)
        assert sorted(started) == [at(env, first + 7_200_000 - i * 600_000) for i in (2, 1, 0)]
        [info] = env.schedules()
        assert info.skipped_catchup == 10 and info.fired == 3


async def test_cron_in_a_timezone() -> None:
    async with TestEngine(workflows=[job]) as env:
        await env.schedule("s", job, 1, cron="30 9 * * *", timezone="Asia/Kolkata")  # 04:00 UTC
        await env.until(lambda: len(started) >= 2)
        for wid in started[:2]:
            assert wid.endswith("T04:00:00Z"), wid
        await env.delete_schedule("s")


async def test_jitter_delays_the_start_but_not_the_id() -> None:
    async with TestEngine(workflows=[job]) as env:
        first = grid(env, 3_600_000)
        await env.schedule("s", job, 1, every="1h", jitter="30m")
        await env.until(lambda: len(started) >= 2)
        assert started[:2] == [at(env, first), at(env, first + 3_600_000)]




@pytest.mark.parametrize(
    ("overlap", "runs", "skipped"),
    [
        ("skip", 2, 2),  # the first run covers times 1-3; time 4 starts the second run
        ("buffer_one", 2, 1),  # time 2 waits, time 3 is dropped
        ("buffer_all", 3, 0),
        ("allow_all", 4, 0),
        ("cancel_other", 2, 1),
        ("terminate_other", 2, 1),
    ],
)
async def test_overlap_policies(overlap: str, runs: int, skipped: int) -> None:
    async with TestEngine(workflows=[slow], skip_time=False) as env:
        every = 60_000
        first = grid(env, every)
        await env.schedule("s", slow, 1, every="1m", overlap=overlap)
        now = int(env.now().timestamp() * 1000)
        await env.skip(f"{first - now}ms")
        await env.until(lambda: len(started) == 1)
        await env.skip("1m")  # time 2 while the first runs
        await env.skip("1m")  # time 3
        info = await env.describe_schedule("s")
        if overlap in ("cancel_other", "terminate_other"):
            # The first run was stopped; time 3 replaced time 2 and runs now.
            await env.until(lambda: len(started) == 2)
            status = env.describe(started[0]).status
            assert status == ("cancelled" if overlap == "cancel_other" else "terminated")
            assert started[1] == at(env, first + 2 * every)
        else:
            await env.signal(started[0], finish)
            await env.until(lambda: env.describe(started[0]).status == "ok")
            if overlap == "skip":
                await env.skip("1m")  # time 4 finds nothing running
            await env.until(lambda: len(started) == (3 if overlap == "allow_all" else 2))
            for wid in list(started)[1:]:
                await env.signal(wid, finish)
            if overlap == "buffer_all":
                await env.until(lambda: len(started) == 3)
                await env.signal(started[2], finish)
            if overlap == "allow_all":
                await env.skip("1m")
                await env.until(lambda: len(started) == 4)
        info = await env.describe_schedule("s")
        assert len(started) == runs, started
        assert len(set(started)) == runs
        assert info.skipped_overlap == skipped, info


async def test_pause_unpause_trigger_backfill_delete() -> None:
    async with TestEngine(workflows=[job], skip_time=False) as env:
        every = 60_000
        first = grid(env, every)
        await env.schedule("s", job, 1, every="1m", paused=True)
        now = int(env.now().timestamp() * 1000)
        await env.skip(f"{first - now + 3 * every}ms")
        info = await env.describe_schedule("s")
        assert info.paused and started == []
        await env.trigger_schedule("s")
        await env.until(lambda: len(started) == 1)
        assert started[0].startswith("s@")
        # Backfill the three times that passed while paused, and one of them twice.
        start = datetime.datetime.fromtimestamp(first / 1000, tz=datetime.UTC)
        await env.backfill_schedule("s", start, start + datetime.timedelta(minutes=3))
        await env.until(lambda: len(started) == 4)
        await env.backfill_schedule("s", start, start + datetime.timedelta(minutes=1))
        await env.unpause_schedule("s")
        await env.skip("1m")
        await env.until(lambda: len(started) == 5)
        assert started[1:4] == [at(env, first + i * every) for i in range(3)]
        assert len(set(started)) == 5  # the repeated backfill started nothing again
        final = await env.delete_schedule("s")
        assert not final.paused
        with pytest.raises(fusee.ScheduleNotFound):
            await env.describe_schedule("s")
        with pytest.raises(fusee.InvalidSchedule, match="timezone-aware"):
            await env.schedule("t", job, 1, every="1m")
            await env.backfill_schedule("t", datetime.datetime(2026, 1, 1), datetime.datetime(2026, 1, 2))


async def test_a_long_lived_schedule_continues_as_new_and_keeps_its_counts() -> None:
    from fusee.flow import schedules

    async with TestEngine(workflows=[job]) as env:
        await env.schedule("s", job, 1, every="1s", overlap="allow_all")
        await env.until(lambda: len(started) >= schedules.CONTINUE_EVERY + 20, timeout=60)
        info = await env.describe_schedule("s")
        assert env.describe("fusee:schedule:s").run_id > 1  # it continued as new
        assert info.fired >= schedules.CONTINUE_EVERY + 20
        assert len(set(started)) == len(started)
        journal = await env.journal("fusee:schedule:s")
        assert len(journal) < 20 * schedules.CONTINUE_EVERY


async def test_a_backfill_of_fired_times_leaves_a_parked_schedule_parked() -> None:
    """Regression: the start of a detached child whose ID is in use woke its (parked) parent,
    whose replay sent the start again: a schedule with allow_all spun forever."""
    async with TestEngine(workflows=[job], skip_time=False, park_after=0) as env:
        every = 60_000
        first = grid(env, every)
        await env.schedule("s", job, 1, every="1m", overlap="allow_all")
        now = int(env.now().timestamp() * 1000)
        await env.skip(f"{first - now + 2 * every}ms")
        await env.until(lambda: len(started) == 3)
        start = datetime.datetime.fromtimestamp(first / 1000, tz=datetime.UTC)
        info = await env.backfill_schedule("s", start, start + datetime.timedelta(minutes=3))
        assert info.fired == 3
        await env.until(lambda: env.describe_schedule is not None and env.schedules()[0].fired == 6)
        woken = env.stats["woken"]
        for _ in range(50):  # many turns of the loop: nothing should wake it now
            await asyncio.sleep(0.002)
        assert env.stats["woken"] - woken <= 2
        assert len(started) == 3  # the backfilled times had fired: nothing started again
