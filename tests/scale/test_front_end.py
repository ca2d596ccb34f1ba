"""``Engine.open(front_end=True)``: a process that runs no workflow and no step, routing every call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

import fusee
from fusee.errors import NotAnEngineDirectory, NotFound, OwnerUnreachable
from fusee.scale.follower import Follower
from fusee.scale.parts import PartedEngine, part_of
from tests.scale.test_directory_scale import spawn

add = fusee.signal("fe-add", int)


@fusee.workflow("fe-where")
async def where(ctx: fusee.Ctx, n: int) -> list[int]:
    """Which process ran its step, and ``n`` back after a signal."""
    pid = await ctx.step("pid", os.getpid)
    got = await ctx.wait_for(add)
    return [pid, n + got]


HOLDER = textwrap.dedent("""
    import asyncio, json, os, sys
    import fusee
    from tests.scale.test_front_end import where

    async def main():
        d, parts = sys.argv[1], sys.argv[2]
        async with fusee.Engine.open(d, parts=int(parts) if parts != "0" else None, workflows=[where],
                                     route_timeout=60) as eng:
            for _ in range(1200):  # a process that joins a parted directory gets its share handed over
                if eng.is_owner:
                    break
                await asyncio.sleep(0.05)
            print(json.dumps({"opened": os.getpid(), "owner": eng.is_owner}), flush=True)
            await asyncio.Event().wait()  # until killed

    asyncio.run(main())
""")


def _holder(d: Path, parts: int) -> subprocess.Popen[str]:
    p = spawn("-c", HOLDER, str(d), str(parts))
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, f"the holder failed: {p.communicate()}"
    assert json.loads(line)["owner"]
    return p


def _kill(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.communicate()


async def _wait(cond: object, what: str, timeout: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


def test_a_front_end_holds_no_part_runs_nothing_and_follows_takeovers(tmp_path: Path) -> None:
    d = tmp_path / "data"
    first = _holder(d, 2)
    second: subprocess.Popen[str] | None = None

    async def main() -> None:
        nonlocal second
        async with fusee.Engine.open(d, front_end=True, workflows=[where], route_timeout=60) as eng:
            assert isinstance(eng, PartedEngine)
            assert eng.held_parts == [] and not eng.is_owner and "front end" in repr(eng)
            ids = [f"w{i}" for i in range(12)]
            assert {part_of(w, 2) for w in ids} == {0, 1}
            handles = await asyncio.gather(*(eng.start(where, w, i) for i, w in enumerate(ids)))
            # A second holder joins: the two holders split the parts, the front end takes no share.
            second = await asyncio.get_running_loop().run_in_executor(None, _holder, d, 0)
            for h in handles:
                await h.signal(add, 100)
            got = await asyncio.gather(*(h.result() for h in handles))
            assert [n for _, n in got] == [i + 100 for i in range(12)]
            assert {pid for pid, _ in got} <= {first.pid, second.pid}
            assert os.getpid() not in {pid for pid, _ in got}, "the front end ran a step"
            assert eng.held_parts == []
            await eng.refresh()
            assert eng.counts()["ok"] == 12
            # SIGKILL of one holder: the other takes its part over; the front end's calls reach it.
            _kill(first)
            h = await eng.start(where, "after-kill", 1)
            await h.signal(add, 2)
            pid, n = await h.result()
            assert (pid, n) == (second.pid, 3) and eng.held_parts == []
        _kill(second)

    try:
        asyncio.run(main())
    finally:
        _kill(first)
        if second is not None:
            _kill(second)


@pytest.mark.parametrize("parts", [2, 0], ids=["parted", "owner-and-followers"])
def test_a_front_end_with_no_holder_left_does_nothing_and_never_takes_over(tmp_path: Path, parts: int) -> None:
    d = tmp_path / "data"
    holder = _holder(d, parts)

    async def main() -> None:
        async with fusee.Engine.open(d, front_end=True, workflows=[where], route_timeout=1.0) as eng:
            assert eng.is_owner is False
            if parts == 0:
                assert isinstance(eng, Follower) and "front end" in repr(eng)
            h = await eng.start(where, "kept", 1)
            _kill(holder)
            with pytest.raises(OwnerUnreachable):
                await eng.start(where, "never", 1)
            with pytest.raises(OwnerUnreachable):
                await h.signal(add, 1)
            await asyncio.sleep(0.3)  # a follower would have taken the lease over by now
            assert not eng.is_owner
        # Nothing the refused calls asked for happened; what was acknowledged is there.
        async with fusee.Engine.open(d, workflows=[where], exclusive=True) as again:
            assert again.is_owner
            with pytest.raises(NotFound):
                again.describe("never")
            kept = again.get("kept")
            await kept.signal(add, 5)
            assert (await kept.result())[1] == 6

    try:
        asyncio.run(main())
    finally:
        _kill(holder)


def test_bad_front_end_arguments_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="front_end"):
            await fusee.Engine.open(None, front_end=True)
        with pytest.raises(ValueError, match="front_end"):
            await fusee.Engine.open(tmp_path / "a", front_end=True, exclusive=True)
        with pytest.raises(ValueError, match="front_end"):
            await fusee.Engine.open(tmp_path / "a", front_end=True, read_only=True)
        with pytest.raises(TypeError, match="front_end"):
            await fusee.Engine.open(tmp_path / "a", front_end="yes")  # type: ignore[arg-type]
        with pytest.raises(NotAnEngineDirectory):
            await fusee.Engine.open(tmp_path / "a", front_end=True)
        assert not (tmp_path / "a").exists()

    asyncio.run(main())


def test_a_sync_host_opens_a_front_end_on_a_parted_directory(tmp_path: Path) -> None:
    d = tmp_path / "data"
    holder = _holder(d, 3)
    try:
        with fusee.SyncEngine.open(d, front_end=True, workflows=[where], route_timeout=60) as eng:
            assert isinstance(eng.engine, PartedEngine) and eng.engine.held_parts == []
            handles = [eng.start(where, f"s{i}", i) for i in range(6)]
            for h in handles:
                h.signal(add, 10)
            assert [h.result(timeout=60) for h in handles] == [[holder.pid, i + 10] for i in range(6)]
        with fusee.SyncEngine.open(tmp_path / "new", parts=2, workflows=[where]) as eng:
            assert isinstance(eng.engine, PartedEngine) and eng.engine.parts == 2
    finally:
        _kill(holder)
