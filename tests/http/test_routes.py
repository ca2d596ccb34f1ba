"""Every run ID is reachable, fork has a route, a resume with nothing paused is an error, and
refusals are worded for the user (issue 22, finding 9)."""

from __future__ import annotations

import html
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import fusee
from fusee import journal_file
from fusee.core import records as rec
from fusee.http import app
from fusee.http.openapi import document
from tests.helpers import until

sys.path.insert(0, str(Path(__file__).parent))
import ops_app


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[fusee.Engine]:
    ops_app.TOKENS.clear()
    ops_app.FIXED.clear()
    async with fusee.Engine.open(tmp_path / "e", workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20) as e:
        yield e


def client(engine: fusee.Engine) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app(engine)), base_url="http://127.0.0.1:8233")


def path(wid: str) -> str:
    return "/api/runs/" + quote(wid, safe="")


#: IDs that end like a route's suffix, or hold what a path decodes.
IDS = ["x/journal", "y/signal", "z/export", "w/streams/log", "v/", "/u", "a%2Fb", "100%", "sp ace", "é/ü"]


@pytest.mark.parametrize("wid", IDS)
async def test_every_run_id_is_reachable(engine: fusee.Engine, wid: str) -> None:
    async with client(engine) as c:
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": wid, "input": "acme"})
        assert r.status_code == 201, r.text
        r = await c.get(path(wid))
        assert r.status_code == 200, r.text
        assert r.json()["workflow_id"] == wid
        await until(lambda: any(isinstance(x, rec.Wait) for x in engine._rt.wf[wid].journal))
        r = await c.post(path(wid) + "/signal", json={"name": "approve", "value": True})
        assert r.status_code == 200, r.text
        assert r.json()["workflow_id"] == wid
        assert await engine.get(wid).result() == "shipped"
        r = await c.get(path(wid) + "/journal")
        assert r.status_code == 200, r.text
        assert r.json()["workflow_id"] == wid and r.json()["timeline"][-1]["result"] == "shipped"
        r = await c.get(path(wid) + "/export")
        assert r.status_code == 200, r.text
        assert journal_file.loads(r.content)[0].id == wid
        r = await c.get(path(wid) + "/streams/log")
        assert r.status_code == 200 and '"order for acme"' in r.text
        r = await c.get("/ui/runs/" + quote(wid, safe=""))  # the UI's run page too
        assert r.status_code == 200 and html.escape(wid) in r.text


async def test_an_id_is_one_path_segment(engine: fusee.Engine) -> None:
    """A '/' in an ID is sent as %2F: a bare one makes another path, never another run's."""
    await engine.start(ops_app.order, "x", "acme")
    await engine.start(ops_app.order, "x/journal", "acme")
    async with client(engine) as c:
        assert (await c.get("/api/runs/x%2Fjournal")).json()["workflow_id"] == "x/journal"
        assert (await c.get("/api/runs/x/journal")).json()["workflow_id"] == "x"
        r = await c.get("/api/runs/x/journal/journal")
        assert r.status_code == 404
        assert "%2F" in r.json()["error"]["message"]


async def test_fork_has_a_route(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    await until(lambda: any(isinstance(x, rec.Wait) for x in engine._rt.wf["o-1"].journal))
    async with client(engine) as c:
        r = await c.post("/api/runs/o-1/fork", json={"new_id": "o-1/copy", "before_step": "reserve", "by": "ops"})
        assert r.status_code == 201, r.text
        assert r.json()["workflow_id"] == "o-1/copy"
        r = await c.post("/api/runs/o-1/fork", json={"before_step": "reserve"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "new_id"
        r = await c.post("/api/runs/o-1/fork", json={"new_id": "o-2"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "before_step"
    assert engine.describe("o-1").status == "running"
    assert engine.describe("o-1/copy").status == "running"
    assert "/api/runs/{workflow_id}/fork" in document()["paths"]
    await engine.signal("o-1/copy", ops_app.approve, True)
    assert await engine.get("o-1/copy").result() == "shipped"


@pytest.mark.parametrize(("method", "suffix", "words"), [
    ("post", "/frobnicate", ["signal", "fork", "resume"]),
    ("get", "/signal", ["POST"]),
    ("post", "", ["GET"]),
])
async def test_a_wrong_endpoint_says_what_there_is(engine: fusee.Engine, method: str, suffix: str,
                                                  words: list[str]) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    async with client(engine) as c:
        r = await c.request(method.upper(), "/api/runs/o-1" + suffix, json={} if method == "post" else None)
    assert r.status_code in (404, 405), r.text
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message


async def test_a_resume_with_nothing_paused_is_a_conflict(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    await until(lambda: any(isinstance(x, rec.Wait) for x in engine._rt.wf["o-1"].journal))
    await until(lambda: engine.metrics().records_pending == 0 and not engine.metrics().steps_executing)
    before = sum(engine._log._appended)
    async with client(engine) as c:
        r = await c.post("/api/runs/o-1/resume", json={"by": "ops"})
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["type"] == "NothingPaused" and "no paused step" in error["message"]
        assert sum(engine._log._appended) == before
        assert engine.describe("o-1").audit == ()

        await engine.start(ops_app.pauser, "p-1")
        await until(lambda: engine.describe("p-1").paused_steps == ("call",))
        ops_app.FIXED.add("fixed")
        r = await c.post("/api/runs/p-1/resume", json={"by": "ops"})
        assert r.status_code == 200, r.text
        assert (await engine.get("p-1").result()).startswith("ok after")
        r = await c.post("/api/runs/p-1/resume", json={})
        assert r.status_code == 409 and r.json()["error"]["type"] == "WorkflowEnded"  # ended: said so


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"workflow": "order", "workflow_id": 5}, "workflow_id", ["workflow_id", "a string", "a number"]),
    ({"workflow": "order"}, "workflow_id", ["workflow_id", "missing"]),
    ({"workflow": "order", "workflow_id": "x", "colour": 1}, "colour", ["colour", "unknown field"]),
    ({"workflow": "order", "workflow_id": "x", "if_running": "maybe"}, "if_running",
     ["if_running", "'fail'", "'attach'", "'terminate'"]),
    ({"workflow": ["order"], "workflow_id": "x"}, "workflow", ["workflow", "a string", "a list"]),
])
async def test_a_malformed_body_is_explained_in_the_users_words(
        engine: fusee.Engine, body: dict[str, Any], field: str, words: list[str]) -> None:
    async with client(engine) as c:
        r = await c.post("/api/runs", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["field"] == field
    for w in words:
        assert w in error["message"], error["message"]
    for internal in ("`", "$.", "Expected", "msgspec", "Object "):
        assert internal not in error["message"], error["message"]
    assert engine.runs() == []


async def test_an_update_refused_by_its_validator_gives_the_validators_words(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    async with client(engine) as c:
        await until(lambda: engine.describe("o-1").attributes.get("customer") == "acme")
        r = await c.post("/api/runs/o-1/update", json={"name": "bump", "arg": -1})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "the update was rejected: bump by a positive number"


async def test_an_empty_segment_is_no_route(engine: fusee.Engine) -> None:
    """``//`` never lets the next word slide into an ID's place: /api/runs//journal is not the run
    ``journal``."""
    await engine.start(ops_app.order, "journal", "acme")
    async with client(engine) as c:
        assert (await c.get("/api/runs/journal")).json()["workflow_id"] == "journal"
        for bad in ("/api/runs//journal", "/api/runs/journal//journal", "/api//runs/journal"):
            r = await c.get(bad)
            assert r.status_code == 404 and r.json()["error"]["field"] == "path", (bad, r.text)


@pytest.mark.parametrize("body", [b"", b"  \n"])
async def test_a_blank_body_is_an_empty_object(engine: fusee.Engine, body: bytes) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    async with client(engine) as c:
        r = await c.post("/api/runs/o-1/cancel", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        r = await c.post("/api/runs", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "workflow", r.text


async def test_a_get_route_answers_head_without_a_body(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    async with client(engine) as c:
        r = await c.head("/api/runs/o-1")
        assert r.status_code == 200 and r.content == b"" and int(r.headers["content-length"]) > 0
        assert (await c.head("/api/runs/missing")).status_code == 404
        r = await c.head("/api/runs/o-1/signal")
        assert r.status_code == 405 and "POST" in r.headers["allow"]
