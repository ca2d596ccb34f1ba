"""A writer the power-cut test runs as a real process on an ext4 loop device, then SIGKILLs.

Usage: python powercut_app.py DIR TAG

Starts workflows (each runs two steps) twenty at a time and prints each
workflow ID once its start is acknowledged (durable), one per line, flushed.
With KILL_IN_SYNC=N it kills itself inside its N-th fdatasync. It also
attaches to the workflows of earlier lives (``if_running="attach"``),
which builds on what recovery read: the case where a process crash left
unsynced writes in the page cache.
"""

from __future__ import annotations

import asyncio
import os
import sys

import fusee
from fusee import sabotage

if os.environ.get("POWERCUT_SABOTAGE"):  # to prove the test catches what it guards against
    sabotage.active = sabotage.Sabotage(**{os.environ["POWERCUT_SABOTAGE"]: True})

if os.environ.get("KILL_IN_SYNC"):
    # Die inside the N-th fdatasync, before it syncs: the batch written just
    # before stays in the page cache only (the case a timed SIGKILL rarely hits).
    import signal

    from fusee.storage.posix import PosixStorage

    left = int(os.environ["KILL_IN_SYNC"])
    real_sync = PosixStorage.fdatasync

    def fdatasync(self: PosixStorage, fh: int) -> None:
        global left
        left -= 1
        if left == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        real_sync(self, fh)

    PosixStorage.fdatasync = fdatasync  # type: ignore[method-assign]

DIR = sys.argv[1]
TAG = sys.argv[2]


@fusee.workflow("work")
async def work(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("a", lambda: n + 1)
    return await ctx.step("b", lambda: a * 2)


async def main() -> None:
    async with fusee.Engine.open(DIR, workflows=[work], segment_bytes=1 << 20) as engine:
        earlier = [s.workflow_id for s in engine.runs()]

        async def one(wid: str, n: int) -> None:
            await engine.start(work, wid, n, if_running="attach", if_finished="attach")
            print(wid, flush=True)

        await asyncio.gather(*(one(w, 0) for w in earlier[-20:]))
        i = 0
        while True:
            await asyncio.gather(*(one(f"{TAG}-{i + k}", i + k) for k in range(20)))
            i += 20


asyncio.run(main())
