"""The OpenAPI 3.1 document of the HTTP API, built from the request and answer structs."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from fusee.engine.bulk import ACTIONS as BULK_ACTIONS
from fusee.engine.bulk import MAX_BULK
from fusee.http import schemas

_REF = "#/components/schemas/{name}"


def _ref(kind: type) -> dict[str, str]:
    return {"$ref": _REF.format(name=kind.__name__)}


def _json(kind: type, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(kind)}}}


_ERRORS = {
    "400": _json(schemas.Error, "A bad request: the error's field names what is wrong. Nothing was recorded."),
    "401": _json(schemas.Error, "The token is missing or wrong. Nothing ran."),
    "404": _json(schemas.Error, "No workflow (schedule, limit, object) with that ID or name."),
}
#: The answers of the checks made before any handler, on requests that change something.
_WRITE_ERRORS = {
    "403": _json(schemas.Error, "The request comes from another site (its Origin, Sec-Fetch-Site or Referer)."),
    "413": _json(schemas.Error, "The body is over the server's limit (16 MiB unless configured)."),
    "415": _json(schemas.Error, "The body is not sent as Content-Type: application/json."),
}
#: Path parameters are one segment each: a "/" in an ID is sent as %2F.
_SEGMENT = "Percent-encoded, one path segment (send a '/' as %2F)"


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "description": _SEGMENT}


_ID = _path("workflow_id")
_WHERE = {"name": "where", "in": "query", "schema": {"type": "string"},
          "description": "A query such as status = 'paused' and started_at > now() - 1h, which may "
                         "end with an order: ... order by started_at desc (an unknown status is "
                         "refused as UnknownStatus; see docs/api.md)"}
_SID = _path("schedule_id")
_OBJ = [_path("object"), _path("key")]
_CONFLICT = {"409": _json(schemas.Error, "The state no longer has the version if_version names: read it again.")}


def _op(summary: str, ok: dict[str, Any], body: type | None = None, params: list[dict[str, Any]] | None = None,
        status: str = "200", more: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {status: ok, **_ERRORS, **(more or {})}}
    if params:
        op["parameters"] = params
    if body is not None:
        op["responses"].update(_WRITE_ERRORS)
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
    return op


def _action(summary: str, body: type, answer: type = schemas.Accepted,
            more: dict[str, Any] | None = None, status: str = "200") -> dict[str, Any]:
    conflict = {"409": _json(schemas.Error, "The run has ended (or the request conflicts with its state).")}
    return {"post": _op(summary, _json(answer, "Done, and durable."), body, [_ID], status=status,
                        more={**conflict, **(more or {})})}


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document (served at ``/openapi.json``)."""
    _, components = msgspec.json.schema_components(
        [*schemas.REQUESTS, *schemas.ANSWERS], ref_template=_REF)
    paths: dict[str, Any] = {
        "/api/runs": {
            "get": _op("List runs matching a where query, a page at a time (Engine.list)",
                       _json(schemas.RunPage, "A page of runs, oldest first (or newest first, or in the "
                                                    "where query's order by)."), params=[
                           _WHERE,
                           {"name": "order", "in": "query",
                            "schema": {"type": "string", "enum": ["oldest", "newest"], "default": "oldest"},
                            "description": "oldest: first seen first; newest: last seen first (pass the "
                                           "same order with a cursor; with an order by in where, "
                                           "newest is refused)"},
                           {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                        "maximum": 10000, "default": 100}},
                           {"name": "cursor", "in": "query", "schema": {"type": "string"},
                            "description": "The cursor of the previous page"},
                       ]),
            "post": _op("Start a workflow (Engine.start)", _json(schemas.Started, "Started, and durable."),
                        schemas.StartRequest, status="201",
                        more={"409": _json(schemas.Error, "The ID is running (if_running='fail') or "
                                                          "finished (if_finished='fail').")}),
        },
        "/api/runs/{workflow_id}": {
            "get": _op("Describe a run (Engine.describe)", _json(schemas.RunSummary, "The run."),
                       params=[_ID]),
        },
        "/api/runs/{workflow_id}/journal": {
            "get": _op("The run's durable journal, readable, and its timeline",
                       _json(schemas.Journal, "The journal."), params=[_ID]),
        },
        "/api/runs/{workflow_id}/export": {
            "get": _op("The run's durable journal as a .fjnl file (Engine.export)",
                       {"description": "The .fjnl bytes.",
                        "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                            "format": "binary"}}}},
                       params=[_ID]),
        },
        "/api/runs/{workflow_id}/streams/{name}": {
            "get": _op("Follow a stream as Server-Sent Events (Engine.read_stream_batch)",
                       {"description": "Events 'chunk' (data: the chunk as JSON; id: the offset after it), "
                                       "then 'end' (data: {offset, status, run_id}; status 'ok', 'failed', "
                                       "...). One connection follows one run (run_id pins it; an 'error' "
                                       "event RunNotCurrent once another run is current). Reconnect with "
                                       "Last-Event-ID.",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                       params=[_ID, _path("name"),
                               {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                               {"name": "run_id", "in": "query", "schema": {"type": "integer", "minimum": 1}}]),
        },
        "/api/runs/{workflow_id}/signal": _action("Send a signal (Engine.signal)", schemas.SignalRequest),
        "/api/runs/{workflow_id}/query": _action(
            "Ask a query (Engine.query)", schemas.QueryRequest, schemas.Result,
            {"422": _json(schemas.Error, "The query's handler failed.")}),
        "/api/runs/{workflow_id}/update": _action(
            "Run an update (Engine.update)", schemas.UpdateRequest, schemas.Result,
            {"422": _json(schemas.Error, "The update's handler failed.")}),
        "/api/runs/{workflow_id}/cancel": _action("Request cancellation (Engine.cancel)", schemas.ReasonRequest),
        "/api/runs/{workflow_id}/terminate": _action("Terminate (Engine.terminate)", schemas.ReasonRequest),
        "/api/runs/{workflow_id}/resume": _action(
            "Resume paused steps (Engine.resume); 409 NothingPaused when no step is paused",
            schemas.ResumeRequest),
        "/api/runs/{workflow_id}/reset": _action("Reset to before a step (Engine.reset)", schemas.ResetRequest,
                                                 schemas.Started),
        "/api/runs/{workflow_id}/fork": _action(
            "Start new_id from the run's journal before a step, leaving the run alone (Engine.fork)",
            schemas.ForkRequest, schemas.Started, status="201"),
        "/api/counts": {
            "get": _op("How many runs match a where query, by status (Engine.counts)",
                       _json(schemas.Counts, "Every status, zeros included."), params=[_WHERE]),
        },
        "/api/bulk/{action}": {
            "post": _op(f"Cancel, terminate, resume, signal or reset every run a where query matches, at most "
                        f"{MAX_BULK} per request; dry_run counts them and does nothing (Engine.bulk)",
                        _json(schemas.BulkResult, "Counted (dry run), or done and durable for the runs in "
                                                  "done; the others are in failed."),
                        schemas.BulkRequest,
                        [{"name": "action", "in": "path", "required": True,
                          "schema": {"type": "string", "enum": list(BULK_ACTIONS)}}]),
        },
        "/api/completions": {
            "post": _op("Complete or fail an await_completion by its token (Engine.complete)",
                        _json(schemas.Completed, "Whether it was completed (durable)."), schemas.CompleteRequest),
        },
        "/api/metrics": {
            "get": _op("Engine metrics (Engine.metrics)", _json(schemas.Metrics, "A snapshot.")),
        },
        "/api/schedules": {
            "get": _op("Every schedule (Engine.schedules)", _json(schemas.ScheduleList, "The schedules, by ID.")),
            "post": _op("Make a schedule; the same ID and spec again does nothing (Engine.schedule)",
                        _json(schemas.Schedule, "Made, and durable."), schemas.ScheduleRequest, status="201",
                        more={"409": _json(schemas.Error, "The ID is scheduled with another spec: delete it "
                                                          "first.")}),
        },
        "/api/schedules/{schedule_id}": {
            "get": _op("One schedule, once durable (Engine.describe_schedule)",
                       _json(schemas.Schedule, "The schedule."), params=[_SID]),
        },
        **{f"/api/schedules/{{schedule_id}}/{op}": {
            "post": _op(summary, _json(schemas.Schedule, "Done, and durable: the schedule now."),
                        schemas.Empty, [_SID])}
           for op, summary in [
               ("pause", "Stop starting runs (Engine.pause_schedule)"),
               ("unpause", "Start runs again from the next time (Engine.unpause_schedule)"),
               ("trigger", "Start a run now, under the overlap policy (Engine.trigger_schedule)"),
               ("delete", "End the schedule; its runs go on (Engine.delete_schedule)"),
           ]},
        "/api/schedules/{schedule_id}/backfill": {
            "post": _op("Run the scheduled times in [start, end) (Engine.backfill_schedule)",
                        _json(schemas.Schedule, "Done, and durable: the schedule now."),
                        schemas.BackfillRequest, [_SID]),
        },
        "/api/limits": {
            "get": _op("Step limits with permits in use and steps waiting (Engine.limits)",
                       _json(schemas.LimitList, "The limits, by name.")),
        },
        "/api/limits/{name}": {
            "post": _op("Resize a limit now; not durable: the next Engine.open takes its own (Engine.set_limit)",
                        _json(schemas.LimitView, "The limit now."), schemas.SetLimitRequest,
                        [_path("name")]),
        },
        "/api/objects/{object}/{key}/state": {
            "get": _op("A keyed object's state and version (Engine.object_state)",
                       _json(schemas.ObjectStateView, "The durable state."), params=_OBJ),
            "put": _op("Replace the state, if it still has if_version (Engine.set_object_state)",
                       _json(schemas.ObjectStateView, "The state now, durable."), schemas.SetObjectStateRequest,
                       _OBJ, more=_CONFLICT),
            "patch": _op("Apply a JSON Patch (RFC 6902) to the state (Engine.patch_object_state)",
                         _json(schemas.ObjectStateView, "The state now, durable."),
                         schemas.PatchObjectStateRequest, _OBJ, more=_CONFLICT),
        },
        "/api/objects/{object}/{key}/state/clear": {
            "post": _op("Put the state back to the initial state (Engine.clear_object_state)",
                        _json(schemas.ObjectStateView, "The state now, durable."),
                        schemas.ClearObjectStateRequest, _OBJ, more=_CONFLICT),
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Fusee", "version": "1",
                 "description": "Operate the runs of a Fusee engine: list, inspect, start, signal, "
                                "query, update, cancel, terminate, resume, reset, fork, complete, follow "
                                "streams; "
                                "operate schedules, step limits and keyed objects' state."},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }
