"""Micro-benchmark of the per-run workflow loop (``fusee.runtime.wfloop``).

Measures one await, in workflow code, of a Future that the host resolves from
outside, followed by the host draining the loop until quiescent: the cost the
loop adds to every operation a workflow awaits.

    .venv/bin/python bench/wfloop.py [N]
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from fusee.runtime.wfloop import WorkflowLoop


def bench_await(n: int) -> float:
    """µs per (create future in workflow code, await it, host set_result + drain)."""
    loop = WorkflowLoop("bench")
    pending: list[asyncio.Future[Any]] = []

    async def workflow() -> int:
        total = 0
        for _ in range(n):
            fut = loop.create_future()
            pending.append(fut)
            total += await fut
        return total

    task = loop.create_task(workflow())
    loop.run_until_quiescent()
    start = time.perf_counter()
    for _ in range(n):
        pending.pop().set_result(1)
        loop.run_until_quiescent()
    elapsed = time.perf_counter() - start
    assert task.result() == n
    loop.close()
    return elapsed / n * 1e6


def bench_gather(n: int, width: int = 10) -> float:
    """µs per branch of gather(width branches), each awaiting one host-resolved future."""
    loop = WorkflowLoop("bench")
    pending: list[asyncio.Future[Any]] = []

    async def branch() -> int:
        fut = loop.create_future()
        pending.append(fut)
        result: int = await fut
        return result

    async def workflow() -> int:
        total = 0
        for _ in range(n):
            total += sum(await asyncio.gather(*(branch() for _ in range(width))))
        return total

    task = loop.create_task(workflow())
    loop.run_until_quiescent()
    start = time.perf_counter()
    for _ in range(n):
        batch = pending[:]
        pending.clear()
        for fut in batch:
            fut.set_result(1)
            loop.run_until_quiescent()
    elapsed = time.perf_counter() - start
    assert task.result() == n * width
    loop.close()
    return elapsed / (n * width) * 1e6


async def _inside_host(n: int) -> tuple[float, float]:
    return bench_await(n), bench_gather(n // 10)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    best_await = min(bench_await(n) for _ in range(3))
    best_gather = min(bench_gather(n // 10) for _ in range(3))
    hosted = min(asyncio.run(_inside_host(n)) for _ in range(3))
    print(f"await a host-resolved future + drain:       {best_await:6.2f} µs")
    print(f"gather branch (create task, await, finish): {best_gather:6.2f} µs")
    print(f"same two inside asyncio.run (host loop set): {hosted[0]:6.2f} µs, {hosted[1]:6.2f} µs")


if __name__ == "__main__":
    main()
