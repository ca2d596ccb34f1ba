"""Time to first progress after opening a directory of many unfinished runs (recovery in batches).

    .venv/bin/python bench/first_progress.py [--runs 100000] [--steps 3] [--batches 1000,0]

A child process starts ``--runs`` runs of ``--steps`` quick steps and then a
step that hangs (each run is mid-step), makes everything durable and is
``SIGKILL``ed. Each figure then comes from a fresh process opening a copy of
that directory with ``recovery_batch=B`` (0 stands for all the runs in one
batch: every run replays before any goes on, as before batches). Each run's
next step awaits once (as a step doing I/O would), so it can only finish once
the loop gets a turn. Reported, from the start of ``Engine.open``: when the
open returned, when the first recovered run finished that step (first
progress), when the last run was loaded (the DEBUG line of its batch) and when
every run had finished that step.

Not part of ``run_all.py`` (filling 100,000 runs takes minutes); ``--runs
2000`` is a quick look. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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

#: In the child, the hanging step hangs; in a measuring process it notes the first finish.
HANG = os.environ.get("FIRST_PROGRESS_PHASE") == "fill"
FIRST: list[float] = []
#: How many runs finished the step, how many there are, and when the last one did.
RUNS = [0]
RUNS_WANTED = [-1]
DONE: list[float] = []


def quick(i: int) -> int:
    return i + 1


async def work(wid: str) -> str:
    if HANG:
        await asyncio.Event().wait()
    await asyncio.sleep(0)  # as a step doing I/O would: it goes on only once the loop gets a turn
    if not FIRST:
        FIRST.append(time.perf_counter())
    RUNS[0] += 1
    if RUNS[0] == RUNS_WANTED[0]:
        DONE.append(time.perf_counter())
    return wid


@fusee.workflow("first_progress")
async def first_progress(ctx: fusee.Ctx, steps: int) -> str:
    for i in range(steps):
        await ctx.step(f"quick-{i}", quick, i)
    return await ctx.step("work", work, ctx.workflow_id)


@fusee.workflow("first_progress_barrier")
async def barrier(ctx: fusee.Ctx) -> int:
    return 0


WORKFLOWS = [first_progress, barrier]


async def fill(path: Path, runs: int, steps: int) -> None:
    engine = await fusee.Engine.open(path, workflows=WORKFLOWS, park_after=None)
    for start in range(0, runs, 1000):
        await asyncio.gather(*(engine.start(first_progress, f"p-{i}", steps)
                               for i in range(start, min(runs, start + 1000))))
    while engine.metrics().steps_executing < runs:
        await asyncio.sleep(0.05)
    await engine.execute(barrier, "barrier")  # records reach the log in order: all before it are durable
    print("READY", flush=True)
    await asyncio.sleep(3600)


class _LastBatch(logging.Handler):
    """Notes when recovery logged its last batch (polling ``metrics()`` would walk the table of
    100,000 runs every time and slow what it measures)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.at: float | None = None
        self.done = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().endswith("; 0 still to load") and self.at is None:
            self.at = time.perf_counter()
            self.done.set()


async def measure(path: Path, batch: int, runs: int) -> dict[str, Any]:
    RUNS_WANTED[0] = runs
    last = _LastBatch()
    logger = logging.getLogger("fusee")
    logger.addHandler(last)
    logger.setLevel(logging.DEBUG)
    t0 = time.perf_counter()
    engine = await fusee.Engine.open(path, workflows=WORKFLOWS, park_after=None,
                                     recovery_batch=batch if batch > 0 else runs + 1)
    opened = time.perf_counter()
    await last.done.wait()
    while not DONE:
        await asyncio.sleep(0.01)
    assert engine.metrics().runs_to_load == 0
    assert last.at is not None
    return {"recovery_batch": batch or "all", "open_returned_s": opened - t0, "first_progress_s": FIRST[0] - t0,
            "last_loaded_s": last.at - t0, "all_progressed_s": DONE[0] - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=3, help="quick steps each run replays before the hanging one")
    p.add_argument("--batches", default="1000,0", help="recovery_batch values to measure (0: one batch of all)")
    p.add_argument("--filled", help="a directory an earlier run filled and kept (--keep): skip the filling")
    p.add_argument("--keep", help="keep the filled directory here (copied) for later runs")
    p.add_argument("--phase", choices=["fill", "measure"], help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase == "fill":
        asyncio.run(fill(Path(args.dir), args.runs, args.steps))
        return
    if args.phase == "measure":
        print(json.dumps(asyncio.run(measure(Path(args.dir), args.batch, args.runs))), flush=True)
        os._exit(0)  # the figures are out; closing 100,000 runs measures nothing here
    with common.scratch("fusee-first-progress") as root:
        filled = Path(args.filled) if args.filled else root / "filled"
        if not args.filled:
            t0 = time.perf_counter()
            env = {**os.environ, "FIRST_PROGRESS_PHASE": "fill"}
            cmd = [sys.executable, __file__, "--phase", "fill", "--dir", str(filled), "--runs", str(args.runs),
                   "--steps", str(args.steps)]
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as child:
                assert child.stdout is not None
                line = child.stdout.readline()
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
            if not line.startswith("READY"):
                raise SystemExit(f"the filling child failed (exit {child.returncode})")
            print(f"filled {args.runs:,} runs mid-step in {time.perf_counter() - t0:.1f} s", flush=True)
            if args.keep:
                shutil.copytree(filled, args.keep)
        env = {k: v for k, v in os.environ.items() if k != "FIRST_PROGRESS_PHASE"}
        for batch in (int(b) for b in args.batches.split(",")):
            copy = root / f"copy-{batch}"
            shutil.copytree(filled, copy)
            out = subprocess.run([sys.executable, __file__, "--phase", "measure", "--dir", str(copy),
                                  "--batch", str(batch), "--runs", str(args.runs)],
                                 capture_output=True, text=True, env=env, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"recovery_batch={r['recovery_batch']}: open returned {r['open_returned_s']:.3f} s, "
                  f"first progress {r['first_progress_s']:.3f} s, last run loaded {r['last_loaded_s']:.3f} s, "
                  f"every run past the step {r['all_progressed_s']:.3f} s",
                  flush=True)
            shutil.rmtree(copy)


if __name__ == "__main__":
    main()
