"""A read-only open takes no lock and writes nothing: it reads a directory a live engine writes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fusee
from fusee.errors import DirectoryLocked
from fusee.storage.posix import PosixStorage


@fusee.workflow("tick")
async def tick(ctx: fusee.Ctx, i: int) -> int:
    return await ctx.step("double", lambda: i * 2)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


async def test_a_live_directory_is_read_while_its_engine_writes_checkpoints_and_rotates(tmp_path: Path) -> None:
    d = tmp_path / "e"
    # Small segments and frequent checkpoints: the writer rotates segments and removes old ones
    # while the reader scans.
    async with fusee.Engine.open(d, workflows=[tick], segment_bytes=64 << 10, checkpoint_every=40) as writer:
        assert PosixStorage().held(str(d))
        stop = asyncio.Event()
        acked = 0  # runs whose result was returned: released only once durable

        async def write() -> None:
            nonlocal acked
            i = 0
            while not stop.is_set():
                await writer.execute(tick, f"t-{i}", i)
                acked += 1
                i += 1

        task = asyncio.create_task(write())
        seen = 0
        try:
            reads = 0
            # Until the writer has checkpointed (and removed segments) a few times meanwhile.
            while reads < 10 or writer.stats.get("checkpoints", 0) < 3:
                reads += 1
                assert reads < 2000, "the writer never checkpointed"
                done_before = acked
                reader = await fusee.Engine.open(d, read_only=True, park_after=None)
                try:
                    assert reader.live
                    runs = reader.runs()
                finally:
                    await reader.close()
                # Everything acknowledged before the read is in it; reads only grow.
                assert sum(1 for s in runs if s.status == "ok") >= done_before
                assert len(runs) >= seen
                seen = len(runs)
                with pytest.raises(DirectoryLocked):
                    await fusee.Engine.open(d, workflows=[tick])  # the writer's lock still holds
        finally:
            stop.set()
            await task
    assert not PosixStorage().held(str(d))


async def test_a_read_only_open_of_a_closed_directory_is_not_live_and_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "e"
    async with fusee.Engine.open(d, workflows=[tick]) as engine:
        await engine.execute(tick, "t-1", 1)
    before = tree(d)
    reader = await fusee.Engine.open(d, read_only=True)
    try:
        assert not reader.live
        assert [s.status for s in reader.runs()] == ["ok"]
        # No lock: a writer may open the directory while the reader holds it open.
        async with fusee.Engine.open(d, workflows=[tick]) as writer:
            assert writer.describe("t-1").status == "ok"
    finally:
        await reader.close()
    before = tree(d)  # the writer changed files; the reader alone changes none
    reader = await fusee.Engine.open(d, read_only=True)
    await reader.close()
    assert tree(d) == before
