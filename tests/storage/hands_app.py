"""An engine process that tests steer line by line from stdin, to play against outside hands.

Usage: python hands_app.py DIR

Opens DIR (``exclusive=True``: it owns the directory or fails) and prints
``{"opened": pid, "epoch": n}``. Then, one command per stdin line:

* ``start PREFIX N``: starts N ``job`` workflows PREFIX-0 ... PREFIX-(N-1) at once and
  prints ``{"acked": id}`` or ``{"refused": id, "error": type}`` for each, then
  ``{"started": PREFIX}``;
* ``checkpoint``: writes a checkpoint, prints ``{"checkpoint": error type or null}``;
* ``close``: closes the engine, prints ``{"closed": error type or null, "failure": ...}``
  and exits.

Every line is a JSON object, flushed at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import fusee

DIR = sys.argv[1]


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


@fusee.workflow("job")
async def job(ctx: fusee.Ctx, x: int) -> int:
    return await ctx.step("s", lambda: x + 1)  # type: ignore[no-any-return]


async def main() -> None:
    engine = await fusee.Engine.open(DIR, workflows=[job], exclusive=True)
    emit(opened=os.getpid(), epoch=engine.epoch)
    loop = asyncio.get_running_loop()

    async def one(wid: str, x: int) -> None:
        try:
            await engine.start(job, wid, x)
        except fusee.FuseeError as e:
            emit(refused=wid, error=type(e).__name__)
            return
        emit(acked=wid)

    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line:
            line = ["close"]  # stdin closed: the test is done with us
        if line[0] == "start":
            prefix, n = line[1], int(line[2])
            await asyncio.gather(*(one(f"{prefix}-{i}", i) for i in range(n)))
            emit(started=prefix)
        elif line[0] == "checkpoint":
            try:
                await engine.checkpoint()
            except fusee.FuseeError as e:
                emit(checkpoint=type(e).__name__, message=str(e))
            else:
                emit(checkpoint=None)
        elif line[0] == "close":
            failure = engine.failure
            try:
                await engine.close()
            except fusee.FuseeError as e:
                emit(closed=type(e).__name__, message=str(e),
                     failure=None if failure is None else type(failure).__name__)
            else:
                emit(closed=None, failure=None if failure is None else type(failure).__name__)
            return


asyncio.run(main())
