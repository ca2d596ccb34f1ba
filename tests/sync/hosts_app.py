"""The workflows the host tests (Flask, Django, trio) drive through SyncEngine.

``order`` reserves (a step), waits for ``approve``, charges (a step) and returns
a string; each step appends ``name:order_id`` to ``LEDGER`` (the page cache
survives a kill), so a test can tell how often each step function ran.
"""

from __future__ import annotations

import os

import fusee

approve = fusee.signal("approve", str)
LEDGER = os.environ.get("FUSEE_TEST_LEDGER", "")


def effect(name: str, order_id: str) -> str:
    if LEDGER:
        with open(LEDGER, "a") as f:
            f.write(f"{name}:{order_id}\n")
    return f"{name}-{order_id}"


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, order_id: str) -> str:
    await ctx.step("reserve", effect, "reserve", order_id)
    who = await ctx.wait_for(approve)
    charged = await ctx.step("charge", effect, "charge", order_id)
    return f"{charged} by {who}"
