"""Debounce and batch windows: receipts, one window per event, windows of a key in order."""

from __future__ import annotations

import dataclasses

import pytest

import fusee
from fusee.testing import TestEngine

got: list[tuple[str, list[int]]] = []


@fusee.workflow("digest", debounce=fusee.Debounce(period="5s", max_wait="1m"))
async def digest(ctx: fusee.Ctx, events: list[int]) -> int:
    got.append((ctx.workflow_id, events))
    return sum(events)


@fusee.workflow("bulk", batch=fusee.Batch(max_size=3, max_delay="2s", continue_every=4, dedup_memory=5))
async def bulk(ctx: fusee.Ctx, events: list[int]) -> int:
    got.append((ctx.workflow_id, events))
    await ctx.sleep("slow", "10s")  # the next window waits for this one
    got.append((ctx.workflow_id, []))
    return len(events)


@dataclasses.dataclass
class Click:
    page: str


@fusee.workflow("clicks", batch=fusee.Batch(max_size=2, max_delay="1s"))
async def clicks(ctx: fusee.Ctx, events: list[Click]) -> list[str]:
    return [c.page for c in events]


@fusee.workflow("plain")
async def plain(ctx: fusee.Ctx, n: int) -> int:
    return n


@pytest.fixture(autouse=True)
def _clear() -> None:
    got.clear()


async def test_debounce_runs_once_the_events_pause_and_receipts_name_the_window() -> None:
    async with TestEngine(workflows=[digest], skip_time=False) as env:
        receipts = []
        for i in range(3):
            receipts.append(await env.enqueue(digest, "ann", i, event_id=f"e{i}"))
            await env.skip("3s")  # under the 5 s period: the window stays open
        assert receipts == [fusee.Receipt("digest:ann#0", i) for i in range(3)]
        assert got == []
        await env.skip("5s")
        await env.until(lambda: len(got) == 1)
        assert got == [("digest:ann#0", [0, 1, 2])]
        await env.until(lambda: any(x.workflow_id == "digest:ann#0" for x in env.runs()))
        assert await env.get("digest:ann#0").result() == 3
        # The same event ID again: the same receipt, nothing delivered twice.
        assert await env.enqueue(digest, "ann", 1, event_id="e1") == receipts[1]
        assert (await env.enqueue(digest, "ann", 9)).window_id == "digest:ann#1"


async def test_debounce_max_wait_caps_a_window_that_never_pauses() -> None:
    async with TestEngine(workflows=[digest], skip_time=False) as env:
        for i in range(25):
            await env.enqueue(digest, "bob", i)
            await env.skip("3s")
        await env.until(lambda: len(got) >= 1)
        window, events = got[0]
        assert window == "digest:bob#0" and events == list(range(len(events))) and 19 <= len(events) <= 21


async def test_batches_fill_run_in_order_and_survive_continue_as_new() -> None:
    async with TestEngine(workflows=[bulk]) as env:
        receipts = [await env.enqueue(bulk, "k", i, event_id=f"e{i}") for i in range(10)]
        assert [(r.window_id, r.position) for r in receipts] == [
            (f"bulk:k#{i // 3}", i % 3) for i in range(10)
        ]
        # A repeat after the coordinator continued as new (every 4 events): the same receipt.
        assert await env.enqueue(bulk, "k", 8, event_id="e8") == receipts[8]
        await env.until(lambda: len(got) == 8, timeout=20)
        assert got == [
            ("bulk:k#0", [0, 1, 2]), ("bulk:k#0", []), ("bulk:k#1", [3, 4, 5]), ("bulk:k#1", []),
            ("bulk:k#2", [6, 7, 8]), ("bulk:k#2", []), ("bulk:k#3", [9]), ("bulk:k#3", []),
        ]
        assert env.describe("fusee:window:bulk:k").run_id > 1
        # Two keys are independent.
        await env.enqueue(bulk, "other", 1)
        assert env.describe("fusee:window:bulk:other").status == "running"


async def test_typed_events_and_bad_calls() -> None:
    async with TestEngine(workflows=[clicks, plain]) as env:
        r = await env.enqueue(clicks, "u", Click("home"))
        await env.enqueue(clicks, "u", Click("cart"))
        await env.until(lambda: any(x.workflow_id == r.window_id for x in env.runs()))
        assert await env.get(r.window_id).result() == ["home", "cart"]
        with pytest.raises(fusee.NotWindowed, match="debounce"):
            await env.enqueue(plain, "u", 1)
        with pytest.raises(fusee.SerializationError):
            await env.enqueue(clicks, "u", object())
    with pytest.raises(TypeError, match="not both"):
        fusee.workflow("x", debounce=fusee.Debounce("1s"), batch=fusee.Batch(1, "1s"))
    with pytest.raises(ValueError, match="max_size"):
        fusee.Batch(max_size=0, max_delay="1s")
