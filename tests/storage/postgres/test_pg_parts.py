"""Parts on a PostgreSQL namespace: each part a namespace of its own, members by rows with expiry."""

from __future__ import annotations

import asyncio
import json
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.errors import NotAnEngineDirectory, ShardCountMismatch
from fusee.scale.parts import PartedEngine, part_of
from fusee.scale.pg_parts import PostgresHome
from tests.helpers import finish, ledger
from tests.scale.test_directory_scale import spawn
from tests.scale.test_part_limits import set_limit_across_processes
from tests.scale.test_parts import KIDS, kid, parent, sink
from tests.storage.postgres.test_pg_engine import rows


async def test_a_namespace_with_parts_runs_children_across_parts_and_reopens(pg_dsn: str) -> None:
    KIDS.clear()
    async with fusee.Engine.open(pg_dsn, parts=3, namespace="shop", workflows=[kid, parent, sink]) as eng:
        assert isinstance(eng, PartedEngine) and eng.held_parts == [0, 1, 2]
        await eng.start(sink, "p-sink")
        assert await eng.execute(parent, "p", 20) == sum(2 * i for i in range(20))
        assert await eng.get("p-sink").result() == sum(2 * i for i in range(20))
        assert {part_of(f"p-kid-{i}", 3) for i in range(20)} == {0, 1, 2}
        assert eng.counts()["ok"] == 22
    assert len(KIDS) == 20 and set(KIDS.values()) == {1}
    async with fusee.Engine.open(pg_dsn, namespace="shop", workflows=[kid, parent, sink]) as eng:
        assert isinstance(eng, PartedEngine) and eng.parts == 3  # the count comes from the namespace
        assert await eng.get("p-kid-7").result() == 14
        assert len(eng.runs()) == 22
    with pytest.raises(ShardCountMismatch):
        await fusee.Engine.open(pg_dsn, parts=4, namespace="shop", workflows=[kid])
    async with fusee.Engine.open(pg_dsn, namespace="plain", workflows=[kid]) as eng:
        assert not isinstance(eng, PartedEngine)
    with pytest.raises(NotAnEngineDirectory):
        await fusee.Engine.open(pg_dsn, parts=2, namespace="plain", workflows=[kid])
    home = PostgresHome(pg_dsn, "plain", 5.0, None, 256, 256)
    assert home.read_parts() is None
    home.close()


HOLDER = textwrap.dedent("""
    import asyncio, json, os, sys
    import fusee
    from tests.scale.test_parts import kid, parent, sink

    async def main():
        dsn, d = sys.argv[1], sys.argv[2]
        async with fusee.Engine.open(dsn, parts=2, namespace="shop", lease_ttl=1.0, route_timeout=60,
                                     workflows=[kid, parent, sink]) as eng:
            print(json.dumps({"opened": os.getpid()}), flush=True)
            while not os.path.exists(os.path.join(d, "release")):
                await asyncio.sleep(0.05)
            for _ in range(1200):  # the other engine closed: its part comes back here
                if eng.held_parts == [0, 1]:
                    break
                await asyncio.sleep(0.05)
            print(json.dumps({"held": eng.held_parts}), flush=True)

    asyncio.run(main())
""")


def _holder(pg_dsn: str, d: Path) -> Any:
    p = spawn("-c", HOLDER, pg_dsn, str(d))
    assert p.stdout is not None
    assert "opened" in json.loads(p.stdout.readline())
    return p


async def _share(eng: Any, n: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while len(eng.held_parts) != n:
        assert loop.time() < deadline, f"holding {eng.held_parts}, not {n} parts"
        await asyncio.sleep(0.02)


def test_a_second_engine_takes_its_share_and_children_cross_machines_by_tcp(pg_dsn: str, tmp_path: Path) -> None:
    KIDS.clear()
    holder = _holder(pg_dsn, tmp_path)

    async def main() -> None:
        async with fusee.Engine.open(pg_dsn, namespace="shop", lease_ttl=1.0, route_timeout=60,
                                     workflows=[kid, parent, sink]) as eng:
            assert isinstance(eng, PartedEngine)
            await _share(eng, 1)
            mine = eng.held_parts[0]
            theirs = next(w for w in (f"x{i}" for i in range(200)) if part_of(w, 2) != mine)
            await eng.start(sink, f"{theirs}-sink")
            assert await eng.execute(parent, theirs, 30) == sum(2 * i for i in range(30))
            assert await eng.get(f"{theirs}-sink").result() == sum(2 * i for i in range(30))
            here = [i for i in range(30) if part_of(f"{theirs}-kid-{i}", 2) == mine]
            assert here and all(KIDS.get(f"{theirs}-kid-{i}") == 1 for i in here)
            for i in range(30):
                journal = await eng.journal(f"{theirs}-kid-{i}")
                assert sum(type(r).__name__ == "Start" for r in journal) == 1
        (tmp_path / "release").touch()

    try:
        asyncio.run(main())
        lines = finish(holder)
        assert lines[-1]["held"] == [0, 1], "the holder took the closed engine's part back"
    finally:
        if holder.poll() is None:
            holder.kill()


def test_three_holders_sigkill_one_mid_load(pg_dsn: str, tmp_path: Path, monkeypatch: Any) -> None:
    """Three engines on a namespace of 3 parts under load; the holder of part 0 SIGKILLed: its
    part is taken over past its 1 s lease, every acknowledged run completes, no recorded step
    runs again."""
    from tests.storage.postgres.test_pg_scale import check_steps_in_order, until_alive
    from tests.storage.postgres.test_pg_scale import spawn as spawn_app

    monkeypatch.setenv("FUSEE_TEST_PARTS", "3")
    d = tmp_path / "data"
    d.mkdir()
    procs = [spawn_app(d, name, 300, pg_dsn) for name in ("a", "b", "c")]
    until_alive(lambda: len({line.split()[0].split("-")[0] for line in ledger(d)}) == 3 and len(ledger(d)) >= 200,
                procs)
    until_alive(lambda: len(part_holders(pg_dsn)) == 3, procs)  # all three hold a part
    epoch, pid = part_holders(pg_dsn)[0]
    victim = next(p for p in procs if p.pid == pid)
    assert len(ledger(d)) < 3 * 3 * 300, "the load ended before the kill: give it more work"
    victim.send_signal(signal.SIGKILL)
    survivors = [p for p in procs if p is not victim]
    until_alive(lambda: part_holders(pg_dsn)[0][0] > epoch, survivors, timeout=60)
    (d / "release").touch()
    out, _ = victim.communicate(timeout=60)
    killed_acks = {json.loads(x)["acked"] for x in out.splitlines() if '"acked"' in x}
    results: dict[str, int] = {}
    for p in survivors:
        lines = finish(p, timeout=180)
        acked = {x["acked"] for x in lines if "acked" in x}
        done = {x["done"]: x["result"] for x in lines if "done" in x}
        assert acked == set(done) and len(acked) == 300
        results.update(done)
    results.update(asyncio.run(carried_on(pg_dsn, killed_acks, d)))
    check_steps_in_order(d, results)


def test_a_holder_stopped_past_its_lease_loses_its_part_and_rejoins(pg_dsn: str, tmp_path: Path,
                                                                   monkeypatch: Any) -> None:
    """SIGSTOP of the holder of part 0 past its lease: the others take part 0 with the next epoch
    (its flushes, fenced by that lease, can write nothing more there); after SIGCONT it finds its
    lease lost, follows part 0 instead, comes back as a member, and every run acknowledged by any
    of the three completes with no recorded step run again."""
    from tests.storage.postgres.test_pg_scale import check_steps_in_order, until_alive
    from tests.storage.postgres.test_pg_scale import spawn as spawn_app

    monkeypatch.setenv("FUSEE_TEST_PARTS", "3")
    d = tmp_path / "data"
    d.mkdir()
    procs = [spawn_app(d, name, 300, pg_dsn) for name in ("a", "b", "c")]
    until_alive(lambda: len({line.split()[0].split("-")[0] for line in ledger(d)}) == 3 and len(ledger(d)) >= 200,
                procs)
    until_alive(lambda: len(part_holders(pg_dsn)) == 3, procs)
    epoch, pid = part_holders(pg_dsn)[0]
    stopped = next(p for p in procs if p.pid == pid)
    others = [p for p in procs if p is not stopped]
    assert len(ledger(d)) < 3 * 3 * 300, "the load ended before the pause: give it more work"
    stopped.send_signal(signal.SIGSTOP)
    try:
        until_alive(lambda: part_holders(pg_dsn)[0][0] > epoch, others, timeout=60)
        assert part_holders(pg_dsn)[0][1] != pid, "part 0 has a new holder"
    finally:
        stopped.send_signal(signal.SIGCONT)
    (d / "release").touch()
    results: dict[str, int] = {}
    unanswered: set[str] = set()
    for p in procs:
        out = finish(p, timeout=180)
        acked = {x["acked"] for x in out if "acked" in x}
        done = {x["done"]: x["result"] for x in out if "done" in x}
        if p is stopped:
            # The paused one may refuse (EngineClosed) starts, and the results it waited for, in
            # flight when its part's lease lapsed: what it acknowledged completes all the same.
            unanswered = acked - set(done)
        else:
            assert acked == set(done) and len(acked) == 300, "an acknowledged start did not complete"
        results.update(done)
    results.update(asyncio.run(carried_on(pg_dsn, unanswered, d)))
    check_steps_in_order(d, results)


def part_holders(dsn: str) -> list[tuple[int, int]]:
    """(epoch, pid) of each live part lease of the default namespace's parts, in part order."""
    out = []
    for p in range(3):
        got = rows(dsn, f"SELECT owner, epoch FROM fusee_p{p:03d}.lease WHERE expires_at > now()") \
            if rows(dsn, f"SELECT to_regclass('fusee_p{p:03d}.lease')")[0][0] else []
        if got:
            owner, epoch = got[0]
            out.append((int(epoch), int(owner.split(":")[1])))
    return out


async def carried_on(dsn: str, wids: set[str], d: Path) -> dict[str, int]:
    """The results of runs a stopped or killed engine acknowledged, from an engine of its own on the
    namespace (a run still mid-way goes on here, its steps writing the same ledger)."""
    from tests.scale.test_directory_scale import _job

    async with fusee.Engine.open(dsn, workflows=[_job(d)], lease_ttl=1, route_timeout=60) as engine:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while len(engine.held_parts) != engine.parts:  # the others closed: it holds every part
            assert loop.time() < deadline, engine.held_parts
            await asyncio.sleep(0.05)
        return {wid: await engine.get(wid).result() for wid in wids}


async def test_fusee_parts_gives_new_namespaces_their_parts(pg_dsn: str, monkeypatch: Any) -> None:
    from fusee.scale.parts import PARTS_ENV

    async with fusee.Engine.open(pg_dsn, namespace="before", workflows=[kid]) as eng:
        assert not isinstance(eng, PartedEngine)
    monkeypatch.setenv(PARTS_ENV, "3")
    async with fusee.Engine.open(pg_dsn, namespace="fresh", workflows=[kid]) as eng:
        assert isinstance(eng, PartedEngine) and eng.parts == 3
        assert await eng.execute(kid, "k", 4) == 8
    async with fusee.Engine.open(pg_dsn, namespace="before", workflows=[kid]) as eng:
        assert not isinstance(eng, PartedEngine), "a namespace that exists keeps what it is"
    monkeypatch.setenv(PARTS_ENV, "nope")
    with pytest.raises(ValueError, match=PARTS_ENV):
        await fusee.Engine.open(pg_dsn, namespace="other", workflows=[kid])


def test_the_parts_benchmark_runs_on_a_namespace_and_renders_its_rows(pg_dsn: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[3] / "bench"
    sys.path.insert(0, str(bench))
    import common
    import run_all

    env = {**os.environ, "BENCH_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(bench / "parts_scale.py"), "--json", "--runs", "200", "--trials", "1",
                           "--procs", "1,2", "--dsn", pg_dsn],
                          capture_output=True, text=True, timeout=300, cwd=bench.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (fanout,) = common.parse_results(proc.stdout)
    assert fanout["workload"] == "parts_fanout_pg" and all(fanout[f"steps_per_s_{n}"] > 0 for n in (1, 2))
    section = "\n".join(run_all.render_parts({"fusee-postgres": {"parts_fanout_pg": fanout}}))
    assert "## Parts (one PostgreSQL namespace" in section and "| 2 |" in section


def test_a_front_end_on_a_namespace_holds_no_part_and_routes_every_call(pg_dsn: str, tmp_path: Path) -> None:
    holder = _holder(pg_dsn, tmp_path)

    async def main() -> None:
        async with fusee.Engine.open(pg_dsn, namespace="shop", front_end=True, route_timeout=60,
                                     workflows=[kid, parent, sink]) as eng:
            assert isinstance(eng, PartedEngine) and eng.held_parts == [] and "front end" in repr(eng)
            KIDS.clear()
            assert await eng.execute(parent, "fe", 10) == sum(2 * i for i in range(10))
            assert KIDS == {}, "a step ran in the front end"
            await asyncio.sleep(1.5)  # past the lease: a front end still takes no part
            assert eng.held_parts == []
        (tmp_path / "release").touch()

    try:
        asyncio.run(main())
        assert finish(holder)[-1]["held"] == [0, 1]
    finally:
        if holder.poll() is None:
            holder.kill()


def test_set_limit_on_a_namespace_reaches_every_engine(pg_dsn: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    set_limit_across_processes(pg_dsn, {"namespace": "shop"}, tmp_path, monkeypatch)


def test_a_namespace_with_parts_reads_offline_beside_a_live_holder(
        pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """read_only=True on a parted namespace opens every part's namespace read-only (no lease, no
    member row) and merges the reads, beside a live holder; it refuses to act. The offline CLI
    reads a parted default namespace the same way."""
    from fusee.cli import main as cli

    holder = _holder(pg_dsn, tmp_path)

    async def main() -> None:
        async with fusee.Engine.open(pg_dsn, namespace="shop", front_end=True, route_timeout=60,
                                     workflows=[kid, parent, sink]) as eng:
            assert await eng.execute(parent, "q", 8) == sum(2 * i for i in range(8))
        async with fusee.Engine.open(pg_dsn, namespace="shop", read_only=True, workflows=[kid, parent, sink]) as eng:
            assert isinstance(eng, PartedEngine) and eng.parts == 2 and eng.held_parts == []
            assert sorted(r.workflow_id for r in eng.runs()) == sorted(["q", *(f"q-kid-{i}" for i in range(8))])
            counts = eng.counts()
            assert counts["ok"] == 9 and sum(counts.values()) == 9
            assert eng.describe("q-kid-3").status == "ok"
            assert [type(r).__name__ for r in await eng.journal("q-kid-3")] == ["Start", "Step", "Done"]
            with pytest.raises(fusee.FuseeError):
                await eng.start(kid, "new-run", 1)
        (tmp_path / "release").touch()
        # The default namespace, made with parts here, read by the offline CLI.
        async with fusee.Engine.open(pg_dsn, parts=3, workflows=[kid, parent, sink]) as eng:
            assert await eng.execute(parent, "c", 5) == sum(2 * i for i in range(5))

    try:
        asyncio.run(main())
        assert finish(holder)[-1]["held"] == [0, 1]
        assert cli(["count", pg_dsn, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["counts"]["ok"] == 6
        assert cli(["runs", pg_dsn, "--json", "--limit", "100"]) == 0
        assert len(json.loads(capsys.readouterr().out)["items"]) == 6
    finally:
        if holder.poll() is None:
            holder.kill()
