"""The HTTP API (``fusee.http.app``) against a real engine, through httpx."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate

import fusee
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


def client(engine: fusee.Engine, token: str | None = None, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app(engine, token=token)),
                             base_url="http://127.0.0.1:8233", **kw)


def check_schema(answer: Any, name: str) -> None:
    """``answer`` fits the OpenAPI document's schema ``name``."""
    doc = document()
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    jsonschema.validate(answer, schema)


async def test_openapi_document_is_served_and_valid(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        r = await c.get("/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    validate(spec)
    assert {"/api/runs", "/api/runs/{workflow_id}/signal", "/api/metrics"} <= set(spec["paths"])


async def test_start_list_describe_signal_and_the_run_finishes(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "acme"})
        assert r.status_code == 201, r.text
        assert r.json() == {"workflow_id": "o-1", "run_id": 1} or r.json()["workflow_id"] == "o-1"
        check_schema(r.json(), "Started")
        await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-2", "input": "zed"})
        await until(lambda: engine.describe("o-1").attributes.get("customer") == "acme")
        await until(lambda: engine.describe("o-2").attributes.get("customer") == "zed")

        r = await c.get("/api/runs", params={"where": "attrs.customer = 'acme'"})
        assert r.status_code == 200
        check_schema(r.json(), "RunPage")
        assert [s["workflow_id"] for s in r.json()["items"]] == ["o-1"]

        first = (await c.get("/api/runs", params={"limit": 1})).json()
        assert [s["workflow_id"] for s in first["items"]] == ["o-1"] and first["cursor"]
        second = (await c.get("/api/runs", params={"limit": 1, "cursor": first["cursor"]})).json()
        assert [s["workflow_id"] for s in second["items"]] == ["o-2"]

        r = await c.post("/api/runs/o-1/signal", json={"name": "approve", "value": True, "by": "ada"})
        assert r.status_code == 200, r.text
        assert await engine.get("o-1").result() == "shipped"

        r = await c.get("/api/runs/o-1")
        summary = r.json()
        check_schema(summary, "RunSummary")
        assert summary["status"] == "ok"
        assert summary["started_at"].endswith("Z") and summary["ended_at"].endswith("Z")
        assert summary["audit"] == [{"action": "signal", "by": "ada", "detail": "approve"}]


async def test_journal_is_readable_json(engine: fusee.Engine) -> None:
    h = await engine.start(ops_app.order, "o-1", "acme")
    await until(lambda: any(isinstance(x, rec.Step) for x in engine._rt.wf["o-1"].journal))
    await h.cancel("customer changed their mind", by="bob")
    with pytest.raises(fusee.WorkflowFailed):
        await h.result()
    async with client(engine) as c:
        r = await c.get("/api/runs/o-1/journal")
    assert r.status_code == 200
    body = r.json()
    check_schema(body, "Journal")
    text = json.dumps(body["records"])
    # Times are ISO text (only durations are numbers of milliseconds), payloads decoded.
    assert "$bytes" not in text
    assert not [k for x in body["records"] for k in x if k.endswith("_ms") and k not in ("took_ms", "queued_ms")]
    kinds = [x["kind"] for x in body["records"]]
    assert kinds[0] == "Start" and kinds[-1] == "Done"
    start = body["records"][0]
    assert start["input"] == "acme" and start["started_at"].endswith("Z")
    cancel = next(x for x in body["records"] if x["kind"] == "CancelRequest")
    assert cancel["reason"] == "customer changed their mind" and cancel["by"] == "bob"
    step = next(x for x in body["records"] if x["kind"] == "Step")
    assert step["name"] == "reserve" and step["payload"] == "reserved" and step["status"] == "ok"
    timeline = body["timeline"]
    assert [e["kind"] for e in timeline][:2] == ["start", "step"]
    assert timeline[-1]["kind"] == "end" and timeline[-1]["status"] == "cancelled"
    assert any(e["kind"] == "cancel" and e["by"] == "bob" for e in timeline)


async def test_query_update_cancel_terminate(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    await engine.start(ops_app.order, "o-2", "zed")
    async with client(engine) as c:
        await until(lambda: engine.describe("o-1").attributes.get("customer") == "acme")
        r = await c.post("/api/runs/o-1/query", json={"name": "state"})
        assert r.status_code == 200 and r.json()["result"] in ("new", "reserved")
        r = await c.post("/api/runs/o-1/update", json={"name": "bump", "arg": 3})
        assert r.status_code == 200, r.text
        assert r.json() == {"result": 3}
        r = await c.post("/api/runs/o-1/update", json={"name": "bump", "arg": -1})
        assert r.status_code == 400 and r.json()["error"]["type"] == "UpdateRejected"
        timeline = (await c.get("/api/runs/o-1/journal")).json()["timeline"]
        assert [(e["name"], e["status"], e["value"], e["result"]) for e in timeline
                if e["kind"] == "update"] == [("bump", "ok", 3, 3)]  # the rejected one left no trace
        r = await c.post("/api/runs/o-1/terminate", json={"reason": "test", "by": "ops"})
        assert r.status_code == 200
        assert engine.describe("o-1").status == "terminated"
        r = await c.post("/api/runs/o-1/signal", json={"name": "approve", "value": True})
        assert r.status_code == 409 and r.json()["error"]["type"] == "WorkflowEnded"
        r = await c.post("/api/runs/o-2/cancel", json={})
        assert r.status_code == 200
    with pytest.raises(fusee.WorkflowCancelled):
        await engine.get("o-2").result()


async def test_resume_reset_and_complete(engine: fusee.Engine) -> None:
    await engine.start(ops_app.pauser, "p-1")
    await until(lambda: engine.describe("p-1").paused_steps == ("call",))
    ops_app.FIXED.add("fixed")
    async with client(engine) as c:
        r = await c.get("/api/runs/p-1")
        assert r.json()["paused_steps"] == ["call"] and "the service is down" in r.json()["last_error"]
        r = await c.post("/api/runs/p-1/resume", json={"by": "ops"})
        assert r.status_code == 200
        assert (await engine.get("p-1").result()).startswith("ok after attempt")

        r = await c.post("/api/runs/p-1/reset", json={"before_step": "call", "by": "ops"})
        assert r.status_code == 200, r.text
        assert r.json()["run_id"] > 1
        assert (await engine.get("p-1").result()).startswith("ok after attempt")

        await engine.start(ops_app.approval, "a-1", 100)
        await until(lambda: len(ops_app.TOKENS) == 1)
        await until(lambda: any(isinstance(x, rec.Awaiting) for x in engine._rt.wf["a-1"].journal))
        r = await c.post("/api/completions", json={"token": ops_app.TOKENS[0], "value": "alice", "by": "ada"})
        assert r.status_code == 200 and r.json() == {"completed": True}
        assert await engine.get("a-1").result() == "100 approved by alice"
        r = await c.post("/api/completions", json={"token": ops_app.TOKENS[0], "value": "bob"})
        assert r.json() == {"completed": False}


async def test_stream_as_server_sent_events(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    await engine.signal("o-1", ops_app.approve, True)
    await engine.get("o-1").result()
    async with client(engine) as c:
        r = await c.get("/api/runs/o-1/streams/log")
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in r.text.split("\n\n") if e.strip()]
        assert events[0] == 'id: 1\nevent: chunk\ndata: "order for acme"'
        assert events[1] == 'id: 2\nevent: chunk\ndata: "approved"'
        assert events[2].startswith("event: end")
        run_id = engine.describe("o-1").run_id
        assert json.loads(events[2].split("data: ", 1)[1]) == {"offset": 2, "status": "ok", "run_id": run_id}
        r = await c.get(f"/api/runs/o-1/streams/log?run_id={run_id + 1}")
        assert "event: error" in r.text and "RunNotCurrent" in r.text
        r = await c.get("/api/runs/o-1/streams/log?run_id=0")
        assert r.status_code == 400
        r = await c.get("/api/runs/o-1/streams/log", headers={"Last-Event-ID": "1"})
        assert r.text.split("\n\n")[0] == 'id: 2\nevent: chunk\ndata: "approved"'


async def test_metrics(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    async with client(engine) as c:
        r = await c.get("/api/metrics")
    assert r.status_code == 200
    check_schema(r.json(), "Metrics")
    assert r.json()["shards"][0]["runs"] == {"running": 1}


async def _records(engine: fusee.Engine) -> int:
    """Records appended to the log so far (durable or not)."""
    return sum(engine._log._appended)


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), [
    ("post", "/api/runs", {"workflow": "order"}, 400, "workflow_id"),
    ("post", "/api/runs", {"workflow": "order", "workflow_id": 5}, 400, "workflow_id"),
    ("post", "/api/runs", {"workflow": "nope", "workflow_id": "x"}, 400, "workflow"),
    ("post", "/api/runs", {"workflow": "order", "workflow_id": "x", "if_running": "maybe"}, 400, "if_running"),
    ("post", "/api/runs", {"workflow": "order", "workflow_id": "x", "input": 5}, 400, "input"),
    ("post", "/api/runs", {"workflow": "order", "workflow_id": "x", "timeout": -1}, 400, "timeout"),
    ("post", "/api/runs", {"workflow": "order", "workflow_id": "x", "colour": "red"}, 400, "colour"),
    ("post", "/api/runs/o-1/signal", {"value": True}, 400, "name"),
    ("post", "/api/runs/o-1/signal", {"name": "approve", "by": ""}, 400, "by"),
    ("post", "/api/runs/o-1/reset", {}, 400, "before_step"),
    ("post", "/api/runs/missing/signal", {"name": "approve"}, 404, None),
    ("post", "/api/runs/missing/cancel", {}, 404, None),
    ("get", "/api/runs/missing", None, 404, None),
    ("get", "/api/runs/missing/journal", None, 404, None),
    ("get", "/api/runs/missing/streams/log", None, 404, None),
    ("get", "/api/runs?where=status%20%3D", None, 400, "where"),
    ("get", "/api/runs?limit=0", None, 400, "limit"),
    ("get", "/api/runs?limit=many", None, 400, "limit"),
    ("get", "/api/runs?cursor=zzz", None, 400, "cursor"),
    ("post", "/api/completions", {"token": ""}, 400, "token"),
    ("post", "/api/completions", {"token": "not-a-token"}, 404, None),
    ("get", "/api/nothing", None, 404, "path"),
])
async def test_bad_requests_name_the_field_and_record_nothing(
        engine: fusee.Engine, method: str, path: str, body: Any, status: int, field: str | None) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    # Settled: the run waits for its signal and every record is durable.
    await until(lambda: any(isinstance(x, rec.Wait) for x in engine._rt.wf["o-1"].journal))
    await until(lambda: engine.metrics().records_pending == 0 and not engine.metrics().steps_executing)
    before = await _records(engine)
    async with client(engine) as c:
        r = await (c.post(path, json=body) if method == "post" else c.get(path))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    check_schema(r.json(), "Error")
    assert error["field"] == field, error
    assert error["message"]
    await asyncio.sleep(0)
    assert await _records(engine) == before
    assert [s.workflow_id for s in engine.runs()] == ["o-1"]


async def test_a_body_that_is_not_json_is_refused(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        r = await c.post("/api/runs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "body"


async def test_a_token_is_checked_before_anything_runs(engine: fusee.Engine) -> None:
    async with client(engine, token="s3cret") as c:
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "acme"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "Unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        r = await c.get("/api/runs", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert engine.runs() == []
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "acme"},
                         headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 201
        r = await c.get("/api/runs", headers={"Cookie": "fusee_token=s3cret"})
        assert r.status_code == 200 and len(r.json()["items"]) == 1
        # A browser opens a page once with ?token=: the answer sets the cookie.
        assert (await c.get("/api/runs?token=wrong")).status_code == 401
        r = await c.get("/api/runs?token=s3cret")
        assert r.status_code == 200
        assert r.headers["set-cookie"].startswith("fusee_token=s3cret;") and "HttpOnly" in r.headers["set-cookie"]


def test_the_app_serves_from_another_thread_than_the_engines(tmp_path: Path) -> None:
    """Mounted in an app served on another loop (here: another thread's), calls are handed
    to the engine's loop."""
    import threading

    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    opening = fusee.Engine.open(tmp_path / "e", workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20)

    async def open_engine() -> fusee.Engine:
        return await opening

    engine = asyncio.run_coroutine_threadsafe(open_engine(), loop).result(30)

    async def requests() -> None:
        async with client(engine) as c:
            r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "acme"})
            assert r.status_code == 201, r.text
            assert (await c.get("/api/runs/o-1")).json()["workflow"] == "order"
            assert (await c.get("/api/runs/nope")).status_code == 404

    try:
        asyncio.run(requests())
    finally:
        asyncio.run_coroutine_threadsafe(engine.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


async def test_the_web_ui_is_mounted_at_ui_behind_the_same_token(
        engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract with the UI: ``fusee.ui.routes(engine, secret=...)`` is mounted at ``/ui``."""
    import importlib.machinery
    import types

    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    seen: list[fusee.Engine] = []

    def routes(e: fusee.Engine, *, secret: bytes | str | None) -> list[Route]:
        seen.append(e)

        async def page(request: Any) -> PlainTextResponse:
            return PlainTextResponse(f"runs: {len(e.runs())}")

        return [Route("/", page)]

    ui = types.ModuleType("fusee.ui")
    ui.__spec__ = importlib.machinery.ModuleSpec("fusee.ui", None)
    ui.routes = routes  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fusee.ui", ui)
    async with client(engine, token="s3cret") as c:
        assert (await c.get("/ui/")).status_code == 401
        r = await c.get("/ui/", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.text == "runs: 0"
        r = await c.get("/", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 307 and r.headers["location"] == "/ui/"
    assert seen == [engine]


async def test_an_id_with_a_slash_is_addressed_as_percent_2f(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "acme/o-1", "input": "acme"})
        assert r.status_code == 201
        assert (await c.get("/api/runs/acme%2Fo-1")).json()["workflow_id"] == "acme/o-1"
        r = await c.post("/api/runs/acme%2Fo-1/signal", json={"name": "approve", "value": True})
        assert r.status_code == 200, r.text
        assert await engine.get("acme/o-1").result() == "shipped"
        journal = (await c.get("/api/runs/acme%2Fo-1/journal")).json()
        assert journal["workflow_id"] == "acme/o-1"


async def test_the_web_ui_is_served_at_ui(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    async with client(engine, token="s3cret") as c:
        assert (await c.get("/ui/")).status_code == 401
        r = await c.get("/ui/?token=s3cret")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/html") and "o-1" in r.text
        assert "fusee_token=s3cret" in r.headers["set-cookie"]
