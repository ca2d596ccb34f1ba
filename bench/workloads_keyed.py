"""Benchmarks of keyed objects and step limits (issue 12), through the public API only.

    .venv/bin/python bench/workloads_keyed.py {objects,limits,all} [--quick] [--calls N] [--waiting N]

objects: ``--calls`` calls (10,000) to one key's exclusive handler, then as
many to its shared handler, each from its own caller, at most 1,000 in flight:
calls/s and call latency. Every call is durable (journaled, fdatasynced)
before it is answered.

limits: a limit of 10 and ``--waiting`` steps (10,000) waiting for it (100
workflows of 100 steps each); once all wait, they are let go: permits handed
out per second, CPU per permit, and memory per waiting step (RSS growth while
they wait, divided by the steps; it includes each step's pending operation and
its share of the workflow runs).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

import fusee

counter = fusee.object("bench-counter", state=int, calls_per_run=1000)


@counter.exclusive
async def incr(ctx: fusee.ObjectCtx[int]) -> int:
    ctx.set_state(ctx.state + 1)
    return ctx.state


@counter.shared
async def read(ctx: fusee.ObjectCtx[int]) -> int:
    return ctx.state


GO = {"event": None}


async def held(i: int) -> int:
    ev = GO["event"]
    assert isinstance(ev, asyncio.Event)
    await ev.wait()
    return 1


@fusee.workflow("limited-fan")
async def limited_fan(ctx: fusee.Ctx, n: int) -> int:
    got = await asyncio.gather(*(
        ctx.step(f"s{i}", held, i, limit="bench", fairness_key=f"t{i % 4}") for i in range(n)
    ))
    return sum(got)


SCRATCH: list[Path] = []


def scratch(name: str) -> Path:
    path = common.scratch_dir(name)
    SCRATCH.append(path)
    return path


async def timed_calls(engine: Any, handler: Any, n: int, width: int = 1000) -> tuple[dict[str, float], list[float]]:
    lat: list[float] = []

    async def one() -> None:
        t0 = time.perf_counter()
        await engine.call(handler, "hot")
        lat.append(time.perf_counter() - t0)

    with common.measured() as m:
        for start in range(0, n, width):
            await asyncio.gather(*(one() for _ in range(min(width, n - start))))
    return m, lat


async def run_objects(args: argparse.Namespace) -> dict[str, Any]:
    n = args.calls
    async with fusee.Engine.open(str(scratch("fusee-objects")), workflows=[counter]) as engine:
        mx, lx = await timed_calls(engine, incr, n)
        assert (await engine.object_state(counter, "hot")).value == n
        ms, ls = await timed_calls(engine, read, n)
    x, s = common.latency_summary(lx), common.latency_summary(ls)
    return {
        "workload": "objects", "calls": n, "wall_s": mx["wall_s"] + ms["wall_s"],
        "cpu_s": mx["cpu_s"] + ms["cpu_s"],
        "exclusive_calls_per_s": n / mx["wall_s"], "shared_calls_per_s": n / ms["wall_s"],
        "exclusive_p50_us": x["p50_us"], "exclusive_p99_us": x["p99_us"],
        "shared_p50_us": s["p50_us"], "shared_p99_us": s["p99_us"],
    }


async def run_limits(args: argparse.Namespace) -> dict[str, Any]:
    total = args.waiting
    per = 100 if total >= 100 else total
    runs = total // per
    total = runs * per
    GO["event"] = asyncio.Event()
    limits = [fusee.Limit("bench", concurrency=10)]
    async with fusee.Engine.open(str(scratch("fusee-limits")), workflows=[limited_fan], limits=limits) as engine:
        rss0 = common.rss_bytes()
        handles = [await engine.start(limited_fan, f"lf-{i}", per) for i in range(runs)]
        while engine.limits()["bench"].waiting < total - 10:
            await asyncio.sleep(0.01)
        rss1 = common.rss_bytes()
        with common.measured() as m:
            GO["event"].set()
            for h in handles:
                assert await h.result() == per
        status = engine.limits()["bench"]
        assert status.in_use == 0 and status.waiting == 0
    return {
        "workload": "limits", "waiting": total, "concurrency": 10,
        "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "permits_per_s": total / m["wall_s"], "cpu_us_per_permit": m["cpu_s"] / total * 1e6,
        "bytes_per_waiting_step": (rss1 - rss0) / total,
    }


WORKLOADS = {"objects": run_objects, "limits": run_limits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="keyed objects and step limits benchmarks")
    parser.add_argument("workload", choices=[*WORKLOADS, "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--calls", type=int, help="object calls of each kind (10,000)")
    parser.add_argument("--waiting", type=int, help="steps waiting for the limit (10,000)")
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = 300 if args.quick else 10_000
    if args.waiting is None:
        args.waiting = 500 if args.quick else 10_000
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        try:
            result = asyncio.run(WORKLOADS[name](args))
        finally:
            for path in SCRATCH:
                shutil.rmtree(path, ignore_errors=True)
            SCRATCH.clear()
        common.emit_result({"system": "fusee", **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
