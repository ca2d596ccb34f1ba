"""Type checkers see workflow, signal and handle types (``make typecheck`` runs mypy here).

Each ``type: ignore[...]`` marks a mistake mypy must catch: with
``warn_unused_ignores`` an ignore that is not needed fails the check, so a
lost error fails ``make test``. Also importable by pytest, which runs nothing.
"""

from __future__ import annotations

from typing import assert_type

import fusee

approve = fusee.signal("approve", bool)
assert_type(approve, fusee.SignalDef[bool])
status = fusee.query("status", int)
assert_type(status, fusee.QueryDef[int])
add = fusee.update("add", int)
assert_type(add, fusee.UpdateDef[int])


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, qty: int) -> str:
    ok = await ctx.wait_for(approve)
    return f"{qty} {ok}"


@fusee.workflow("ping")
async def ping(ctx: fusee.Ctx) -> int:
    return 1


assert_type(order, fusee.WorkflowDef[int, str])
assert_type(ping, fusee.WorkflowDef[None, int])


async def client(engine: fusee.Engine) -> None:
    run = await engine.start(order, "o-1", 3)
    assert_type(run, fusee.RunHandle[str])
    assert_type(await run.result(), str)
    assert_type(await engine.execute(ping, "p-1"), int)
    await engine.signal("o-1", approve, True)
    await run.signal(approve, False)
    assert_type(await engine.query("o-1", status), int)
    assert_type(await run.query(status), int)
    await engine.update("o-1", add, 2)
    await run.update(add, 3)

    await engine.start(order, "o-2", "three")  # type: ignore[misc]
    await engine.signal("o-1", approve, "yes")  # type: ignore[misc]
    await run.signal(approve, 1.5)  # type: ignore[misc]
    await engine.update("o-1", add, "two")  # type: ignore[misc]
    late: str = await run.query(status)  # type: ignore[arg-type]
    del late
    wrong: int = await run.result()  # type: ignore[assignment]
    del wrong


async def traced() -> None:
    async with fusee.Engine.open(telemetry=fusee.Telemetry(meter_provider=None, traces=False)) as engine:
        assert_type(engine, fusee.Engine)
    async with fusee.Engine.open(telemetry="on"):  # type: ignore[arg-type]
        pass
