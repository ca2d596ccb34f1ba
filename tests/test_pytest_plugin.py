"""The pytest plugin's fixtures, used the way a user's test suite would."""

from __future__ import annotations

from typing import Any

import pytest

import fusee


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    await ctx.sleep("think", "2d")
    return await ctx.step("hello", lambda: f"hello {name}")


@pytest.mark.fusee_workflows(greet)
async def test_the_memory_engine_fixture(fusee_engine: Any) -> None:
    async with fusee_engine as env:
        assert await env.execute(greet, "g-1", "ann") == "hello ann"  # two days, skipped


@pytest.mark.fusee_workflows(greet)
async def test_the_disk_engine_fixture(fusee_tmp_engine: Any) -> None:
    async with fusee_tmp_engine as engine:
        run = await engine.start(greet, "g-1", "bob")
        assert engine.describe("g-1").status == "running"
        await run.cancel()
