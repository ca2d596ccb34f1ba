"""Type checkers see steps, step functions, children, schedules, object calls and the testing kit
(issue 22, finding 8). ``make typecheck`` runs ``mypy --strict --warn-unused-ignores`` here.

Each assignment to an annotated name checks the inferred type (mypy rejects a wrong one);
each ``type: ignore[...]`` marks a mistake mypy must catch (an unneeded ignore fails the check).
Also importable by pytest, which runs nothing.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Awaitable
from typing import assert_type

import fusee
from fusee.testing import TestEngine


def quote(item: str, qty: int) -> float:
    return qty * 2.5


async def reserve(item: str) -> bool:
    return bool(item)


def charge(info: fusee.StepInfo, amount: float) -> str:
    return f"{info.key}:{amount}"


def scaled(x: int, *, factor: int = 1) -> int:
    return x * factor


@fusee.step
def ship(item: str) -> int:
    return len(item)


@fusee.step(retry=fusee.Retry(attempts=3))
def label(item: str, copies: int) -> str:
    return item * copies


@fusee.step
async def notify(who: str) -> None:
    return None


@fusee.workflow("child")
async def child(ctx: fusee.Ctx, n: int) -> str:
    return str(n)


@fusee.workflow("nothing-in")
async def nothing_in(ctx: fusee.Ctx) -> int:
    return 0


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, item: str) -> str:
    # ctx.step: the function's result (awaited for an async one), its arguments checked.
    price: float = await ctx.step("quote", quote, item, 2)
    ok: bool = await ctx.step("reserve", reserve, item)
    receipt: str = await ctx.step("charge", charge, price, retry=fusee.Retry(attempts=5))
    key: str = await ctx.step("key", lambda info: info.key)
    n: int = await ctx.step("count", lambda: 3, timeout="1s")
    big: int = await ctx.step("scaled", scaled, 2, factor=3)
    mixed: int = await ctx.step("both", functools.partial(scaled, factor=3), 2, read_only=True)
    decoded: bytes = await ctx.step("raw", lambda: "x", result_type=bytes)
    # A lambda that binds a loop variable by default, as users write chains of steps.
    total = 0
    for _ in range(3):
        total = await ctx.step("add", lambda t=total: t + 1, retry=fusee.Retry(attempts=2))
    assert_type(ctx.step("quote", quote, item, 2), Awaitable[float])
    assert_type(ctx.step("reserve", reserve, item, limit="api"), Awaitable[bool])
    await ctx.step("quote", quote, item, "two")  # type: ignore[arg-type, call-arg]
    await ctx.step("quote", quote, item)  # type: ignore[arg-type]
    await ctx.step("quote", quote, 2, 2, retry=None)  # type: ignore[arg-type, call-arg]
    again = await ctx.step("quote", quote, item, 2)
    wrong: str = again  # type: ignore[assignment]

    # @fusee.step functions, sync or async, awaited in workflow code as documented.
    parcels: int = await ship(item)
    text: str = await label(item, 2)
    await notify("ops")
    await label(item, "two")  # type: ignore[arg-type]
    not_str: str = await ship(item)  # type: ignore[assignment]

    # Children: input and result typed by the workflow.
    c: str = await ctx.child(child, "c-1", 3)
    z: int = await ctx.child(nothing_in, "z-1")
    handle = await ctx.start_child(child, "c-2", 4)
    await ctx.child(child, "c-3", "three")  # type: ignore[misc]
    await ctx.start_child(child, "c-4", "four")  # type: ignore[misc]

    token_value: int = await ctx.await_completion("approve", lambda info: None, result_type=int)
    del wrong, not_str, handle
    return f"{price}{ok}{receipt}{key}{n}{big}{mixed}{decoded!r}{parcels}{text}{c}{z}{token_value}"


cart = fusee.object("cart", state=list[str])


@cart.exclusive
async def add(ctx: fusee.ObjectCtx[list[str]], item: str) -> int:
    ctx.set_state([*ctx.state, item])
    return len(ctx.state)


@cart.shared
async def size(ctx: fusee.ObjectCtx[list[str]]) -> int:
    return len(ctx.state)


async def client(engine: fusee.Engine) -> None:
    n: int = await engine.call(add, "k", "tea")
    m: int = await engine.call(size, "k")
    await engine.call(add, "k", 5)  # type: ignore[misc]
    await engine.call(size, "k", "extra")  # type: ignore[misc]
    await engine.schedule("nightly", child, 7, every="1d")
    await engine.schedule("zero", nothing_in, every="1h")
    await engine.schedule("named", "child", "anything", every="1h")  # by name: not checked
    await engine.schedule("bad", child, "seven", every="1d")  # type: ignore[misc]
    print(n, m)


async def kit() -> None:
    async with TestEngine(workflows=[order, child, nothing_in, cart], limits=[fusee.Limit("api", concurrency=1)]) as env:
        assert_type(env, TestEngine)
        run = await env.start(order, "o-1", "tea")
        assert_type(run, fusee.RunHandle[str])
        result: str = await env.execute(child, "c-1", 3)
        count: int = await env.call(add, "k", "tea")
        await env.start(order, "o-2", 3)  # type: ignore[misc]
        await env.skip("1h")
        await env.until(lambda: env.describe("o-1").status == "ok")
        print(result, count, env.now())
        for attempt in env.describe("o-1").steps:
            assert_type(attempt, fusee.StepAttempt)
            assert_type(attempt.duration, datetime.timedelta | None)
            assert_type(attempt.started_at, datetime.datetime | None)
            assert_type(attempt.queued, datetime.timedelta)
    TestEngine(workflows=[order], limits="api")  # type: ignore[arg-type]
    TestEngine(workflows=[order], frozen_clock=True)
    TestEngine(workflows=[order], frozen_clock="yes")  # type: ignore[arg-type]
