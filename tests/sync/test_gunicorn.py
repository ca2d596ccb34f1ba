"""Flask on SyncEngine under a real gunicorn (sync workers): kill -9 of the whole server, and --preload."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import fusee
from tests.sync.hosts_app import order
from tests.sync.servers import Server, gunicorn, wait_for

APP = "tests.sync.gunicorn_app:app"
ORDERS = [f"g{i}" for i in range(8)]


def done(s: Server, oid: str) -> dict[str, object]:
    """The order's answer once it finished (polled: a follower's describe may lag the owner)."""
    got: dict[str, object] = {}

    def finished() -> bool:
        with s.client() as c:
            got.update(c.get(f"/orders/{oid}").json())
        return got.get("status") == "ok"

    wait_for(f"{oid} finishing", finished)
    return got


def test_gunicorn_workers_start_and_signal_then_survive_kill_9_of_the_whole_server(tmp_path: Path) -> None:
    acked_starts: set[str] = set()
    acked_signals: set[str] = set()
    lock = threading.Lock()
    half = threading.Event()

    def client(s: Server, oid: str) -> None:
        try:
            with s.client() as c:
                assert c.post(f"/orders/{oid}").status_code == 200
                with lock:
                    acked_starts.add(oid)
                assert c.post(f"/orders/{oid}/approve/ann").status_code == 200
                with lock:
                    acked_signals.add(oid)
                    if len(acked_signals) >= len(ORDERS) // 2:
                        half.set()
        except httpx.TransportError:
            pass  # the server was killed under this request: nothing was acknowledged

    # Two sync workers on one directory: one owns it, the other routes its calls there.
    with gunicorn(APP, tmp_path, workers=2) as s, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client, s, oid) for oid in ORDERS]
        assert half.wait(60), s.log.read_text()
        s.kill_all()  # kill -9 of the master and every worker, requests in flight
        for f in futures:
            f.result()
    assert s.proc.returncode == -signal.SIGKILL
    assert len(acked_signals) >= len(ORDERS) // 2

    with gunicorn(APP, tmp_path, workers=2) as s:
        with s.client() as c:
            for oid in acked_starts:  # nothing acknowledged was lost
                assert c.get(f"/orders/{oid}").status_code == 200
        for oid in acked_signals:
            assert done(s, oid)["result"] == f"charge-{oid} by ann"
        with ThreadPoolExecutor(4) as pool:  # the client retries what was not acknowledged
            list(pool.map(lambda oid: client(s, oid), [o for o in ORDERS if o not in acked_signals]))
        for oid in ORDERS:
            assert done(s, oid)["result"] == f"charge-{oid} by ann"
    runs = Counter((tmp_path / "ledger.txt").read_text().splitlines())
    # Each step ran at least once per order; at most once more (if the kill took it mid-run).
    assert all(1 <= runs[f"{st}:{oid}"] <= 2 for st in ("reserve", "charge") for oid in ORDERS), runs


def test_gunicorn_preload_fails_at_once_in_the_worker_and_leaves_no_lock_behind(tmp_path: Path) -> None:
    # --preload: the master imports the app, so opens the engine, then forks the worker.
    with gunicorn(APP, tmp_path, "--preload", workers=1) as s:
        with s.client() as c:
            r = c.post("/orders/x")  # answered at once: the worker's call does not wait on the master
        assert r.status_code == 500
        wait_for("the worker's log naming EngineForked",
                 lambda: "fusee.errors.EngineForked" in s.log.read_text())
        assert "drop --preload" in s.log.read_text()

        # The worker lives on (busy in a request) after kill -9 of the master: it must not keep
        # the directory's lock, which it inherited, or nothing could open the directory again.
        holding = threading.Thread(target=lambda: _post_quietly(s, "/hold"))
        holding.start()
        pid_file = tmp_path / "held.pid"
        wait_for("the worker holding a request", lambda: pid_file.exists() and pid_file.read_text() != "")
        worker = int(pid_file.read_text())
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(timeout=60)
        os.kill(worker, 0)  # still alive (raises ProcessLookupError otherwise)
        try:
            with fusee.SyncEngine.open(tmp_path / "engine", workflows=[order], exclusive=True) as engine:
                assert engine.is_owner
                with pytest.raises(fusee.NotFound):  # the refused start recorded nothing
                    engine.describe("x")
        finally:
            (tmp_path / "release").touch()
            holding.join(timeout=60)
    assert not holding.is_alive()


def test_gunicorn_preload_with_an_engine_opened_lazily_in_the_worker_works(tmp_path: Path) -> None:
    # The master opened the module's engine before the fork; the worker opens its own at first
    # use, after the fork: a follower of the master's engine, whose calls run there.
    with gunicorn(APP, tmp_path, "--preload", workers=2) as s, s.client() as c:
        for oid in ("l1", "l2", "l3"):
            r = c.post(f"/lazy/orders/{oid}/approve/ann")
            assert r.status_code == 200, s.log.read_text()
            assert r.json() == {"result": f"charge-{oid} by ann", "worker_is_owner": False}
        assert c.post("/orders/x").status_code == 500  # the master's engine, called in a worker


def _post_quietly(s: Server, url: str) -> None:
    try:
        with s.client() as c:
            c.post(url)
    except httpx.TransportError:
        pass  # the worker was ended with its server
