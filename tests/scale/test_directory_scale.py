"""Many processes on one engine directory: routing, takeover after SIGKILL, epochs, errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.errors import (
    DirectoryLocked,
    NotFound,
    OwnerUnreachable,
    UnknownWorkflow,
    WorkflowFailed,
)
from fusee.scale.lease import read_owner
from fusee.storage.directory import read_epoch
from fusee.storage.posix import PosixStorage
from tests.helpers import finish, ledger

APP = Path(__file__).with_name("scale_app.py")
ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def until(cond: Any, procs: list[subprocess.Popen[str]], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise AssertionError(f"a process failed: {p.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_three_processes_sigkill_the_owner_mid_load(tmp_path: Path) -> None:
    d = tmp_path / "data"
    first = spawn(str(APP), str(d), "a", "400")
    assert first.stdout is not None
    opened = json.loads(first.stdout.readline())
    assert opened["owner"] and opened["epoch"] == 1  # the first process owns the directory
    procs = [first, *(spawn(str(APP), str(d), name, "400") for name in ("b", "c"))]
    # Mid-load: starts through every process have run steps.
    until(lambda: len({line.split()[0].split("-")[0] for line in ledger(d)}) == 3
          and len(ledger(d)) >= 300, procs)
    owner = read_owner(str(d))
    assert owner is not None
    victim = next(p for p in procs if p.pid == owner[2])
    assert len(ledger(d)) < 3 * 3 * 400, "the load ended before the kill: give it more work"
    victim.send_signal(signal.SIGKILL)
    (d / "release").touch()  # the others close once their work is done
    out, _ = victim.communicate(timeout=60)
    killed_acks = [json.loads(x)["acked"] for x in out.splitlines() if '"acked"' in x]
    others = [p for p in procs if p is not victim]

    results: dict[str, int] = {}
    takeover = False
    for p in others:
        lines = finish(p, timeout=180)
        acked = {x["acked"] for x in lines if "acked" in x}
        done = {x["done"]: x["result"] for x in lines if "done" in x}
        assert acked == set(done), "a start acknowledged through a follower did not complete"
        results.update(done)
        takeover |= any(x.get("owner") for x in lines if "finished" in x)
    assert takeover, "no follower took the directory over"
    assert read_epoch(PosixStorage(), str(d)) > owner[0]  # each new owner wrote a larger epoch

    check_after_kill(d, results, killed_acks)


def check_after_kill(d: Path, results: dict[str, int], killed_acks: list[str]) -> None:
    """After a kill mid-load: every run acknowledged (by survivors in ``results``, by the killed
    process in ``killed_acks``) completes with the app's result, and no recorded step ran again."""

    async def rest() -> None:
        # The survivors close once their own starts are done: a run the killed process started
        # may still be mid-way, and this engine carries it on (its steps write the same ledger).
        async with fusee.Engine.open(d, workflows=[_job(d)], exclusive=True) as engine:
            for wid in killed_acks:  # acknowledged by the killed process to itself
                results[wid] = await engine.get(wid).result()

    asyncio.run(rest())
    for wid, got in results.items():
        x = int(wid.split("-")[1])
        assert got == 3 * x + 3, (wid, got)
    # A step whose result was recorded never runs again: a step begins only once its
    # predecessor's result is durable, so each run's steps appear in order, repeats only
    # of the step in flight at the kill.
    seen: dict[str, int] = {}
    for line in ledger(d):
        wid, k = line.split()
        assert int(k) >= seen.get(wid, 0), f"{wid}: step s{seen[wid]} ran after s{k} began again"
        seen[wid] = int(k)
    assert all(seen.get(w) == 2 for w in results)


def _job(ledger_dir: Path | None = None) -> Any:
    """The app's workflow, for the test's own engine (the same name and steps; they write the
    ledger in ``ledger_dir``, and fail when it is None: nothing should be left to run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scale_app_defs", APP)
    assert spec is not None and spec.loader is not None
    src = APP.read_text().split("async def main()")[0]
    ns: dict[str, Any] = {"__name__": "scale_app_defs"}
    old = sys.argv
    sys.argv = ["x", str(ledger_dir) if ledger_dir is not None else "/nonexistent", "t", "0"]
    try:
        exec(compile(src, str(APP), "exec"), ns)
    finally:
        sys.argv = old
    return ns["job"]


# --- errors ----------------------------------------------------------------------------

OWNER = """
import asyncio, sys
import fusee

@fusee.workflow("boom")
async def boom(ctx: fusee.Ctx, x: int) -> int:
    raise ValueError(f"bad {x}")

@fusee.workflow("ok")
async def ok(ctx: fusee.Ctx) -> str:
    return "fine"

add = fusee.update("add", int, int)
done = fusee.signal("done")

@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx) -> int:
    total = {"n": 0}
    def on_add(x: int) -> int:
        total["n"] += x
        return total["n"]
    ctx.on_update(add, on_add)
    await ctx.wait_for(done)
    return total["n"]

tally = fusee.object("tally", state=int)

@tally.exclusive
async def bump(ctx: fusee.ObjectCtx[int], by: int) -> int:
    ctx.set_state(ctx.state + by)
    return ctx.state

paid = fusee.signal("paid", bool)

@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx) -> str:
    try:
        return "paid" if await ctx.wait_for(paid) else "unpaid"
    except fusee.Cancelled:
        return await ctx.step("refund", lambda: "refunded")

@fusee.workflow("streamer")
async def streamer(ctx: fusee.Ctx) -> str:
    s = ctx.stream("s")
    await s.write(1)
    await s.write(2)
    await s.close()
    return "streamed"

async def main():
    engine = await fusee.Engine.open(sys.argv[1], workflows=[boom, ok, counter, tally, gated, streamer])
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await engine.close()

asyncio.run(main())
"""


@fusee.workflow("boom")
async def boom(ctx: fusee.Ctx, x: int) -> int:
    raise ValueError("never runs here")


@fusee.workflow("ok")
async def ok(ctx: fusee.Ctx) -> str:
    return "never runs here"


add = fusee.update("add", int, int)
done = fusee.signal("done")


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx) -> int:
    raise AssertionError("runs in the owner only")


tally = fusee.object("tally", state=int)


@tally.exclusive
async def bump(ctx: fusee.ObjectCtx[int], by: int) -> int:
    raise AssertionError("runs in the owner only")


@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx) -> str:
    raise AssertionError("runs in the owner only")


@fusee.workflow("streamer")
async def streamer(ctx: fusee.Ctx) -> str:
    raise AssertionError("runs in the owner only")


def test_stream_reads_through_a_follower_name_their_run_and_end(tmp_path: Path) -> None:
    p = _owner(tmp_path)
    try:
        async def main() -> None:
            async with fusee.Engine.open(tmp_path, workflows=[streamer]) as engine:
                assert not engine.is_owner
                h = await engine.start(streamer, "s-1")
                assert await h.result() == "streamed"
                b = await engine.stream_batch("s-1", "s", 0, wait=5)
                assert (b.workflow_id, b.run_id, b.chunks, b.next_offset, b.end_status) == (
                    "s-1", h.run_id, [1, 2], 2, "ok")
                assert await engine.read_stream_batch("s-1", "s", 1, run_id=h.run_id) == ([2], 2, True)
                assert [c async for c in engine.read_stream("s-1", "s")] == [1, 2]
                with pytest.raises(fusee.RunNotCurrent) as info:
                    await engine.stream_batch("s-1", "s", 0, run_id=h.run_id + 1)
                assert info.value.current_run_id == h.run_id

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


def _owner(d: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", OWNER, str(d)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    return p


def test_follower_errors_keep_their_types_and_exclusive_refuses(tmp_path: Path) -> None:
    p = _owner(tmp_path)
    try:
        async def main() -> None:
            with pytest.raises(DirectoryLocked):
                await fusee.Engine.open(tmp_path, workflows=[boom, ok], exclusive=True)
            async with fusee.Engine.open(tmp_path, workflows=[boom, ok]) as engine:
                assert not engine.is_owner and engine.epoch == 1
                with pytest.raises(DirectoryLocked):  # a second open in one process, as always
                    await fusee.Engine.open(tmp_path, workflows=[boom, ok])
                assert await engine.execute(ok, "ok-1") == "fine"  # ran in the owner's process
                h = await engine.start(boom, "b-1", 7)
                with pytest.raises(WorkflowFailed, match="bad 7") as info:
                    await h.result()
                assert type(info.value) is WorkflowFailed
                with pytest.raises(fusee.AlreadyExists, match="b-1"):
                    await engine.start(boom, "b-1", 7)
                with pytest.raises(NotFound):
                    await engine.signal("nobody", fusee.signal("s"))
                with pytest.raises(UnknownWorkflow):
                    await engine.start("unregistered", "u-1")
                with pytest.raises(fusee.SerializationError):  # checked here, before routing
                    await engine.start(boom, "b-2", "not an int")
                await engine.refresh()
                assert engine.describe("ok-1").status == "ok"
                assert {r.workflow_id for r in engine.runs()} >= {"ok-1", "b-1"}

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


def test_a_routed_signal_is_checked_by_the_owner_and_a_resend_after_the_end_answers_the_same(
        tmp_path: Path) -> None:
    p = _owner(tmp_path)
    try:
        async def main() -> None:
            async with fusee.Engine.open(tmp_path, workflows=[gated]) as engine:
                assert not engine.is_owner
                h = await engine.start(gated, "g-1")
                while not any(type(r).__name__ == "Wait" for r in await engine.journal("g-1")):
                    await asyncio.sleep(0.01)
                # By name only, as HTTP and the CLI send it: the owner knows the declared type.
                with pytest.raises(fusee.SerializationError, match="bool"):
                    await engine.signal("g-1", fusee.SignalDef("paid"), "yes")
                with pytest.raises(fusee.UnknownSignal, match="'paid'") as info:
                    await engine.signal("g-1", fusee.SignalDef("payed"), True)
                assert "paid" in info.value.known
                assert not any(type(r).__name__ == "Signal" for r in await engine.journal("g-1"))
                await engine.signal("g-1", fusee.SignalDef("paid"), True, dedup_key="req-1")
                assert await h.result() == "paid"
                await engine.signal("g-1", fusee.SignalDef("paid"), True, dedup_key="req-1")  # a retry
                with pytest.raises(fusee.WorkflowEnded):
                    await engine.signal("g-1", fusee.SignalDef("paid"), True, dedup_key="req-2")
                h2 = await engine.start(gated, "g-2")
                await h2.cancel()
                assert await h2.result() == "refunded"
                await h2.cancel()  # a retry

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


def test_a_call_with_no_owner_to_reach_fails_within_its_deadline(tmp_path: Path) -> None:
    p = _owner(tmp_path)
    try:
        async def main() -> None:
            async with fusee.Engine.open(tmp_path, workflows=[boom, ok], route_timeout=0.3) as engine:
                assert await engine.execute(ok, "ok-1") == "fine"
                os.kill(p.pid, signal.SIGSTOP)  # holds the lease (no expiry) but answers nothing
                try:
                    engine._conn.close()  # type: ignore[attr-defined]  # a new connection must be made
                    loop = asyncio.get_running_loop()
                    t0 = loop.time()
                    with pytest.raises(OwnerUnreachable, match="nothing was done"):
                        await engine.start(ok, "ok-2")
                    assert loop.time() - t0 < 5
                    assert not engine.is_owner  # a stopped owner keeps its lock: no takeover
                finally:
                    os.kill(p.pid, signal.SIGCONT)

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)


def test_a_burst_of_calls_before_the_connection_shares_one_dial_and_leaves_in_one_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusee.scale import wire

    writes: list[int] = []
    send = wire.Outbox._send

    def counted(self: wire.Outbox) -> None:
        writes.append(len(self._frames))
        send(self)

    monkeypatch.setattr(wire.Outbox, "_send", counted)
    p = _owner(tmp_path)
    try:
        async def main() -> None:
            async with fusee.Engine.open(tmp_path, workflows=[boom, ok]) as engine:
                assert not engine.is_owner
                dials = 0
                connect = engine._place.connect  # type: ignore[attr-defined]

                async def dial(address: str) -> Any:
                    nonlocal dials
                    dials += 1
                    return await connect(address)

                engine._place.connect = dial  # type: ignore[attr-defined]
                # Every call waits for the one dial; once it is up they all go out together (one
                # write after the dial's ping), not one loop turn each, which under load is long.
                handles = await asyncio.gather(*(engine.start(ok, f"burst-{i}") for i in range(200)))
                assert dials == 1
                assert writes[:2] == [1, 200], writes[:4]  # the ping, then every start
                assert await asyncio.gather(*(h.result() for h in handles)) == ["fine"] * 200

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


def test_a_call_outlives_a_shared_dial_that_gave_up_at_an_earlier_calls_deadline(tmp_path: Path) -> None:
    p = _owner(tmp_path)
    try:
        async def main() -> None:
            async with fusee.Engine.open(tmp_path, workflows=[boom, ok], route_timeout=4) as engine:
                assert await engine.execute(ok, "ok-1") == "fine"
                os.kill(p.pid, signal.SIGSTOP)
                try:
                    engine._conn.close()  # type: ignore[attr-defined]  # a new connection must be made
                    first = asyncio.create_task(engine.start(ok, "ok-2"))
                    while engine._dialing is None:  # type: ignore[attr-defined]
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(2)  # the second call's deadline is 2 s after the first's
                    second = asyncio.create_task(engine.start(ok, "ok-3"))
                    with pytest.raises(OwnerUnreachable):
                        await first
                    assert not second.done()
                finally:
                    os.kill(p.pid, signal.SIGCONT)
                h = await second  # dialled again within its own deadline
                assert await h.result() == "fine"
                await engine.refresh()
                with pytest.raises(NotFound):  # the call that gave up was never sent
                    engine.describe("ok-2")

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


# --- uvicorn workers ----------------------------------------------------------------------


def _http(port: int, method: str, path: str) -> dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method == "POST" else None,
                                 headers={"Connection": "close"})
    with urllib.request.urlopen(req, timeout=60) as r:
        got: dict[str, Any] = json.loads(r.read())
        return got


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_demo_behind_uvicorn(target: str, workers: int, owner: Any, env: dict[str, str] | None = None) -> None:
    """The demo's orders behind ``uvicorn --workers N``, every worker on ``target`` (a directory or
    a PostgreSQL DSN): orders started through every worker, the owning worker (``owner()`` gives its
    pid) SIGKILLed, more orders started, all approved and finished through the survivors. ``env``:
    more environment for the workers."""
    pytest.importorskip("uvicorn")
    from concurrent.futures import ThreadPoolExecutor

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(APP.parent), "uv_app:app", "--workers", str(workers),
         "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), FUSEE_SCALE_DIR=target, **(env or {})),
    )
    try:
        def up() -> bool:
            try:
                _http(port, "GET", "/who")
            except OSError:
                return False
            return True

        until(up, [server])
        pids: set[int] = set()
        with ThreadPoolExecutor(8) as pool:
            def spread() -> bool:  # fresh connections land on every worker
                pids.update(r["pid"] for r in pool.map(lambda _: _http(port, "GET", "/who"), range(4 * workers)))
                return len(pids) == workers

            until(spread, [server])
            before = [f"o{i}" for i in range(6)]
            started = list(pool.map(lambda o: _http(port, "POST", f"/orders/{o}"), before))
            assert {r["started"] for r in started} == set(before)
            pid = owner()
            assert pid in pids
            os.kill(pid, signal.SIGKILL)  # the worker that owns the engine
            after = [f"p{i}" for i in range(6)]
            started = list(pool.map(lambda o: _http(port, "POST", f"/orders/{o}"), after))
            assert all(r["pid"] != pid for r in started)
            orders = before + after

            def all_waiting() -> bool:
                stages = pool.map(lambda o: _http(port, "GET", f"/orders/{o}/stage")["stage"], orders)
                return all(s == "awaiting approval" for s in stages)

            until(all_waiting, [server])
            list(pool.map(lambda o: _http(port, "POST", f"/orders/{o}/approve"), orders))
            results = list(pool.map(lambda o: _http(port, "GET", f"/orders/{o}")["result"], orders))
        for o, r in zip(orders, results, strict=True):
            assert r == f"item {o}: price 42, paid by payment-7, shipped as parcel-99"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


def test_uvicorn_with_four_workers_on_one_directory_survives_killing_the_owner(tmp_path: Path) -> None:
    d = tmp_path / "data"
    seen: list[tuple[int, str, int]] = []

    def owner() -> int:
        found = read_owner(str(d))
        assert found is not None
        seen.append(found)
        return found[2]

    run_demo_behind_uvicorn(str(d), 4, owner)
    assert read_epoch(PosixStorage(), str(d)) > seen[0][0]  # the new owner wrote a larger epoch


def test_a_directory_too_deep_for_a_socket_path_is_served_on_an_abstract_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 110)
    deep.mkdir()
    p = _owner(deep)
    try:
        owner = read_owner(str(deep))
        assert owner is not None and owner[1].startswith("@fusee-")

        async def main() -> None:
            async with fusee.Engine.open(deep, workflows=[boom, ok]) as engine:
                assert not engine.is_owner
                assert await engine.execute(ok, "ok-1") == "fine"

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)


def test_updates_and_object_calls_through_a_follower(tmp_path: Path) -> None:
    p = _owner(tmp_path)
    try:
        async def main() -> None:
            async with fusee.Engine.open(tmp_path, workflows=[boom, ok, counter, tally]) as engine:
                h = await engine.start(counter, "c-1")
                assert await h.update(add, 2) == 2
                assert await engine.update("c-1", add, 3, update_id="u-1") == 5
                assert await engine.update("c-1", add, 3, update_id="u-1") == 5  # answered once
                await h.signal(done)
                assert await h.result() == 5
                assert await engine.call(bump, "k", 4) == 4
                assert await engine.call(bump, "k", 1, call_id="c") == 5
                assert await engine.call(bump, "k", 1, call_id="c") == 5
                state = await engine.object_state(tally, "k")
                assert (state.value, state.version) == (5, 2)
                journal = await engine.journal("c-1")
                assert type(journal[0]).__name__ == "Start"

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


def test_the_http_api_serves_from_a_follower(tmp_path: Path) -> None:
    import httpx

    from fusee.http import app

    p = _owner(tmp_path)
    try:
        async def main() -> None:
            async with fusee.Engine.open(tmp_path, workflows=[boom, ok, counter, tally]) as engine:
                assert not engine.is_owner
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app(engine)),
                                             base_url="http://127.0.0.1") as http:
                    r = await http.post("/api/runs", json={"workflow": "ok", "workflow_id": "h-1"})
                    assert r.status_code in (200, 201), r.text
                    assert await engine.get("h-1").result() == "fine"
                    await engine.call(bump, "k", 3)
                    r = await http.get("/api/objects/tally/k/state")
                    assert r.status_code == 200 and r.json()["value"] == 3, r.text
                    await engine.refresh()
                    r = await http.get("/api/runs/h-1")
                    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
                    r = await http.get("/api/runs/nobody")
                    assert r.status_code == 404

        asyncio.run(main())
    finally:
        p.communicate("\n", timeout=60)


def test_set_limit_is_refused_on_a_follower_and_changes_every_bound_once_it_took_over(tmp_path: Path) -> None:
    p = _owner(tmp_path)
    assert p.stdin is not None
    try:
        async def main() -> None:
            limits = [fusee.Limit("svc", concurrency=2, per_second=5)]
            async with fusee.Engine.open(tmp_path, workflows=[boom, ok], limits=limits) as engine:
                assert not engine.is_owner
                with pytest.raises(fusee.FuseeError, match="follower"):
                    engine.set_limit("svc", concurrency=3)
                assert p.stdin is not None
                p.stdin.write("\n")  # the owner closes; this process takes the directory over
                p.stdin.flush()
                deadline = time.monotonic() + 60
                while not engine.is_owner:
                    assert time.monotonic() < deadline, "the follower did not take over"
                    await asyncio.sleep(0.02)
                new = engine.set_limit("svc", per_second=None)  # None lifts the rate bound, as on an owner
                assert (new.concurrency, new.per_second) == (2, None)
                assert engine.limits()["svc"].per_second is None
                assert engine.set_limit("svc", concurrency=3).concurrency == 3

        asyncio.run(main())
    finally:
        p.communicate(timeout=60)
    assert p.returncode == 0
