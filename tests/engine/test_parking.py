"""Parking: suspended runs leave memory and come back by replay; retention ends finished runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.helpers import crash_in_process, until

poke = fusee.signal("poke", int)
seen = fusee.query("seen")
bump = fusee.update("bump", int)

RUNS: list[str] = []


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx, ms: int) -> list[Any]:
    got: list[Any] = []
    ctx.on_query(seen, lambda: list(got))

    def add(n: int) -> int:
        got.append(("bump", n))
        return len(got)

    ctx.on_update(bump, add)
    first = await ctx.step("first", lambda: RUNS.append(ctx.workflow_id) or "once")
    await ctx.sleep("nap", f"{ms}ms")
    got.append(await ctx.wait_for(poke))
    return [first, *got]


def test_a_parked_run_wakes_for_timers_signals_queries_and_updates() -> None:
    async def main() -> None:
        RUNS.clear()
        async with fusee.Engine.open(workflows=[napper], park_after=0) as engine:
            h = await engine.start(napper, "nap-1", 30)
            await until(lambda: engine.stats["parked"] >= 1 and engine._rt.wf["nap-1"].run is None)
            # The timer wakes it; it parks again while waiting for the signal.
            await until(lambda: engine.stats["woken"] >= 1)
            await until(lambda: engine._rt.wf["nap-1"].run is None and engine.stats["parked"] >= 2)
            assert await h.query(seen) == []  # a query wakes it
            assert await h.update(bump, 5) == 1
            await h.signal(poke, 9)
            assert await h.result() == ["once", ["bump", 5], 9]
            assert RUNS == ["nap-1"], "a step ran again on wake-up"

    asyncio.run(main())


def test_parked_runs_stay_parked_across_a_clean_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        RUNS.clear()
        async with fusee.Engine.open(tmp_path, workflows=[napper]) as engine:
            for i in range(20):
                await engine.start(napper, f"n-{i}", 1)
            await until(lambda: all(
                any(type(r).__name__ == "Wait" for r in engine._rt.journal_of(st)[0])
                for st in engine._rt.wf.values()))
        async with fusee.Engine.open(tmp_path, workflows=[napper]) as engine:
            assert engine.stats["replays"] == 0, "parked runs were replayed at open"
            assert engine._rt.loaded_runs == 0
            for i in range(20):
                await engine.signal(f"n-{i}", poke, i)
            for i in range(20):
                assert await engine.get(f"n-{i}").result() == ["once", i]
        assert sorted(RUNS) == sorted(f"n-{i}" for i in range(20))

    asyncio.run(main())


def test_memory_budget_parks_early() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[napper], park_after=3600, max_loaded=5) as engine:
            for i in range(30):
                await engine.start(napper, f"m-{i}", 3_600_000)
            await until(lambda: engine._rt.loaded_runs <= 6)
            await engine.signal("m-0", poke, 1)  # still reachable

    asyncio.run(main())


@fusee.workflow("quick")
async def quick(ctx: fusee.Ctx) -> int:
    return 1


def test_retention_forgets_finished_workflows() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[quick], retention=0.05) as engine:
            assert await engine.execute(quick, "q-1") == 1
            await until(lambda: "q-1" not in engine._rt.wf)
            with pytest.raises(fusee.NotFound):
                engine.get("q-1")
            assert await engine.execute(quick, "q-1") == 1  # the ID is free again

    asyncio.run(main())


@fusee.workflow("stepper")
async def stepper(ctx: fusee.Ctx, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", (lambda v: lambda: v)(i))
    return n


def test_periodic_checkpoints_bound_recovery(tmp_path: Path) -> None:
    async def main() -> None:
        engine = await fusee.Engine.open(tmp_path, workflows=[stepper, napper], checkpoint_every=40)
        for i in range(30):
            assert await engine.execute(stepper, f"st-{i}", 5) == 5
        await engine.start(napper, "sleepy", 3_600_000)
        assert engine.stats["checkpoints"] >= 3
        # A crash (no close, no final checkpoint): the process lets go of the directory.
        await crash_in_process(engine)  # no close, no final checkpoint
        # Recovery reads only the log after the last periodic checkpoint.
        async with fusee.Engine.open(tmp_path, workflows=[stepper, napper]) as engine:
            assert engine.recovered_records < 60
            assert await engine.get("st-0").result() == 5
            await engine.signal("sleepy", poke, 1)

    asyncio.run(main())
