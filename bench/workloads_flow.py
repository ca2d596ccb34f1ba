"""Schedules and debounce windows on Fusee (issue 12), through the public API.

    .venv/bin/python bench/workloads_flow.py WORKLOAD [--quick] [--schedule-seconds S]

``schedules``: 1,000 schedules of ``every="1s"`` fire for ``--schedule-seconds``
(default 60; 5 with ``--quick``); each scheduled run stamps the wall clock in
its first step, and the lateness is that stamp minus the scheduled time its ID
names (p50/p99). ``enqueue``: events enqueued into 1,000 keys of a workflow
with a 100 ms debounce, 200 in flight at a time; acknowledged events/s (each
acknowledged once durable), then the time until every window ran.
Each prints one marked JSON line (see ``common.emit_result``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

import fusee

STAMPS: dict[str, float] = {}
RAN: set[str] = set()


async def stamp(info: fusee.StepInfo) -> None:
    STAMPS.setdefault(info.workflow_id, time.time())


@fusee.workflow("tick")
async def tick(ctx: fusee.Ctx) -> None:
    await ctx.step("stamp", stamp)


@fusee.workflow("digest", debounce=fusee.Debounce(period="100ms", max_wait="1s"))
async def digest(ctx: fusee.Ctx, events: list[int]) -> int:
    RAN.add(ctx.workflow_id)
    return len(events)


def scheduled_at(workflow_id: str) -> float:
    iso = workflow_id.split("@", 1)[1].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(iso).timestamp()


async def schedules(n: int, seconds: float) -> dict[str, object]:
    with common.scratch("flow-schedules") as d:
        async with fusee.Engine.open(d / "engine", workflows=[tick]) as engine:
            for i in range(n):
                await engine.schedule(f"s{i}", tick, every="1s")
            t0 = time.time()
            await asyncio.sleep(seconds)
            # Only times after the first full second count (the first one may come
            # while the schedules are still being made).
            late = [stamp - scheduled_at(wid) for wid, stamp in STAMPS.items() if scheduled_at(wid) > t0]
            fired = sum(i.fired for i in engine.schedules())
    return {"workload": "schedules", "schedules": n, "seconds": seconds, "fired": fired,
            "measured": len(late), **{f"lateness_{k}": v for k, v in common.latency_summary(late).items()}}


async def enqueue(keys: int, events: int) -> dict[str, object]:
    with common.scratch("flow-enqueue") as d:
        async with fusee.Engine.open(d / "engine", workflows=[digest]) as engine:
            sem = asyncio.Semaphore(200)
            windows: set[str] = set()

            async def one(i: int) -> None:
                async with sem:
                    r = await engine.enqueue(digest, f"key-{i % keys}", i, event_id=f"e{i}")
                    windows.add(r.window_id)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(events)))
            acked = time.perf_counter() - t0
            while not windows <= RAN:
                await asyncio.sleep(0.01)
            done = time.perf_counter() - t0
    return {"workload": "enqueue", "keys": keys, "events": events, "events_per_s": events / acked,
            "all_windows_ran_s": done, "windows": len(windows)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=["schedules", "enqueue", "all"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--schedule-seconds", type=float, default=None)
    p.add_argument("--schedules", type=int, default=1_000)
    p.add_argument("--keys", type=int, default=1_000)
    p.add_argument("--events", type=int, default=None)
    args = p.parse_args()
    seconds = args.schedule_seconds if args.schedule_seconds is not None else (5.0 if args.quick else 60.0)
    events = args.events if args.events is not None else (3_000 if args.quick else 20_000)
    if args.workload in ("schedules", "all"):
        common.emit_result(asyncio.run(schedules(args.schedules, seconds)))
    if args.workload in ("enqueue", "all"):
        common.emit_result(asyncio.run(enqueue(args.keys, events)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
