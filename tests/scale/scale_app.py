"""One of several processes on one engine directory (a worker of a scaled-out app).

Usage: python scale_app.py DIR NAME N

Opens DIR (the first process owns it, the others follow), starts N ``job``
workflows named NAME-i, eight at a time, through its engine, prints a JSON line
per acknowledged start, then waits for every result and prints it, and closes once DIR/release exists. Steps append
``<workflow id> <step>`` to DIR/ledger.txt (their effects), one line per run.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import fusee

DIR, NAME, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
LEDGER = os.path.join(DIR, "ledger.txt")


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def effect(wid: str, step: int, value: int) -> int:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{wid} {step}\n".encode())
    finally:
        os.close(fd)
    return value


@fusee.workflow("job")
async def job(ctx: fusee.Ctx, x: int) -> int:
    total = 0
    for k in range(3):
        total += await ctx.step(f"s{k}", lambda k=k: effect(ctx.workflow_id, k, x + k))
    return total


async def main() -> None:
    engine = await fusee.Engine.open(DIR, workflows=[job], route_timeout=60)
    emit(opened=os.getpid(), owner=engine.is_owner, epoch=engine.epoch)
    sem = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with sem:
            wid = f"{NAME}-{i}"
            await engine.start(job, wid, i)
            emit(acked=wid)

    await asyncio.gather(*(one(i) for i in range(N)))
    for i in range(N):
        wid = f"{NAME}-{i}"
        emit(done=wid, result=await engine.get(wid).result())
    emit(finished=os.getpid(), owner=engine.is_owner, epoch=engine.epoch)
    # Stays open (owner or follower) until the test lets the processes go.
    while not os.path.exists(os.path.join(DIR, "release")):
        await asyncio.sleep(0.01)
    await engine.close()


asyncio.run(main())
