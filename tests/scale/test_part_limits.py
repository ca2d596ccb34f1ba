"""Step limits on a parted directory: each part enforces its share, so all holders together never
exceed the limit."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.scale.parts import PartedEngine, part_of, part_share
from tests.helpers import finish
from tests.scale.test_directory_scale import spawn, until


def test_shares_add_up_to_the_limit() -> None:
    for parts in range(1, 9):
        for c in range(parts, 40):
            shares = [part_share(fusee.Limit("x", concurrency=c, per_second=7.0), p, parts) for p in range(parts)]
            assert sum(s.concurrency or 0 for s in shares) == c
            assert {s.concurrency for s in shares} <= {c // parts, c // parts + 1}
            assert sum(s.per_second or 0 for s in shares) == pytest.approx(7.0)


RELEASE: asyncio.Event | None = None
RUNNING = {"now": 0, "most": 0}


@fusee.workflow("held")
async def held(ctx: fusee.Ctx) -> str:
    async def work() -> str:
        RUNNING["now"] += 1
        RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
        assert RELEASE is not None
        await RELEASE.wait()
        RUNNING["now"] -= 1
        return ctx.workflow_id

    return str(await ctx.step("work", work, limit="svc"))


def test_one_process_holds_every_share(tmp_path: Path) -> None:
    async def main() -> None:
        global RELEASE
        RELEASE = asyncio.Event()
        RUNNING.update(now=0, most=0)
        limits = [fusee.Limit("svc", concurrency=3)]
        async with fusee.Engine.open(tmp_path / "d", parts=2, workflows=[held], limits=limits) as eng:
            assert isinstance(eng, PartedEngine)
            ids = [f"h{i}" for i in range(40)]
            ids = [w for w in ids if part_of(w, 2) == 0][:4] + [w for w in ids if part_of(w, 2) == 1][:4]
            runs = [await eng.start(held, w) for w in ids]
            # Part 0's share is 2, part 1's 1: three run at once and five wait, however many start.
            deadline = asyncio.get_running_loop().time() + 30
            while (eng.limits()["svc"].in_use, eng.limits()["svc"].waiting) != (3, 5):
                assert asyncio.get_running_loop().time() < deadline, eng.limits()
                await asyncio.sleep(0.01)
            assert eng.limits()["svc"].concurrency == 3 and RUNNING["most"] == 3
            # A change is the whole directory's: shares 3 and 2 of 5, taken before set_limit returns.
            assert eng.set_limit("svc", concurrency=5) == fusee.Limit("svc", concurrency=5)
            while (eng.limits()["svc"].in_use, eng.limits()["svc"].waiting, RUNNING["now"]) != (5, 3, 5):
                assert asyncio.get_running_loop().time() < deadline, (eng.limits(), RUNNING)
                await asyncio.sleep(0.01)
            assert RUNNING["most"] == 5 and eng.limits()["svc"].concurrency == 5
            with pytest.raises(ValueError, match="below the directory's 2 parts"):
                eng.set_limit("svc", concurrency=1)
            with pytest.raises(fusee.UnknownLimit):
                eng.set_limit("nope", concurrency=4)
            assert eng.limits()["svc"].concurrency == 5  # a refused change changed nothing
            RELEASE.set()
            assert sorted([await r.result() for r in runs]) == sorted(ids)
            assert RUNNING["most"] == 5
        # The change ended with the last process that had the directory open.
        async with fusee.Engine.open(tmp_path / "d", workflows=[held], limits=limits) as eng:
            assert eng.limits()["svc"].concurrency == 3

    asyncio.run(main())


def test_a_limit_below_the_part_count_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="below the directory's 4 parts"):
            await fusee.Engine.open(tmp_path / "d", parts=4, workflows=[held],
                                    limits=[fusee.Limit("svc", concurrency=3)])
        # Nothing was left held: the directory opens with a limit it can share.
        async with fusee.Engine.open(tmp_path / "d", parts=4, workflows=[held],
                                     limits=[fusee.Limit("svc", concurrency=4)]) as eng:
            assert eng.limits()["svc"].concurrency == 4

    asyncio.run(main())


LIMITED = textwrap.dedent("""
    import asyncio, json, os, sys
    import fusee
    from fusee.scale.parts import part_of

    @fusee.workflow("marked")
    async def marked(ctx):
        async def work():
            d = os.environ["MARKS"]
            mark = os.path.join(d, ctx.workflow_id)
            open(mark, "w").close()
            seen = len(os.listdir(d))  # every step running now, in every process, has its mark
            await asyncio.sleep(0.02)
            os.unlink(mark)
            return seen
        return await ctx.step("work", work, limit="svc")

    async def main():
        d, me = sys.argv[1], sys.argv[2]
        limits = [fusee.Limit("svc", concurrency=4)]
        async with fusee.Engine.open(d, parts=4, workflows=[marked], limits=limits, route_timeout=60) as eng:
            while len(eng.held_parts) != 2:
                await asyncio.sleep(0.02)
            open(os.path.join(d, f"ready-{me}"), "w").close()
            while not all(os.path.exists(os.path.join(d, f"ready-{x}")) for x in "ab"):
                await asyncio.sleep(0.01)
            mine = [w for w in (f"{me}{i}" for i in range(400))
                    if part_of(w, 4) in eng.held_parts][:60]
            runs = [await eng.start(marked, w) for w in mine]
            seen = [await r.result() for r in runs]
            print(json.dumps({"most": max(seen), "runs": len(seen)}), flush=True)
            open(os.path.join(d, f"done-{me}"), "w").close()
            while not all(os.path.exists(os.path.join(d, f"done-{x}")) for x in "ab"):
                await asyncio.sleep(0.01)

    asyncio.run(main())
""")


def test_two_processes_never_exceed_the_limit_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("MARKS", str(marks))
    d = tmp_path / "data"
    first, second = (spawn("-c", LIMITED, str(d), name) for name in "ab")
    try:
        until(lambda: (d / "done-a").exists() and (d / "done-b").exists(), [first, second], timeout=120)
        lines = [x for p in (first, second) for x in finish(p, timeout=60)]
        assert [x["runs"] for x in lines] == [60, 60]
        out = [x["most"] for x in lines]
        # Each process runs its parts' shares (2 of 4) at once: together never more than 4.
        assert max(out) <= 4, out
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()


GATED = textwrap.dedent("""
    import asyncio, json, os, sys
    import fusee
    from fusee.scale.parts import part_of

    @fusee.workflow("gated")
    async def gated(ctx):
        async def work():
            while not os.path.exists(os.environ["RELEASE"]):
                await asyncio.sleep(0.01)
            return ctx.workflow_id
        return await ctx.step("work", work, limit="svc")

    async def main():
        target, status, where = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
        limits = [fusee.Limit("svc", concurrency=2)]
        async with fusee.Engine.open(target, parts=2, workflows=[gated], limits=limits, route_timeout=60,
                                     **where) as eng:
            open(status + ".opened", "w").close()
            while len(eng.held_parts) != 1:  # the test's process took the other part
                await asyncio.sleep(0.02)
            (part,) = eng.held_parts
            mine = [w for w in (f"a{i}" for i in range(100)) if part_of(w, 2) == part][:6]
            runs = [await eng.start(gated, w) for w in mine]
            last = None
            while not os.path.exists(os.environ["RELEASE"]):
                s = eng.limits()["svc"]
                now = [s.concurrency, s.in_use, s.waiting]
                if now != last:  # what this process enforces, written whole for the test to read
                    with open(status + ".tmp", "w") as f:
                        json.dump(now, f)
                    os.replace(status + ".tmp", status)
                    last = now
                await asyncio.sleep(0.01)
            print(json.dumps({"results": sorted([await r.result() for r in runs]) == sorted(mine)}), flush=True)

    asyncio.run(main())
""")


FRONT = textwrap.dedent("""
    import asyncio, json, sys
    import fusee

    async def main():
        limits = [fusee.Limit("svc", concurrency=2)]
        async with fusee.Engine.open(sys.argv[1], front_end=True, limits=limits, route_timeout=60,
                                     **json.loads(sys.argv[2])) as fe:
            seen = fe.limits()["svc"].concurrency
            new = fe.set_limit("svc", per_second=50.0)
            print(json.dumps({"concurrency": seen, "set": [new.concurrency, new.per_second]}), flush=True)

    asyncio.run(main())
""")


@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx) -> str:
    raise AssertionError("every gated run lives on the other process's part")


def test_set_limit_reaches_every_process_and_ends_with_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_limit_across_processes(str(tmp_path / "data"), {}, tmp_path, monkeypatch)


def set_limit_across_processes(target: str, where: dict[str, str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A change made in one process reaches another's part, and a front end opened later; once
    every process closed, the next open takes its own limits=. ``where``: Engine.open's namespace."""
    release = tmp_path / "release"
    monkeypatch.setenv("RELEASE", str(release))
    status = tmp_path / "status.json"
    other = spawn("-c", GATED, target, str(status), json.dumps(where))
    limits = [fusee.Limit("svc", concurrency=2)]

    def enforced() -> list[int] | None:
        return json.loads(status.read_text()) if status.exists() else None

    async def wait(cond: Any) -> None:
        deadline = asyncio.get_running_loop().time() + 90
        while not cond():
            assert other.poll() is None, other.communicate()
            assert asyncio.get_running_loop().time() < deadline, enforced()
            await asyncio.sleep(0.01)

    async def main() -> None:
        await wait(lambda: (tmp_path / "status.json.opened").exists())
        async with fusee.Engine.open(target, workflows=[gated], limits=limits, route_timeout=60, **where) as eng:
            assert isinstance(eng, PartedEngine)
            # Part 0 is the other process's, its share 1 of 2: one of its six steps runs.
            await wait(lambda: eng.held_parts == [1] and enforced() == [2, 1, 5])
            assert eng.set_limit("svc", concurrency=8) == fusee.Limit("svc", concurrency=8)
            assert eng.limits()["svc"].concurrency == 8
            await wait(lambda: enforced() == [8, 4, 2])  # part 0's share of 8 is 4
            # A process that opens while others have the directory open takes the change too
            # (here a front end, which holds no part), and its own change reaches the others.
            front = spawn("-c", FRONT, target, json.dumps(where))
            await wait(lambda: front.poll() is not None)
            assert finish(front) == [{"concurrency": 8, "set": [8, 50.0]}]
            await wait(lambda: eng.limits()["svc"].per_second == 50.0)
            release.touch()
            assert finish(other) == [{"results": True}]
        # Every process closed: the next open takes the limits= it is given again.
        async with fusee.Engine.open(target, workflows=[gated], limits=limits, **where) as eng:
            assert (eng.limits()["svc"].concurrency, eng.limits()["svc"].per_second) == (2, None)

    try:
        asyncio.run(main())
    finally:
        if other.poll() is None:
            other.kill()
