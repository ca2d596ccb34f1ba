"""An engine with an encrypted journal, run as a real process and SIGKILLed.

Usage: python encrypted_app.py DIR CURRENT_KEY KEY_IDS

KEY_IDS (comma-separated, of k1 and k2) are the keys the codec holds; new
payloads use CURRENT_KEY. Step functions append to DIR/ledger.txt (the test
waits on it and kills the process mid-run). Prints each workflow's result as
a JSON line once all are done.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import fusee

DIR, CURRENT, KEY_IDS = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
KEYS = {"k1": bytes(range(32)), "k2": bytes(range(100, 132))}
LEDGER = os.path.join(DIR, "ledger.txt")
RUNS = 30


def ledger(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def part(info: fusee.StepInfo, n: int, i: int) -> str:
    time.sleep(0.01)  # slow enough for the kill to land mid-run
    info.stream(f"part-{i}").write(f"CONFIDENTIAL-chunk-{n}-{i}")  # a step's result ends its streams
    ledger(f"done {n} {i}")
    return f"CONFIDENTIAL-part-{n}-{i}"


@fusee.workflow("pipeline")
async def pipeline(ctx: fusee.Ctx, n: int) -> dict[str, Any]:
    parts = [await ctx.step(f"part-{i}", part, n, i) for i in range(8)]
    return {"n": n, "parts": parts, "note": f"CONFIDENTIAL-result-{n}"}


async def main() -> None:
    codec = fusee.AesGcmCodec(keys={k: KEYS[k] for k in KEY_IDS}, current=CURRENT)
    async with fusee.Engine.open(DIR, workflows=[pipeline], codec=codec) as engine:
        handles = [
            await engine.start(pipeline, f"p-{n}", n, if_running="attach", if_finished="attach")
            for n in range(RUNS)
        ]
        results = await asyncio.gather(*(h.result() for h in handles))
        for n in range(RUNS):
            chunks = [c for i in range(8) async for c in engine.read_stream(f"p-{n}", f"part-{i}")]
            print(json.dumps({"result": results[n], "chunks": chunks}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
