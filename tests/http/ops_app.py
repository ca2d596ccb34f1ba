"""The operator tests' application: workflows an operator lists, inspects and acts on.

``fusee serve ops_app:make_engine`` serves it (the directory is ``$OPS_DIR``).
``python ops_app.py DIR`` opens DIR, starts a few runs, prints ``ready`` once they
are durable, and keeps the directory open until killed (a live directory).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from typing import Any

import fusee

approve = fusee.signal("approve", bool)
state = fusee.query("state", str)
bump = fusee.update("bump", int, int)
TOKENS: list[str] = []
FIXED: set[str] = set()


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, customer: str) -> str:
    ctx.set_attributes({"customer": customer})
    now = {"state": "new", "count": 0}
    ctx.on_query(state, lambda: now["state"])

    def on_bump(n: int) -> int:
        now["count"] += n
        return now["count"]

    def positive(n: int) -> None:
        if n <= 0:
            raise ValueError("bump by a positive number")

    ctx.on_update(bump, on_bump, validator=positive)
    out = ctx.stream("log")
    await out.write(f"order for {customer}")
    now["state"] = await ctx.step("reserve", lambda: "reserved")
    ok = await ctx.wait_for(approve)
    now["state"] = "approved" if ok else "declined"
    await out.write(now["state"])
    await out.close()
    return "shipped" if ok else "declined"


def _hand_out(info: fusee.StepInfo) -> None:
    assert info.token is not None
    TOKENS.append(info.token)


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx, amount: int) -> str:
    ctx.on_query(fusee.query("token", str), lambda: TOKENS[-1] if TOKENS else "")
    who = await ctx.await_completion("manager", _hand_out, result_type=str)
    return f"{amount} approved by {who}"


@fusee.workflow("pauser")
async def pauser(ctx: fusee.Ctx) -> str:
    def flaky(info: fusee.StepInfo) -> str:
        if "fixed" not in FIXED:
            raise ConnectionError("the service is down")
        return f"ok after attempt {info.attempt}"

    return await ctx.step("call", flaky, retry=fusee.Retry(attempts=2, initial="1ms",
                                                            pause_when_exhausted=True))


#: What the broken workflow's step raises: longer than any terminal is wide.
LONG_ERROR = ("the inventory service answered 503 Service Unavailable for SKU 1234567890 in warehouse "
              "berlin-east while reserving 17 units for order o-17; its status page says the database "
              "failover is in progress and asks clients to retry in a few minutes, or call the on-call number")


def _unavailable() -> str:
    raise ConnectionError(LONG_ERROR)


@fusee.workflow("broken")
async def broken(ctx: fusee.Ctx) -> str:
    return await ctx.step("reserve", _unavailable, retry=fusee.Retry(attempts=1))


@fusee.workflow("tick")
async def tick(ctx: fusee.Ctx, n: int) -> int:
    """What the operator tests' schedules run."""
    return await ctx.step("work", lambda: n + 1)


@dataclasses.dataclass
class Cart:
    items: list[str] = dataclasses.field(default_factory=list)


cart = fusee.object("cart", state=Cart)


@cart.exclusive
async def add(ctx: fusee.ObjectCtx, item: str) -> int:
    state = ctx.state
    ctx.set_state(Cart([*state.items, item]))
    return len(state.items) + 1


WORKFLOWS: list[Any] = [order, approval, pauser, broken, tick, cart]
#: The step limits the operator's tools list and resize.
LIMITS = [fusee.Limit("payments", concurrency=2, per_second=10.0)]


async def make_engine() -> fusee.Engine:
    """The factory ``fusee serve`` calls: the engine on ``$OPS_DIR``."""
    return await fusee.Engine.open(os.environ["OPS_DIR"], workflows=WORKFLOWS, segment_bytes=1 << 20,
                                   limits=LIMITS)


async def _live(directory: str) -> None:
    engine = await fusee.Engine.open(directory, workflows=WORKFLOWS, segment_bytes=1 << 20,
                                   limits=LIMITS)
    await engine.start(order, "o-live", "acme")
    # Ready once the run waits for its approval and that is durable: then nothing more is written.
    while not any(type(r).__name__ == "Wait" for r in await engine.journal("o-live")):
        await asyncio.sleep(0.005)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_live(sys.argv[1]))
