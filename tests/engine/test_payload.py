"""Payload types, ended runs and periodic checkpoints, through the public API (issue 9)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

import fusee
from tests.helpers import until


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@fusee.workflow("count-steps")
async def count_steps(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step("add", (lambda v: lambda: v)(i))
    return total


# --- checkpoint_interval ------------------------------------------------------


def test_checkpoint_interval_checkpoints_on_a_timer(tmp_path: Any) -> None:
    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[count_steps], checkpoint_interval=0.01) as engine:
            assert engine.stats["checkpoints"] == 0
            assert await engine.execute(count_steps, "c-1", 5) == 10
            # No checkpoint_every was reached and nobody asked: the timer wrote it.
            await until(lambda: engine.stats["checkpoints"] >= 1)

    run(main())


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1s", True])
def test_checkpoint_interval_must_be_positive_seconds(bad: Any) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="checkpoint_interval"):
            await fusee.Engine.open(workflows=[count_steps], checkpoint_interval=bad)

    run(main())


def test_the_simulators_checkpoint_interval_reaches_the_engine() -> None:
    from fusee.sim.config import SimConfig
    from fusee.sim.world import run_seed

    cfg = dataclasses.replace(SimConfig.for_seed(4), checkpoint_every=1_000_000, checkpoint_interval_ms=20)
    assert run_seed(cfg.seed, config=cfg).report.checkpoints > 0
