"""Scale-out (issue 16): several processes on one directory or one PostgreSQL namespace.

    .venv/bin/python bench/workloads_scale.py {failover,routing,fanout,all} [--quick] [--trials N]
        [--url postgresql://...] [--lease-ttl S]

With ``--url`` every workload runs on that PostgreSQL database instead (each
scenario in a namespace of its own; the owner serves the others over TCP,
a standby takes over once the dead owner's lease, ``--lease-ttl`` seconds,
expired), and the results are reported as system ``fusee-postgres``.

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
Then a chain of sequential steps started through each of 1, 2 and 4 processes
at once: µs per step.
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


@fusee.workflow("scale-chain")
async def chain(ctx: fusee.Ctx, n: int) -> int:
    v = 0
    for i in range(n):
        v = await ctx.step(f"s{i}", lambda v=v: v + 1)
    return v


@fusee.workflow("scale-listen")
async def listen(ctx: fusee.Ctx) -> int:
    n = {"n": 0}
    ctx.on_query(count, lambda: n["n"])
    while True:
        await ctx.wait_for(ping)
        n["n"] += 1


WORKFLOWS = [one, fan, chain, listen]
#: Set by ``--url``: the PostgreSQL database every workload runs on (None: a directory each).
URL: str | None = None
LEASE_TTL = 1.0
_namespaces = iter(range(1, 1 << 30))


class Target:
    """Where one scenario runs: a fresh directory, or a fresh namespace of the ``--url`` database."""

    def __enter__(self) -> str:
        if URL is None:
            self._scratch = common.scratch("scale")
            return str(self._scratch.__enter__())
        self.namespace = f"bench_{os.getpid()}_{next(_namespaces)}"
        return self.namespace

    def __exit__(self, *exc: object) -> None:
        if URL is None:
            self._scratch.__exit__(None, None, None)
        else:
            import psycopg

            with psycopg.connect(URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.namespace}" CASCADE')


def open_engine(where: str, **kw: Any) -> Any:
    """``Engine.open`` of a scenario's directory, or of its namespace on ``URL``."""
    if URL is None:
        return fusee.Engine.open(where, workflows=WORKFLOWS, **kw)
    return fusee.Engine.open(URL, workflows=WORKFLOWS, namespace=where, lease_ttl=LEASE_TTL, **kw)


# --- the other processes ---------------------------------------------------------------


async def worker(path: str) -> None:
    """``--worker DIR``: opens DIR (a namespace of ``--url``), says whether it owns it, then follows
    commands on stdin: ``fan NAME COUNT K`` runs a fan-out through this process and prints the
    seconds it took; ``chain NAME N`` runs a chain of N steps and prints its µs per step."""
    engine = await open_engine(path, route_timeout=120)
    print(json.dumps({"ready": os.getpid(), "owner": engine.is_owner}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            break
        cmd, name, *rest = line.split()
        t0 = time.perf_counter()
        if cmd == "chain":
            n = int(rest[0])
            await (await engine.start(chain, name, n)).result()
            print(json.dumps({"us_per_step": (time.perf_counter() - t0) / n * 1e6}), flush=True)
            continue
        count, k = rest
        handles = await asyncio.gather(*(engine.start(fan, f"{name}-{i}", int(k)) for i in range(int(count))))
        await asyncio.gather(*(h.result() for h in handles))
        print(json.dumps({"done": time.perf_counter() - t0}), flush=True)
    await engine.close()


def spawn_worker(path: Path | str) -> subprocess.Popen[str]:
    url = [] if URL is None else ["--url", URL, "--lease-ttl", str(LEASE_TTL)]
    p = subprocess.Popen([sys.executable, str(HERE), "--worker", str(path), *url], stdin=subprocess.PIPE,
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
        with Target() as d:
            owner = spawn_worker(d)
            engine = await open_engine(d)
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
    with Target() as d:
        async with open_engine(d) as engine:
            direct, direct_q = await _latencies(engine, "direct", n)
        owner = spawn_worker(d)
        try:
            async with open_engine(d) as engine:
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


def fanout(workflows: int, k: int, chain_steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": "scale_fanout", "workflows": workflows, "steps_per_workflow": k,
                           "chain_steps": chain_steps}
    for procs in (1, 2, 4):
        with Target() as d:
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
                for i, w in enumerate(workers):  # one chain through each process at once
                    assert w.stdin is not None
                    w.stdin.write(f"chain c{i} {chain_steps}\n")
                    w.stdin.flush()
                per_step = [json.loads(w.stdout.readline())["us_per_step"] for w in workers if w.stdout]
            finally:
                for w in workers:
                    stop(w)
            out[f"steps_per_s_{procs}"] = share * procs * k / wall
            out[f"chain_us_{procs}"] = sorted(per_step)[len(per_step) // 2]
    return out


WORKLOADS = ("failover", "routing", "fanout")


def main(argv: list[str] | None = None) -> int:
    global URL, LEASE_TTL
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        if "--url" in argv:
            URL = argv[argv.index("--url") + 1]
            LEASE_TTL = float(argv[argv.index("--lease-ttl") + 1])
        asyncio.run(worker(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=[*WORKLOADS, "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes (the default is short too)")
    parser.add_argument("--trials", type=int, default=None, help="failover trials (10; 3 with --quick)")
    parser.add_argument("--url", default=None, help="run on this PostgreSQL database instead of directories")
    parser.add_argument("--lease-ttl", type=float, default=LEASE_TTL,
                        help="the namespace lease's TTL with --url (seconds; bounds the failover time)")
    args = parser.parse_args(argv)
    URL, LEASE_TTL = args.url, args.lease_ttl
    system = "fusee" if URL is None else "fusee-postgres"
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    trials = args.trials or (3 if args.quick else 10)
    for name in names:
        if name == "failover":
            result = asyncio.run(failover(trials, 50 if args.quick else 300))
        elif name == "routing":
            result = asyncio.run(routing(100 if args.quick else 1000))
        else:
            result = fanout(200 if args.quick else 1000, 10, 100 if args.quick else 500)
        if URL is not None:
            result["lease_ttl_s"] = LEASE_TTL
        common.emit_result({"system": system, **result})
    shutil.rmtree(common.TMP_DIR / "none", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
