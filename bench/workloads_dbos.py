"""The comparison workloads on DBOS Transact, run inside ``bench/.venv-dbos``.

``run_all.py`` creates that environment (``pip install dbos matplotlib``) and
runs this script there, once per system database; each workload prints one
marked JSON line (see ``common.emit_result``). By hand:

    bench/.venv-dbos/bin/python bench/workloads_dbos.py --db sqlite --quick

DBOS runs with its default durability: on SQLite, the library's own settings
(rollback journal, ``synchronous=FULL``: one fsync per committed transaction,
each step's output committed before the workflow goes on); on PostgreSQL, the
server's defaults (``fsync=on``, ``synchronous_commit=on``). The step
functions are the same as on the Fusee side: async functions that stamp the
clock and return a small value.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from dbos import DBOS, DBOSConfig, SetWorkflowID

#: perf_counter() each time a stamped step function ran (live runs only).
STAMPS: list[float] = []
#: Per workflow id: when its "ready"/"before" step ran, and when its last step ran.
MARKS: dict[str, list[float]] = {}


@DBOS.step()
async def bump(value: int) -> int:
    """The benchmark's step: note the time, return a small value."""
    STAMPS.append(time.perf_counter())
    return value + 1


@DBOS.step()
async def mark(key: str) -> int:
    """A step that notes when it ran for workflow ``key``."""
    MARKS.setdefault(key, []).append(time.perf_counter())
    return len(MARKS[key])


@DBOS.workflow()
async def chain(steps: int) -> int:
    """Workload 2: ``steps`` sequential steps."""
    total = 0
    for _ in range(steps):
        total = await bump(total)
    return total


@DBOS.workflow()
async def fan(steps: int) -> int:
    """Workload 3: one of many concurrent workflows of ``steps`` steps."""
    total = 0
    for _ in range(steps):
        total = await bump(total)
    return total


@DBOS.workflow()
async def one_step(value: int) -> int:
    """Workload 4: a workflow of one step, executed start to result."""
    return await bump(value)


@DBOS.workflow()
async def waiter(key: str) -> Any:
    """Workload 5a: notes it is ready, waits for a message, notes it resumed."""
    await mark(key)
    value = await DBOS.recv_async("go", timeout_seconds=3600)
    await mark(key)
    return value


@DBOS.workflow()
async def sleeper(key: str, seconds: float) -> int:
    """Workload 5b: notes the time, sleeps durably, notes the time again."""
    await mark(key)
    await DBOS.sleep_async(seconds)
    return await mark(key)


# --- workloads ---------------------------------------------------------------


async def run_chain(steps: int) -> dict[str, Any]:
    """One workflow of ``steps`` sequential steps: µs per step and its distribution."""
    STAMPS.clear()
    with common.measured() as m, SetWorkflowID(f"chain-{time.monotonic_ns()}"):
        result = await chain(steps)
    assert result == steps, result
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    return {
        "workload": "chain", "steps": steps, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "us_per_step": m["wall_s"] / steps * 1e6, **common.latency_summary(gaps),
        "samples_us": [g * 1e6 for g in gaps],
    }


async def run_fanout(workflows: int, steps: int) -> dict[str, Any]:
    """``workflows`` workflows of ``steps`` steps started at once: throughput and latency."""
    STAMPS.clear()
    latencies: list[float] = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        with SetWorkflowID(f"fan-{i}-{time.monotonic_ns()}"):
            handle = await DBOS.start_workflow_async(fan, steps)
        assert await handle.get_result() == steps
        latencies.append(time.perf_counter() - t0)

    with common.measured() as m:
        await asyncio.gather(*(one(i) for i in range(workflows)))
    total_steps = workflows * steps
    assert len(STAMPS) == total_steps, len(STAMPS)
    return {
        "workload": "fanout", "workflows": workflows, "steps_per_workflow": steps,
        "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "steps_per_s": total_steps / m["wall_s"], "workflows_per_s": workflows / m["wall_s"],
        "cpu_s_per_1000_steps": m["cpu_s"] / total_steps * 1000,
        **common.latency_summary(latencies),
    }


async def run_start(count: int) -> dict[str, Any]:
    """``count`` one-step workflows executed one after another (start + result)."""
    latencies: list[float] = []
    tag = time.monotonic_ns()
    with common.measured() as m:
        for i in range(count):
            t0 = time.perf_counter()
            with SetWorkflowID(f"start-{tag}-{i}"):
                assert await one_step(i) == i + 1
            latencies.append(time.perf_counter() - t0)
    return {
        "workload": "start", "count": count, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "per_s": count / m["wall_s"], **common.latency_summary(latencies),
    }


async def run_signals(count: int) -> dict[str, Any]:
    """``count`` workflows wait for a message, then each is sent one, one after another.

    Latency: from just before ``send`` to the waiter's next step running.
    """
    MARKS.clear()
    tag = time.monotonic_ns()
    keys = [f"sig-{tag}-{i}" for i in range(count)]
    handles = []
    for key in keys:
        with SetWorkflowID(key):
            handles.append(await DBOS.start_workflow_async(waiter, key))
    while any(len(MARKS.get(k, ())) < 1 for k in keys):
        await asyncio.sleep(0.01)
    # The "ready" step has run; let each waiter reach recv before signalling.
    await asyncio.sleep(0.5)
    sent: dict[str, float] = {}
    with common.measured() as m:
        for key in keys:
            sent[key] = time.perf_counter()
            await DBOS.send_async(key, 1, "go")
        results = await asyncio.gather(*(h.get_result() for h in handles))
    assert results == [1] * count
    latencies = [MARKS[k][1] - sent[k] for k in keys]
    return {
        "workload": "signals", "count": count, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "per_s": count / m["wall_s"], **common.latency_summary(latencies),
    }


async def run_timers(count: int, seconds: float) -> dict[str, Any]:
    """``count`` workflows sleep ``seconds``: from due (before step + sleep) to resumed.

    The due time is taken as the "before" step's stamp plus the sleep, so the
    figure also holds the durable write between that step and the sleep.
    """
    MARKS.clear()
    tag = time.monotonic_ns()
    with common.measured() as m:
        handles = []
        for i in range(count):
            with SetWorkflowID(f"timer-{tag}-{i}"):
                handles.append(
                    await DBOS.start_workflow_async(sleeper, f"timer-{tag}-{i}", seconds))
        await asyncio.gather(*(h.get_result() for h in handles))
    lateness = [v[1] - v[0] - seconds for v in MARKS.values()]
    return {
        "workload": "timers", "count": count, "sleep_s": seconds, "wall_s": m["wall_s"],
        "cpu_s": m["cpu_s"], **common.latency_summary(lateness),
    }


# --- main ------------------------------------------------------------------


def durability(url: str) -> str:
    """The durability settings of the system database DBOS used, as read from it."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1]
        with sqlite3.connect(path) as conn:
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
            sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
                conn.execute("PRAGMA synchronous").fetchone()[0], "?")
        return (f"SQLite {sqlite3.sqlite_version}: journal_mode={journal}, synchronous={sync} "
                "(SQLite defaults; DBOS sets only busy_timeout and foreign_keys)")
    import psycopg  # only needed for PostgreSQL

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        settings = {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method",
                         "full_page_writes")
        }
    return ("PostgreSQL " + settings.pop("server_version") + ": "
            + ", ".join(f"{k}={v}" for k, v in settings.items()) + " (server defaults)")


async def main_async(args: argparse.Namespace, url: str) -> None:
    """Launches DBOS on ``url`` and runs the chosen workloads, emitting each result."""
    config: DBOSConfig = {"name": "fusee-bench", "system_database_url": url,
                          "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        settings = durability(url)
        base = {"system": f"dbos-{args.db}", "durability": settings}
        wanted = args.workloads.split(",")
        if "chain" in wanted:
            common.emit_result({**base, **await run_chain(args.chain)})
        if "fanout" in wanted:
            common.emit_result({**base, **await run_fanout(args.fanout, args.fanout_steps)})
        if "start" in wanted:
            common.emit_result({**base, **await run_start(args.starts)})
        if "signals" in wanted:
            common.emit_result({**base, **await run_signals(args.signals)})
        if "timers" in wanted:
            common.emit_result({**base, **await run_timers(args.timers, 1.0)})
    finally:
        DBOS.destroy()


def main(argv: list[str] | None = None) -> int:
    """Parses the sizes, picks the database, runs the workloads."""
    parser = argparse.ArgumentParser(description="DBOS side of the Fusee benchmarks")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--url", default=None,
                        help="PostgreSQL URL (postgresql://...); SQLite uses a fresh file")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--workloads", default="chain,fanout,start,signals,timers")
    parser.add_argument("--chain", type=int, default=None, help="steps in the chain (2000)")
    parser.add_argument("--fanout", type=int, default=None, help="fan-out workflows (2000)")
    parser.add_argument("--fanout-steps", type=int, default=10)
    parser.add_argument("--starts", type=int, default=None, help="one-step workflows (500)")
    parser.add_argument("--signals", type=int, default=None, help="signalled workflows (1000)")
    parser.add_argument("--timers", type=int, default=None, help="sleeping workflows (1000)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.chain = args.chain or (200 if quick else 2000)
    args.fanout = args.fanout or (100 if quick else 2000)
    args.starts = args.starts or (50 if quick else 500)
    args.signals = args.signals or (50 if quick else 1000)
    args.timers = args.timers or (50 if quick else 1000)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    if args.db == "postgres":
        if not args.url:
            parser.error("--db postgres needs --url")
        asyncio.run(main_async(args, args.url))
        return 0
    with common.scratch("dbos-sqlite") as path:
        asyncio.run(main_async(args, f"sqlite:///{path / 'dbos.sqlite'}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
