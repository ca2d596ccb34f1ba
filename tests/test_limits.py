"""The limiter's rate in virtual time: a burst of ``per_second`` tokens, then one grant per 1/rate."""

from __future__ import annotations

import asyncio

from fusee.limits import Limit, Limiter
from fusee.sim.loop import SimLoop


def grant_times(per_second: float, steps: int) -> list[float]:
    loop = SimLoop()
    limiter = Limiter(loop, loop.time)
    limiter.configure([Limit("svc", per_second=per_second)])
    times: list[float] = []

    async def step(i: int) -> None:
        req = limiter.request("svc", 0, None)
        assert await limiter.acquire(("step", i), ("wf", "run", i), req, lambda: True)
        times.append(loop.time())
        limiter.release(("step", i))

    async def main() -> None:
        await asyncio.gather(*(step(i) for i in range(steps)))

    loop.run_until_complete(main())
    loop.close()
    return times


def test_a_burst_of_the_rate_then_one_grant_per_interval() -> None:
    times = grant_times(20, 30)
    assert times[:20] == [0.0] * 20
    for k, t in enumerate(times[20:], start=1):
        assert abs(t - k / 20) < 1e-9, (k, t)


def test_a_rate_below_one_waits_for_the_first_whole_token() -> None:
    times = grant_times(0.5, 3)
    assert [round(t, 9) for t in times] == [1.0, 3.0, 5.0]


def test_a_waiter_that_stopped_waiting_costs_its_key_no_turn() -> None:
    # Seed 18351: a cancelled waiter at the head of its key's queue was dropped as if
    # granted, and its key's turn passed on: the key's next waiter waited through one
    # more permit than the fairness bound allows.
    loop = SimLoop()
    limiter = Limiter(loop, loop.time)
    limiter.configure([Limit("svc", concurrency=1)])
    limiter.grants = []
    order: list[str] = []
    cancelled: set[str] = set()

    async def step(tag: str) -> None:
        req = limiter.request("svc", 0, tag[0])
        if await limiter.acquire(tag, ("wf", "run", hash(tag)), req, lambda: tag not in cancelled):
            order.append(tag)
            await asyncio.sleep(0.01)
            limiter.release(tag)

    async def main() -> None:
        tasks = [asyncio.ensure_future(step(tag)) for tag in ["a0", "a1", "a2", "b0", "b1", "b2", "c0", "c1"]]
        await asyncio.sleep(0.005)  # a0 holds the permit; the rest wait
        cancelled.add("b0")
        await asyncio.gather(*tasks)

    loop.run_until_complete(main())
    loop.close()
    assert order == ["a0", "a1", "b1", "c0", "a2", "b2", "c1"]
    from fusee.sim import checkers

    assert checkers.check_limit_fairness([(1, g) for g in limiter.grants], {}) == []
