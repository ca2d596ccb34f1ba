"""CPU per durable step of a fan-out, in-process: a quick probe for hot-path regressions.

Usage: .venv/bin/python bench/cpu_per_step.py [REPO_DIR ...]

Runs 2,000 workflows of 10 async steps on a real directory, five times, and
prints the best CPU time per step (process time: the loop's thread and the
log's). Give several checkouts (e.g. a ``git worktree`` of an older commit)
to compare them in one sitting: absolute figures move with the machine's
load, their ratio much less.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = r'''
import asyncio, functools, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import fusee

async def bump(v: int) -> int:
    return v + 1

@fusee.workflow("fan")
async def fan(ctx, steps: int) -> int:
    t = 0
    for _ in range(steps):
        t = await ctx.step("bump", functools.partial(bump, t))
    return t

async def main() -> None:
    best = float("inf")
    for _ in range(5):
        async with fusee.Engine.open(tempfile.mkdtemp(), workflows=[fan]) as e:
            t0 = time.process_time()
            hs = await asyncio.gather(*(e.start(fan, f"f{i}", 10) for i in range(2000)))
            for h in hs:
                await h.result()
            best = min(best, (time.process_time() - t0) / 20000 * 1e6)
    print(f"{best:.1f}")

asyncio.run(main())
'''


def main(argv: list[str]) -> int:
    repos = argv or [str(Path(__file__).resolve().parents[1])]
    for repo in repos:
        out = subprocess.run([sys.executable, "-c", PROBE, repo], capture_output=True, text=True, check=True)
        print(f"{repo}: {out.stdout.strip()} µs CPU per step (best of 5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
