"""Where synchronous step functions run: measured, then on the loop's thread or in the pool."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any

import pytest

import fusee
from fusee.runtime.syncsteps import (
    DEMOTE_ABOVE_S,
    PROBES,
    PROMOTE_BELOW_S,
    REPROBE_AFTER,
    STRIKE_MEMORY,
    SyncStepPolicy,
)


def cheap(x: int) -> int:
    return x + 1


def policy(mode: bool | None = None) -> SyncStepPolicy:
    return SyncStepPolicy(mode, time.perf_counter)


def test_a_function_runs_inline_once_its_probes_were_fast() -> None:
    p = policy()
    for _ in range(PROBES):
        assert not p.runs_inline(cheap)
        p.observe(cheap, PROMOTE_BELOW_S / 10, inline=False)
    assert p.runs_inline(cheap)


def test_one_slow_probe_keeps_it_pooled_until_it_is_probed_again() -> None:
    p = policy()
    p.observe(cheap, PROMOTE_BELOW_S * 2, inline=False)
    for _ in range(REPROBE_AFTER + PROBES):
        assert not p.runs_inline(cheap)
        p.observe(cheap, PROMOTE_BELOW_S / 10, inline=False)
    assert p.runs_inline(cheap)


def promoted(p: SyncStepPolicy, fn: Any = cheap) -> None:
    for _ in range(PROBES):
        p.observe(fn, 0.0, inline=False)
    assert p.runs_inline(fn)


def test_an_inline_execution_that_blocked_is_probed_in_the_pool_and_a_slow_probe_demotes() -> None:
    p = policy()
    promoted(p)
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=True)
    assert not p.runs_inline(cheap)  # the next execution is a probe in the pool
    assert p.demoted == 0
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=False)
    assert p.demoted == 1
    # Each demotion doubles the pooled spell before the next probes.
    spell = 0
    while not p.runs_inline(cheap):
        p.observe(cheap, 0.0, inline=False)
        spell += 1
    assert spell == 2 * REPROBE_AFTER + PROBES
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=True)
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=False)
    spell = 0
    while not p.runs_inline(cheap):
        p.observe(cheap, 0.0, inline=False)
        spell += 1
    assert spell == 4 * REPROBE_AFTER + PROBES


def test_a_strike_a_quick_probe_excuses_keeps_the_function_inline_and_a_second_demotes() -> None:
    """A loaded machine deschedules the loop's thread mid-call: a cheap function must not pay the pool for it."""
    p = policy()
    promoted(p)
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=True)  # descheduled mid-call
    assert not p.runs_inline(cheap)
    p.observe(cheap, PROMOTE_BELOW_S / 10, inline=False)
    assert p.runs_inline(cheap) and p.demoted == 0 and p.cleared == 1
    for _ in range(STRIKE_MEMORY - 1):
        p.observe(cheap, 0.0, inline=True)
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=True)  # within the strike's memory: demoted at once
    assert not p.runs_inline(cheap) and p.demoted == 1


def test_a_strike_is_forgotten_after_its_memory() -> None:
    p = policy()
    promoted(p)
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=True)
    p.observe(cheap, 0.0, inline=False)
    for _ in range(STRIKE_MEMORY):
        p.observe(cheap, 0.0, inline=True)
    p.observe(cheap, DEMOTE_ABOVE_S * 3, inline=True)  # a first strike again: probed, not demoted
    assert not p.runs_inline(cheap) and p.demoted == 0
    p.observe(cheap, 0.0, inline=False)
    assert p.runs_inline(cheap) and p.cleared == 2


def test_closures_and_partials_of_one_function_are_learned_together() -> None:
    def make(i: int) -> Any:
        return lambda: i  # one lambda expression: a new function object per call, one code object

    p = policy()
    for i in range(PROBES):
        p.observe(make(i), 0.0, inline=False)
    assert p.runs_inline(make(99))
    assert not p.runs_inline(lambda: 7)  # another expression: measured on its own
    for _ in range(PROBES):
        p.observe(functools.partial(cheap, 1), 0.0, inline=False)
    assert p.runs_inline(functools.partial(cheap, 2))


def test_engine_modes_and_declarations_win_over_measurement() -> None:
    assert policy(True).runs_inline(cheap)
    assert not policy(False).runs_inline(cheap)

    @fusee.step(blocking=True)
    def waits_on_io() -> int:
        return 1

    @fusee.step(blocking=False)
    def pure() -> int:
        return 2

    p = policy()
    for _ in range(PROBES):
        p.observe(waits_on_io.__wrapped__, 0.0, inline=False)  # type: ignore[attr-defined]
    assert not p.runs_inline(waits_on_io.__wrapped__)  # type: ignore[attr-defined]
    assert p.runs_inline(pure.__wrapped__)  # type: ignore[attr-defined]
    assert not policy(False).runs_inline(pure.__wrapped__)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="blocking must be"):
        fusee.step(blocking="yes")  # type: ignore[call-overload]


THREADS: list[tuple[str, bool]] = []


def note_thread(kind: str) -> int:
    THREADS.append((kind, threading.current_thread() is threading.main_thread()))
    if kind == "slow" and len([k for k, _ in THREADS if k == "slow"]) > PROBES:
        time.sleep(DEMOTE_ABOVE_S * 5)  # fast in its probes, then it blocks (a cache miss, say)
    return len(THREADS)


@fusee.workflow("sync_mix")
async def sync_mix(ctx: fusee.Ctx, n: int) -> int:
    for _ in range(n):
        await ctx.step("cheap", lambda: note_thread("cheap"))
    for _ in range(n):
        await ctx.step("slow", lambda: note_thread("slow"))
    return n


async def test_default_engine_runs_cheap_functions_on_the_loop_and_blocking_ones_in_the_pool(tmp_path: Any) -> None:
    THREADS.clear()
    async with fusee.Engine.open(tmp_path, workflows=[sync_mix]) as engine:
        h = await engine.start(sync_mix, "mix", 20)
        assert await h.result() == 20
        stats = engine.stats
    cheap_runs = [main for kind, main in THREADS if kind == "cheap"]
    slow_runs = [main for kind, main in THREADS if kind == "slow"]
    assert cheap_runs[:PROBES] == [False] * PROBES  # probes in the pool
    # Then on the loop's thread (a loaded machine may make a probe look slow: most, not all).
    assert sum(cheap_runs[PROBES:]) >= 10
    # The slow one blocked the loop once, inline; its probe in the pool was slow too, so it
    # went back to the pool for good.
    assert slow_runs[:PROBES] == [False] * PROBES
    if True in slow_runs:  # (a loaded machine may have made a probe look slow: never inline then)
        first = slow_runs.index(True)
        assert not slow_runs[first + 1]
    assert slow_runs[PROBES + 2:].count(True) <= PROBES + 1
    assert not slow_runs[-1]
    assert stats["sync_demoted"] >= 1


def logged(fn: Any) -> Any:
    """A decorator as users write one: every function it wraps shares the wrapper's code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@logged
def with_info(info: fusee.StepInfo, x: int) -> str:
    return f"{info.name}:{x}"


@logged
def without_info(x: int) -> str:
    return f"plain:{x}"


@fusee.workflow("decorated")
async def decorated(ctx: fusee.Ctx) -> list[str]:
    out = []
    for i in range(3):
        out.append(await ctx.step("a", with_info, i))
        out.append(await ctx.step("b", without_info, i))
    return out


async def test_functions_behind_one_decorator_keep_their_own_signatures() -> None:
    async with fusee.Engine.open(None, workflows=[decorated]) as engine:
        assert await engine.execute(decorated, "d") == ["a:0", "plain:0", "a:1", "plain:1", "a:2", "plain:2"]


async def quick(v: int) -> int:
    return v + 1  # returns without suspending: runs within its workflow's turn


@fusee.workflow("then_sleep")
async def then_sleep(ctx: fusee.Ctx, inline: bool) -> int:
    v = 0
    for _ in range(PROBES + 2):
        v = await (ctx.step("cheap", lambda v=v: v + 1) if inline else ctx.step("quick", quick, v))
    await ctx.sleep("nap", "1h")
    return v


@pytest.mark.parametrize("inline", [True, False])
async def test_a_step_run_within_its_workflows_turn_is_durable_before_a_long_sleep(tmp_path: Any, inline: bool) -> None:
    """Regression: a step that ran at once (inline, or async without suspending) and a sleep
    right after it left their records unflushed until something else happened."""
    async with fusee.Engine.open(tmp_path, workflows=[then_sleep]) as engine:
        await engine.start(then_sleep, "ts", inline)
        deadline = time.monotonic() + 30
        # The code reached its sleep (its timer is journaled) ...
        while not any(type(r).__name__ == "Timer" for r in await engine.journal("ts")):
            assert time.monotonic() < deadline, "the run never reached its sleep"
            await asyncio.sleep(0.01)
        # ... and, with nothing else happening, everything it appended becomes durable.
        while engine.metrics().records_pending:
            assert time.monotonic() < deadline, f"records still pending: {engine.metrics().records_pending}"
            await asyncio.sleep(0.01)
        assert engine.describe("ts").status == "running"
        journal = await engine.journal("ts")
        assert sum(1 for r in journal if type(r).__name__ == "Step") == PROBES + 2


ENGINES: list[fusee.Engine] = []


def ask_engine(i: int) -> int:
    if i < PROBES + 1:
        return i  # cheap: promoted to the loop's thread
    # Then it waits for the engine's loop from its thread: only the pool can run that.
    return len(ENGINES[0].run_threadsafe(ENGINES[0].journal, "asks", timeout=30))


@fusee.workflow("asks")
async def asks(ctx: fusee.Ctx) -> list[int]:
    return [await ctx.step("ask", ask_engine, i) for i in range(PROBES + 3)]


async def test_a_step_that_calls_back_into_the_engine_moves_to_the_pool_instead_of_failing() -> None:
    ENGINES.clear()
    async with fusee.Engine.open(None, workflows=[asks]) as engine:
        ENGINES.append(engine)
        out = await asyncio.wait_for(engine.execute(asks, "asks"), 60)
        stats = engine.stats
        journal = await engine.journal("asks")
    assert out[: PROBES + 1] == list(range(PROBES + 1))
    assert all(n > 0 for n in out[PROBES + 1:])
    assert stats["sync_inline"] >= 1 and stats["sync_demoted"] == 1
    assert not [r for r in journal if type(r).__name__ == "Attempt"]  # no attempt failed for it


def test_a_function_blocking_the_loop_again_and_again_is_logged_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 25: a trivial lambda 'blocking the loop' was logged 20 times in 100 s."""
    import logging

    from fusee.runtime import syncsteps

    now = [1000.0]
    p = SyncStepPolicy(None, lambda: now[0])

    def demote(fn: Any) -> None:
        for _ in range(PROBES):
            p.observe(fn, PROMOTE_BELOW_S / 10, inline=False)
        p.observe(fn, DEMOTE_ABOVE_S * 2, inline=True)
        p.observe(fn, DEMOTE_ABOVE_S * 2, inline=False)  # the probe: slow too

    caplog.set_level(logging.DEBUG, logger="fusee")
    for i in range(20):
        demote(lambda i=i: i)  # a closure made anew each time, as a workflow's lambda is per run
        now[0] += 5.0
    info = [r for r in caplog.records if r.levelno == logging.INFO and "blocked the event loop" in r.getMessage()]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and "blocked the event loop" in r.getMessage()]
    assert len(info) == 1 and len(debug) == 19
    assert p.demoted == 20
    now[0] += getattr(syncsteps, "LOG_EVERY_S", 600)
    demote(lambda: 0)
    info = [r for r in caplog.records if r.levelno == logging.INFO and "blocked the event loop" in r.getMessage()]
    assert len(info) == 2
