"""Signals over HTTP are checked as the Python API checks them: a wrongly typed value or an
unknown name is a 400 and records nothing; a resent signal or cancel after the run ended
answers as the first try did."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import fusee
from fusee.core import records as rec
from fusee.http import app
from tests.helpers import until

refund_ok = fusee.signal("refund_ok", bool)
LEDGER: list[str] = []


@fusee.workflow("http_charge")
async def http_charge(ctx: fusee.Ctx, order: str) -> str:
    await ctx.step("charge", lambda: LEDGER.append(f"charge {order}"))
    try:
        ok = await ctx.wait_for(refund_ok)
    except fusee.Cancelled:
        await ctx.step("refund", lambda: LEDGER.append(f"refund {order}"))
        return "refunded"
    return "shipped" if ok else "declined"


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[fusee.Engine]:
    LEDGER.clear()
    async with fusee.Engine.open(tmp_path / "e", workflows=[http_charge], segment_bytes=1 << 20) as e:
        yield e


def client(engine: fusee.Engine) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app(engine)), base_url="http://127.0.0.1")


async def started(c: httpx.AsyncClient, engine: fusee.Engine, wid: str) -> None:
    r = await c.post("/api/runs", json={"workflow": "http_charge", "workflow_id": wid, "input": "tea"})
    assert r.status_code == 201, r.text
    await until(lambda: any(isinstance(x, rec.Wait) for x in engine._rt.wf[wid].journal))


async def signals_in(engine: fusee.Engine, wid: str) -> int:
    return sum(isinstance(x, rec.Signal) for x in await engine.journal(wid))


async def test_a_wrongly_typed_signal_is_a_400_and_the_run_still_compensates(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        await started(c, engine, "o-1")
        r = await c.post("/api/runs/o-1/signal", json={"name": "refund_ok", "value": "yes"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "SerializationError" and err["field"] == "value"
        assert "bool" in err["message"]
        assert await signals_in(engine, "o-1") == 0
        r = await c.post("/api/runs/o-1/cancel", json={"reason": "changed their mind"})
        assert r.status_code == 200, r.text
        assert await engine.get("o-1").result() == "refunded"
    assert LEDGER == ["charge tea", "refund tea"]


async def test_an_unknown_signal_name_is_a_400_listing_the_known_ones(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        await started(c, engine, "o-1")
        r = await c.post("/api/runs/o-1/signal", json={"name": "refund_okk", "value": True})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "UnknownSignal" and err["field"] == "name"
        assert "'refund_ok'" in err["message"] and "'refund_okk'" in err["message"]
        assert await signals_in(engine, "o-1") == 0
        r = await c.post("/api/runs/o-1/signal", json={"name": "refund_ok", "value": True})
        assert r.status_code == 200, r.text
        assert await engine.get("o-1").result() == "shipped"


async def test_a_signal_or_cancel_resent_after_the_run_ended_answers_as_the_first_did(
        engine: fusee.Engine) -> None:
    async with client(engine) as c:
        await started(c, engine, "o-1")
        body = {"name": "refund_ok", "value": True, "dedup_key": "req-1"}
        assert (await c.post("/api/runs/o-1/signal", json=body)).status_code == 200
        assert await engine.get("o-1").result() == "shipped"
        r = await c.post("/api/runs/o-1/signal", json=body)  # the client's retry
        assert r.status_code == 200, r.text
        assert r.json() == {"workflow_id": "o-1", "action": "signal"}
        r = await c.post("/api/runs/o-1/signal", json={**body, "dedup_key": "req-2"})
        assert r.status_code == 409 and r.json()["error"]["type"] == "WorkflowEnded"
        assert await signals_in(engine, "o-1") == 1

        await started(c, engine, "o-2")
        assert (await c.post("/api/runs/o-2/cancel", json={})).status_code == 200
        assert await engine.get("o-2").result() == "refunded"
        r = await c.post("/api/runs/o-2/cancel", json={})  # the client's retry
        assert r.status_code == 200, r.text
        r = await c.post("/api/runs/o-1/cancel", json={})  # ended without a cancel
        assert r.status_code == 409 and r.json()["error"]["type"] == "WorkflowEnded"
