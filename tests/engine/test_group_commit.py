"""Group commit across runs, on a real directory: N chains taking turns share their flushes.

Nothing here is timed: the tests count flushes and records (``Engine.stats``).
Before the committer counted producers, each of N sequential chains got an
``fdatasync`` of its own per step on a quiet machine (about N x steps
flushes); now a round of steps of every chain shares one. The exact
rule (and its sabotage) is checked in virtual time by ``fusee.sim.grouping``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fusee

CHAINS, STEPS = 8, 40


@fusee.workflow("group-chain")
async def group_chain(ctx: fusee.Ctx, steps: int) -> int:
    total = 0
    for _ in range(steps):
        total = await ctx.step("add", lambda t=total: t + 1)  # a sync lambda, as users write it
    return total


async def _flushes(path: Path, flush: str) -> tuple[int, int]:
    async with fusee.Engine.open(path, workflows=[group_chain], flush=flush) as engine:
        before = engine.stats["flushes"]
        handles = await asyncio.gather(*(engine.start(group_chain, f"c{i}", STEPS) for i in range(CHAINS)))
        assert [await h.result() for h in handles] == [STEPS] * CHAINS
        return engine.stats["flushes"] - before, CHAINS * STEPS


@pytest.mark.parametrize("flush", ["inline", "pipeline", "background"])
async def test_concurrent_chains_share_their_flushes(tmp_path: Path, flush: str) -> None:
    flushes, records = await _flushes(tmp_path, flush)
    # One flush per round of steps would be STEPS; a busy machine may add some (a held
    # flush whose pooled first executions are slow runs out). Chains flushing alone take
    # CHAINS x STEPS; chains split into two groups taking turns (a round's first records
    # handed to the log's thread once the round passed a flush time of CPU) take 2 x STEPS.
    # Pipeline mode writes a round's first delivery ahead by design (after_delivery).
    bound = records // 2 if flush == "pipeline" else STEPS + STEPS // 2
    assert flushes <= bound, f"{flushes} flushes for {records} step results (at most {bound})"
