"""Finding trouble and acting in bulk over HTTP: statuses, newest first, counts, ``/api/bulk``."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

import fusee
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


def check_schema(answer: Any, name: str) -> None:
    doc = document()
    jsonschema.validate(answer, {"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


async def _setup(engine: fusee.Engine) -> None:
    await engine.start(ops_app.pauser, "p-1")
    for i in range(3):
        await engine.start(ops_app.order, f"o-{i}", "acme")
    await until(lambda: engine.describe("p-1").status == "paused")
    await until(lambda: all(engine.describe(f"o-{i}").attributes for i in range(3)))


async def test_paused_runs_newest_first_and_counts_that_follow_the_filter(engine: fusee.Engine) -> None:
    await _setup(engine)
    async with client(engine) as c:
        r = await c.get("/api/runs", params={"where": "status = 'paused'"})
        assert r.status_code == 200 and [s["workflow_id"] for s in r.json()["items"]] == ["p-1"]
        assert r.json()["items"][0]["status"] == "paused"

        r = await c.get("/api/runs", params={"where": "status = 'pasued'"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "UnknownStatus" and err["field"] == "where"
        assert "running, retrying, paused, stuck" in err["message"]

        r = await c.get("/api/runs", params={"order": "newest", "limit": 2})
        assert [s["workflow_id"] for s in r.json()["items"]] == ["o-2", "o-1"]
        r = await c.get("/api/runs", params={"order": "newest", "limit": 2, "cursor": r.json()["cursor"]})
        assert [s["workflow_id"] for s in r.json()["items"]] == ["o-0", "p-1"]
        r = await c.get("/api/runs", params={"order": "latest"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "order"

        r = await c.get("/api/runs", params={"where": "started_at > now() - 1h and workflow = 'order'"})
        assert len(r.json()["items"]) == 3
        where = "workflow = 'order' order by workflow_id desc"
        r = await c.get("/api/runs", params={"where": where, "limit": 2})
        assert r.status_code == 200 and [s["workflow_id"] for s in r.json()["items"]] == ["o-2", "o-1"]
        r = await c.get("/api/runs", params={"where": where, "limit": 2, "cursor": r.json()["cursor"]})
        assert [s["workflow_id"] for s in r.json()["items"]] == ["o-0"] and r.json()["cursor"] is None
        r = await c.get("/api/runs", params={"where": where, "order": "newest"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "where"
        assert "both set the order" in r.json()["error"]["message"]

        r = await c.get("/api/counts", params={"where": "workflow = 'order'"})
        assert r.status_code == 200, r.text
        check_schema(r.json(), "Counts")
        assert {k: v for k, v in r.json()["counts"].items() if v} == {"running": 3}
        r = await c.get("/api/counts")
        assert {k: v for k, v in r.json()["counts"].items() if v} == {"running": 3, "paused": 1}
        r = await c.get("/api/counts", params={"where": "status = 'hung'"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "UnknownStatus"


async def test_bulk_dry_run_then_cancel_with_the_audit(engine: fusee.Engine) -> None:
    await _setup(engine)
    async with client(engine) as c:
        r = await c.post("/api/bulk/cancel", json={"where": "workflow = 'order'", "dry_run": True})
        assert r.status_code == 200, r.text
        check_schema(r.json(), "BulkResult")
        assert r.json()["matched"] == 3 and r.json()["done"] == [] and r.json()["dry_run"]
        assert all(engine.describe(f"o-{i}").status == "running" for i in range(3))

        r = await c.post("/api/bulk/cancel", json={"where": "workflow = 'order'", "by": "ada", "reason": "dup",
                                                   "limit": 2})
        assert r.status_code == 200, r.text
        assert r.json()["done"] == ["o-0", "o-1"] and r.json()["remaining"] == 1
        for wid in ("o-0", "o-1"):
            with pytest.raises(fusee.WorkflowCancelled):
                await engine.get(wid).result()
            assert [(a.action, a.by, a.detail) for a in engine.describe(wid).audit] == [("cancel", "ada", "dup")]

        ops_app.FIXED.add("fixed")
        r = await c.post("/api/bulk/resume", json={"where": "status = 'paused'", "by": "ops"})
        assert r.json()["done"] == ["p-1"]
        assert (await engine.get("p-1").result()).startswith("ok after attempt")

        r = await c.post("/api/bulk/signal", json={"where": "workflow_id = 'o-2'", "signal": "approve",
                                                   "value": True, "by": "bob"})
        assert r.json()["done"] == ["o-2"], r.text
        assert await engine.get("o-2").result() == "shipped"


@pytest.mark.parametrize(("path", "body", "status", "field"), [
    ("/api/bulk/cancel", {"where": "workflow = 'order'", "limit": 1001}, 400, "limit"),
    ("/api/bulk/cancel", {"where": " "}, 400, "where"),
    ("/api/bulk/cancel", {}, 400, "where"),
    ("/api/bulk/cancel", {"where": "status = 'hung'"}, 400, "where"),
    ("/api/bulk/signal", {"where": "workflow = 'order'"}, 400, "signal"),
    ("/api/bulk/resume", {"where": "workflow = 'order'", "reason": "x"}, 400, "reason"),
    ("/api/bulk/delete", {"where": "workflow = 'order'"}, 404, "path"),
])
async def test_bad_bulk_requests_change_nothing(engine: fusee.Engine, path: str, body: dict[str, Any],
                                                status: int, field: str) -> None:
    await _setup(engine)
    async with client(engine) as c:
        r = await c.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field
    assert all(engine.describe(f"o-{i}").status == "running" and not engine.describe(f"o-{i}").audit
               for i in range(3))


async def test_bulk_from_another_site_is_refused(engine: fusee.Engine) -> None:
    await _setup(engine)
    async with client(engine) as c:
        r = await c.post("/api/bulk/terminate", json={"where": "workflow = 'order'"},
                         headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        r = await c.post("/api/bulk/terminate", content=b'{"where": "workflow = \'order\'"}',
                         headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
    assert all(engine.describe(f"o-{i}").status == "running" for i in range(3))


async def test_healthz_and_readyz_answer_without_the_token(tmp_path: Path) -> None:
    engine = await fusee.Engine.open(tmp_path / "e", workflows=ops_app.WORKFLOWS)
    served = app(engine, token="s3cret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://127.0.0.1:8233") as c:
        r = await c.get("/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        r = await c.get("/readyz")
        assert r.status_code == 200 and r.json() == {"status": "ready"}
        assert (await c.get("/api/metrics")).status_code == 401  # the rest still needs the token
        r = await c.get("/readyz", headers={"Host": "evil.example"})
        assert r.status_code == 400  # the Host check applies to probes too
        await engine.close()
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "not ready"
        assert "EngineClosed" in r.json()["reason"]
        assert (await c.get("/healthz")).status_code == 200


async def test_metrics_in_the_prometheus_format(engine: fusee.Engine) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    await _setup(engine)
    async with client(engine) as c:
        r = await c.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    runs = {s.labels["status"]: s.value for s in families["fusee_runs"].samples}
    assert runs["running"] == 3 and runs["paused"] == 1 and runs["ok"] == 0
    assert families["fusee_steps_run"].type == "counter"
    assert families["fusee_flushes"].samples[0].value >= 1


async def test_prometheus_metrics_need_the_token(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "e", workflows=ops_app.WORKFLOWS) as engine:
        served = app(engine, token="s3cret")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served),
                                     base_url="http://127.0.0.1:8233") as c:
            assert (await c.get("/metrics")).status_code == 401
            r = await c.get("/metrics", headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == 200 and "fusee_runs" in r.text
