"""A plain synchronous script on SyncEngine, run as a real process and killed with SIGKILL.

Usage: python script_app.py DIR

Every step appends its name to DIR/ledger.txt. Step ``s2`` waits until
DIR/release exists, so the test can kill the script while it runs; the script
prints ``{"ready": ...}`` once s0 and s1 are durable and s2 runs (read through the sync API).
"""

from __future__ import annotations

import json
import os
import sys
import time

import fusee

DIR = sys.argv[1]


def ledger() -> list[str]:
    path = os.path.join(DIR, "ledger.txt")
    return open(path).read().splitlines() if os.path.exists(path) else []


def effect(name: str, value: int) -> int:
    with open(os.path.join(DIR, "ledger.txt"), "a") as f:
        f.write(name + "\n")
    if name == "s2":
        while not os.path.exists(os.path.join(DIR, "release")):
            time.sleep(0.01)  # the app's own wait: held until the test kills or releases it
    return value + 1


@fusee.workflow("pipeline")
async def pipeline(ctx: fusee.Ctx, n: int) -> int:
    v = 0
    for i in range(n):
        v = await ctx.step(f"s{i}", effect, f"s{i}", v)
    return v


def main() -> None:
    with fusee.SyncEngine.open(os.path.join(DIR, "engine"), workflows=[pipeline]) as engine:
        h = engine.start(pipeline, "p-1", 5, if_running="attach", if_finished="attach")
        while (sum(type(r).__name__ == "Step" for r in engine.journal("p-1")) < 2
               or "s2" not in ledger()):
            if os.path.exists(os.path.join(DIR, "release")):
                break
            time.sleep(0.01)
        print(json.dumps({"ready": True}), flush=True)
        print(json.dumps({"result": h.result(timeout=120)}), flush=True)


if __name__ == "__main__":
    main()
