"""Type checkers see SyncEngine's results as they see Engine's (mypy --strict runs here).

Each ``type: ignore[...]`` marks a mistake mypy must catch (``warn_unused_ignores``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, assert_type

import fusee

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
        wrong: int = run.result()  # type: ignore[assignment]
        late: str = run.query(status)  # type: ignore[assignment]
        print(wrong, late)
