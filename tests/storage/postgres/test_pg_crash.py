"""Real processes on PostgreSQL: SIGKILL mid-chain and mid-load, then reopen; SIGSTOP past the lease (fencing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg

import fusee
from fusee.errors import LeaseHeld
from tests.helpers import finish, wait_for

APP = Path(__file__).with_name("pg_app.py")
ROOT = Path(__file__).resolve().parents[3]


def start(dsn: str, d: Path, mode: str, *args: str, kill_at: str = "") -> subprocess.Popen[str]:
    env = dict(os.environ, KILL_AT=kill_at, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(APP), dsn, str(d), mode, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def effects(d: Path) -> list[tuple[str, ...]]:
    f = d / "effects.txt"
    return [tuple(line.split("\t")) for line in f.read_text().splitlines()] if f.exists() else []


def check_no_step_ran_on_a_taken_back_input(d: Path) -> None:
    inputs: dict[str, set[str]] = defaultdict(set)
    for key, inp, _ in effects(d):
        inputs[key].add(inp)
    bad = {k: v for k, v in inputs.items() if len(v) > 1}
    assert not bad, f"steps ran again on different inputs: {bad}"


class Lines:
    """The JSON lines a running app prints, collected by a thread (the test waits on them)."""

    def __init__(self, p: subprocess.Popen[str]) -> None:
        self.items: list[dict[str, Any]] = []
        assert p.stdout is not None
        out = p.stdout
        self._thread = threading.Thread(target=lambda: self.items.extend(
            json.loads(line) for line in out if line.strip()), daemon=True)
        self._thread.start()

    def join(self) -> list[dict[str, Any]]:
        self._thread.join(60)
        return self.items


def test_kill_mid_chain_then_reopen(pg_dsn: str, tmp_path: Path) -> None:
    p = start(pg_dsn, tmp_path, "chain", kill_at="after-effect:s1")
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL
    before = effects(tmp_path)
    assert [e[0].rsplit("/", 1)[1] for e in before] == ["0", "1"]
    # The reopen waits out the killed process's lease, then recovers from the tables.
    out = finish(start(pg_dsn, tmp_path, "chain"))
    after = effects(tmp_path)
    keys = [k for k, _, _ in after]
    assert keys.count(before[0][0]) == 1  # s0's result was recorded: it never ran again
    assert keys.count(before[1][0]) == 2  # s1's was not: it ran again, on the same input
    assert len(after) == 5
    assert out[-1]["result"] == after[-1][2]
    check_no_step_ran_on_a_taken_back_input(tmp_path)
    again = finish(start(pg_dsn, tmp_path, "chain"))
    assert again[-1]["result"] == out[-1]["result"]
    assert len(effects(tmp_path)) == 5


def test_kill_mid_load_loses_nothing_acknowledged(pg_dsn: str, tmp_path: Path) -> None:
    n = 60
    p = start(pg_dsn, tmp_path, "load", str(n))
    lines = Lines(p)
    wait_for(lambda: sum("ack" in x for x in lines.items) >= n // 3, p)
    p.send_signal(signal.SIGKILL)
    p.wait(60)  # stdout is the reader thread's alone
    acked = {x["ack"] for x in lines.join() if "ack" in x}
    assert acked
    out = finish(start(pg_dsn, tmp_path, "finish", str(n)))
    results = out[-1]["results"]
    assert acked <= set(results), f"acknowledged starts lost: {sorted(acked - set(results))}"
    check_no_step_ran_on_a_taken_back_input(tmp_path)
    # Each finished chain's result is the output of its last step's (one) recorded run.
    outputs = {out_ for _, _, out_ in effects(tmp_path)}
    assert all(r in outputs for r in results.values())


async def test_a_paused_owner_is_fenced_after_a_takeover(pg_dsn: str, tmp_path: Path) -> None:
    """SIGSTOP the owner past its lease, take over here, SIGCONT it: it acknowledges nothing more."""
    p = start(pg_dsn, tmp_path, "serve")
    lines = Lines(p)
    wait_for(lambda: sum("ack" in x for x in lines.items) >= 3, p)
    p.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while True:  # the server's clock decides when the paused owner's lease expired
            try:
                b = await fusee.Engine.open(pg_dsn, workflows=[], lease_ttl=30, exclusive=True)
                break
            except LeaseHeld:
                assert time.monotonic() < deadline, "the paused owner's lease never expired"
                time.sleep(0.05)
        assert b._log.lease.epoch == 2  # type: ignore[attr-defined]
        known = {r.workflow_id for r in b.runs()}
    finally:
        p.send_signal(signal.SIGCONT)
    p.wait(60)
    items = lines.join()
    assert p.stderr is not None
    assert p.returncode == 0, p.stderr.read()
    assert items[-1] == {"failed": "LeaseLost"}
    acked = {x["ack"] for x in items if "ack" in x}
    # Everything A acknowledged was durable before B took over: nothing after.
    assert acked and acked <= known, f"acknowledged after the takeover: {sorted(acked - known)}"
    await b.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT epoch FROM fusee.lease").fetchone() == (2,)
