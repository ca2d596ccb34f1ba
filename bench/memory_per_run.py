"""What a loaded run holds in memory, measured with tracemalloc: the source of the constants
of ``fusee/runtime/budget.py`` (``RUN_BYTES``, ``RECORD_BYTES``).

    .venv/bin/python bench/memory_per_run.py [--runs 1000]

For journals of a few lengths (runs of K steps, then a wait for a signal) it
measures the memory the loaded runs hold beyond their table entries: traced
memory with every run loaded, less traced memory once they are all parked,
plus their packed journals (which a parked run keeps and a loaded one does
not). A line through those points gives the cost per run and per record
beyond each record's encoded bytes. Memory, not time: the figures do not
depend on the machine's load (they do on the Python version).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tracemalloc
from typing import Any

import fusee
from fusee.core import records as rec
from fusee.runtime.footprint import RECORD_BYTES, RUN_BYTES

go = fusee.signal("go", int)


@fusee.workflow("held")
async def held(ctx: fusee.Ctx, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += await ctx.step(f"s{i}", (lambda v: lambda: v)(i))
    return total + await ctx.wait_for(go)


async def measure(runs: int, steps: int) -> dict[str, float]:
    async with fusee.Engine.open(workflows=[held], park_after=None) as engine:
        rt = engine._rt
        for i in range(runs):
            await engine.start(held, f"h-{i}", steps)
        while any(not any(type(r) is rec.Wait for r in st.journal) for st in rt.wf.values()
                  if st.packed is None):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        records = sum(len(st.journal) for st in rt.wf.values())
        encoded = sum(len(rec.encode(r)) for st in rt.wf.values() for r in st.journal)
        gc.collect()
        loaded = tracemalloc.get_traced_memory()[0]
        rt.park_all()
        await asyncio.sleep(0)  # disposals scheduled by the parks
        gc.collect()
        parked = tracemalloc.get_traced_memory()[0]
        packed = sum(len(st.packed or b"") for st in rt.wf.values())
        for i in range(runs):
            await engine.signal(f"h-{i}", go, 1)
    held_bytes = loaded - parked + packed
    return {"steps": steps, "records_per_run": records / runs, "held_per_run": held_bytes / runs,
            "encoded_per_run": encoded / runs}


async def main(runs: int) -> None:
    tracemalloc.start()
    points = [await measure(runs, steps) for steps in (0, 5, 20, 50)]
    for p in points:
        print(f"{p['steps']:>3} steps: {p['records_per_run']:.0f} records/run, "
              f"{p['held_per_run']:,.0f} B held/run, {p['encoded_per_run']:,.0f} B encoded/run")
    # Least squares of (held - encoded) against records per run: intercept per run, slope per record.
    xs = [p["records_per_run"] for p in points]
    ys = [p["held_per_run"] - p["encoded_per_run"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    print(f"per run: {intercept:,.0f} B (footprint.RUN_BYTES = {RUN_BYTES:,}); "
          f"per record beyond its encoded bytes: {slope:,.0f} B (footprint.RECORD_BYTES = {RECORD_BYTES:,})")
    print(f"python {sys.version.split()[0]}")


def cli(argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs per journal length (1,000; about a minute)")
    args = parser.parse_args(argv)
    asyncio.run(main(args.runs))


if __name__ == "__main__":
    cli()
