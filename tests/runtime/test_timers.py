"""The timer queue: entries come due in order, with one host timer for all of them."""

from __future__ import annotations

import asyncio

from fusee.runtime.timers import FIRE, PARK, TimerQueue


def test_entries_come_due_in_order_and_late_ones_wait() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        seen: list[tuple[int, str, int]] = []

        def now_ms() -> int:
            return int((loop.time() - start) * 1000)

        q = TimerQueue(loop, now_ms, lambda kind, wid, run, seq, extra: seen.append((kind, wid, seq)))
        q.push(30, FIRE, "b", 1, 2)
        q.push(10, FIRE, "a", 1, 1)
        q.push(10, PARK, "a", 1, 0)
        q.push(10_000, FIRE, "late", 1, 9)
        while len(seen) < 3:
            await asyncio.sleep(0.005)
        assert seen == [(FIRE, "a", 1), (PARK, "a", 0), (FIRE, "b", 2)]
        assert len(q) == 1  # the late one is still waiting
        q.close()

    asyncio.run(main())


def test_a_closed_queue_dispatches_nothing() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[int] = []
        q = TimerQueue(loop, lambda: 0, lambda *a: seen.append(1))
        q.push(0, FIRE, "a", 1)
        q.close()
        await asyncio.sleep(0.02)
        assert seen == []

    asyncio.run(main())


def test_a_mass_wake_comes_in_batches_with_the_loop_turning_between() -> None:
    """10,000 entries due at once: the loop runs other callbacks (a flush starting, an
    acknowledgement) between batches instead of after all of them."""
    from fusee.runtime.timers import BATCH

    async def main() -> None:
        loop = asyncio.get_running_loop()
        order: list[str] = []
        q = TimerQueue(loop, lambda: 100, lambda *a: order.append("wake"))
        for i in range(10_000):
            q.push(50, FIRE, f"w{i}", 1)

        def other() -> None:
            order.append("other")

        # A callback made ready by the first batch (as a flush's start would be).
        first = True

        def dispatch(*a: object) -> None:
            nonlocal first
            order.append("wake")
            if first:
                first = False
                loop.call_soon(other)

        q._dispatch = dispatch
        while len(order) < 10_001:
            await asyncio.sleep(0)
        assert order.index("other") == BATCH  # right after the first batch
        assert len(q) == 0
        q.close()

    asyncio.run(main())
