"""Parts (issue 24): a workflow with 1,000 children, about half on another holder's parts.

    .venv/bin/python bench/parts_children.py [--children 1000] [--parts 4] [--trials 3] [--json]

Two processes hold a directory of ``--parts`` parts, half each. Process A
starts a parent on one of its own parts; the parent starts ``--children``
children at once (IDs that hash anywhere, so about half land on B's parts and
go there by the relay: the start there, the result back), each child one step.
The parent reads ``ctx.now()`` before each child's start and after its result:
a child's start-to-result time, as the parent's code sees it (1 ms resolution).
Prints p50 and p99 for the children on the other holder's parts and on the
parent's own holder, the whole parent's time, and checks that every child ran
once and the parent's sum is right.
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

@fusee.workflow("pc-kid")
async def kid(ctx, i: int) -> int:
    return await ctx.step("double", lambda: 2 * i)

@fusee.workflow("pc-parent")
async def parent(ctx, n: int) -> list:
    async def one(i):
        t0 = ctx.now()
        r = await ctx.child(kid, f"{ctx.workflow_id}-kid-{i}", i)
        t1 = ctx.now()
        return [r, (t1 - t0).total_seconds() * 1000]
    return await asyncio.gather(*(one(i) for i in range(n)))

async def main():
    d, me, n, parts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    eng = await fusee.Engine.open(d, parts=parts, workflows=[kid, parent], route_timeout=120)
    while len(eng._member.live()) < 2 or len(eng.held_parts) != parts // 2:
        await asyncio.sleep(0.02)
    open(f"{d}/ready-{me}", "w").close()
    if me == "a":
        while not os.path.exists(f"{d}/ready-b"):
            await asyncio.sleep(0.005)
        pid = next(w for w in (f"p{i}" for i in range(1000)) if part_of(w, parts) in eng.held_parts)
        t0 = time.perf_counter()
        got = await eng.execute(parent, pid, n)
        took = time.perf_counter() - t0
        assert [r for r, _ in got] == [2 * i for i in range(n)]
        mine = set(eng.held_parts)
        there = [ms for i, (_, ms) in enumerate(got) if part_of(f"{pid}-kid-{i}", parts) not in mine]
        here = [ms for i, (_, ms) in enumerate(got) if part_of(f"{pid}-kid-{i}", parts) in mine]
        starts = 0
        for i in range(n):
            starts += sum(type(r).__name__ == "Start" for r in await eng.journal(f"{pid}-kid-{i}"))
        assert starts == n, f"{starts} starts for {n} children"
        print(json.dumps({"took_s": took, "there": there, "here": here}), flush=True)
        open(f"{d}/done", "w").close()
    while not os.path.exists(f"{d}/done"):
        await asyncio.sleep(0.01)
    await eng.close()

asyncio.run(main())
"""


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def trial(children: int, parts: int) -> dict[str, object]:
    d = tempfile.mkdtemp(prefix="fusee-parts-kids-", dir=os.environ.get("BENCH_DIR"))
    ps: dict[str, subprocess.Popen[str]] = {}
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        ps = {me: subprocess.Popen([sys.executable, "-c", WORKER, f"{d}/data", me, str(children), str(parts)],
                                   stdout=subprocess.PIPE, text=True, env=env) for me in "ab"}
        outs = {}
        for me, p in ps.items():
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"worker {me} failed (exit {p.returncode})")
            outs[me] = out
        return dict(json.loads(outs["a"].strip().splitlines()[-1]))
    finally:
        for p in ps.values():
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=1000)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    there: list[float] = []
    here: list[float] = []
    took: list[float] = []
    for _ in range(a.trials):
        r = trial(a.children, a.parts)
        there += r["there"]  # type: ignore[arg-type]
        here += r["here"]  # type: ignore[arg-type]
        took.append(float(r["took_s"]))  # type: ignore[arg-type]
    out = {"workload": "parts_children", "children": a.children, "parts": a.parts, "trials": a.trials,
           "there_n": len(there), "there_p50_ms": pct(there, 0.5), "there_p99_ms": pct(there, 0.99),
           "here_n": len(here), "here_p50_ms": pct(here, 0.5), "here_p99_ms": pct(here, 0.99),
           "parent_s": statistics.median(took)}
    if a.json:
        common.emit_result(out)
    print(f"{a.children} children of one parent, {a.parts} parts on 2 processes, {a.trials} trials (every child once)")
    print(f"  on the other holder's parts ({len(there)}): start-to-result p50 {out['there_p50_ms']:.0f} ms, "
          f"p99 {out['there_p99_ms']:.0f} ms")
    print(f"  on the parent's holder ({len(here)}): p50 {out['here_p50_ms']:.0f} ms, p99 {out['here_p99_ms']:.0f} ms")
    print(f"  the whole parent: median {out['parent_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
