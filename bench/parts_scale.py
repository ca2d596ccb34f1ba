"""Parts (issue 24): one fan-out through 1, 2 and 4 processes on a parted directory.

    .venv/bin/python bench/parts_scale.py [--runs 2000] [--steps 10] [--parts 4] [--procs 1,2,4]
        [--trials 5] [--local] [--json] [--dsn postgresql://...]

Each trial makes a new directory with ``--parts`` parts and starts N processes
on it. Once every process holds its share (``parts / N`` parts each), they all
start ``--runs / N`` workflows of ``--steps`` sequential steps at the same
moment, with IDs that hash anywhere: about ``1 - 1/N`` of each process's starts
and results are routed to another process. Durable steps/s = every step of
every process over the time from the first start to the last result. Prints
the median and the spread per process count, and the ratio to one process
measured in the same run. ``--local``: each process starts only workflows of
its own parts (nothing routed), the ceiling routing leaves. ``--dsn``: the parts on a
PostgreSQL namespace (a new one per trial) instead of a directory. ``--json``: also
prints the figures as a ``make bench`` result (``bench/run_all.py`` renders them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

import common  # noqa: E402

WORKER = r"""
import asyncio, json, os, sys, time
import fusee
from fusee.scale.parts import part_of

def inc(v):
    return v + 1

@fusee.workflow("parts-chain")
async def chain(ctx, steps: int) -> int:
    v = 0
    for i in range(steps):
        v = await ctx.step(f"s{i}", lambda v=v: inc(v))
    return v

async def main():
    d, me, procs, runs, steps, parts, local, dsn, ns = sys.argv[1:10]
    me, procs, runs, steps, parts = int(me), int(procs), int(runs), int(steps), int(parts)
    if dsn:
        os.makedirs(d, exist_ok=True)  # for the ready and done files
        eng = await fusee.Engine.open(dsn, namespace=ns, parts=parts, workflows=[chain], route_timeout=120)
    else:
        eng = await fusee.Engine.open(d, parts=parts, workflows=[chain], route_timeout=120)
    while len(eng._member.live()) < procs or len(eng.held_parts) != parts // procs:
        await asyncio.sleep(0.02)
    open(f"{d}/ready-{me}", "w").close()
    while sum(os.path.exists(f"{d}/ready-{i}") for i in range(procs)) < procs:
        await asyncio.sleep(0.005)
    ids = (f"w{me}-{i}" for i in range(runs * parts * 4))
    ids = [w for w in ids if local == "0" or part_of(w, parts) in eng.held_parts][:runs]
    t0 = time.time()
    handles = await asyncio.gather(*(eng.start(chain, w, steps) for w in ids))
    results = await asyncio.gather(*(h.result() for h in handles))
    t1 = time.time()
    assert results == [steps] * len(ids)
    print(json.dumps({"t0": t0, "t1": t1, "steps": steps * len(ids)}), flush=True)
    open(f"{d}/done-{me}", "w").close()
    while sum(os.path.exists(f"{d}/done-{i}") for i in range(procs)) < procs:
        await asyncio.sleep(0.01)
    await eng.close()

asyncio.run(main())
"""


def trial(procs: int, runs: int, steps: int, parts: int, local: bool, dsn: str | None = None) -> float:
    d = tempfile.mkdtemp(prefix="fusee-parts-", dir=os.environ.get("BENCH_DIR"))
    ns = f"bench_{os.urandom(4).hex()}"  # a new namespace per trial (PostgreSQL)
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        ps = [subprocess.Popen([sys.executable, "-c", WORKER, f"{d}/data", str(i), str(procs), str(runs // procs),
                                str(steps), str(parts), "1" if local else "0", dsn or "", ns],
                               stdout=subprocess.PIPE, text=True, env=env) for i in range(procs)]
        outs = []
        try:
            for p in ps:
                out, _ = p.communicate(timeout=600)
                if p.returncode != 0:
                    raise SystemExit(f"a worker failed (exit {p.returncode})")
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in ps:  # the others would wait forever for the one that failed (and load the next trials)
                if p.poll() is None:
                    p.kill()
                    p.wait()
        span = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
        return sum(o["steps"] for o in outs) / span
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--local", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dsn", default=None, help="a PostgreSQL DSN: each trial a new namespace of --parts parts")
    a = ap.parse_args()
    counts = [int(x) for x in a.procs.split(",")]
    rates: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(a.trials):  # interleaved, so that a noisy minute hits every count alike
        for n in counts:
            rates[n].append(trial(n, a.runs, a.steps, a.parts, a.local, a.dsn))
    base = statistics.median(rates[counts[0]])
    if a.json:
        common.emit_result({
            "workload": "parts_fanout_pg" if a.dsn else "parts_fanout", "runs": a.runs, "steps": a.steps, "parts": a.parts,
            "trials": a.trials, "local": a.local,
            **{f"steps_per_s_{n}": statistics.median(rates[n]) for n in counts},
            **{f"min_{n}": min(rates[n]) for n in counts}, **{f"max_{n}": max(rates[n]) for n in counts},
            **{f"ratio_{n}": statistics.median(rates[n]) / base for n in counts},
        })
    print(f"fan-out {a.runs} x {a.steps} steps, {a.parts} parts, {a.trials} trials"
          f"{' (local IDs only)' if a.local else ''}")
    for n in counts:
        med = statistics.median(rates[n])
        print(f"  {n} process(es): median {med:,.0f} steps/s (min {min(rates[n]):,.0f}, max {max(rates[n]):,.0f})"
              f"  x{med / base:.2f} of {counts[0]}")


if __name__ == "__main__":
    main()
