"""The virtual-time loop: instant long sleeps, deterministic order, no threads."""

from __future__ import annotations

import asyncio
import random

import pytest

from fusee.sim.env import EPOCH_MS, SimEnv
from fusee.sim.loop import SimDeadlock, SimLoop, ThreadsForbidden


def test_day_long_sleep_is_instant_and_lands_exactly() -> None:
    loop = SimLoop(start=10.0)

    async def main() -> float:
        await asyncio.sleep(86400)
        await asyncio.sleep(3 * 86400 + 0.25)
        return asyncio.get_running_loop().time()

    got = loop.run_until_complete(main())
    # asyncio waits at most a day at a time: 1 + 4 jumps for 4.25 days, never a real wait or a poll.
    assert loop.clock_jumps == 5
    assert got == 10.0 + 4 * 86400 + 0.25
    assert loop.now == got


def test_timers_fire_in_due_order_then_fifo() -> None:
    loop = SimLoop()
    order: list[str] = []
    for name, when in [("c", 2.0), ("a", 1.0), ("b1", 1.5), ("b2", 1.5), ("b3", 1.5)]:
        loop.call_at(when, order.append, name)
    loop.call_soon(order.append, "now1")
    loop.call_soon(order.append, "now2")
    loop.run_until(5.0)
    assert order == ["now1", "now2", "a", "b1", "b2", "b3", "c"]
    assert loop.now == 5.0


def test_run_until_stops_at_t_and_resumes() -> None:
    loop = SimLoop()
    seen: list[float] = []

    async def ticker() -> None:
        for _ in range(10):
            await asyncio.sleep(1.0)
            seen.append(loop.time())

    task = loop.create_task(ticker())
    assert loop.run_until(3.5) == 3.5
    assert seen == [1.0, 2.0, 3.0]
    loop.run_until(100.0)
    assert seen == [float(i) for i in range(1, 11)]
    assert task.done()
    # Nothing left: the clock still moves to the requested time.
    assert loop.run_until(200.0) == 200.0


def test_stop_inside_a_callback_ends_run_until_early() -> None:
    loop = SimLoop()
    loop.call_at(2.0, loop.stop)
    fired: list[float] = []
    loop.call_at(3.0, lambda: fired.append(loop.time()))
    assert loop.run_until(10.0) == 2.0
    assert fired == []
    loop.run_until(10.0)
    assert fired == [3.0]


def test_deadlock_is_reported_not_hung() -> None:
    loop = SimLoop()

    async def main() -> None:
        await loop.create_future()

    with pytest.raises(SimDeadlock):
        loop.run_until_complete(main())


def test_threads_are_refused() -> None:
    loop = SimLoop()

    async def main() -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: 1)

    with pytest.raises(ThreadsForbidden):
        loop.run_until_complete(main())


def _trace(seed: int) -> list[tuple[float, int]]:
    loop = SimLoop()
    rng = random.Random(seed)
    out: list[tuple[float, int]] = []

    async def worker(i: int) -> None:
        for _ in range(20):
            await asyncio.sleep(rng.choice([0, 0.001, 0.5, 3600]))
            out.append((loop.time(), i))

    async def main() -> None:
        await asyncio.gather(*(worker(i) for i in range(8)))

    loop.run_until_complete(main())
    return out


def test_same_seed_same_interleaving() -> None:
    a, b = _trace(7), _trace(7)
    assert a == b
    assert _trace(8) != a


def test_bury_closes_a_dead_life_quietly() -> None:
    loop = SimLoop()
    closed: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(1e9)
        finally:
            closed.append("closed")

    loop.create_task(forever())
    loop.run_until(1.0)
    loop.bury()
    assert closed == ["closed"]


def test_sim_env_clock_io_and_withheld_results() -> None:
    loop = SimLoop(start=2.0)
    withhold = [False]
    env = SimEnv(object(), random.Random(1), loop, lambda: 0.003,
                 message_latency=lambda: 0.002, clock_offset_ms=5, after_io=lambda err: withhold[0])
    assert env.now_ms() == EPOCH_MS + 5 + 2000
    assert env.message_delay() == 0.002
    calls: list[float] = []

    async def main() -> int:
        return await env.run_io(lambda: calls.append(loop.time()) or 42)

    assert loop.run_until_complete(main()) == 42
    assert calls == [2.003]

    async def failing() -> None:
        def boom() -> None:
            raise OSError("fsync failed")
        await env.run_io(boom)

    with pytest.raises(OSError, match="fsync failed"):
        loop.run_until_complete(failing())

    withhold[0] = True
    fut = env.run_io(lambda: calls.append(loop.time()))
    loop.run_until(loop.time() + 1.0)
    assert len(calls) == 2  # the I/O happened...
    assert not fut.done()  # ...but its caller never hears of it
    assert env.io_withheld == 1
