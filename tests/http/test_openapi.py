"""The OpenAPI document is generated from the API's route handlers (``fusee.http.api``): it is
valid OpenAPI 3.1, lists every route the API serves under a unique and stable operationId, every
``$ref`` resolves, its schemas say what the msgspec structs say, and no route can take a run ID
for one of its fixed words."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from litestar.routes import HTTPRoute
from openapi_spec_validator import validate

import fusee
from fusee.http import api, app, schemas
from fusee.http.openapi import document

METHODS = ("get", "put", "post", "patch", "delete")

#: Every operation's ID: clients generated from the document name their calls after them, so one
#: is never renamed (a new endpoint adds a line).
OPERATIONS = {
    ("get", "/api/runs"): "listRuns",
    ("post", "/api/runs"): "startRun",
    ("get", "/api/counts"): "countRuns",
    ("get", "/api/runs/{workflow_id}"): "describeRun",
    ("get", "/api/runs/{workflow_id}/journal"): "getRunJournal",
    ("get", "/api/runs/{workflow_id}/export"): "exportRun",
    ("get", "/api/runs/{workflow_id}/streams/{name}"): "followStream",
    ("post", "/api/runs/{workflow_id}/signal"): "signalRun",
    ("post", "/api/runs/{workflow_id}/query"): "queryRun",
    ("post", "/api/runs/{workflow_id}/update"): "updateRun",
    ("post", "/api/runs/{workflow_id}/cancel"): "cancelRun",
    ("post", "/api/runs/{workflow_id}/terminate"): "terminateRun",
    ("post", "/api/runs/{workflow_id}/resume"): "resumeRun",
    ("post", "/api/runs/{workflow_id}/reset"): "resetRun",
    ("post", "/api/runs/{workflow_id}/fork"): "forkRun",
    ("post", "/api/completions"): "completeAwait",
    ("post", "/api/bulk/{action}"): "bulkAct",
    ("get", "/api/metrics"): "getMetrics",
    ("get", "/api/schedules"): "listSchedules",
    ("post", "/api/schedules"): "createSchedule",
    ("get", "/api/schedules/{schedule_id}"): "describeSchedule",
    ("post", "/api/schedules/{schedule_id}/pause"): "pauseSchedule",
    ("post", "/api/schedules/{schedule_id}/unpause"): "unpauseSchedule",
    ("post", "/api/schedules/{schedule_id}/trigger"): "triggerSchedule",
    ("post", "/api/schedules/{schedule_id}/delete"): "deleteSchedule",
    ("post", "/api/schedules/{schedule_id}/backfill"): "backfillSchedule",
    ("get", "/api/limits"): "listLimits",
    ("post", "/api/limits/{name}"): "setLimit",
    ("get", "/api/objects/{object}/{key}/state"): "getObjectState",
    ("put", "/api/objects/{object}/{key}/state"): "setObjectState",
    ("patch", "/api/objects/{object}/{key}/state"): "patchObjectState",
    ("post", "/api/objects/{object}/{key}/state/clear"): "clearObjectState",
}


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[fusee.Engine]:
    async with fusee.Engine.open(tmp_path / "e") as e:
        yield e


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                yield method, path, item[method]


def served_routes() -> set[tuple[str, str]]:
    """Every (method, path template) the API app routes, as the document spells paths."""
    out = set()
    for route in api.build(None).routes:
        if not isinstance(route, HTTPRoute) or not route.path.startswith("/api/"):
            continue  # (Litestar's own schema routes: the outer app does not mount them)
        template = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        out |= {(m.lower(), template) for m in route.methods if m not in ("OPTIONS", "HEAD")}
    return out


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = document()
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["title"] == "Fusee"
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}


async def test_the_served_document_is_the_generated_one(engine: fusee.Engine) -> None:
    transport = httpx.ASGITransport(app=app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8233") as c:
        r = await c.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == document()


def test_every_route_is_documented_under_a_unique_stable_operation_id() -> None:
    doc = document()
    ops = {(method, path): op for method, path, op in operations(doc)}
    assert served_routes() == set(ops)
    ids = [op["operationId"] for op in ops.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert {key: op["operationId"] for key, op in ops.items()} == OPERATIONS
    for (method, path), op in ops.items():
        assert op["summary"] and op["description"], (method, path)
        assert "200" in op["responses"] or "201" in op["responses"], (method, path)
        for status in ("400", "401", "404"):  # every operation documents the API's errors
            assert op["responses"][status]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"}, (method, path, status)
        if method != "get":
            assert {"403", "413", "415"} <= set(op["responses"]), (method, path)
            assert op["requestBody"]["required"] is True


def test_path_parameters_are_documented_as_one_segment() -> None:
    for method, path, op in operations(document()):
        declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
        assert declared == set(re.findall(r"\{(\w+)\}", path)), (method, path)
        for p in op.get("parameters", []):
            assert p.get("description"), (method, path, p["name"])
            if p["in"] == "path" and p["name"] != "action":
                assert "%2F" in p["description"], (method, path, p["name"])


def refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "$ref":
                yield v
            else:
                yield from refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from refs(v)


def test_every_ref_resolves() -> None:
    doc = document()
    found = set(refs(doc))
    assert found
    components = doc["components"]["schemas"]
    for ref in found:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in components, ref


def test_no_route_can_take_an_id_for_a_fixed_word() -> None:
    """Where a route has a parameter, no route sharing its prefix has a fixed word there (and so
    /api/runs/counts cannot exist: counts is /api/counts)."""
    paths = [p.strip("/").split("/") for p in document()["paths"]]
    for path in paths:
        for i, part in enumerate(path):
            if part.startswith("{"):
                rivals = {q[i] for q in paths if len(q) > i and q[:i] == path[:i]}
                assert rivals == {part}, (path, rivals)
    runs = [p for p in paths if p[:2] == ["api", "runs"] and len(p) > 2]
    assert runs and all(p[2] == "{workflow_id}" for p in runs)


def kinds(schema: dict[str, Any]) -> Any:
    """What a property's schema lets through, comparably between Litestar's and msgspec's
    spelling (oneOf or anyOf, a type or a list of types, an enum with or without its type)."""
    if "$ref" in schema:
        return {"ref:" + schema["$ref"].rsplit("/", 1)[1]}
    if "enum" in schema:
        return {"enum:" + ",".join(sorted(map(str, schema["enum"])))}
    options = schema.get("oneOf") or schema.get("anyOf")
    if options:
        return set().union(*(kinds(o) for o in options))
    kind = schema.get("type")
    if kind is None:
        return {"any"}
    out = set(kind) if isinstance(kind, list) else {kind}
    if "items" in schema:
        out = {f"{k}[{','.join(sorted(kinds(schema['items'])))}]" if k == "array" else k for k in out}
    return out


@pytest.mark.parametrize("struct", [*schemas.REQUESTS, *schemas.ANSWERS], ids=lambda s: s.__name__)
def test_the_documented_schemas_are_the_msgspec_structs(struct: type[msgspec.Struct]) -> None:
    components = document()["components"]["schemas"]
    _, expected = msgspec.json.schema_components([*schemas.REQUESTS, *schemas.ANSWERS],
                                                 ref_template="#/components/schemas/{name}")
    for name in {struct.__name__} | {r.rsplit("/", 1)[1] for r in refs(expected[struct.__name__])}:
        want, got = expected[name], components[name]
        assert got["type"] == "object" and set(got["properties"]) == set(want["properties"]), name
        assert sorted(got["required"]) == sorted(want["required"]), name
        assert got.get("additionalProperties", True) == want.get("additionalProperties", True), name
        assert got.get("description") == want.get("description"), name
        for field, spec in want["properties"].items():
            assert kinds(got["properties"][field]) == kinds(spec), (name, field)


@pytest.mark.parametrize(("method", "path", "body", "answers"), [
    ("post", "/api/runs", "StartRequest", {"201": "Started", "409": "Error"}),
    ("get", "/api/runs", None, {"200": "RunPage"}),
    ("get", "/api/runs/{workflow_id}", None, {"200": "RunSummary"}),
    ("post", "/api/runs/{workflow_id}/signal", "SignalRequest", {"200": "Accepted", "409": "Error"}),
    ("post", "/api/runs/{workflow_id}/update", "UpdateRequest", {"200": "Result", "422": "Error"}),
    ("post", "/api/runs/{workflow_id}/fork", "ForkRequest", {"201": "Started"}),
    ("post", "/api/bulk/{action}", "BulkRequest", {"200": "BulkResult"}),
    ("post", "/api/schedules/{schedule_id}/pause", "Empty", {"200": "Schedule"}),
    ("post", "/api/limits/{name}", "SetLimitRequest", {"200": "LimitView"}),
    ("patch", "/api/objects/{object}/{key}/state", "PatchObjectStateRequest", {"200": "ObjectStateView",
                                                                             "409": "Error"}),
])
def test_an_operation_documents_its_body_and_answers(method: str, path: str, body: str | None,
                                                     answers: dict[str, str]) -> None:
    op = document()["paths"][path][method]
    if body is None:
        assert "requestBody" not in op
    else:
        assert op["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{body}"}
    for status, name in answers.items():
        assert op["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{name}"}, status


def test_streams_and_exports_document_their_media_types() -> None:
    paths = document()["paths"]
    stream = paths["/api/runs/{workflow_id}/streams/{name}"]["get"]
    assert set(stream["responses"]["200"]["content"]) == {"text/event-stream"}
    assert {p["name"] for p in stream["parameters"]} >= {"offset", "run_id", "Last-Event-ID"}
    export = paths["/api/runs/{workflow_id}/export"]["get"]
    assert set(export["responses"]["200"]["content"]) == {"application/octet-stream"}
    limit = next(p for p in paths["/api/runs"]["get"]["parameters"] if p["name"] == "limit")
    assert (limit["in"], limit["schema"]["type"], limit["schema"]["minimum"]) == ("query", "integer", 1)
