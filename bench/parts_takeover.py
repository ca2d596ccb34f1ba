"""Parts (issue 24): the other holders' step time while a killed holder's parts are taken over.

    .venv/bin/python bench/parts_takeover.py [--parts 6] [--chains 20] [--before 3] [--after 3]
        [--trials 3] [--json]

Three processes hold a directory of ``--parts`` parts (a third each). Each runs
``--chains`` workflows on its own parts, each a loop of sequential steps, until
told to stop. After ``--before`` seconds the bench SIGKILLs one of them; the
other two take its parts over (its runs go on there, replayed). A step's time is
the gap between one step function's start and the next one's in the same run
(its result made durable, the workflow code resumed). Prints p50 and p99 of the
survivors' own runs before the kill, from the kill until its parts are held
again, and ``--after`` seconds after; the takeover time (kill to the last of its
parts held by a survivor); and checks that no run ran a recorded step twice
(each step function of a run is counted once; the victim's last steps may run
again only if their results had not been made durable).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

import common  # noqa: E402

WORKER = r"""
import asyncio, json, os, sys, time
import fusee
from fusee.scale.parts import part_of

D, ME, PARTS, CHAINS = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
STOP = f"{D}/stop"
TIMES = []

def tick(wid, i):
    TIMES.append((wid, i, time.time()))
    return os.path.exists(STOP)

@fusee.workflow("pt-chain")
async def chain(ctx) -> int:
    i = 0
    while not await ctx.step(f"s{i}", tick, ctx.workflow_id, i):
        i += 1
    return i

async def main():
    eng = await fusee.Engine.open(f"{D}/data", parts=PARTS, workflows=[chain], route_timeout=120)
    while len(eng._member.live()) < 3 or len(eng.held_parts) != PARTS // 3:
        await asyncio.sleep(0.02)
    mine = list(eng.held_parts)
    ids = [w for w in (f"{ME}-{i}" for i in range(CHAINS * PARTS * 4)) if part_of(w, PARTS) in mine][:CHAINS]
    open(f"{D}/ready-{ME}", "w").close()
    while sum(os.path.exists(f"{D}/ready-{m}") for m in "abc") < 3:
        await asyncio.sleep(0.005)
    handles = await asyncio.gather(*(eng.start(chain, w) for w in ids))
    print(json.dumps({"started": time.time(), "parts": mine, "pid": os.getpid()}), flush=True)
    held = len(mine)
    while not os.path.exists(STOP):
        if len(eng.held_parts) != held:
            held = len(eng.held_parts)
            print(json.dumps({"held": held, "at": time.time()}), flush=True)
        await asyncio.sleep(0.005)
    await asyncio.gather(*(h.result() for h in handles))
    with open(f"{D}/times-{ME}.json", "w") as f:  # a file: the pipe would block on this much
        json.dump({"own": ids, "times": TIMES}, f)
    open(f"{D}/done-{ME}", "w").close()
    while sum(os.path.exists(f"{D}/done-{m}") for m in "ab") < 2:
        await asyncio.sleep(0.01)
    await eng.close()

asyncio.run(main())
"""


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def trial(parts: int, chains: int, before: float, after: float) -> dict[str, float]:
    d = tempfile.mkdtemp(prefix="fusee-parts-takeover-", dir=os.environ.get("BENCH_DIR"))
    ps: dict[str, subprocess.Popen[str]] = {}
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        ps = {me: subprocess.Popen([sys.executable, "-c", WORKER, d, me, str(parts), str(chains)],
                                   stdout=subprocess.PIPE, text=True, env=env) for me in "abc"}
        first = {me: json.loads(p.stdout.readline()) for me, p in ps.items()}  # type: ignore[union-attr]
        time.sleep(before)
        killed_at = time.time()
        os.kill(first["c"]["pid"], signal.SIGKILL)
        ps["c"].wait()
        held_at: list[float] = []
        lines: dict[str, list[dict[str, object]]] = {"a": [], "b": []}
        deadline = time.time() + 120
        # Read until the survivors together hold every part (each reports its count as it grows),
        # then let them run --after more seconds.
        counts = {"a": len(first["a"]["parts"]), "b": len(first["b"]["parts"])}
        sel = selectors.DefaultSelector()
        for me in "ab":
            sel.register(ps[me].stdout, selectors.EVENT_READ, me)  # type: ignore[arg-type]
        while counts["a"] + counts["b"] < parts:
            if time.time() > deadline:
                raise SystemExit("the victim's parts were not taken over within 120 s")
            for key, _ in sel.select(timeout=1):
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if line:
                    x = json.loads(line)
                    if "held" in x:
                        counts[key.data] = int(x["held"])
                        held_at.append(float(x["at"]))
        taken_at = max(held_at)
        took = taken_at - killed_at
        time.sleep(after)
        Path(d, "stop").touch()
        for me in "ab":
            ps[me].communicate(timeout=300)
            if ps[me].returncode != 0:
                raise SystemExit(f"survivor {me} failed (exit {ps[me].returncode})")
            lines[me].append(json.loads(Path(d, f"times-{me}.json").read_text()))
        windows: dict[str, list[float]] = {"before": [], "during": [], "after": []}
        for me in "ab":
            [x] = lines[me]
            own = set(x["own"])  # type: ignore[arg-type]
            last: dict[str, float] = {}
            for wid, _i, t in x["times"]:  # type: ignore[attr-defined]
                if wid in own and wid in last:
                    gap = (t - last[wid]) * 1000
                    w = "before" if t < killed_at else "during" if t <= taken_at else "after"
                    if w != "before" or t > killed_at - before + 1.0:  # skip the first second (warm-up)
                        windows[w].append(gap)
                last[wid] = t
        ran: dict[tuple[str, int], int] = {}
        for me in "ab":
            for wid, i, _t in lines[me][0]["times"]:  # type: ignore[attr-defined]
                if not wid.startswith("c-"):
                    ran[(wid, i)] = ran.get((wid, i), 0) + 1
        twice = [k for k, n in ran.items() if n > 1]
        assert not twice, f"steps of the survivors' own runs ran twice: {twice[:5]}"
        out_row: dict[str, float] = {"takeover_s": took}
        for w, gaps in windows.items():
            out_row[f"{w}_n"] = len(gaps)
            out_row[f"{w}_p50_ms"] = pct(gaps, 0.5)
            out_row[f"{w}_p99_ms"] = pct(gaps, 0.99)
        return out_row
    finally:
        for p in ps.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", type=int, default=6)
    ap.add_argument("--chains", type=int, default=20)
    ap.add_argument("--before", type=float, default=3.0)
    ap.add_argument("--after", type=float, default=3.0)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.parts % 3:
        raise SystemExit("--parts must be a multiple of 3 (three holders)")
    rows = [trial(a.parts, a.chains, a.before, a.after) for _ in range(a.trials)]
    out: dict[str, object] = {"workload": "parts_takeover", "parts": a.parts, "chains": a.chains, "trials": a.trials}
    for k in rows[0]:
        out[k] = statistics.median(float(r[k]) for r in rows)
    if a.json:
        common.emit_result(out)
    print(f"3 holders of {a.parts} parts, {a.chains} step loops each; one SIGKILLed; {a.trials} trials, medians")
    print(f"  takeover (kill to its parts held again): {out['takeover_s']:.2f} s")
    for w in ("before", "during", "after"):
        print(f"  survivors' step time {w:>6}: p50 {out[f'{w}_p50_ms']:.1f} ms, p99 {out[f'{w}_p99_ms']:.1f} ms "
              f"({int(out[f'{w}_n'])} steps)")  # type: ignore[call-overload]


if __name__ == "__main__":
    main()
