"""A parted directory: parts held by several processes, messages between parts, takeover."""

from __future__ import annotations

import asyncio
import json
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.errors import DirectoryLocked, InvalidQuery, NotAnEngineDirectory, ShardCountMismatch
from fusee.scale.lease import read_owner
from fusee.scale.parts import PARTS_ENV, PartedEngine, part_of
from fusee.storage.directory import read_epoch
from fusee.storage.partsfile import part_path, read_parts
from fusee.storage.posix import PosixStorage
from tests.helpers import finish, ledger
from tests.scale.test_directory_scale import (
    APP,
    check_after_kill,
    run_demo_behind_uvicorn,
    spawn,
    until,
)

KIDS: dict[str, int] = {}


@fusee.workflow("kid")
async def kid(ctx: fusee.Ctx, n: int) -> int:
    def effect() -> int:
        KIDS[ctx.workflow_id] = KIDS.get(ctx.workflow_id, 0) + 1
        return n * 2

    return await ctx.step("double", effect)


@fusee.workflow("parent")
async def parent(ctx: fusee.Ctx, n: int) -> int:
    results = await asyncio.gather(*(ctx.child(kid, f"{ctx.workflow_id}-kid-{i}", i) for i in range(n)))
    await ctx.signal_workflow(f"{ctx.workflow_id}-sink", got, sum(results))
    return sum(results)


got = fusee.signal("got", int)


@fusee.workflow("sink")
async def sink(ctx: fusee.Ctx) -> int:
    return await ctx.wait_for(got)


def test_part_of_is_stable_and_spreads() -> None:
    assert part_of("order-1", 4) == part_of("order-1", 4)
    counts = [0] * 4
    for i in range(4000):
        counts[part_of(f"w-{i}", 4)] += 1
    assert min(counts) > 800, counts


def test_children_and_signals_cross_parts_and_survive_a_reopen(tmp_path: Path) -> None:
    d = tmp_path / "data"
    KIDS.clear()

    async def first() -> None:
        async with fusee.Engine.open(d, parts=3, workflows=[kid, parent, sink]) as eng:
            assert isinstance(eng, PartedEngine) and eng.held_parts == [0, 1, 2]
            await eng.start(sink, "p-sink")
            assert await eng.execute(parent, "p", 30) == sum(2 * i for i in range(30))
            assert await eng.get("p-sink").result() == sum(2 * i for i in range(30))
            homes = {part_of(f"p-kid-{i}", 3) for i in range(30)}
            assert homes == {0, 1, 2}, "the children should land on every part"
            assert eng.counts()["ok"] == 32
            m = eng.metrics()  # every part's shards, numbered on; counts and steps of all three
            assert [sm.shard for sm in m.shards] == list(range(len(m.shards)))
            assert len(m.shards) == 3 * len(eng._slots[0].metrics().shards)
            assert sum(sm.runs.get("ok", 0) for sm in m.shards) == 32
            assert m.steps_run == 30 and m.flushes >= 3 and m.flush_p99_ms >= m.flush_p50_ms > 0

    asyncio.run(first())
    assert len(KIDS) == 30 and set(KIDS.values()) == {1}, "every child ran its step once"
    assert read_parts(str(d)) == 3

    async def again() -> None:
        async with fusee.Engine.open(d, workflows=[kid, parent, sink]) as eng:  # parts come from the directory
            assert await eng.get("p").result() == sum(2 * i for i in range(30))
            assert await eng.get("p-kid-7").result() == 14
            assert len(eng.runs()) == 32
            # A listing goes part by part, a page at most `limit` long, every run once.
            seen: list[str] = []
            page = eng.list(limit=7)
            while True:
                assert len(page.items) <= 7
                seen += [r.workflow_id for r in page.items]
                if page.cursor is None:
                    break
                page = eng.list(limit=7, cursor=page.cursor)
            assert sorted(seen) == sorted(r.workflow_id for r in eng.runs())
            with pytest.raises(InvalidQuery):
                eng.list("workflow = 'kid' order by started_at desc")

    asyncio.run(again())
    assert len(KIDS) == 30 and set(KIDS.values()) == {1}, "nothing ran again after the reopen"


def test_bad_parts_arguments_are_refused_and_change_nothing(tmp_path: Path) -> None:
    plain = tmp_path / "plain"

    async def main() -> None:
        async with fusee.Engine.open(plain, workflows=[kid]) as eng:
            await eng.execute(kid, "k", 1)
        with pytest.raises(NotAnEngineDirectory):
            await fusee.Engine.open(plain, parts=2, workflows=[kid])
        async with fusee.Engine.open(plain, workflows=[kid]) as eng:  # still the plain engine
            assert await eng.get("k").result() == 2
        parted = tmp_path / "parted"
        async with fusee.Engine.open(parted, parts=2, workflows=[kid]):
            pass
        with pytest.raises(ShardCountMismatch):
            await fusee.Engine.open(parted, parts=3, workflows=[kid])
        for bad in (0, -1, 257, True, "2"):
            with pytest.raises(ValueError):
                await fusee.Engine.open(tmp_path / f"bad{bad!s}", parts=bad, workflows=[kid])  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await fusee.Engine.open(None, parts=2, workflows=[kid])
        async with fusee.Engine.open(parted, workflows=[kid]):
            with pytest.raises(DirectoryLocked):  # one open per process, as for any directory
                await fusee.Engine.open(parted, workflows=[kid])

    asyncio.run(main())



def test_a_process_that_looked_before_another_created_the_directory_agrees_with_it(
        tmp_path: Path, monkeypatch: Any) -> None:
    # The window of two processes opening a new directory at once: this one found no parts file,
    # then the other created it and its first part before this one listed the directory.
    import fusee.storage.partsfile as parts_module

    root = tmp_path / "d"
    assert parts_module.create_parts(str(root), 3) == 3
    (root / "part-000").mkdir()
    real = parts_module.read_parts
    looks: list[str] = []

    def first_look_misses(path: str) -> int | None:
        looks.append(path)
        return None if len(looks) == 1 else real(path)

    monkeypatch.setattr(parts_module, "read_parts", first_look_misses)
    assert parts_module.create_parts(str(root), 2) == 3  # the first creator's count, no error
    assert len(looks) == 2
    monkeypatch.setattr(parts_module, "read_parts", real)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "wal-000").write_bytes(b"x")
    with pytest.raises(NotAnEngineDirectory):  # files of another kind are still refused
        parts_module.create_parts(str(plain), 2)

HOLDER = textwrap.dedent("""
    import asyncio, json, os, sys
    import fusee
    from tests.scale.test_parts import kid, parent, sink

    async def main():
        d = sys.argv[1]
        async with fusee.Engine.open(d, parts=2, workflows=[kid, parent, sink], route_timeout=60) as eng:
            print(json.dumps({"opened": os.getpid()}), flush=True)
            while not os.path.exists(os.path.join(d, "release")):
                print(json.dumps({"held": eng.held_parts}), flush=True)
                await asyncio.sleep(0.05)

    asyncio.run(main())
""")


def test_a_second_process_takes_its_share_and_children_cross_to_it(tmp_path: Path) -> None:
    d = tmp_path / "data"
    holder = spawn("-c", HOLDER, str(d))
    assert holder.stdout is not None
    assert "opened" in json.loads(holder.stdout.readline())

    async def main() -> None:
        async with fusee.Engine.open(d, workflows=[kid, parent, sink], route_timeout=60) as eng:
            assert isinstance(eng, PartedEngine)
            deadline = asyncio.get_running_loop().time() + 60
            while len(eng.held_parts) != 1:  # the other process hands one part over
                assert asyncio.get_running_loop().time() < deadline, "no part was handed over"
                await asyncio.sleep(0.02)
            mine = eng.held_parts[0]
            ids = [f"x{i}" for i in range(200)]
            theirs = next(w for w in ids if part_of(w, 2) != mine)  # a parent on the other process
            await eng.start(sink, f"{theirs}-sink")
            assert await eng.execute(parent, theirs, 40) == sum(2 * i for i in range(40))
            assert await eng.get(f"{theirs}-sink").result() == sum(2 * i for i in range(40))
            kids_here = [i for i in range(40) if part_of(f"{theirs}-kid-{i}", 2) == mine]
            assert kids_here, "some children should run in this process"
            assert all(KIDS.get(f"{theirs}-kid-{i}") == 1 for i in kids_here)
            for i in range(40):  # each child started once, wherever it ran
                journal = await eng.journal(f"{theirs}-kid-{i}")
                assert sum(type(r).__name__ == "Start" for r in journal) == 1
            # Metrics count the runs of both parts (the other's as its last view read from disk,
            # at most VIEW_TTL old), and the steps of the part held here only.
            m = eng.metrics()
            while sum(sum(sm.runs.values()) for sm in m.shards) != 42:
                assert asyncio.get_running_loop().time() < deadline, m
                await asyncio.sleep(0.05)
                m = eng.metrics()
            assert m.steps_run == len(kids_here)
        (d / "release").touch()

    try:
        asyncio.run(main())
        finish(holder)
    finally:
        if holder.poll() is None:
            holder.kill()


@pytest.mark.parametrize("parts", [3])
def test_three_holders_sigkill_one_mid_load(tmp_path: Path, parts: int, monkeypatch: Any) -> None:
    monkeypatch.setenv("FUSEE_TEST_PARTS", str(parts))
    d = tmp_path / "data"
    procs = [spawn(str(APP), str(d), name, "300") for name in ("a", "b", "c")]
    until(lambda: len({line.split()[0].split("-")[0] for line in ledger(d)}) == 3
          and len(ledger(d)) >= 300, procs)
    holder = read_owner(f"{d}/part-000")
    assert holder is not None
    victim = next(p for p in procs if p.pid == holder[2])  # the process holding part 0
    assert len(ledger(d)) < 3 * 3 * 300, "the load ended before the kill: give it more work"
    victim.send_signal(signal.SIGKILL)
    survivors = [p for p in procs if p is not victim]
    # The survivors stay open until the release file exists: part 0 must pass to one of them.
    until(lambda: read_epoch(PosixStorage(), f"{d}/part-000") > holder[0], survivors)
    (d / "release").touch()
    out, _ = victim.communicate(timeout=60)
    killed_acks = [json.loads(x)["acked"] for x in out.splitlines() if '"acked"' in x]
    results: dict[str, int] = {}
    for p in survivors:
        lines = finish(p, timeout=180)
        acked = {x["acked"] for x in lines if "acked" in x}
        done = {x["done"]: x["result"] for x in lines if "done" in x}
        assert acked == set(done), "a start acknowledged through a survivor did not complete"
        results.update(done)

    check_after_kill(d, results, killed_acks)


def test_fusee_parts_gives_new_directories_their_parts(tmp_path: Path, monkeypatch: Any) -> None:
    async def opened(path: Path) -> Any:
        async with fusee.Engine.open(path, workflows=[kid]) as eng:
            assert await eng.execute(kid, "k", 1, if_finished="attach") == 2
            return type(eng), getattr(eng, "parts", None)

    plain = tmp_path / "plain"
    assert asyncio.run(opened(plain)) == (fusee.Engine, None)
    monkeypatch.setenv(PARTS_ENV, "3")
    assert asyncio.run(opened(tmp_path / "new")) == (PartedEngine, 3)
    assert read_parts(str(tmp_path / "new")) == 3
    # A directory that exists keeps what it is: the variable is for directories created now.
    assert asyncio.run(opened(plain)) == (fusee.Engine, None)
    monkeypatch.setenv(PARTS_ENV, "2")
    assert asyncio.run(opened(tmp_path / "new")) == (PartedEngine, 3)
    for bad in ("0", "four", str(10**6)):
        monkeypatch.setenv(PARTS_ENV, bad)
        with pytest.raises(ValueError, match=PARTS_ENV):
            asyncio.run(opened(tmp_path / f"bad-{bad}"))
        assert not (tmp_path / f"bad-{bad}").exists(), "a refused open creates nothing"
    monkeypatch.setenv(PARTS_ENV, "")
    assert asyncio.run(opened(tmp_path / "empty-var")) == (fusee.Engine, None)


def test_uvicorn_workers_split_a_new_directory_by_fusee_parts(tmp_path: Path) -> None:
    """No code change: FUSEE_PARTS=4 in the environment, and the two uvicorn workers of an app that
    opens the directory each hold parts; the holder of part 0 SIGKILLed, the other takes it over."""
    d = tmp_path / "data"
    seen: list[tuple[int, str, int]] = []

    def owner() -> int:
        def split() -> bool:
            owners = [read_owner(part_path(str(d), p)) for p in range(4)]
            return all(o is not None for o in owners) and len({o[2] for o in owners if o}) == 2

        until(split, [])
        found = read_owner(part_path(str(d), 0))
        assert found is not None
        seen.append(found)
        return found[2]

    run_demo_behind_uvicorn(str(d), 2, owner, env={PARTS_ENV: "4"})
    assert read_parts(str(d)) == 4
    assert read_epoch(PosixStorage(), part_path(str(d), 0)) > seen[0][0], "part 0 was taken over"


def test_a_parted_directory_reads_offline_while_a_process_holds_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """read_only=True (and so the offline `fusee` commands) opens every part read-only and merges
    the reads, beside a live holder; it writes nothing and refuses to act."""
    from fusee.cli import main as cli

    d = tmp_path / "data"
    holder = spawn("-c", HOLDER, str(d))
    assert holder.stdout is not None
    assert "opened" in json.loads(holder.stdout.readline())
    try:
        async def fill() -> None:
            async with fusee.Engine.open(d, workflows=[kid, parent, sink], route_timeout=60) as eng:
                assert await eng.execute(parent, "q", 12) == sum(2 * i for i in range(12))

        asyncio.run(fill())

        async def view() -> None:
            async with fusee.Engine.open(d, read_only=True, workflows=[kid, parent, sink]) as eng:
                assert isinstance(eng, PartedEngine) and eng.held_parts == [] and not eng.is_owner
                assert sorted(r.workflow_id for r in eng.runs()) == sorted(["q", *(f"q-kid-{i}" for i in range(12))])
                counts = eng.counts()
                assert counts["ok"] == 13 and sum(counts.values()) == 13
                assert eng.describe("q-kid-5").status == "ok"
                assert [type(r).__name__ for r in await eng.journal("q-kid-5")] == ["Start", "Step", "Done"]
                with pytest.raises(fusee.FuseeError):
                    await eng.start(kid, "new-run", 1)

        asyncio.run(view())
        assert cli(["runs", str(d), "--json", "--limit", "100"]) == 0
        items = json.loads(capsys.readouterr().out)["items"]
        assert len(items) == 13 and {s["status"] for s in items} == {"ok"}
        assert cli(["count", str(d), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["counts"]["ok"] == 13
        (d / "release").touch()
        finish(holder)
    finally:
        if holder.poll() is None:
            holder.kill()


def test_one_process_reopens_a_killed_directory_and_every_message_between_parts_arrives(tmp_path: Path) -> None:
    """SIGKILL of the only holder while parents on every part wait for children on the others;
    one process reopens it: each part, recovering before the later ones are open, sends again
    what its runs owe other parts, and every acknowledged parent completes with its children."""
    from tests.backup.test_parted_backup import APP, expected
    from tests.backup.test_parted_backup import kid as pkid
    from tests.backup.test_parted_backup import parent as pparent

    d = tmp_path / "data"
    app = spawn("-c", APP, str(d), "-")
    assert app.stdout is not None
    acked: list[str] = []
    while len(acked) < 200:
        line = app.stdout.readline()
        assert line, f"the app exited: {app.communicate()}"
        acked.append(json.loads(line)["acked"])
    app.send_signal(signal.SIGKILL)
    app.communicate()

    async def main() -> dict[str, Any]:
        async with fusee.Engine.open(d, workflows=[pkid, pparent]) as eng:
            return {w: await asyncio.wait_for(eng.get(w).result(), 60) for w in acked}

    assert asyncio.run(main()) == {w: expected(4) for w in acked}
