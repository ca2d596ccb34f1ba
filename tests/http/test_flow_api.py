"""The HTTP API's schedules, step limits and keyed objects' state, against a real engine."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

import fusee
from tests.helpers import until

sys.path.insert(0, str(Path(__file__).parent))
import ops_app
from test_api import _records, check_schema, client


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[fusee.Engine]:
    async with fusee.Engine.open(tmp_path / "e", workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20,
                                 limits=ops_app.LIMITS) as e:
        yield e


async def _scheduled(engine: fusee.Engine, sid: str = "hourly", paused: bool = True) -> None:
    await engine.schedule(sid, ops_app.tick, 1, every="1h", paused=paused)
    await until(lambda: any(s.schedule_id == sid for s in engine.schedules()))


async def _settled(engine: fusee.Engine) -> None:
    await until(lambda: engine.metrics().records_pending == 0 and not engine.metrics().steps_executing)


async def test_the_document_has_the_new_paths(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        spec = (await c.get("/openapi.json")).json()
    validate(spec)
    assert {"/api/schedules", "/api/schedules/{schedule_id}/pause", "/api/schedules/{schedule_id}/backfill",
            "/api/limits", "/api/limits/{name}", "/api/objects/{object}/{key}/state"} <= set(spec["paths"])


async def test_list_pause_unpause_trigger_backfill_delete_a_schedule(engine: fusee.Engine) -> None:
    await _scheduled(engine)
    async with client(engine) as c:
        listed = (await c.get("/api/schedules")).json()
        check_schema(listed, "ScheduleList")
        [s] = listed["schedules"]
        assert (s["schedule_id"], s["workflow"], s["every"], s["paused"]) == ("hourly", "tick", 3600.0, True)
        assert s["next_time"].endswith("Z")

        r = await c.post("/api/schedules/hourly/unpause", json={})
        assert r.status_code == 200, r.text
        check_schema(r.json(), "Schedule")
        assert r.json()["paused"] is False
        assert (await c.post("/api/schedules/hourly/pause", json={})).json()["paused"] is True

        r = await c.post("/api/schedules/hourly/trigger", json={})
        assert r.status_code == 200, r.text
        await until(lambda: any(x.workflow_id.startswith("hourly@") and x.status == "ok"
                                for x in engine.runs()))

        r = await c.post("/api/schedules/hourly/backfill",
                         json={"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T03:00:00Z"})
        assert r.status_code == 200, r.text
        want = {f"hourly@2026-01-01T0{h}:00:00Z" for h in range(3)}
        await until(lambda: want <= {x.workflow_id for x in engine.runs() if x.status == "ok"})
        assert (await c.get("/api/schedules/hourly")).json()["fired"] == 4

        r = await c.post("/api/schedules/hourly/delete", json={})
        assert r.status_code == 200, r.text
        await until(lambda: not list(engine.schedules()))
        assert (await c.get("/api/schedules")).json() == {"schedules": []}
        assert (await c.post("/api/schedules/hourly/pause", json={})).status_code == 404


@pytest.mark.parametrize(("path", "body", "status", "field"), [
    ("/api/schedules/hourly/backfill", {"start": "yesterday", "end": "2026-01-01T00:00:00Z"}, 400, "start"),
    ("/api/schedules/hourly/backfill", {"start": "2026-01-01T00:00:00", "end": "2026-01-01T01:00:00Z"},
     400, "start"),
    ("/api/schedules/hourly/backfill", {"start": "2026-01-01T02:00:00Z", "end": "2026-01-01T01:00:00Z"},
     400, "end"),
    ("/api/schedules/hourly/backfill", {"start": "2026-01-01T00:00:00Z"}, 400, "end"),
    ("/api/schedules/hourly/pause", {"now": True}, 400, "now"),
    ("/api/schedules/hourly/explode", {}, 404, "path"),
    ("/api/schedules/nope/trigger", {}, 404, None),
    ("/api/limits/payments", {"concurrency": 0}, 400, "concurrency"),
    ("/api/limits/payments", {"concurrency": "many"}, 400, "concurrency"),
    ("/api/limits/payments", {"per_second": -1}, 400, "per_second"),
    ("/api/limits/payments", {}, 400, "concurrency"),
    ("/api/limits/nope", {"concurrency": 3}, 404, None),
])
async def test_bad_schedule_and_limit_requests_name_the_field_and_record_nothing(
        engine: fusee.Engine, path: str, body: Any, status: int, field: str | None) -> None:
    await _scheduled(engine)
    await _settled(engine)
    before = await _records(engine)
    async with client(engine) as c:
        r = await c.post(path, json=body)
    assert r.status_code == status, r.text
    check_schema(r.json(), "Error")
    assert r.json()["error"]["field"] == field, r.json()
    await asyncio.sleep(0)
    assert await _records(engine) == before
    [s] = engine.schedules()
    assert (s.paused, s.fired) == (True, 0)
    assert engine.limits()["payments"].concurrency == 2


async def test_list_and_resize_a_limit(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        listed = (await c.get("/api/limits")).json()
        check_schema(listed, "LimitList")
        assert listed == {"limits": [{"name": "payments", "concurrency": 2, "per_second": 10.0,
                                      "in_use": 0, "waiting": 0}]}
        r = await c.post("/api/limits/payments", json={"concurrency": 5})
        assert r.status_code == 200, r.text
        check_schema(r.json(), "LimitView")
        assert (r.json()["concurrency"], r.json()["per_second"]) == (5, 10.0)
        r = await c.post("/api/limits/payments", json={"per_second": None})
        assert (r.json()["concurrency"], r.json()["per_second"]) == (5, None)
    assert engine.limits()["payments"].concurrency == 5


async def test_object_state_read_set_clear_and_patch(engine: fusee.Engine) -> None:
    assert await engine.call(ops_app.add, "k/1", "apple") == 1
    async with client(engine) as c:
        url = "/api/objects/cart/k%2F1/state"
        r = await c.get(url)
        assert r.status_code == 200, r.text
        check_schema(r.json(), "ObjectStateView")
        assert r.json() == {"object": "cart", "key": "k/1", "value": {"items": ["apple"]}, "version": 1}

        r = await c.put(url, json={"value": {"items": ["pear"]}, "if_version": 1})
        assert r.status_code == 200, r.text
        assert (r.json()["value"], r.json()["version"]) == ({"items": ["pear"]}, 2)

        r = await c.put(url, json={"value": {"items": []}, "if_version": 1})
        assert r.status_code == 409 and r.json()["error"]["type"] == "ObjectVersionConflict"

        r = await c.patch(url, json={"patch": [{"op": "add", "path": "/items/-", "value": "fig"}]})
        assert r.status_code == 200, r.text
        assert (r.json()["value"], r.json()["version"]) == ({"items": ["pear", "fig"]}, 3)

        r = await c.post(url + "/clear", json={"if_version": 3})
        assert r.status_code == 200, r.text
        assert r.json()["value"] == {"items": []}
    assert (await engine.object_state(ops_app.cart, "k/1")).value == ops_app.Cart([])


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), [
    ("put", "/api/objects/cart/k/state", {"value": {"items": 5}}, 400, "value"),
    ("put", "/api/objects/cart/k/state", {"value": {"items": []}, "if_version": -1}, 400, "if_version"),
    ("put", "/api/objects/cart/k/state", {"value": {"items": []}, "if_version": 0}, 409, "if_version"),
    ("patch", "/api/objects/cart/k/state", {"patch": [{"op": "remove", "path": "/nothing"}]}, 400, "patch"),
    ("patch", "/api/objects/cart/k/state", {"patch": "add"}, 400, "patch"),
    ("get", "/api/objects/basket/k/state", None, 404, "object"),
])
async def test_bad_object_edits_name_the_field_and_change_nothing(
        engine: fusee.Engine, method: str, path: str, body: Any, status: int, field: str | None) -> None:
    await engine.call(ops_app.add, "k", "apple")
    await _settled(engine)
    before = await _records(engine)
    async with client(engine) as c:
        r = await c.request(method.upper(), path, json=body)
    assert r.status_code == status, r.text
    check_schema(r.json(), "Error")
    assert r.json()["error"]["field"] == field, r.json()
    await _settled(engine)
    state = await engine.object_state(ops_app.cart, "k")
    assert (state.value, state.version) == (ops_app.Cart(["apple"]), 1)
    assert await _records(engine) == before


async def test_the_token_guards_the_new_endpoints(engine: fusee.Engine) -> None:
    await _scheduled(engine)
    async with client(engine, token="s3cret") as c:
        for r in [await c.get("/api/schedules"), await c.post("/api/schedules/hourly/trigger", json={}),
                  await c.get("/api/limits"), await c.post("/api/limits/payments", json={"concurrency": 9}),
                  await c.get("/api/objects/cart/k/state")]:
            assert r.status_code == 401
        assert engine.limits()["payments"].concurrency == 2
        assert [s.fired for s in engine.schedules()] == [0]
        ok = await c.get("/api/limits", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


async def test_make_a_schedule(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        r = await c.post("/api/schedules", json={"schedule_id": "nightly", "workflow": "tick", "input": 3,
                                                 "cron": "0 2 * * *", "timezone": "Europe/Paris"})
        assert r.status_code == 201, r.text
        check_schema(r.json(), "Schedule")
        assert (r.json()["cron"], r.json()["timezone"], r.json()["paused"]) == ("0 2 * * *", "Europe/Paris", False)
        again = await c.post("/api/schedules", json={"schedule_id": "nightly", "workflow": "tick", "input": 3,
                                                     "cron": "0 2 * * *", "timezone": "Europe/Paris"})
        assert again.status_code == 201
        other = await c.post("/api/schedules", json={"schedule_id": "nightly", "workflow": "tick", "input": 3, "every": 60})
        assert other.status_code == 409 and other.json()["error"]["type"] == "ScheduleExists"
    assert [s.schedule_id for s in engine.schedules()] == ["nightly"]


@pytest.mark.parametrize(("body", "field"), [
    ({"workflow": "tick", "every": 60}, "schedule_id"),
    ({"schedule_id": "s", "workflow": "nope", "every": 60}, "workflow"),
    ({"schedule_id": "s", "workflow": "tick", "input": 1, "every": -5}, "every"),
    ({"schedule_id": "s", "workflow": "tick", "input": 1, "every": "soon"}, "every"),
    ({"schedule_id": "s", "workflow": "tick", "input": 1}, "every"),
    ({"schedule_id": "s", "workflow": "tick", "input": 1, "cron": "every tuesday"}, "cron"),
    ({"schedule_id": "s", "workflow": "tick", "input": 1, "every": 60, "timezone": "Mars/Olympus"}, "timezone"),
    ({"schedule_id": "s", "workflow": "tick", "input": 1, "every": 60, "overlap": "sometimes"}, "overlap"),
])
async def test_a_bad_schedule_names_the_field_and_records_nothing(
        engine: fusee.Engine, body: dict[str, Any], field: str) -> None:
    before = await _records(engine)
    async with client(engine) as c:
        r = await c.post("/api/schedules", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == field, r.json()
    await asyncio.sleep(0)
    assert await _records(engine) == before
    assert not list(engine.schedules()) and not engine.runs()


async def test_schedules_objects_and_runs_through_the_api_on_a_parted_directory(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "parted", parts=3, workflows=ops_app.WORKFLOWS) as engine, \
            client(engine) as c:
        for sid in ("a", "b", "c", "d", "e"):  # on more than one part
            r = await c.post("/api/schedules", json={"schedule_id": sid, "workflow": "tick", "input": 1,
                                                     "every": "1h", "paused": True})
            assert r.status_code == 201, r.text
        listed = (await c.get("/api/schedules")).json()
        check_schema(listed, "ScheduleList")
        assert [s["schedule_id"] for s in listed["schedules"]] == ["a", "b", "c", "d", "e"]
        assert (await c.post("/api/schedules/d/unpause", json={})).json()["paused"] is False

        assert await engine.call(ops_app.add, "k/1", "apple") == 1
        r = await c.get("/api/objects/cart/k%2F1/state")
        assert r.status_code == 200, r.text
        assert r.json()["value"] == {"items": ["apple"]}

        for i in range(6):
            r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": f"o-{i}", "input": "acme"})
            assert r.status_code in (200, 201, 202), r.text
        runs = (await c.get("/api/runs", params={"where": "workflow = 'order'", "limit": 100})).json()
        check_schema(runs, "RunPage")
        assert sorted(r["workflow_id"] for r in runs["items"]) == [f"o-{i}" for i in range(6)]
