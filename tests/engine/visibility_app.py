"""A program the visibility tests run as a real process and SIGKILL.

Usage: python visibility_app.py DIR N

Starts N ``tagged`` workflows (each sets search attributes, then sleeps a
day), prints ``ready`` once every start is durable and waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys

import fusee


@fusee.workflow("tagged")
async def tagged(ctx: fusee.Ctx, i: int) -> int:
    ctx.set_attributes({"customer": "acme" if i % 3 == 0 else "other", "i": i})
    await ctx.sleep("nap", "1d")
    ctx.set_attributes({"phase": "woke"})
    return i


async def main() -> None:
    engine = await fusee.Engine.open(sys.argv[1], workflows=[tagged])
    for i in range(int(sys.argv[2])):
        await engine.start(tagged, f"t-{i}", i)
    # Ready once every run's attributes are durable (``journal`` shows durable records only).
    for i in range(int(sys.argv[2])):
        while not any(type(r).__name__ == "Attributes" for r in await engine.journal(f"t-{i}")):
            await asyncio.sleep(0.005)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
