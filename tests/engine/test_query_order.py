"""Query answers around a run's end leave in the order they were asked (sim seed 356).

A query asked while the run ran reads the live state, then waits for that state
to be durable. A query asked after the run ended is answered by a replay of its
journal (its final state). The ended answer must wait for the live answers asked
before it, or a caller polling sees the final state and then an older one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.testing import TestEngine

total_q = fusee.query("total", int)
add = fusee.update("add", int, int)
close = fusee.signal("close")
ADDS = 40


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


def memory(tmp_path: Path) -> Any:
    return fusee.Engine.open(None, workflows=[tally])


def directory(tmp_path: Path) -> Any:
    return fusee.Engine.open(tmp_path / "e", workflows=[tally])


@asynccontextmanager
async def kit_engine(tmp_path: Path) -> AsyncIterator[Any]:
    async with TestEngine(workflows=[tally], skip_time=False) as env:
        yield env


ENGINES: list[Callable[[Path], Any]] = [memory, directory, kit_engine]


ROUNDS = 5
#: Queries asked per turn of the loop: enough that some still wait when the run ends.
BURST = 20


@pytest.mark.parametrize("opened", ENGINES, ids=["memory", "directory", "TestEngine"])
async def test_answers_around_the_end_never_go_back(opened: Callable[[Path], Any], tmp_path: Path) -> None:
    async with opened(tmp_path) as engine:
        for n in range(ROUNDS):
            run = await engine.start(tally, f"t-{n}")
            answers: list[int] = []  # in the order the answers arrived
            stop = asyncio.Event()

            async def ask(run: Any = run, answers: list[int] = answers) -> None:
                answers.append(await run.query(total_q))

            async def poll(stop: asyncio.Event = stop, ask: Any = ask) -> None:
                # A tight loop of overlapping queries, each waiting for its state to be durable.
                tasks: list[asyncio.Task[None]] = []
                while not stop.is_set():
                    tasks.extend(asyncio.create_task(ask()) for _ in range(BURST))
                    await asyncio.sleep(0)
                await asyncio.gather(*tasks)

            poller = asyncio.create_task(poll())
            for i in range(1, ADDS + 1):
                await run.update(add, i)
            await run.signal(close)
            final = await run.result()
            stop.set()
            # Asked once it ended, while answers asked before may still wait for durability.
            after = [asyncio.create_task(run.query(total_q)) for _ in range(20)]
            for t in after:
                t.add_done_callback(lambda t, answers=answers: answers.append(t.result()))
            await poller
            await asyncio.gather(*after)
            assert final == ADDS * (ADDS + 1) // 2
            assert [t.result() for t in after] == [final] * len(after)
            went_back = [(a, b) for a, b in itertools.pairwise(answers) if b < a]
            assert not went_back, f"an answer showed an older state than one answered before it: {went_back[:3]}"
            assert answers[-1] == final
