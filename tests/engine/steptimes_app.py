"""Workflows whose step attempts the step-time tests look at; run as a program, it is killed.

Usage: python steptimes_app.py DIR: starts ``timed`` as ``t-1``, prints the step
attempts of its durable journal as one JSON line once it waits for ``go``, then
waits to be killed. The same workflows wrote ``fixtures/pre_step_times.fjnl``
with the engine of before step times.
"""

from __future__ import annotations

import asyncio
import json
import sys

import fusee
from fusee.core import records as rec

go = fusee.signal("go", int)


def flaky(info: fusee.StepInfo) -> str:
    if info.attempt == 1:
        raise RuntimeError("flaky")
    return f"b@{info.attempt}"


@fusee.workflow("timed")
async def timed(ctx: fusee.Ctx, n: int) -> str:
    a = await ctx.step("a", lambda: n + 1)
    b = await ctx.step("b", flaky, retry=fusee.Retry(initial="1ms"))
    await ctx.sleep("nap", 0.05)
    got = await ctx.wait_for(go, timeout=3600)
    return f"{a} {b} {got}"


async def main(directory: str) -> None:
    from fusee import views

    engine = await fusee.Engine.open(directory, workflows=[timed])
    await engine.start(timed, "t-1", 1)
    while not any(isinstance(r, rec.Wait) for r in await engine.journal("t-1")):
        await asyncio.sleep(0.005)  # polls what is durable: the run's own progress, not a timing
    print(json.dumps(views.summary(engine.describe("t-1"))["steps"]), flush=True)
    await asyncio.Event().wait()  # the test kills the process here


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
