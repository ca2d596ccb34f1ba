"""Scale-out on one directory (issue 16): several processes, one owner, routed calls.

    .venv/bin/python bench/workloads_scale.py {failover,routing,fanout,all} [--quick] [--trials N]

failover: an owner process and this process (a follower) on one directory with
a few hundred finished runs; the owner is SIGKILLed and the time until a
``start`` + ``result`` is served again is measured (p50/p99 over ``--trials``).

routing: the latency of a durable signal, then of a query, sent by this
process to a workflow while it owns the directory, then while another process
owns it and this one routes (µs, p50/p99). A signal's time is mostly its
fdatasync; the queries' difference is the routing cost (one Unix socket round
trip, the encoding, and the other process's loop).

fanout: the same fan-out (workflows of 10 parallel steps) started through 1, 2
and 4 processes on one directory (one owner, the others followers): durable
steps/s. Every step runs in the owner; followers only route starts and results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

import fusee

ping = fusee.signal("ping")
count = fusee.query("count")
HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


@fusee.workflow("scale-one")
async def one(ctx: fusee.Ctx, x: int) -> int:
    return await ctx.step("s", lambda: x + 1)


@fusee.workflow("scale-fan")
async def fan(ctx: fusee.Ctx, k: int) -> int:
    parts = await asyncio.gather(*(ctx.step(f"s{i}", lambda i=i: i) for i in range(k)))
    return sum(parts)


@fusee.workflow("scale-listen")
async def listen(ctx: fusee.Ctx) -> int:
    n = {"n": 0}
    ctx.on_query(count, lambda: n["n"])
    while True:
        await ctx.wait_for(ping)
        n["n"] += 1


WORKFLOWS = [one, fan, listen]


# --- the other processes ---------------------------------------------------------------


async def worker(path: str) -> None:
    """``--worker DIR``: opens DIR, says whether it owns it, then follows commands on stdin:
    ``fan NAME COUNT K`` runs a fan-out through this process and prints the seconds it took."""
    engine = await fusee.Engine.open(path, workflows=WORKFLOWS, route_timeout=120)
    print(json.dumps({"ready": os.getpid(), "owner": engine.is_owner}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            break
        _cmd, name, count, k = line.split()
        t0 = time.perf_counter()
        handles = await asyncio.gather(*(engine.start(fan, f"{name}-{i}", int(k)) for i in range(int(count))))
        await asyncio.gather(*(h.result() for h in handles))
        print(json.dumps({"done": time.perf_counter() - t0}), flush=True)
    await engine.close()


def spawn_worker(path: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, str(HERE), "--worker", str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout is not None
    json.loads(p.stdout.readline())  # opened
    return p


def stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.communicate("\n", timeout=120)


# --- the workloads -----------------------------------------------------------------------


async def failover(trials: int, runs: int) -> dict[str, Any]:
    seconds: list[float] = []
    for t in range(trials):
        with common.scratch("scale-failover") as d:
            owner = spawn_worker(d)
            engine = await fusee.Engine.open(d, workflows=WORKFLOWS)
            assert not engine.is_owner
            await asyncio.gather(*(engine.execute(one, f"pre-{i}", i) for i in range(runs)))
            t0 = time.perf_counter()
            owner.send_signal(signal.SIGKILL)
            assert await engine.execute(one, f"after-{t}", 1) == 2
            seconds.append(time.perf_counter() - t0)
            owner.communicate()
            await engine.close()
    return {"workload": "failover", "trials": trials, "runs": runs,
            **common.latency_summary(seconds)}


async def _latencies(engine: fusee.Engine, wid: str, n: int) -> tuple[list[float], list[float]]:
    """Durable signals, then queries (no sync: the routing alone), one at a time."""
    await engine.start(listen, wid)
    signals, queries = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        await engine.signal(wid, ping)
        signals.append(time.perf_counter() - t0)
    for _ in range(n):
        t0 = time.perf_counter()
        await engine.query(wid, count)
        queries.append(time.perf_counter() - t0)
    return signals, queries


async def routing(n: int) -> dict[str, Any]:
    with common.scratch("scale-routing") as d:
        async with fusee.Engine.open(d, workflows=WORKFLOWS) as engine:
            direct, direct_q = await _latencies(engine, "direct", n)
        owner = spawn_worker(d)
        try:
            async with fusee.Engine.open(d, workflows=WORKFLOWS) as engine:
                assert not engine.is_owner
                routed, routed_q = await _latencies(engine, "routed", n)
        finally:
            stop(owner)
    a, b = common.latency_summary(direct), common.latency_summary(routed)
    qa, qb = common.latency_summary(direct_q), common.latency_summary(routed_q)
    return {"workload": "routing", "signals": n,
            "owner_p50_us": a["p50_us"], "owner_p99_us": a["p99_us"],
            "follower_p50_us": b["p50_us"], "follower_p99_us": b["p99_us"],
            "query_owner_p50_us": qa["p50_us"], "query_owner_p99_us": qa["p99_us"],
            "query_follower_p50_us": qb["p50_us"], "query_follower_p99_us": qb["p99_us"],
            "cost_p50_us": qb["p50_us"] - qa["p50_us"]}


def fanout(workflows: int, k: int) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": "scale_fanout", "workflows": workflows, "steps_per_workflow": k}
    for procs in (1, 2, 4):
        with common.scratch("scale-fanout") as d:
            workers = [spawn_worker(d) for _ in range(procs)]
            try:
                share = workflows // procs
                t0 = time.perf_counter()
                for i, w in enumerate(workers):
                    assert w.stdin is not None
                    w.stdin.write(f"fan p{i} {share} {k}\n")
                    w.stdin.flush()
                for w in workers:
                    assert w.stdout is not None
                    json.loads(w.stdout.readline())
                wall = time.perf_counter() - t0
            finally:
                for w in workers:
                    stop(w)
            out[f"steps_per_s_{procs}"] = share * procs * k / wall
    return out


WORKLOADS = ("failover", "routing", "fanout")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        asyncio.run(worker(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=[*WORKLOADS, "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes (the default is short too)")
    parser.add_argument("--trials", type=int, default=None, help="failover trials (10; 3 with --quick)")
    args = parser.parse_args(argv)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    trials = args.trials or (3 if args.quick else 10)
    for name in names:
        if name == "failover":
            result = asyncio.run(failover(trials, 50 if args.quick else 300))
        elif name == "routing":
            result = asyncio.run(routing(100 if args.quick else 1000))
        else:
            result = fanout(200 if args.quick else 1000, 10)
        common.emit_result({"system": "fusee", **result})
    shutil.rmtree(common.TMP_DIR / "none", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
