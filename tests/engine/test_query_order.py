"""Answers to one run's queries leave in the order they were asked, an ended run's too (sim
seeds 2269 and 356): a client never sees a newer state and then an older one.

Bounded, unlike the poller it replaces: a fixed number of queries per run, asked in bursts
while the run advances and ends, each one awaited."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

import fusee

total_q = fusee.query("total", int)
add = fusee.update("add", int, int)
close = fusee.signal("close")
ADDS = 30
#: Queries asked per turn of the loop, and in all per run (asked while it runs, then after).
BURST = 20
QUERIES = 2_000


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx) -> int:
    state = {"total": 0}
    ctx.on_query(total_q, lambda: state["total"])

    async def apply(v: int) -> int:
        state["total"] += await ctx.step("apply", lambda: v)
        return state["total"]

    ctx.on_update(add, apply)
    await ctx.wait_for(close)
    return state["total"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["memory", "inline", "pipeline", "background"])
async def test_answers_around_the_end_never_go_back(where: str, tmp_path: Path) -> None:
    path, flush = (None, None) if where == "memory" else (tmp_path, where)
    async with fusee.Engine.open(path, workflows=[tally], flush=flush, park_after=None) as engine:
        for n in range(3):
            run = await engine.start(tally, f"t-{n}")
            answers: list[int] = []  # in the order the answers left
            asked: list[asyncio.Task[int]] = []

            def ask(run: Any = run, answers: list[int] = answers, asked: list[Any] = asked) -> None:
                t: asyncio.Task[int] = asyncio.ensure_future(run.query(total_q))
                t.add_done_callback(lambda t: answers.append(t.result()))
                asked.append(t)

            async def poll(run_done: asyncio.Future[Any], asked: list[Any] = asked) -> None:
                # Bursts of overlapping queries until the run ended and a last burst was asked
                # (its answers come from the ended run), or the bound is reached.
                while len(asked) < QUERIES:
                    ended = run_done.done()
                    for _ in range(BURST):
                        ask()
                    if ended:
                        return
                    await asyncio.sleep(0)

            result = asyncio.ensure_future(run.result())
            poller = asyncio.ensure_future(poll(result))
            for i in range(1, ADDS + 1):
                await run.update(add, i)
            await run.signal(close)
            final = await asyncio.wait_for(result, 30)
            await asyncio.wait_for(poller, 30)
            await asyncio.wait_for(asyncio.gather(*asked), 30)
            assert final == ADDS * (ADDS + 1) // 2
            went_back = [(a, b) for a, b in itertools.pairwise(answers) if b < a]
            assert not went_back, f"an answer showed an older state than one that left before it: {went_back[:3]}"
            assert len(answers) == len(asked) <= QUERIES + BURST
            if len(asked) < QUERIES:
                assert answers[-1] == final
