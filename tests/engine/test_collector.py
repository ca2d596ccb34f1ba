"""An open engine's effect on CPython's garbage collector (``tune_gc=``), and that it is undone."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import fusee
from fusee.engine import collector

pytestmark = pytest.mark.skipif(not collector.applies(), reason="the generational collector of CPython < 3.14")


@fusee.workflow("collected")
async def collected(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[tuple[int, int, int]]:
    """Each test starts from the interpreter's defaults, with no engine open, and leaves the
    process as it found it (an engine another test left open is counted apart meanwhile)."""
    gc.collect()  # an engine an earlier test dropped without closing lets go here
    counted = collector._holders, collector._tuned
    collector._holders, collector._tuned = 0, None
    before = gc.get_threshold()
    young, middle, _ = before
    gc.set_threshold(young, middle, collector.DEFAULT_FULL)
    try:
        yield gc.get_threshold()
    finally:
        assert collector.holders() == 0, "a test left an engine open"
        collector._holders, collector._tuned = counted
        gc.set_threshold(*before)


async def test_an_open_engine_collects_the_whole_heap_less_often_and_close_sets_it_back(
        tmp_path: Path, default_thresholds: tuple[int, int, int]) -> None:
    young, middle, _ = default_thresholds
    engine = await fusee.Engine.open(tmp_path / "e", workflows=[collected])
    assert gc.get_threshold() == (young, middle, collector.TUNED_FULL)
    assert await engine.execute(collected, "c-1", 21) == 42
    await engine.close()
    assert gc.get_threshold() == default_thresholds


async def test_the_thresholds_come_back_only_when_the_last_engine_closes(
        tmp_path: Path, default_thresholds: tuple[int, int, int]) -> None:
    first = await fusee.Engine.open(tmp_path / "a", workflows=[collected])
    second = await fusee.Engine.open(None, workflows=[collected])
    tuned = gc.get_threshold()
    assert tuned[2] == collector.TUNED_FULL
    await first.close()
    assert gc.get_threshold() == tuned
    await second.close()
    assert gc.get_threshold() == default_thresholds


async def test_thresholds_the_application_chose_are_left_alone(tmp_path: Path) -> None:
    gc.set_threshold(5000, 20, 30)
    engine = await fusee.Engine.open(tmp_path / "e", workflows=[collected])
    assert gc.get_threshold() == (5000, 20, 30)
    await engine.close()
    assert gc.get_threshold() == (5000, 20, 30)


async def test_thresholds_changed_while_open_are_not_overwritten_at_close(tmp_path: Path) -> None:
    engine = await fusee.Engine.open(tmp_path / "e", workflows=[collected])
    gc.set_threshold(1000, 10, 50)
    await engine.close()
    assert gc.get_threshold() == (1000, 10, 50)


async def test_tune_gc_false_leaves_the_collector_alone(
        tmp_path: Path, default_thresholds: tuple[int, int, int]) -> None:
    engine = await fusee.Engine.open(tmp_path / "e", workflows=[collected], tune_gc=False)
    assert gc.get_threshold() == default_thresholds
    assert await engine.execute(collected, "c-1", 1) == 2
    await engine.close()
    assert gc.get_threshold() == default_thresholds


async def test_a_read_only_view_and_a_failed_open_hold_nothing(
        tmp_path: Path, default_thresholds: tuple[int, int, int]) -> None:
    engine = await fusee.Engine.open(tmp_path / "e", workflows=[collected])
    await engine.close()
    view = await fusee.Engine.open(tmp_path / "e", workflows=[collected], read_only=True)
    assert gc.get_threshold() == default_thresholds
    await view.close()
    (tmp_path / "not-an-engine").mkdir()
    (tmp_path / "not-an-engine" / "notes.txt").write_text("mine")
    with pytest.raises(fusee.errors.NotAnEngineDirectory):
        await fusee.Engine.open(tmp_path / "not-an-engine", workflows=[collected])
    assert gc.get_threshold() == default_thresholds


async def test_tune_gc_takes_a_bool(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="tune_gc"):
        await fusee.Engine.open(tmp_path / "e", workflows=[collected], tune_gc="yes")  # type: ignore[arg-type]


def test_a_sync_engine_tunes_and_restores_alike(tmp_path: Path, default_thresholds: tuple[int, int, int]) -> None:
    with fusee.SyncEngine.open(tmp_path / "e", workflows=[collected]) as engine:
        assert gc.get_threshold()[2] == collector.TUNED_FULL
        assert engine.execute(collected, "c-1", 4) == 8
    assert gc.get_threshold() == default_thresholds
    with fusee.SyncEngine.open(tmp_path / "e", workflows=[collected], tune_gc=False):
        assert gc.get_threshold() == default_thresholds


async def test_an_engine_dropped_without_close_lets_the_thresholds_go(
        default_thresholds: tuple[int, int, int]) -> None:
    engine = await fusee.Engine.open(None, workflows=[collected])
    assert collector.holders() == 1 and gc.get_threshold()[2] == collector.TUNED_FULL
    release = engine._gc_release
    assert release is not None
    release()
    release()  # closing after the finalizer ran (or twice) counts the engine out once
    assert collector.holders() == 0 and gc.get_threshold() == default_thresholds
    await engine.close()
    assert collector.holders() == 0


def test_the_release_runs_when_the_owner_is_collected(default_thresholds: tuple[int, int, int]) -> None:
    class Owner:
        pass

    owner = Owner()
    collector.hold(owner)
    assert collector.holders() == 1 and gc.get_threshold()[2] == collector.TUNED_FULL
    del owner
    gc.collect()
    assert collector.holders() == 0 and gc.get_threshold() == default_thresholds
