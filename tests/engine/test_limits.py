"""Step limits: permits bound concurrency and rate; priority first, fairness keys in weighted turns."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fusee
from tests.helpers import crash_in_process

RUNNING = {"now": 0, "most": 0}
ORDER: list[str] = []
RELEASE: dict[str, asyncio.Event] = {}


async def hold(tag: str) -> str:
    RUNNING["now"] += 1
    RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    ORDER.append(tag)
    try:
        ev = RELEASE.get(tag)
        if ev is not None:
            await ev.wait()
        else:
            await asyncio.sleep(0.001)
    finally:
        RUNNING["now"] -= 1
    return tag


@fusee.workflow("limited")
async def limited(ctx: fusee.Ctx, spec: list[Any]) -> list[str]:
    """spec: [tag, priority, fairness key] per step, all started at once."""
    return list(await asyncio.gather(*(
        ctx.step(f"s-{tag}", hold, tag, limit="svc", priority=prio, fairness_key=key)
        for tag, prio, key in spec
    )))


@fusee.workflow("one")
async def one(ctx: fusee.Ctx, spec: list[Any]) -> str:
    tag, prio, key = spec
    return str(await ctx.step("s", hold, tag, limit="svc", priority=prio, fairness_key=key))


@fusee.workflow("unknown")
async def unknown(ctx: fusee.Ctx) -> str:
    try:
        await ctx.step("s", lambda: 1, limit="nope")
    except fusee.UnknownLimit as e:
        return f"{e.name}: {e}"
    return "ran"


@fusee.workflow("plain")
async def plain(ctx: fusee.Ctx) -> str:
    return "done"


FLAKY: list[int] = []


def flaky(info: fusee.StepInfo) -> int:
    FLAKY.append(info.attempt)
    if info.attempt < 3:
        raise ConnectionError("try again")
    return info.attempt


@fusee.workflow("retrying")
async def retrying(ctx: fusee.Ctx) -> int:
    return int(await ctx.step("f", flaky, limit="svc", retry=fusee.Retry(attempts=5, initial="1ms", jitter=0)))


@pytest.fixture(autouse=True)
def _clean() -> None:
    RUNNING.update(now=0, most=0)
    ORDER.clear()
    RELEASE.clear()
    FLAKY.clear()


async def wait_until(cond: Any) -> None:
    for _ in range(5000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached")


async def test_concurrency_is_never_exceeded() -> None:
    limits = [fusee.Limit("svc", concurrency=3)]
    async with fusee.Engine.open(workflows=[limited], limits=limits) as engine:
        runs = [await engine.start(limited, f"r{i}", [[f"{i}-{j}", 0, None] for j in range(20)]) for i in range(5)]
        for r in runs:
            assert len(await r.result()) == 20
        assert RUNNING["most"] == 3
        assert engine.limits()["svc"] == fusee.LimitStatus("svc", 3, None, 0, 0)


async def test_priority_first_then_weighted_turns_per_fairness_key() -> None:
    limits = [fusee.Limit("svc", concurrency=1, weights={"a": 2})]
    async with fusee.Engine.open(workflows=[limited, one], limits=limits) as engine:
        RELEASE["blocker"] = asyncio.Event()
        first = await engine.start(one, "blocker", ["blocker", 0, None])
        await wait_until(lambda: ORDER == ["blocker"])
        spec = [[f"a{i}", 0, "a"] for i in range(6)] + [[f"b{i}", 0, "b"] for i in range(3)]
        spec += [["urgent", 5, "c"]]
        run = await engine.start(limited, "r", spec)
        await wait_until(lambda: engine.limits()["svc"].waiting == 10)
        status = engine.limits()["svc"]
        assert (status.in_use, status.waiting) == (1, 10)
        RELEASE["blocker"].set()
        assert await first.result() == "blocker"
        await run.result()
        assert ORDER == ["blocker", "urgent", "a0", "a1", "b0", "a2", "a3", "b1", "a4", "a5", "b2"]


async def test_set_limit_resizes_at_run_time_and_unknown_names_are_typed_errors() -> None:
    limits = [fusee.Limit("svc", concurrency=1)]
    async with fusee.Engine.open(workflows=[limited, unknown], limits=limits) as engine:
        for i in range(4):
            RELEASE[f"t{i}"] = asyncio.Event()
        run = await engine.start(limited, "r", [[f"t{i}", 0, None] for i in range(4)])
        await wait_until(lambda: engine.limits()["svc"].waiting == 3)
        new = engine.set_limit("svc", concurrency=3)
        assert new == fusee.Limit("svc", concurrency=3)
        await wait_until(lambda: RUNNING["now"] == 3)
        assert engine.limits()["svc"].in_use == 3
        for ev in RELEASE.values():
            ev.set()
        await run.result()
        assert RUNNING["most"] == 3
        with pytest.raises(fusee.UnknownLimit):
            engine.set_limit("nope", concurrency=1)
        with pytest.raises(ValueError):
            engine.set_limit("svc", concurrency=0)
        assert (await engine.execute(unknown, "u")).startswith("nope: ctx.step names the limit 'nope'")


async def test_per_second_holds_steps_back_until_tokens_refill() -> None:
    # 0.1 per second: the first token is 9 s away, so the steps all wait; raising the
    # rate through set_limit lets them through. (The exact spacing of grants is tested
    # in virtual time in tests/test_limits.py.)
    limits = [fusee.Limit("svc", per_second=0.1)]
    async with fusee.Engine.open(workflows=[limited], limits=limits) as engine:
        run = await engine.start(limited, "r", [[f"t{i}", 0, None] for i in range(3)])
        await wait_until(lambda: engine.limits()["svc"].waiting == 3)
        assert ORDER == [] and engine.limits()["svc"].in_use == 0
        engine.set_limit("svc", per_second=1000)
        assert sorted(await run.result()) == ["t0", "t1", "t2"]


async def test_a_retrying_step_gives_its_permit_back_between_attempts() -> None:
    limits = [fusee.Limit("svc", concurrency=1)]
    async with fusee.Engine.open(workflows=[retrying], limits=limits) as engine:
        assert await engine.execute(retrying, "r") == 3
        assert FLAKY == [1, 2, 3]
        assert engine.limits()["svc"].in_use == 0


async def test_a_cancelled_waiter_takes_no_permit() -> None:
    limits = [fusee.Limit("svc", concurrency=1)]
    async with fusee.Engine.open(workflows=[one], limits=limits) as engine:
        RELEASE["holder"] = asyncio.Event()
        holder = await engine.start(one, "holder", ["holder", 0, None])
        await wait_until(lambda: ORDER == ["holder"])
        waiter = await engine.start(one, "waiter", ["waiter", 0, None])
        await wait_until(lambda: engine.limits()["svc"].waiting == 1)
        await waiter.cancel()
        with pytest.raises(fusee.WorkflowCancelled):
            await waiter.result()
        RELEASE["holder"].set()
        await holder.result()
        await wait_until(lambda: engine.limits()["svc"] == fusee.LimitStatus("svc", 1, None, 0, 0))
        assert ORDER == ["holder"]


def test_limits_are_checked_when_declared() -> None:
    with pytest.raises(ValueError):
        fusee.Limit("x", concurrency=0)
    with pytest.raises(ValueError):
        fusee.Limit("x", per_second=float("nan"))
    with pytest.raises(ValueError):
        fusee.Limit("x", weights={"a": 0})
    with pytest.raises(TypeError):
        fusee.Limit("")


async def test_two_limits_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="two limits"):
        await fusee.Engine.open(limits=[fusee.Limit("x"), fusee.Limit("x")])


async def test_runs_waiting_only_for_permits_are_parked_and_woken_by_their_grant() -> None:
    limits = [fusee.Limit("svc", concurrency=1)]
    async with fusee.Engine.open(workflows=[one], limits=limits, park_after=0.01) as engine:
        RELEASE["holder"] = asyncio.Event()
        holder = await engine.start(one, "holder", ["holder", 0, None])
        await wait_until(lambda: ORDER == ["holder"])
        waiters = [await engine.start(one, f"w{i}", [f"w{i}", 0, f"k{i % 2}"]) for i in range(6)]
        # Every waiter's run leaves memory while it waits (the holder's stays: its step runs).
        await wait_until(lambda: engine.stats["parked"] >= 6)
        assert engine.limits()["svc"].waiting == 6
        RELEASE["holder"].set()
        assert await holder.result() == "holder"
        assert [await w.result() for w in waiters] == [f"w{i}" for i in range(6)]
        assert ORDER == ["holder", "w0", "w1", "w2", "w3", "w4", "w5"]
        assert RUNNING["most"] == 1
        await wait_until(lambda: engine.limits()["svc"] == fusee.LimitStatus("svc", 1, None, 0, 0))


async def test_steps_waiting_at_a_close_wait_again_after_the_reopen(tmp_path: Any) -> None:
    closed = [fusee.Limit("svc", per_second=0.001)]  # hands out nothing while the engine runs
    async with fusee.Engine.open(tmp_path, workflows=[limited], limits=closed) as engine:
        run = await engine.start(limited, "r", [[f"t{i}", 0, None] for i in range(3)])
        await wait_until(lambda: engine.limits()["svc"].waiting == 3)
        assert run.describe().status == "running"
    assert ORDER == []
    async with fusee.Engine.open(tmp_path, workflows=[limited], limits=[fusee.Limit("svc", concurrency=2)]) as engine:
        assert await engine.get("r").result() == ["t0", "t1", "t2"]
        assert RUNNING["most"] == 2


async def test_steps_waiting_at_a_checkpoint_wait_again_after_a_crash(tmp_path: Any) -> None:
    # A checkpoint taken while a loaded run waits only for permits keeps that run parked at
    # the next open: it must come back at once to wait again (permits are not journaled).
    closed = [fusee.Limit("svc", per_second=0.001)]  # hands out nothing while the engine runs
    engine = await fusee.Engine.open(tmp_path, workflows=[limited, plain], limits=closed, checkpoint_every=1)
    run = await engine.start(limited, "r", [[f"t{i}", 0, None] for i in range(3)])
    await wait_until(lambda: engine.limits()["svc"].waiting == 3)
    taken = engine.stats["checkpoints"]
    # Another run's records bring a checkpoint that sees "r" loaded and waiting.
    assert await engine.execute(plain, "p") == "done"
    await wait_until(lambda: engine.stats["checkpoints"] > taken)
    assert run.describe().status == "running"
    await crash_in_process(engine)  # no close, no final checkpoint
    assert ORDER == []
    async with fusee.Engine.open(tmp_path, workflows=[limited, plain], limits=[fusee.Limit("svc", concurrency=2)]) as engine:
        # The run asks for its permits again (before the fix it stayed parked for good).
        await wait_until(lambda: engine.limits()["svc"].waiting + engine.limits()["svc"].in_use > 0)
        assert await engine.get("r").result() == ["t0", "t1", "t2"]
        assert RUNNING["most"] == 2
