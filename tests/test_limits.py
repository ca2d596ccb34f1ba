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
