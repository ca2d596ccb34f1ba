"""N concurrent chains in one engine: does group commit group across runs?

    .venv/bin/python bench/concurrent_chains.py [--steps 300] [--chains 1,2,4,8,16,64]
                                                [--rounds 2] [--engine-opt flush=pipeline]

One engine on a directory, default options; N workflows each run ``--steps``
sequential steps whose functions are synchronous lambdas (as users write
them), all started together. The disk's floor (100 B ``pwrite`` +
``fdatasync`` on a preallocated file) is measured in the same run, before and
after. For each N it reports the time between consecutive steps of a chain
(p50 and p99 over every chain's steps, as ratios to the floor's p50), the
engine's durable steps/s, CPU per step, and records per ``fdatasync``. The
best of ``--rounds`` rounds (by p50) is reported for each N, with every
round's figures kept in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

import fusee
from fusee import diskcheck

#: Per chain: perf_counter() each time one of its steps ran.
STAMPS: dict[str, list[float]] = {}


@fusee.workflow("chain")
async def chain(ctx: fusee.Ctx, steps: int) -> int:
    stamps = STAMPS.setdefault(ctx.workflow_id, [])
    total = 0
    for _ in range(steps):
        total = await ctx.step("add", lambda t=total: (stamps.append(time.perf_counter()), t + 1)[1])
    return total


async def one_round(n: int, steps: int, options: dict[str, Any]) -> dict[str, Any]:
    STAMPS.clear()
    with common.scratch(f"chains{n}") as data:
        async with fusee.Engine.open(data, workflows=[chain], **options) as engine:
            before = engine.stats
            with common.measured() as m:
                handles = await asyncio.gather(*(engine.start(chain, f"c{i}", steps) for i in range(n)))
                for h in handles:
                    assert await h.result() == steps
            after = engine.stats
    gaps: list[float] = []
    for stamps in STAMPS.values():
        gaps.extend(b - a for a, b in itertools.pairwise(stamps))
    flushes = after["flushes"] - before["flushes"]
    summary = common.latency_summary(gaps)
    return {
        "chains": n,
        "step_p50_us": summary["p50_us"],
        "step_p99_us": summary["p99_us"],
        "steps_per_s": n * steps / m["wall_s"],
        "cpu_us_per_step": m["cpu_s"] / (n * steps) * 1e6,
        "flushes": flushes,
        "inline_flushes": after["inline_flushes"] - before["inline_flushes"],
        "records_per_flush": (n * (steps + 2)) / flushes if flushes else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--chains", default="1,2,4,8,16,64")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    options: dict[str, Any] = {}
    for opt in args.engine_opt:
        key, _, value = opt.partition("=")
        options[key] = {"true": True, "false": False}.get(value, value)
    common.TMP_DIR.mkdir(parents=True, exist_ok=True)
    floor0 = diskcheck.measure_floor(common.TMP_DIR, count=500)
    rows = []
    for n in [int(x) for x in args.chains.split(",")]:
        rounds = [asyncio.run(one_round(n, args.steps, options)) for _ in range(args.rounds)]
        best = min(rounds, key=lambda r: r["step_p50_us"])
        rows.append({**best, "rounds": rounds})
    floor1 = diskcheck.measure_floor(common.TMP_DIR, count=500)
    floor_p50 = floor0.p50 * 1e6
    print(f"floor p50 {floor_p50:.0f} µs, p99 {floor0.p99 * 1e6:.0f} µs "
          f"(after: {floor1.p50 * 1e6:.0f} / {floor1.p99 * 1e6:.0f} µs); options {options or 'defaults'}")
    print(f"{'chains':>6} {'µs/step':>8} {'x floor':>8} {'p99/p50':>8} {'steps/s':>9} "
          f"{'CPU µs':>7} {'rec/flush':>9} {'inline':>7}")
    for r in rows:
        r["x_floor"] = r["step_p50_us"] / floor_p50
        r["p99_over_p50"] = r["step_p99_us"] / r["step_p50_us"]
        print(f"{r['chains']:>6} {r['step_p50_us']:>8.0f} {r['x_floor']:>8.2f} {r['p99_over_p50']:>8.2f} "
              f"{r['steps_per_s']:>9,.0f} {r['cpu_us_per_step']:>7.1f} {r['records_per_flush']:>9.2f} "
              f"{r['inline_flushes']:>7}")
    common.emit_result({"workload": "concurrent_chains", "floor_p50_us": floor_p50,
                        "floor_p99_us": floor0.p99 * 1e6, "floor_after_p50_us": floor1.p50 * 1e6,
                        "options": options, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
