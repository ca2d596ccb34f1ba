"""Requests that used to end in a 500 (an exception the API did not type) get a 4xx naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import fusee
from fusee.http import app


@fusee.workflow("noop")
async def noop(ctx: fusee.Ctx) -> None:
    return None


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[fusee.Engine]:
    async with fusee.Engine.open(tmp_path / "e", workflows=[noop], segment_bytes=1 << 20) as e:
        yield e


@pytest.mark.parametrize("where", [
    "(" * 400 + "workflow = 'noop'" + ")" * 400,
    "not " * 1000 + "workflow = 'noop'",
])
async def test_a_where_nested_too_deep_is_a_400(engine: fusee.Engine, where: str) -> None:
    transport = httpx.ASGITransport(app=app(engine), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.get("/api/runs", params={"where": where})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "InvalidQuery" and err["field"] == "where" and "deeper than 64" in err["message"]


async def test_a_wrongly_typed_update_argument_is_explained_in_the_users_words(tmp_path: Path) -> None:
    # The message names the type and the value, not the codec's bytes (issue 22, finding 9).
    counted = fusee.update("set_count", int)

    @fusee.workflow("typed_update_words")
    async def wf(ctx: fusee.Ctx) -> int:
        state = {"n": 0}

        def apply(v: int) -> int:
            state["n"] = v
            return v

        ctx.on_update(counted, apply)
        await ctx.wait_for(fusee.signal("stop_typed_update_words"), timeout="1h")
        return state["n"]

    async with fusee.Engine.open(tmp_path / "e", workflows=[wf]) as engine:
        await engine.start(wf, "w")
        transport = httpx.ASGITransport(app=app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            r = await c.post("/api/runs/w/update", json={"name": "set_count", "arg": "three"})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "int" in message and "bytes" not in message, message
