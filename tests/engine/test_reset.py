"""Reset and fork: a new run from a prefix of a run's journal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fusee
from fusee.core import records as rec
from tests.helpers import until

note = fusee.signal("note", str)
CALLS: list[str] = []


def effect(info: fusee.StepInfo) -> str:
    CALLS.append(info.name)
    return info.name


@fusee.workflow("pipeline")
async def pipeline(ctx: fusee.Ctx) -> list[str]:
    out = [await ctx.step("extract", effect)]
    out.append(str(await ctx.wait_for(note)))
    out.append(await ctx.step("load", effect))
    out.append(str(await ctx.wait_for(note)))
    return out


@pytest.fixture(autouse=True)
def _clear() -> None:
    CALLS.clear()


async def test_reset_replays_the_prefix_and_reapplies_later_signals(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[pipeline]) as engine:
        h = await engine.start(pipeline, "p-1")
        await h.signal(note, "first")
        await until(lambda: CALLS == ["extract", "load"])
        old_run = h.run_id
        h2 = await engine.reset("p-1", before_step="load", by="alice")
        assert h2.run_id != old_run
        await until(lambda: CALLS == ["extract", "load", "load"])  # load runs again, extract does not
        await h2.signal(note, "second")
        assert await h2.result() == ["extract", "first", "load", "second"]
        journal = await engine.journal("p-1")
        assert isinstance(journal[0], rec.Start) and journal[0].run == h2.run_id
        assert [r.payload for r in journal if isinstance(r, rec.Signal)] == [b'"first"', b'"second"']
    async with fusee.Engine.open(tmp_path, workflows=[pipeline]) as engine:
        assert await engine.get("p-1").result() == ["extract", "first", "load", "second"]
    assert CALLS == ["extract", "load", "load"]


async def test_reset_before_a_signal_delivers_it_again_once() -> None:
    async with fusee.Engine.open(workflows=[pipeline]) as engine:
        h = await engine.start(pipeline, "p-1")
        await h.signal(note, "first")
        await until(lambda: CALLS == ["extract", "load"])
        h2 = await engine.reset("p-1", before_position=1)  # before the first wait
        await h2.signal(note, "second")
        # The re-applied "first" arrives once, then "second".
        assert await h2.result() == ["extract", "first", "load", "second"]
        # Reset the reset run before "load": in its journal "first" came before the cut and
        # stays; "second" came after it and is dropped.
        h3 = await engine.reset("p-1", before_step="load", reapply_signals=False)
        await h3.signal(note, "x")
        assert await h3.result() == ["extract", "first", "load", "x"]


async def test_fork_leaves_the_original_alone() -> None:
    async with fusee.Engine.open(workflows=[pipeline]) as engine:
        h = await engine.start(pipeline, "p-1")
        await h.signal(note, "first")
        await until(lambda: CALLS == ["extract", "load"])
        f = await engine.fork("p-1", "p-1-copy", before_step="load")
        await until(lambda: CALLS.count("load") == 2)
        await f.signal(note, "fork")
        await h.signal(note, "orig")
        assert await f.result() == ["extract", "first", "load", "fork"]
        assert await h.result() == ["extract", "first", "load", "orig"]
        with pytest.raises(fusee.AlreadyExists):
            await engine.fork("p-1", "p-1-copy", before_step="load")
        with pytest.raises(ValueError, match="no step named"):
            await engine.reset("p-1", before_step="nope")
        with pytest.raises(ValueError, match="exactly one"):
            await engine.reset("p-1")


async def test_reset_moves_a_run_to_another_version() -> None:
    @fusee.workflow("pipeline", version=2)
    async def pipeline_v2(ctx: fusee.Ctx) -> list[str]:
        out = [await ctx.step("extract", effect)]
        out.append(str(await ctx.wait_for(note)))
        out.append(await ctx.step("load-v2", effect))
        return out

    async with fusee.Engine.open(workflows=[pipeline, pipeline_v2]) as engine:
        h = await engine.start(pipeline, "p-1")  # newest: v2
        await h.signal(note, "a")
        assert await h.result() == ["extract", "a", "load-v2"]
        h2 = await engine.reset("p-1", before_position=2, version=2)
        assert await h2.result() == ["extract", "a", "load-v2"]
        with pytest.raises(fusee.UnknownWorkflow):
            await engine.reset("p-1", before_position=2, version=9)


def test_split_keeps_the_start_and_what_came_before_the_cut() -> None:
    from fusee.runtime.reset import split

    start = rec.Start(1, "w", "t", 1, 0, 0, 0, None, 0, None, b"null")
    s0 = rec.Step(1, 0, "a", 1, rec.Status.OK, b"1")
    sig = rec.Signal(1, "go", 0, b"1")
    s2 = rec.Step(1, 2, "c", 1, rec.Status.OK, b"1")  # a later branch that finished first
    s1 = rec.Step(1, 1, "b", 1, rec.Status.OK, b"1")
    late = rec.Signal(1, "go", 0, b"2")
    journal: list[rec.Record] = [start, s0, sig, s2, s1, late]
    assert split(journal, 0) == ([start], [sig, late])
    assert split(journal, 1) == ([start, s0], [sig, late])
    assert split(journal, 2) == ([start, s0, sig, s1], [late])


async def test_two_resets_at_once_return_their_own_runs() -> None:
    async with fusee.Engine.open(workflows=[pipeline]) as engine:
        h = await engine.start(pipeline, "p-1")
        await h.signal(note, "first")
        await until(lambda: CALLS == ["extract", "load"])
        a, b = await asyncio.gather(engine.reset("p-1", before_step="load"),
                                    engine.reset("p-1", before_step="load"))
        assert a.run_id != b.run_id
        assert engine.get("p-1").run_id == b.run_id
