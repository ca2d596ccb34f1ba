"""A program using schedules and windows, run as a real process and SIGKILLed.

Usage: python flow_app.py DIR MODE

Step functions append lines to DIR/ledger.txt (the page cache survives a
process kill), so the test sees what ran across lives.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import fusee

DIR = sys.argv[1]
MODE = sys.argv[2]
LEDGER = os.path.join(DIR, "ledger.txt")


def ledger(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


@fusee.workflow("tick")
async def tick(ctx: fusee.Ctx, n: int) -> int:
    wid, run = ctx.workflow_id, ctx.run_id

    def record() -> int:
        ledger(f"fired {wid} {run}")
        return n

    return int(await ctx.step("record", record))


@fusee.workflow("window", batch=fusee.Batch(max_size=5, max_delay="50ms"))
async def window(ctx: fusee.Ctx, events: list[str]) -> int:
    wid = ctx.workflow_id

    def record() -> int:
        ledger(f"window {wid} {','.join(events)}")
        return len(events)

    return int(await ctx.step("record", record))


async def main() -> None:
    async with fusee.Engine.open(os.path.join(DIR, "engine"), workflows=[tick, window]) as engine:
        if MODE in ("schedule", "schedule-2"):
            # The second life makes the same call (a no-op for the same spec).
            await engine.schedule("s", tick, 1, every="100ms", overlap="allow_all", catchup_window="1h")
            emit(ready=1)
            if MODE == "schedule":
                await asyncio.Event().wait()  # until killed
            while engine.schedules()[0].fired < 30:
                await asyncio.sleep(0.01)
            info = await engine.delete_schedule("s")
            while not any(r.workflow_id == info.last_run and r.status == "ok" for r in engine.runs()):
                await asyncio.sleep(0.01)  # the last run's record step, before the process exits
            emit(fired=info.fired, skipped=info.skipped_catchup)
        elif MODE in ("enqueue", "enqueue-2"):
            n = 40
            receipts = {}
            for i in range(n):
                r = await engine.enqueue(window, "k", f"e{i}", event_id=f"e{i}")
                receipts[f"e{i}"] = [r.window_id, r.position]
                if MODE == "enqueue":
                    emit(acked=f"e{i}", receipt=receipts[f"e{i}"])
            if MODE == "enqueue":
                await asyncio.Event().wait()
            last = max(int(w.split("#")[1]) for w, _ in receipts.values())
            while not any(r.workflow_id == f"window:k#{last}" and r.status == "ok" for r in engine.runs()):
                await asyncio.sleep(0.01)
            emit(receipts=receipts)


asyncio.run(main())
