"""A program the PostgreSQL crash tests run as a real process, then SIGKILL or SIGSTOP.

Usage: python pg_app.py DSN DIR MODE [N]

Every step call appends ``key<TAB>input<TAB>output`` to DIR/effects.txt, so
the test can tell which step functions ran, and whether one ran again on an
input a crash took back. Acknowledgements are printed as JSON lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import fusee
from fusee.errors import LeaseHeld

DSN, DIR, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 0
KILL_AT = os.environ.get("KILL_AT", "")
LEASE_TTL = 1.0


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


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


async def open_engine() -> fusee.Engine:
    """Opens the namespace, waiting out the lease of a killed predecessor (its TTL at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await fusee.Engine.open(DSN, workflows=[chain], shards=4, lease_ttl=LEASE_TTL, exclusive=True)
        except LeaseHeld as e:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(min(max(e.expires_in, 0.0), LEASE_TTL) + 0.02)


async def main() -> None:
    engine = await open_engine()
    async with engine:
        if MODE == "chain":
            h = await engine.start(chain, "chain-1", 4, if_running="attach", if_finished="attach")
            emit(result=await h.result())
        elif MODE == "load":
            async def one(i: int) -> None:
                await engine.start(chain, f"load-{i}", 3, if_running="attach", if_finished="attach")
                emit(ack=f"load-{i}")

            await asyncio.gather(*(one(i) for i in range(N)))
            emit(results={f"load-{i}": await engine.get(f"load-{i}").result() for i in range(N)})
        elif MODE == "finish":
            results: dict[str, str] = {}
            for i in range(N):
                try:
                    results[f"load-{i}"] = await engine.get(f"load-{i}").result()
                except fusee.NotFound:
                    pass
            emit(results=results)
        elif MODE == "serve":
            # Starts runs one after another until the engine stops acknowledging (fenced).
            emit(ready=True)
            i = 0
            try:
                while True:
                    await engine.start(chain, f"a-{i}", 1)
                    emit(ack=f"a-{i}")
                    i += 1
                    await asyncio.sleep(0.01)
            except fusee.EngineClosed:
                emit(failed=type(engine.failure).__name__)
        else:
            raise SystemExit(f"unknown mode {MODE}")


if __name__ == "__main__":
    asyncio.run(main())
