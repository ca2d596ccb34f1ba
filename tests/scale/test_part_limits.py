"""Step limits on a parted directory: each part enforces its share, so all holders together never
exceed the limit."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

import fusee
from fusee.errors import FuseeError
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
            with pytest.raises(FuseeError, match="several parts"):
                eng.set_limit("svc", concurrency=10)
            RELEASE.set()
            assert sorted([await r.result() for r in runs]) == sorted(ids)
            assert RUNNING["most"] == 3

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
