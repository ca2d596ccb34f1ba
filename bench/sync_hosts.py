"""Start + result from a synchronous thread: ``fusee.SyncEngine`` against the async call.

    .venv/bin/python bench/sync_hosts.py [--count 300] [--threads 1,16] [--quick]

One engine on a directory, default options; the workflow runs one step (a
synchronous lambda) and returns. Each caller does ``--count`` sequential
``start`` + ``result`` pairs and each pair's latency is kept. The async rows
are N asyncio tasks on the engine's own loop (``await engine.start(...)``,
``await handle.result()``); the sync rows are N plain threads calling
``SyncEngine.start(...)`` and ``handle.result()``, each call handed to the
engine's loop thread and waited for. It reports p50 and p99 per N and the sync
÷ async ratio of each: what a Flask or Django view pays for the thread hop.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

import fusee


@fusee.workflow("one_step")
async def one_step(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("add", lambda: n + 1)


async def async_round(callers: int, count: int) -> list[float]:
    with common.scratch(f"sync-hosts-async{callers}") as data:
        async with fusee.Engine.open(data, workflows=[one_step]) as engine:
            async def caller(c: int) -> list[float]:
                lat = []
                for i in range(count):
                    t0 = time.perf_counter()
                    h = await engine.start(one_step, f"a{c}-{i}", i)
                    assert await h.result() == i + 1
                    lat.append(time.perf_counter() - t0)
                return lat

            per = await asyncio.gather(*(caller(c) for c in range(callers)))
    return [x for lat in per for x in lat]


def sync_round(callers: int, count: int) -> list[float]:
    with common.scratch(f"sync-hosts-sync{callers}") as data, \
            fusee.SyncEngine.open(data, workflows=[one_step]) as engine:
        barrier = threading.Barrier(callers)
        per: list[list[float]] = [[] for _ in range(callers)]

        def caller(c: int) -> None:
            barrier.wait()
            for i in range(count):
                t0 = time.perf_counter()
                h = engine.start(one_step, f"s{c}-{i}", i)
                assert h.result() == i + 1
                per[c].append(time.perf_counter() - t0)

        threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return [x for lat in per for x in lat]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="start + result pairs per caller")
    parser.add_argument("--threads", default="1,16", help="callers (tasks or threads) at once")
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    args = parser.parse_args(argv)
    count = min(args.count, 20) if args.quick else args.count
    common.TMP_DIR.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    print(f"{'callers':>7} {'async p50':>10} {'async p99':>10} {'sync p50':>9} {'sync p99':>9} "
          f"{'p50 x':>6} {'p99 x':>6}  (µs per start + result)")
    for n in [int(x) for x in args.threads.split(",")]:
        a = common.latency_summary(asyncio.run(async_round(n, count)))
        s = common.latency_summary(sync_round(n, count))
        row = {"callers": n, "count": count,
               "async_p50_us": a["p50_us"], "async_p99_us": a["p99_us"],
               "sync_p50_us": s["p50_us"], "sync_p99_us": s["p99_us"],
               "p50_ratio": s["p50_us"] / a["p50_us"], "p99_ratio": s["p99_us"] / a["p99_us"]}
        rows.append(row)
        print(f"{n:>7} {row['async_p50_us']:>10.0f} {row['async_p99_us']:>10.0f} {row['sync_p50_us']:>9.0f} "
              f"{row['sync_p99_us']:>9.0f} {row['p50_ratio']:>6.2f} {row['p99_ratio']:>6.2f}")
    common.emit_result({"workload": "sync_hosts", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
