"""Type checkers see the flow API's types (schedules, windows): ``make typecheck`` runs mypy here."""

from __future__ import annotations

from typing import assert_type

import fusee


@fusee.workflow("digest", debounce=fusee.Debounce(period="5s", max_wait="1m"))
async def digest(ctx: fusee.Ctx, events: list[str]) -> int:
    return len(events)


@fusee.workflow("bulk", batch=fusee.Batch(max_size=100, max_delay="2s"))
async def bulk(ctx: fusee.Ctx, events: list[int]) -> int:
    return sum(events)


async def use(engine: fusee.Engine) -> None:
    await engine.schedule("nightly", digest, ["x"], cron="0 2 * * *", timezone="Europe/Paris")
    receipt = await engine.enqueue(digest, "user-1", "liked", event_id="e1")
    assert_type(receipt, fusee.Receipt)
    assert_type(receipt.window_id, str)
    assert_type(receipt.position, int)
    info = await engine.pause_schedule("nightly")
    assert_type(info, fusee.ScheduleInfo)
    for s in engine.schedules():
        assert_type(s, fusee.ScheduleInfo)
    await engine.delete_schedule("nightly")
