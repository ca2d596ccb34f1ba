"""The memory budget (``memory_budget=``) and recovery in batches (``recovery_batch=``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.errors import InvalidSize
from tests.helpers import crash_in_process, until

go = fusee.signal("go", int)

BEFORE: list[str] = []


@fusee.workflow("budgeted")
async def budgeted(ctx: fusee.Ctx, n: int) -> int:
    await ctx.step("before", lambda: BEFORE.append(ctx.workflow_id) or n)
    got = await ctx.wait_for(go)
    return await ctx.step("after", lambda: n + got)


@fusee.workflow("barrier")
async def barrier(ctx: fusee.Ctx) -> int:
    return 1


async def all_durable(engine: fusee.Engine) -> None:
    """Returns once everything journaled so far is durable (records reach the log in order, so a
    run acknowledged after them covers them)."""
    await engine.execute(barrier, f"barrier-{len(engine._rt.wf)}")


def waiting(engine: fusee.Engine) -> bool:
    """Every run has journaled its wait for the signal (it is suspended)."""
    return all(any(type(r).__name__ == "Wait" for r in engine._rt.journal_of(st)[0])
               for st in engine._rt.wf.values() if st.wtype == "budgeted")


BUDGET = 64 << 10


def test_suspended_runs_park_to_stay_within_the_budget_and_resume(tmp_path: Path) -> None:
    async def main() -> None:
        BEFORE.clear()
        # park_after of an hour: only the budget parks anything in this test.
        engine = await fusee.Engine.open(tmp_path, workflows=[budgeted, barrier], park_after=3600, memory_budget="64KiB")
        m = engine.metrics()
        assert m.memory_budget == BUDGET and m.loaded_bytes == 0
        peak = 0
        for i in range(60):
            await engine.start(budgeted, f"b-{i}", i)
            peak = max(peak, engine.metrics().loaded_bytes)
        await until(lambda: waiting(engine) and engine.metrics().loaded_bytes <= BUDGET)
        m = engine.metrics()
        loaded = sum(s.loaded for s in m.shards)
        parked = sum(s.parked for s in m.shards)
        assert parked + loaded == 60 and parked >= 40, (parked, loaded)
        assert 0 < m.loaded_bytes <= BUDGET
        assert m.stats["budget_parks"] == m.stats["parked"] >= 40
        # Between two sweeps the loaded runs pass the budget by the runs started meanwhile (a few).
        per_run = m.loaded_bytes / max(loaded, 1)
        assert peak <= BUDGET + 4 * per_run, (peak, per_run)
        for i in range(0, 60, 2):
            await engine.signal(f"b-{i}", go, 1000)
        for i in range(0, 60, 2):
            assert await engine.get(f"b-{i}").result() == i + 1000
        await until(lambda: engine.metrics().loaded_bytes <= BUDGET)
        await all_durable(engine)
        await crash_in_process(engine)

        # After a crash every unfinished run replays (no checkpoint); the budget parks them again.
        engine = await fusee.Engine.open(tmp_path, workflows=[budgeted, barrier], park_after=3600, memory_budget=BUDGET,
                                         recovery_batch=7)
        try:
            await until(lambda: engine.metrics().runs_to_load == 0)
            await until(lambda: engine.metrics().loaded_bytes <= BUDGET)
            assert engine.stats["budget_parks"] >= 20
            for i in range(1, 60, 2):
                await engine.signal(f"b-{i}", go, 2000)
            for i in range(60):
                assert await engine.get(f"b-{i}").result() == i + (1000 if i % 2 == 0 else 2000)
        finally:
            await engine.close()
        assert sorted(BEFORE) == sorted(f"b-{i}" for i in range(60)), "a recorded step ran again"

    asyncio.run(main())


def test_max_loaded_parks_without_park_after() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[budgeted, barrier], park_after=None, max_loaded=3) as engine:
            for i in range(20):
                await engine.start(budgeted, f"m-{i}", i)
            await until(lambda: waiting(engine) and sum(s.loaded for s in engine.metrics().shards) <= 3)
            assert engine.metrics().memory_budget is None
            await engine.signal("m-0", go, 1)
            assert await engine.get("m-0").result() == 1

    asyncio.run(main())


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "", "12", "MiB", "12 parsecs", "1mib", "-3KB", "0.0001KB",
                                 b"1MiB"])
def test_a_bad_memory_budget_is_refused_with_the_forms_accepted(bad: Any) -> None:
    async def main() -> None:
        with pytest.raises(InvalidSize, match=r"memory_budget.*accepted: a positive int of bytes"):
            await fusee.Engine.open(workflows=[budgeted, barrier], memory_budget=bad)

    asyncio.run(main())


def test_recovery_batch_must_be_a_positive_int() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="recovery_batch"):
            await fusee.Engine.open(workflows=[budgeted, barrier], recovery_batch=0)

    asyncio.run(main())


def test_sync_engine_forwards_the_budget_and_the_batch() -> None:
    with fusee.SyncEngine.open(workflows=[budgeted, barrier], memory_budget="1.5MiB", recovery_batch=10) as engine:
        m = engine.metrics()
        assert m.memory_budget == 3 << 19 and m.runs_to_load == 0


# --- recovery in batches ---------------------------------------------------------------------

EVENTS: list[tuple[str, Any]] = []
#: Phase 1 (before the crash): the step hangs, so every run is mid-step when the engine dies.
HANGING = True


async def first(wid: str) -> str:
    if HANGING:
        await asyncio.Event().wait()
    return wid


async def second(wid: str) -> str:
    # Starts once the run's "first" record is durable, and needs a turn of the loop to go on:
    # a recovery that replays every run in one pass gives it none before the last run is loaded.
    await asyncio.sleep(0)
    EVENTS.append(("second", wid))
    return wid


@fusee.workflow("recovering")
async def recovering(ctx: fusee.Ctx) -> str:
    await ctx.step("warm-up", lambda: 1)
    await ctx.step("first", first, ctx.workflow_id)
    return await ctx.step("second", second, ctx.workflow_id)


class _Batches(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("recovery loaded a batch"):
            EVENTS.append(("batch", record.args[1] if isinstance(record.args, tuple) else None))


def test_the_first_recovered_runs_go_on_before_the_last_ones_load(tmp_path: Path) -> None:
    global HANGING

    async def main() -> None:
        global HANGING
        HANGING = True
        EVENTS.clear()
        engine = await fusee.Engine.open(tmp_path, workflows=[recovering])
        for i in range(50):
            await engine.start(recovering, f"r-{i}")
        await until(lambda: engine.metrics().steps_executing == 50)
        await crash_in_process(engine)
        HANGING = False

        handler = _Batches(logging.DEBUG)
        logger = logging.getLogger("fusee")
        logger.addHandler(handler)
        was = logger.level
        logger.setLevel(logging.DEBUG)
        try:
            # Flushes on the loop's thread (the default): each batch's turn of the loop flushes
            # what the runs before it recorded, so the order below is the same on every machine.
            engine = await fusee.Engine.open(tmp_path, workflows=[recovering], recovery_batch=10, flush="inline")
            assert engine.metrics().runs_to_load == 40  # the first batch loaded before the open returned
            try:
                for i in range(50):
                    assert await engine.get(f"r-{i}").result() == f"r-{i}"
                assert engine.metrics().runs_to_load == 0
            finally:
                await engine.close()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(was)
        batches = [i for i, (kind, _) in enumerate(EVENTS) if kind == "batch"]
        progress = [i for i, (kind, _) in enumerate(EVENTS) if kind == "second"]
        assert [EVENTS[i][1] for i in batches] == [40, 30, 20, 10, 0]
        assert len(progress) == 50
        # Runs of the first batch went on before the last batch was even loaded.
        assert progress[0] < batches[-1], str(EVENTS)
        assert {wid for kind, wid in EVENTS[:batches[-1]] if kind == "second"} & {f"r-{i}" for i in range(10)}

    asyncio.run(main())
    HANGING = True


def test_a_run_recovery_has_not_loaded_yet_is_loaded_when_signalled(tmp_path: Path) -> None:
    async def main() -> None:
        BEFORE.clear()
        engine = await fusee.Engine.open(tmp_path, workflows=[budgeted, barrier], park_after=None)
        for i in range(30):
            await engine.start(budgeted, f"s-{i}", i)
        await until(lambda: waiting(engine))
        await all_durable(engine)
        await crash_in_process(engine)
        async with fusee.Engine.open(tmp_path, workflows=[budgeted, barrier], park_after=None, recovery_batch=5) as engine:
            assert engine.metrics().runs_to_load == 25
            # The last run queued: a signal (and a query of its status) reach it before its turn.
            await engine.signal("s-29", go, 1)
            assert await engine.get("s-29").result() == 30
            await until(lambda: engine.metrics().runs_to_load == 0)
            assert sum(s.loaded for s in engine.metrics().shards) == 29
        assert sorted(BEFORE) == sorted(f"s-{i}" for i in range(30)), str(BEFORE)

    asyncio.run(main())
