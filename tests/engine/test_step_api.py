"""Step ergonomics: arguments passed through, @fusee.step, fusee.step_info()."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fusee

CALLS: list[str] = []


@fusee.step(retry=fusee.Retry(attempts=3, initial="1ms"))
def charge(amount: int, currency: str = "EUR") -> str:
    info = fusee.step_info()
    CALLS.append(f"{info.name}#{info.attempt}")
    if info.attempt == 1:
        raise ConnectionError("flaky")
    return f"{amount} {currency} ({info.key.count('/')})"


@fusee.step
async def fetch(url: str) -> int:
    await asyncio.sleep(0)
    CALLS.append(f"fetch {url} {fusee.step_info().attempt}")
    return len(url)


@fusee.workflow("shop")
async def shop(ctx: fusee.Ctx, n: int) -> list[str]:
    out = [await charge(n, currency="USD")]
    out.append(str(await fetch("https://a.example")))
    # Arguments pass straight through ctx.step, after the StepInfo when fn takes one.
    out += [await ctx.step(f"double-{i}", lambda x: x * 2, i) for i in range(2)]
    out.append(await ctx.step("keyed", lambda info, x: f"{x}@{info.attempt}", "k"))
    return [str(x) for x in out]


async def test_decorated_steps_and_arguments(tmp_path: Path) -> None:
    CALLS.clear()
    async with fusee.Engine.open(tmp_path, workflows=[shop]) as engine:
        assert await engine.execute(shop, "s-1", 5) == ["5 USD (2)", "17", "0", "2", "k@1"]
    assert CALLS == ["charge#1", "charge#2", "fetch https://a.example 1"]
    async with fusee.Engine.open(tmp_path, workflows=[shop]) as engine:
        assert await engine.get("s-1").result() == ["5 USD (2)", "17", "0", "2", "k@1"]
    assert len(CALLS) == 3  # nothing ran again


@fusee.step
def add(a: int, b: int) -> int:
    return a + b


def test_outside_a_workflow_they_are_plain_functions() -> None:
    assert add(2, 3) == 5  # no engine, no journal: the function itself
    with pytest.raises(fusee.NotInAStep):
        charge(1)  # it asks for its step info, which only a step has
    with pytest.raises(fusee.NotInAStep):
        fusee.step_info()
