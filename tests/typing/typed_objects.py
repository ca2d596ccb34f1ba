"""Type checkers see keyed objects' state and handler result types, and step limit options.

Each ``type: ignore[...]`` marks a mistake mypy must catch (see typed_usage.py).
"""

from __future__ import annotations

import dataclasses
from typing import assert_type

import fusee


@dataclasses.dataclass
class Cart:
    items: list[str] = dataclasses.field(default_factory=list)


cart = fusee.object("cart", state=Cart)
assert_type(cart, fusee.ObjectDef[Cart])


@cart.exclusive
async def add(ctx: fusee.ObjectCtx[Cart], item: str) -> int:
    state = ctx.state
    assert_type(state, Cart)
    state.items.append(item)
    ctx.set_state(state)
    ctx.set_state("not a cart")  # type: ignore[arg-type]
    assert_type(ctx.key, str)
    return len(state.items)


@cart.shared
async def total(ctx: fusee.ObjectCtx[Cart]) -> int:
    return len(ctx.state.items)


assert_type(add, fusee.Handler[int, str])
assert_type(total, fusee.Handler[int, None])
older: fusee.Handler[int] = add  # one type argument still works: the argument type is Any


@fusee.workflow("pay")
async def pay(ctx: fusee.Ctx, tenant: str) -> int:
    return int(await ctx.step("charge", lambda: 1, limit="payments", priority=1, fairness_key=tenant))


async def client(engine: fusee.Engine) -> None:
    n = await engine.call(add, "k", "tea", call_id="c-1")
    assert_type(n, int)
    bad: str = await engine.call(total, "k")  # type: ignore[arg-type]
    state = await engine.object_state(cart, "k")
    assert_type(state, fusee.ObjectState[Cart])
    assert_type(state.value, Cart)
    version: int = await engine.set_object_state(cart, "k", Cart(), if_version=state.version)
    await engine.set_object_state(cart, "k", 5)  # type: ignore[misc]
    await engine.patch_object_state(cart, "k", [{"op": "add", "path": "/items/-", "value": "x"}])
    await engine.clear_object_state(cart, "k")
    engine.set_limit("payments", concurrency=3)
    status = engine.limits()["payments"]
    assert_type(status.in_use, int)
    print(bad, version)


async def opening() -> None:
    async with fusee.Engine.open(workflows=[pay, cart], limits=[fusee.Limit("payments", concurrency=5)]) as engine:
        await client(engine)
