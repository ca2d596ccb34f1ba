"""``Engine.bulk``: one action on every run a where query matches, with a dry run, the audit and a bound."""

from __future__ import annotations

from pathlib import Path

import pytest

import fusee
from tests.helpers import until

FIXED: set[str] = set()
go = fusee.signal("go", int)


def _call(name: str) -> str:
    if name not in FIXED:
        raise ConnectionError(f"{name} is down")
    return f"{name} ok"


@fusee.workflow("pausing")
async def pausing(ctx: fusee.Ctx, name: str) -> str:
    return await ctx.step("call", lambda: _call(name), retry=fusee.Retry(attempts=1, pause_when_exhausted=True))


@fusee.workflow("waiting")
async def waiting(ctx: fusee.Ctx, n: int) -> int:
    got = await ctx.wait_for(go)
    return await ctx.step("add", lambda: n + got)


@fusee.workflow("fine")
async def fine(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


WORKFLOWS = [pausing, waiting, fine]


async def test_dry_run_counts_and_changes_nothing_then_cancel_acts_with_the_audit() -> None:
    async with fusee.Engine.open(workflows=WORKFLOWS) as engine:
        assert await engine.execute(fine, "f-1", 1) == 2
        for i in range(5):
            await engine.start(waiting, f"w-{i}", i)
        dry = await engine.bulk("cancel", "workflow = 'waiting' or workflow = 'fine'", dry_run=True)
        assert dry.dry_run and dry.matched == 5  # the finished run is not counted: cancel does not apply
        assert dry.workflow_ids == ("w-0", "w-1", "w-2", "w-3", "w-4") and dry.done == ()
        assert all(engine.describe(f"w-{i}").audit == () for i in range(5))

        result = await engine.bulk("cancel", "workflow = 'waiting'", by="ada", reason="clean-up", limit=3)
        assert not result.dry_run and result.matched == 5 and result.remaining == 2
        assert result.done == ("w-0", "w-1", "w-2") and result.failed == {}
        for i in range(3):
            with pytest.raises(fusee.WorkflowCancelled):
                await engine.get(f"w-{i}").result()
            assert [(a.action, a.by, a.detail) for a in engine.describe(f"w-{i}").audit] == [
                ("cancel", "ada", "clean-up")]
        assert engine.describe("w-3").status == "running"
        again = await engine.bulk("cancel", "workflow = 'waiting'", by="ada")
        assert again.done == ("w-3", "w-4") and again.matched == 2 and again.remaining == 0


async def test_resume_terminate_signal_and_reset_in_bulk(tmp_path: Path) -> None:
    FIXED.clear()
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        for name in ("a", "b", "c"):
            await engine.start(pausing, f"p-{name}", name)
        await engine.start(waiting, "w-1", 1)
        await engine.start(waiting, "w-2", 2)
        await until(lambda: engine.counts("workflow = 'pausing'")["paused"] == 3)

        FIXED.update({"a", "b"})
        result = await engine.bulk("resume", "status = 'paused' and workflow_id != 'p-c'", by="ops")
        assert result.done == ("p-a", "p-b") and result.matched == 2
        assert await engine.get("p-a").result() == "a ok" and await engine.get("p-b").result() == "b ok"

        result = await engine.bulk("signal", "workflow = 'waiting'", signal="go", value=10, by="bot")
        assert result.done == ("w-1", "w-2")
        assert await engine.get("w-1").result() == 11 and await engine.get("w-2").result() == 12
        assert ("signal", "bot", "go") in [(a.action, a.by, a.detail) for a in engine.describe("w-1").audit]

        # A wrong value is refused run by run, nothing recorded; the result names each.
        await engine.start(waiting, "w-3", 3)
        result = await engine.bulk("signal", "workflow_id = 'w-3'", signal=go, value="ten")
        assert result.done == () and list(result.failed) == ["w-3"]
        assert "SerializationError" in result.failed["w-3"]

        result = await engine.bulk("reset", "workflow = 'pausing' and status = 'ok'", before_step="call",
                                   by="ops")
        assert result.done == ("p-a", "p-b")
        assert engine.describe("p-a").run_id > 1

        result = await engine.bulk("terminate", "workflow_id in ('p-c', 'w-3')", reason="gone", by="ops")
        assert result.done == ("p-c", "w-3")
        assert engine.describe("p-c").status == "terminated"
    # Durable: a reopen sees what the bulk did.
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        assert engine.describe("w-3").status == "terminated"
        assert [(a.action, a.by) for a in engine.describe("p-c").audit] == [("terminate", "ops")]


@pytest.mark.parametrize(("action", "where", "options", "match"), [
    ("delete", "workflow = 'fine'", {}, "unknown bulk action"),
    ("cancel", "", {}, "needs a where query"),
    ("cancel", "order by started_at desc", {}, "needs a where query"),  # an order names no runs
    ("cancel", "workflow = 'fine'", {"limit": 1001}, "from 1 to 1000"),
    ("cancel", "workflow = 'fine'", {"limit": 0}, "from 1 to 1000"),
    ("signal", "workflow = 'fine'", {}, "needs signal="),
    ("reset", "workflow = 'fine'", {}, "needs before_step="),
    ("resume", "workflow = 'fine'", {"reason": "x"}, "takes no reason"),
    ("cancel", "workflow = 'fine'", {"before_step": "x"}, "takes no before_step"),
])
async def test_bad_bulk_requests_are_refused_before_anything(action: str, where: str, options: dict[str, object],
                                                             match: str) -> None:
    async with fusee.Engine.open(workflows=WORKFLOWS) as engine:
        await engine.start(waiting, "w-1", 1)
        with pytest.raises(ValueError, match=match):
            await engine.bulk(action, where, **options)  # type: ignore[arg-type]
        with pytest.raises(fusee.UnknownStatus):
            await engine.bulk("cancel", "status = 'hung'")
        assert engine.describe("w-1").audit == () and engine.describe("w-1").status == "running"
