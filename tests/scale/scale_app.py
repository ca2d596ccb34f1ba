"""One of several processes on one engine directory (a worker of a scaled-out app).

Usage: python scale_app.py DIR NAME N [DSN]   (FUSEE_TEST_PARTS=P: DIR, or the DSN's namespace, is
created with P parts)

Opens DIR, or the PostgreSQL DSN when given (the first process owns it, the
others follow; on PostgreSQL with a 1 s lease), starts N ``job``
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
DSN = sys.argv[4] if len(sys.argv) > 4 else None
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
    parts = os.environ.get("FUSEE_TEST_PARTS")
    if DSN is None and parts is not None:
        engine = await fusee.Engine.open(DIR, workflows=[job], route_timeout=60, parts=int(parts))
    elif DSN is None:
        engine = await fusee.Engine.open(DIR, workflows=[job], route_timeout=60)
    elif parts is not None:
        engine = await fusee.Engine.open(DSN, workflows=[job], route_timeout=60, lease_ttl=1, parts=int(parts))
    else:
        engine = await fusee.Engine.open(DSN, workflows=[job], route_timeout=60, lease_ttl=1, shards=4)
    emit(opened=os.getpid(), owner=engine.is_owner, epoch=engine.epoch)
    sem = asyncio.Semaphore(8)

    acked: list[str] = []

    async def one(i: int) -> None:
        async with sem:
            wid = f"{NAME}-{i}"
            try:
                await engine.start(job, wid, i)
            except fusee.EngineClosed:
                emit(refused=wid)  # an owner that lost its lease acknowledges nothing more
                return
            acked.append(wid)
            emit(acked=wid)

    await asyncio.gather(*(one(i) for i in range(N)))
    for wid in acked:
        try:
            emit(done=wid, result=await engine.get(wid).result())
        except fusee.EngineClosed:
            emit(refused=wid)
    failure = engine.failure
    emit(finished=os.getpid(), owner=engine.is_owner, epoch=engine.epoch,
         failed=None if failure is None else type(failure).__name__)
    # Stays open (owner or follower) until the test lets the processes go, or its engine fails
    # (an owner that lost its lease to another process: it says so and leaves).
    while not os.path.exists(os.path.join(DIR, "release")) and engine.failure is None:
        await asyncio.sleep(0.01)
    if engine.failure is not None:
        emit(closing=os.getpid(), failed=type(engine.failure).__name__)
    await engine.close()


asyncio.run(main())
