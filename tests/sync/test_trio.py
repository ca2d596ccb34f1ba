"""A trio program on SyncEngine: starts, signals and awaits runs through trio.to_thread.run_sync."""

from __future__ import annotations

from pathlib import Path

import trio

import fusee
from tests.sync.hosts_app import approve, order


def test_trio_starts_signals_and_awaits_runs(tmp_path: Path) -> None:
    async def main() -> list[str]:
        with fusee.SyncEngine.open(tmp_path, workflows=[order]) as engine:
            results: dict[int, str] = {}

            async def one(i: int) -> None:
                h = await trio.to_thread.run_sync(engine.start, order, f"t{i}", f"t{i}")
                await trio.to_thread.run_sync(lambda: h.signal(approve, "trio"))
                results[i] = await trio.to_thread.run_sync(h.result)

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, i)
            return [results[i] for i in range(6)]

    assert trio.run(main) == [f"charge-t{i} by trio" for i in range(6)]
