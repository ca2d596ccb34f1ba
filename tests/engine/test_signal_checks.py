"""Signals sent by name (as HTTP, the CLI, the UI and followers send them) are checked against
the signal's declared type before anything is journaled; resends after the run ended answer as
the first try did; a signal in the journal that its wait cannot decode is passed over."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import fusee
from fusee.core import records as rec
from tests.helpers import until

pay_ok = fusee.signal("pay_ok", bool)
#: The same name with another type, as an older sender declared it: its values reach the
#: journal (a workflow's signal_workflow is typed by the sender), and the wait cannot decode them.
pay_ok_text = fusee.signal("pay_ok", str)
#: Declared here and waited for only after a first step: checked against this declaration.
ship_by = fusee.signal("ship_by", int)
go = fusee.signal("go_ahead")
LEDGER: list[str] = []


@fusee.workflow("charge")
async def charge(ctx: fusee.Ctx, order: str) -> str:
    await ctx.step("charge", lambda: LEDGER.append(f"charge {order}"))
    try:
        ok = await ctx.wait_for(pay_ok)
    except fusee.Cancelled:
        await ctx.step("refund", lambda: LEDGER.append(f"refund {order}"))
        return "refunded"
    return "shipped" if ok else "declined"


@fusee.workflow("old_sender")
async def old_sender(ctx: fusee.Ctx, target: str) -> None:
    await ctx.signal_workflow(target, pay_ok_text, "yes")


@fusee.workflow("shipping")
async def shipping(ctx: fusee.Ctx) -> int:
    await ctx.wait_for(go)
    days = await ctx.wait_for(ship_by)
    return days or 0


WORKFLOWS = [charge, old_sender, shipping]


def by_name(name: str) -> fusee.SignalDef[object]:
    """A signal as a caller that knows only its name sends it (HTTP, CLI, UI, a follower)."""
    return fusee.SignalDef(name)


def signals_in(records: list[rec.Record]) -> list[rec.Signal]:
    return [r for r in records if isinstance(r, rec.Signal)]


async def waiting(engine: fusee.Engine, wid: str) -> None:
    await until(lambda: any(isinstance(r, rec.Wait) for r in engine._rt.wf[wid].journal))


@pytest.fixture(autouse=True)
def _clear() -> None:
    LEDGER.clear()


async def test_a_wrongly_typed_signal_by_name_is_refused_and_the_run_still_compensates(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        h = await engine.start(charge, "o-1", "tea")
        await waiting(engine, "o-1")
        with pytest.raises(fusee.SerializationError, match=r"pay_ok.*bool"):
            await engine.signal("o-1", by_name("pay_ok"), "yes")
        assert signals_in(await engine.journal("o-1")) == []
        await h.cancel("changed their mind")
        assert await h.result() == "refunded"
    assert LEDGER == ["charge tea", "refund tea"]


async def test_a_signal_by_name_before_its_wait_is_checked_against_its_declaration(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        h = await engine.start(shipping, "s-1")
        with pytest.raises(fusee.SerializationError, match=r"ship_by.*int"):
            await engine.signal("s-1", by_name("ship_by"), "next week")
        await engine.signal("s-1", by_name("ship_by"), 3)
        await engine.signal("s-1", by_name("go_ahead"), {"any": "json"})
        assert await h.result() == 3
        assert [s.name for s in signals_in(await engine.journal("s-1"))] == ["ship_by", "go_ahead"]


async def test_an_unknown_signal_name_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        h = await engine.start(charge, "o-1", "tea")
        await waiting(engine, "o-1")
        with pytest.raises(fusee.UnknownSignal, match="'pay_okk'") as info:
            await engine.signal("o-1", by_name("pay_okk"), True)
        assert "pay_ok" in info.value.known and info.value.name == "pay_okk"
        assert "'pay_ok'" in str(info.value)
        assert signals_in(await engine.journal("o-1")) == []
        await engine.signal("o-1", by_name("pay_ok"), True)
        assert await h.result() == "shipped"


async def test_an_undecodable_signal_in_the_journal_is_passed_over_also_after_a_reopen(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fusee")
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        await engine.start(charge, "o-1", "tea")
        await engine.start(charge, "o-2", "jam")
        await waiting(engine, "o-1")
        for target in ("o-1", "o-2"):
            await engine.execute(old_sender, f"sender-{target}", target)
            await until(lambda t=target: len(signals_in(engine._rt.wf[t].journal)) == 1)  # type: ignore[misc]
        await until(lambda: engine.metrics().stats.get("signals_dropped", 0) == 2)
        assert engine.describe("o-1").status == "running"
        warned = [m.getMessage() for m in caplog.records if "pay_ok" in m.getMessage()]
        assert any("o-1" in m and "#0" in m for m in warned), warned
    # The journal holds the signal, and no wait took it: a replay passes it over again.
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        h1, h2 = engine.get("o-1"), engine.get("o-2")
        assert engine.describe("o-1").status == "running"
        await h1.cancel()
        assert await h1.result() == "refunded"
        await engine.signal("o-2", pay_ok, True)
        assert await h2.result() == "shipped"
        waited = [r for r in await engine.journal("o-2") if isinstance(r, rec.Waited)]
        assert [w.ordinal for w in waited] == [1]
    assert sorted(LEDGER) == ["charge jam", "charge tea", "refund tea"]


async def test_a_signal_resent_after_the_run_ended_answers_as_the_first_did(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        h = await engine.start(charge, "o-1", "tea")
        await engine.signal("o-1", pay_ok, True, dedup_key="req-1")
        assert await h.result() == "shipped"
        await engine.signal("o-1", pay_ok, True, dedup_key="req-1")  # the client's retry
        await engine.signal("o-1", by_name("pay_ok"), True, dedup_key="req-1")
        with pytest.raises(fusee.WorkflowEnded):
            await engine.signal("o-1", pay_ok, True, dedup_key="req-2")
        with pytest.raises(fusee.WorkflowEnded):
            await engine.signal("o-1", pay_ok, True)
        with pytest.raises(fusee.WorkflowEnded):
            await engine.cancel("o-1")  # no cancel was ever recorded
        assert len(signals_in(await engine.journal("o-1"))) == 1


async def test_a_cancel_resent_after_the_run_ended_answers_as_the_first_did(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        h = await engine.start(charge, "o-1", "tea")
        await waiting(engine, "o-1")
        await h.cancel("first")
        assert await h.result() == "refunded"
        await h.cancel("first")  # the client's retry
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        await engine.cancel("o-1", "first")
        with pytest.raises(fusee.WorkflowEnded):
            await engine.terminate("o-1")
        kinds = [type(r).__name__ for r in await engine.journal("o-1")]
        assert kinds.count("CancelRequest") == 1
