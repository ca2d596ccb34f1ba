"""Type checkers see SyncEngine's results as they see Engine's (mypy --strict runs here).

Each ``type: ignore[...]`` marks a mistake mypy must catch (``warn_unused_ignores``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, assert_type

import fusee
from fusee.core import records as rec

approve = fusee.signal("approve", bool)
status = fusee.query("status", int)
add = fusee.update("add", int)


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, qty: int) -> str:
    ok = await ctx.wait_for(approve)
    return f"{qty} {ok}"


@fusee.workflow("ping")
async def ping(ctx: fusee.Ctx) -> int:
    return 1


@fusee.workflow("digest", debounce=fusee.Debounce(period="5s"))
async def digest(ctx: fusee.Ctx, events: list[str]) -> int:
    return len(events)


@dataclasses.dataclass
class Cart:
    items: list[str] = dataclasses.field(default_factory=list)


cart = fusee.object("cart", state=Cart)


@cart.exclusive
async def put(ctx: fusee.ObjectCtx[Cart], item: str) -> int:
    return len(ctx.state.items) + 1


@cart.shared
async def size(ctx: fusee.ObjectCtx[Cart]) -> int:
    return len(ctx.state.items)


def client(path: str) -> None:
    with fusee.SyncEngine.open(path, workflows=[order, ping]) as engine:
        assert_type(engine, fusee.SyncEngine)
        run = engine.start(order, "o-1", 3)
        assert_type(run, fusee.SyncRunHandle[str])
        assert_type(run.result(), str)
        assert_type(run.result(timeout=1.5), str)
        assert_type(engine.execute(ping, "p"), int)
        assert_type(engine.start("order", "o-2", 3), fusee.SyncRunHandle[Any])
        assert_type(engine.query("o-1", status), int)
        assert_type(run.query(status), int)
        engine.signal("o-1", approve, True)
        run.signal(approve, True)
        engine.signal("o-1", approve, "yes")  # type: ignore[misc]
        engine.start(order, "o-3", "three")  # type: ignore[misc]
        engine.update("o-1", add, "x")  # type: ignore[misc]
        assert_type(engine.describe("o-1"), fusee.RunSummary)
        assert_type(engine.list(), fusee.RunPage)
        assert_type(engine.read_stream("o-1", "out"), Iterator[Any])
        assert_type(engine.export("o-1", "o.fjnl"), int)
        assert_type(engine.get("o-1"), fusee.SyncRunHandle[Any])
        assert_type(engine.complete("token"), bool)
        # Every other operation of the list, with the async API's types.
        assert_type(engine.update_with_start(order, "o-4", 4, add, 1), Any)
        assert_type(engine.reset("o-1", before_step="charge"), fusee.SyncRunHandle[Any])
        assert_type(engine.fork("o-1", "o-5", before_position=0), fusee.SyncRunHandle[Any])
        assert_type(engine.cancel("o-1", "no stock"), None)
        assert_type(engine.terminate("o-1"), None)
        assert_type(engine.resume("o-1", by="ops"), None)
        assert_type(run.cancel(), None)
        assert_type(engine.call(put, "k", "tea"), int)
        assert_type(engine.call(size, "k"), int)
        engine.call(put, "k", 5)  # type: ignore[misc]
        assert_type(engine.object_state(cart, "k"), fusee.ObjectState[Cart])
        assert_type(engine.enqueue(digest, "user-1", "liked"), fusee.Receipt)
        engine.enqueue(digest, "user-1", 3)  # type: ignore[misc]
        assert_type(engine.schedule("nightly", digest, ["x"], cron="0 2 * * *"), None)
        engine.schedule("nightly", digest, "x", every="1h")  # type: ignore[misc]
        assert_type(engine.describe_schedule("nightly"), fusee.ScheduleInfo)
        assert_type(engine.pause_schedule("nightly"), fusee.ScheduleInfo)
        assert_type(engine.journal("o-1"), list[rec.Record])
        assert_type(engine.counts("status = 'running'"), dict[str, int])
        assert_type(engine.metrics(), fusee.Metrics)
        wrong: int = run.result()  # type: ignore[assignment]
        late: str = run.query(status)  # type: ignore[assignment]
        print(wrong, late)
