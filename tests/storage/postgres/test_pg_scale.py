"""Several engines on one PostgreSQL namespace: one owner, followers routing over TCP, takeover."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.errors import LeaseHeld, LeaseLost, RoutingRefused
from fusee.scale import tcp
from tests.helpers import finish, ledger, release_collector, until
from tests.scale.test_directory_scale import until as until_alive
from tests.storage.postgres.test_pg_engine import crash as pg_crash
from tests.storage.postgres.test_pg_engine import rows

approve = fusee.signal("approve", int)
ran: list[str] = []


@fusee.workflow("pg_order")
async def order(ctx: fusee.Ctx, qty: int) -> int:
    price = await ctx.step("quote", lambda: ran.append(f"{ctx.workflow_id}/quote") or 7)
    ok = await ctx.wait_for(approve)
    return price * qty * (ok or 0)


def crash(engine: Any) -> None:
    """As a killed owner would: no renewals, no connections, and its routing server gone."""
    pg_crash(engine)
    engine._rt.closed = True
    engine._closed = True
    release_collector(engine)
    if engine._route_server is not None and engine._route_server._server is not None:
        engine._route_server._server.close()
        for w in list(engine._route_server._conns):
            w.close()


async def test_a_second_engine_follows_and_routes_every_call(pg_dsn: str) -> None:
    owner = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=2)
    follower = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=2)
    try:
        assert owner.is_owner and not follower.is_owner
        assert follower.epoch == owner.epoch == 1
        address = rows(pg_dsn, "SELECT address FROM fusee.lease")[0][0]
        assert tcp.is_tcp(address)
        run = await follower.start(order, "o-1", 3)  # durable on the owner when it returns
        assert owner.describe("o-1").status == "running"
        await follower.signal("o-1", approve, 1)
        assert await run.result() == 21
        assert await owner.get("o-1").result() == 21
        await follower.refresh()
        assert follower.describe("o-1").status == "ok"  # from its read-only view of the namespace
        assert [r.workflow_id for r in follower.runs()] == ["o-1"]
        with pytest.raises(fusee.AlreadyExists):
            await follower.start(order, "o-1", 3)
        with pytest.raises(LeaseHeld):
            await fusee.Engine.open(pg_dsn, workflows=[order], exclusive=True)
    finally:
        await follower.close()
        await owner.close()


async def test_a_caller_without_the_routing_secret_is_refused(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[order]) as owner:
        address = rows(pg_dsn, "SELECT address FROM fusee.lease")[0][0]
        host, port = tcp.dial_target(address)
        reader, writer = await asyncio.open_connection(host, port)
        with pytest.raises((RoutingRefused, asyncio.IncompleteReadError)):
            await tcp.client_handshake(reader, writer, b"not the secret" * 3)
        writer.close()
        # A caller that proves a wrong secret gets no frame answered.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"\0" * 32)
        await reader.readexactly(64)
        writer.write(b"\0" * 32)  # a wrong proof
        assert await reader.read() == b""  # the owner hung up
        writer.close()
        assert owner._route_server is not None and owner._route_server.served == 0


async def test_a_follower_takes_over_when_the_owner_dies(pg_dsn: str) -> None:
    ran.clear()
    owner = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=1)
    follower = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=1, route_timeout=20)
    await follower.start(order, "o-2", 2)
    await until(lambda: "o-2/quote" in ran)
    crash(owner)
    # The signal waits for the next owner: the follower itself, once the lease expired.
    await follower.signal("o-2", approve, 1)
    assert follower.is_owner and follower.epoch == 2
    assert await follower.get("o-2").result() == 14
    assert ran.count("o-2/quote") == 1  # its recorded result was not run again
    await follower.close()
    assert rows(pg_dsn, "SELECT epoch, owner FROM fusee.lease") == [(2, None)]


effects: list[str] = []
#: Set by the chain's first step (on the loop's thread): the next flush to begin carries its
#: result, and the process "stops" once the server committed it.
stop_after_commit = threading.Event()


@fusee.workflow("pg_chain")
async def chain(ctx: fusee.Ctx, x: int) -> int:
    a = await ctx.step("s0", lambda: effects.append("s0") or stop_after_commit.set() or x + 1)
    return await ctx.step("s1", lambda: effects.append("s1") or a * 2)  # type: ignore[no-any-return]


async def test_an_owner_stopped_while_its_flush_commits_begins_no_step_once_another_took_over(
        pg_dsn: str) -> None:
    """The server commits a flush of an owner that is stopped (SIGSTOP) past its lease; the owner
    hears of it when it resumes, after another engine recovered that flush and ran the step it
    released. The stopped owner must not run that step too: its lease lapsed by its own clock."""
    effects.clear()
    stop_after_commit.clear()
    stopped, resume = threading.Event(), threading.Event()
    owner = await fusee.Engine.open(pg_dsn, workflows=[chain], lease_ttl=1, flush="background",
                                    inline_sync_steps=True)
    log: Any = owner._log
    begin, write = log.begin_flush, log._write_batch
    marked: list[Any] = []

    def begin_and_mark() -> Any:
        job = begin()
        if job is not None and stop_after_commit.is_set() and not marked:
            marked.append(job)  # the first flush begun after s0 returned: it carries s0's result
        return job

    def write_then_stop(job: Any) -> None:
        write(job)  # committed by the server: durable, whatever becomes of this process
        if job in marked:
            log.lease.stop_renewing()  # the whole process stops: its renewals too
            stopped.set()
            resume.wait(60)

    log.begin_flush, log._write_batch = begin_and_mark, write_then_stop
    taker = None
    try:
        await owner.start(chain, "c-1", 3)
        await until(stopped.is_set)
        await until(lambda: not log.lease.holds())  # its TTL passed without a renewal
        await until(lambda: rows(pg_dsn, "SELECT count(*) FROM fusee.lease WHERE expires_at > now()") == [(0,)])
        taker = await fusee.Engine.open(pg_dsn, workflows=[chain], lease_ttl=1, exclusive=True)
        assert taker.epoch == 2
        assert await taker.get("c-1").result() == 8  # s0's result was recovered: only s1 ran
        assert effects == ["s0", "s1"]
        resume.set()  # SIGCONT: the flush returns, committed, and releases s1 in the old owner
        await until(lambda: owner.failure is not None)
        assert isinstance(owner.failure, LeaseLost), owner.failure
        assert effects == ["s0", "s1"], "the stopped owner ran a step the new owner had recorded"
    finally:
        resume.set()
        await owner.close()
        if taker is not None:
            await taker.close()


# --- real processes: three workers on one namespace ---------------------------------------

APP = Path(__file__).resolve().parents[2] / "scale" / "scale_app.py"
ROOT = Path(__file__).resolve().parents[3]


def spawn(d: Path, name: str, n: int, dsn: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), str(d), name, str(n), dsn], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def owner_pid(dsn: str) -> tuple[int, int]:
    """(epoch, pid) of the namespace's live lease holder."""
    [(owner, epoch)] = rows(dsn, "SELECT owner, epoch FROM fusee.lease WHERE expires_at > now()")
    return epoch, int(owner.split(":")[1])


def check_steps_in_order(d: Path, runs: dict[str, int]) -> None:
    """A step begins only once its predecessor's result is durable: repeats only of the step in flight."""
    seen: dict[str, int] = {}
    for line in ledger(d):
        wid, k = line.split()
        assert int(k) >= seen.get(wid, 0), f"{wid}: step s{seen[wid]} ran after s{k} began again"
        seen[wid] = int(k)
    for wid, got in runs.items():
        x = int(wid.split("-")[1])
        assert got == 3 * x + 3, (wid, got)
        assert seen.get(wid) == 2, wid


async def final_results(dsn: str, wids: set[str], d: Path) -> dict[str, int]:
    """The results of runs other processes acknowledged; one still mid-way (the processes that
    could carry it on have closed) goes on here, its steps writing the same ledger."""
    from tests.scale.test_directory_scale import _job

    async with await fusee.Engine.open(dsn, workflows=[_job(d)], exclusive=True, lease_ttl=1) as engine:
        return {wid: await engine.get(wid).result() for wid in wids}


def test_three_workers_sigkill_the_owner_mid_load(pg_dsn: str, tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    first = spawn(d, "a", 300, pg_dsn)
    assert first.stdout is not None
    opened = json.loads(first.stdout.readline())
    assert opened["owner"] and opened["epoch"] == 1
    procs = [first, *(spawn(d, name, 300, pg_dsn) for name in ("b", "c"))]
    until_alive(lambda: len({line.split()[0].split("-")[0] for line in ledger(d)}) == 3 and len(ledger(d)) >= 200,
         procs)
    epoch, pid = owner_pid(pg_dsn)
    victim = next(p for p in procs if p.pid == pid)
    assert len(ledger(d)) < 3 * 3 * 300, "the load ended before the kill: give it more work"
    victim.send_signal(signal.SIGKILL)
    (d / "release").touch()
    out, _ = victim.communicate(timeout=60)
    killed_acks = {json.loads(x)["acked"] for x in out.splitlines() if '"acked"' in x}
    results: dict[str, int] = {}
    takeover = False
    for p in procs:
        if p is victim:
            continue
        lines = finish(p, timeout=180)
        acked = {x["acked"] for x in lines if "acked" in x}
        done = {x["done"]: x["result"] for x in lines if "done" in x}
        assert acked == set(done), "a start acknowledged through a follower did not complete"
        assert len(acked) == 300  # every start a follower made was acknowledged
        results.update(done)
        takeover |= any(x.get("owner") and x.get("epoch", 0) > epoch for x in lines if "finished" in x)
    assert takeover, "no follower took the namespace over"
    results.update(asyncio.run(final_results(pg_dsn, killed_acks, d)))
    check_steps_in_order(d, results)


def test_a_stopped_owner_is_fenced_when_a_follower_takes_over(pg_dsn: str, tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    first = spawn(d, "a", 300, pg_dsn)
    assert first.stdout is not None
    assert json.loads(first.stdout.readline())["owner"]
    procs = [first, *(spawn(d, name, 300, pg_dsn) for name in ("b", "c"))]
    until_alive(lambda: len({line.split()[0].split("-")[0] for line in ledger(d)}) == 3 and len(ledger(d)) >= 200,
         procs)
    assert len(ledger(d)) < 3 * 3 * 300, "the load ended before the pause: give it more work"
    first.send_signal(signal.SIGSTOP)
    try:
        # Past its 1 s lease a follower takes over with the next epoch.
        until_alive(lambda: rows(pg_dsn, "SELECT epoch FROM fusee.lease WHERE expires_at > now()") == [(2,)],
             procs[1:], timeout=60)
        stopped_knows = rows(pg_dsn, "SELECT count(*) FROM fusee.records")
    finally:
        first.send_signal(signal.SIGCONT)
    # Resumed, it learns it lost the namespace (at its next renewal or flush) and leaves on its
    # own: the release file is not there yet.
    lines_a = finish(first, timeout=60)
    (d / "release").touch()
    acked_a = {x["acked"] for x in lines_a if "acked" in x}
    assert lines_a[-1] == {"closing": first.pid, "failed": "LeaseLost"}, lines_a[-1]
    assert stopped_knows
    results: dict[str, int] = {}
    for p in procs[1:]:
        lines = finish(p, timeout=180)
        acked = {x["acked"] for x in lines if "acked" in x}
        done = {x["done"]: x["result"] for x in lines if "done" in x}
        assert acked == set(done) and len(acked) == 300
        results.update(done)
    # Whatever the stopped owner acknowledged (before the pause) is there; nothing after.
    results.update(asyncio.run(final_results(pg_dsn, acked_a, d)))
    check_steps_in_order(d, results)
    # Each owner in turn (the stopped one, the follower that took over, any that took over when
    # that one closed, this check's own engine) wrote a larger epoch.
    assert rows(pg_dsn, "SELECT epoch FROM fusee.lease")[0][0] >= 3


def test_uvicorn_with_three_workers_on_postgres_runs_the_demo_and_survives_killing_the_owner(
        pg_dsn: str) -> None:
    """The demo's orders behind ``uvicorn --workers 3``, every worker on one namespace."""
    from tests.scale.test_directory_scale import run_demo_behind_uvicorn

    epochs: list[int] = []

    def owner() -> int:
        epoch, pid = owner_pid(pg_dsn)
        epochs.append(epoch)
        return pid

    run_demo_behind_uvicorn(pg_dsn, 3, owner)
    # A follower took over under a larger epoch (the row keeps it after the workers released it).
    assert rows(pg_dsn, "SELECT epoch FROM fusee.lease")[0][0] > epochs[0]
