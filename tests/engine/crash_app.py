"""A program the crash tests run as a real process and SIGKILL.

Usage: python crash_app.py DIR MODE [N]

Every step call appends ``key<TAB>input<TAB>output`` to DIR/effects.txt (the
page cache survives a process kill), so the test can tell which step functions
ran, with which input, and whether one ran again on an input a crash took back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import fusee

DIR = sys.argv[1]
MODE = sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 0
KILL_AT = os.environ.get("KILL_AT", "")

go = fusee.signal("go", int)


def effect(info: fusee.StepInfo, inp: str) -> str:
    out = f"{inp}>{os.urandom(3).hex()}"
    with open(os.path.join(DIR, "effects.txt"), "a") as f:
        f.write(f"{info.key}\t{inp}\t{out}\n")
    if f"after-effect:{info.name}" == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return out


@fusee.workflow("chain")
async def chain(ctx: fusee.Ctx, steps: int) -> str:
    v = "start"
    for i in range(steps):
        v = await ctx.step(f"s{i}", lambda info, v=v: effect(info, v))
    return v


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Ctx) -> dict[str, Any]:
    a = await ctx.step("before", lambda info: effect(info, "a"))
    t0 = ctx.now()
    await ctx.sleep("nap", "1500ms")
    t1 = ctx.now()
    b = await ctx.step("after", lambda info: effect(info, a))
    return {"slept": (t1 - t0).total_seconds(), "b": b}


@fusee.workflow("waiter")
async def waiter(ctx: fusee.Ctx, n: int) -> list[int]:
    got = []
    for _ in range(n):
        got.append(await ctx.wait_for(go))
    return got


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


async def main() -> None:
    async with fusee.Engine.open(DIR, workflows=[chain, sleeper, waiter], shards=2) as engine:
        if MODE == "chain":
            h = await engine.start(chain, "chain-1", 3, if_running="attach", if_finished="attach")
            emit(result=await h.result())
        elif MODE == "sleeper":
            h = await engine.start(sleeper, "sleep-1", if_running="attach", if_finished="attach")
            if KILL_AT == "in-sleep":
                while not any(type(r).__name__ == "Timer" for r in await engine.journal("sleep-1")):
                    await asyncio.sleep(0.005)
                emit(sleeping=True)
                await asyncio.sleep(3600)
            emit(result=await h.result())
        elif MODE == "load":
            # Start N chains, signal N waiters; report each acknowledgement; the test kills us at random.
            async def one(i: int) -> None:
                await engine.start(chain, f"load-{i}", 4, if_running="attach", if_finished="attach")
                emit(ack_start=f"load-{i}")
                await engine.start(waiter, f"wait-{i}", 2, if_running="attach", if_finished="attach")
                emit(ack_start=f"wait-{i}")

            await asyncio.gather(*(one(i) for i in range(N)))
            for k in range(2):
                for i in range(N):
                    try:
                        await engine.signal(f"wait-{i}", go, k, dedup_key=f"{i}-{k}")
                        emit(ack_signal=f"wait-{i}", value=k)
                    except (fusee.NotFound, fusee.WorkflowEnded):
                        pass
            results = {}
            for i in range(N):
                results[f"load-{i}"] = await engine.get(f"load-{i}").result()
                results[f"wait-{i}"] = await engine.get(f"wait-{i}").result()
            emit(results=results)
        else:
            raise SystemExit(f"unknown mode {MODE}")


if __name__ == "__main__":
    asyncio.run(main())
