"""Continue-as-new hands over nothing it owes: what a run sent arrives even if a crash follows its end."""

from __future__ import annotations

from typing import Any

import fusee
from fusee.sim import Scenario

ROUNDS = 6
CHILDREN = 4
DONE = fusee.signal("done", str)


def chain_workflows(seed: int) -> list[Any]:
    @fusee.workflow("leaf")
    async def leaf(ctx: fusee.Ctx) -> None:
        await ctx.signal_workflow("collector", DONE, ctx.workflow_id)

    @fusee.workflow("chain")
    async def chain(ctx: fusee.Ctx, k: int) -> int:
        for i in range(CHILDREN):
            ctx.start_child(leaf, f"leaf-{k}-{i}", close_policy="abandon")
        if k + 1 < ROUNDS:
            await ctx.continue_as_new(k + 1)
        return k

    @fusee.workflow("collector")
    async def collector(ctx: fusee.Ctx) -> list[str]:
        seen: set[str] = set()
        while len(seen) < ROUNDS * CHILDREN:
            seen.add(str(await ctx.wait_for(DONE)))
        return sorted(seen)

    return [chain, leaf, collector]


def test_children_started_just_before_continue_as_new_all_start_across_crashes() -> None:
    # Seed 16754: a schedule's runs started in the turn before it continued as new were lost
    # when a crash came after the continue was durable but before the starts were: recovery
    # never reads an ended run's journal again, so nobody resent them. (A lost child never
    # signals the collector, which then never finishes: the scenario fails.)
    scenario = Scenario(chain_workflows, duration="60ms", settle="5s")
    scenario.start("collector", "collector")
    scenario.start("chain", "c", 0, at="1ms")
    want = sorted(f"leaf-{k}-{i}" for k in range(ROUNDS) for i in range(CHILDREN))
    crashed = 0
    for seed in range(60):
        outcome = scenario.run(seed)
        assert outcome.results["c"].status == "ok", (seed, outcome.results["c"])
        assert outcome.results["collector"].value == want, seed
        crashed += outcome.report.crashes > 0
    assert crashed > 10  # the seeds did crash it
