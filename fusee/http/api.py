"""The JSON API under ``/api``, as a Litestar app: each endpoint is declared once.

A route handler here names its path, method, ``operationId``, summary (its
docstring is the description), path and query parameters with their
constraints, its msgspec request body and its answers (``responses=``, errors
included); the OpenAPI document served at ``/openapi.json`` is generated from
these declarations (:func:`document`), never written by hand.

Every handler validates its whole request before it calls the engine, so a
refused request records nothing; the engine's own checks (an unknown ID, an
ended run, a rejected update) also come before anything is journaled. Handlers
run on the engine's event loop (:func:`on_engine`): mounted in an app served on
another loop (or thread), each call is handed to the engine's loop.

IDs in paths (workflow and schedule IDs, limit, stream and object names, object
keys) are one percent-encoded segment each, in a fixed position: the API is
routed on the path as sent (:class:`Gateway`, ``fusee.http.paths``) and each
handler decodes its IDs once (:func:`segment`). The fixed words of a path
(``journal``, ``signal``, ``state``...) come after an ID, never in its place, so
no route can take an ID for one of them.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import inspect
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from http import HTTPStatus
from types import NoneType
from typing import Annotated, Any, Literal, TypeVar, cast, get_args, get_origin
from urllib.parse import unquote

import msgspec
from litestar import Litestar, Request, Response, get, patch, post, put
from litestar.di import NamedDependency, Provide
from litestar.dto import AbstractDTO
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, Schema, SecurityScheme
from litestar.params import HeaderParameter, JSONBody, PathParameter, QueryParameter
from litestar.plugins import OpenAPISchemaPlugin
from litestar.types import ASGIApp, Empty
from litestar.typing import FieldDefinition
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp as StarletteApp
from starlette.types import Message, Receive, Scope, Send

import fusee
from fusee import codec, errors, journal_file, objects, views
from fusee.engine.bulk import ACTIONS as BULK_ACTIONS
from fusee.engine.bulk import MAX_BULK
from fusee.engine.visibility import MAX_LIMIT
from fusee.http import schemas, sse
from fusee.http.auth import user_of
from fusee.http.guard import SAFE_METHODS, error_body
from fusee.http.paths import encoded_path

T = TypeVar("T")

#: The engine a handler acts on (the app's one dependency).
Engine = NamedDependency[fusee.Engine]

#: How long one wait of a stream reader lasts before a keep-alive comment is sent (seconds).
STREAM_POLL = 15.0

#: The POST endpoints of a run (``/api/runs/{workflow_id}/{action}``).
RUN_ACTIONS = ("signal", "query", "update", "cancel", "terminate", "resume", "reset", "fork")
#: Its GET endpoints (with ``streams/{name}``).
RUN_READS = ("journal", "export")
#: A schedule's POST endpoints (``/api/schedules/{schedule_id}/{op}``).
SCHEDULE_OPS = ("pause", "unpause", "trigger", "delete", "backfill")

#: HTTP status of each engine error (the others are 400: the request cannot be done as asked).
_STATUS: dict[type[BaseException], int] = {
    errors.NotFound: 404,
    errors.AlreadyExists: 409,
    errors.WorkflowEnded: 409,
    errors.HistoryUnavailable: 409,
    errors.UpdateFailed: 422,
    errors.QueryFailed: 422,
    errors.EngineClosed: 503,
    errors.StorageError: 503,
    errors.WrongEventLoop: 500,
    errors.UnknownLimit: 404,
    errors.ObjectVersionConflict: 409,
}


class BadRequest(Exception):
    """A request the API refuses before calling the engine: 400 naming the field."""

    def __init__(self, message: str, field: str | None, status: int = 400, type: str = "BadRequest") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status
        self.type = type


async def on_engine(engine: fusee.Engine, call: Callable[[], Awaitable[T]]) -> T:
    """Awaits ``call()`` on the engine's loop (here if this is it) and returns its result."""
    if asyncio.get_running_loop() is engine.loop:
        return await call()

    async def run() -> T:
        return await call()

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), engine.loop))


async def _call(engine: fusee.Engine, fn: Callable[[], Awaitable[T]]) -> T:
    return await on_engine(engine, fn)


async def _read(engine: fusee.Engine, fn: Callable[[], T]) -> T:
    """A synchronous engine call (list, describe, metrics), made on the engine's loop."""

    async def run() -> T:
        return fn()

    return await on_engine(engine, run)


def segment(value: str) -> str:
    """A path parameter as sent (one percent-encoded segment), decoded once (bytes that are no
    UTF-8 stay as surrogates, for the engine to refuse as an invalid ID)."""
    return unquote(value, errors="surrogateescape")


# --- request bodies ----------------------------------------------------------------


class StrictBody(AbstractDTO):  # type: ignore[type-arg]
    """Decodes a handler's ``data`` strictly into its msgspec struct (``msgspec.json.decode``:
    no coercion, unknown fields refused) and refuses a body that does not fit in the API's words,
    naming the field (``schemas.explain``). The OpenAPI document shows the struct itself."""

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Any:
        return iter(())

    @classmethod
    def detect_nested_field(cls, field_definition: Any) -> bool:
        return False

    @classmethod
    def create_for_field_definition(cls, field_definition: Any, handler_id: str, backend_cls: Any = None) -> None:
        return None  # no transfer model: the struct is the body

    @classmethod
    def create_openapi_schema(cls, field_definition: Any, handler_id: str, schema_creator: Any) -> Any:
        return schema_creator.for_field_definition(field_definition)

    def decode_bytes(self, value: bytes) -> Any:
        kind = self.asgi_connection.route_handler.parsed_data_field.annotation
        return decode(value, kind)


def decode(raw: bytes, kind: type[T]) -> T:
    """``raw`` (a request body; blank is ``{}``) as ``kind``; :class:`BadRequest` naming the field."""
    if not raw.strip():
        raw = b"{}"
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        message, field = schemas.explain(str(e), kind)
        raise BadRequest(message, field) from None
    except msgspec.DecodeError as e:
        raise BadRequest(f"the request body is not JSON: {e}", "body") from None


class StructSchemas(OpenAPISchemaPlugin):
    """Documents the API's msgspec structs as Litestar does, with what msgspec's own JSON Schema
    says of them too: the struct's docstring (``description``) and, for a request body that
    refuses unknown fields, ``additionalProperties: false``."""

    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        return not field_definition.is_union and field_definition.is_subclass_of(msgspec.Struct)

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: Any) -> Schema:
        kind = field_definition.type_
        info = msgspec.inspect.type_info(kind)
        assert isinstance(info, msgspec.inspect.StructType)
        hints = field_definition.get_type_hints(include_extras=True, resolve_generics=True)
        unset = (msgspec.NODEFAULT, msgspec.UNSET)
        properties = {
            f.encode_name: FieldDefinition.from_annotation(
                hints[f.name], name=f.encode_name, default=Empty if f.default in unset else f.default)
            for f in info.fields
        }
        schema: Schema = schema_creator.create_component_schema(
            field_definition, required=sorted(f.encode_name for f in info.fields if f.required),
            property_fields=properties)
        if kind.__doc__:
            schema.description = inspect.cleandoc(kind.__doc__)
        if info.forbid_unknown_fields:
            schema.additional_properties = False
        return schema


# --- what the document says of every operation ----------------------------------------


def _doc(kind: Any, description: str, media_type: str = "application/json") -> ResponseSpec:
    return ResponseSpec(kind, description=description, media_type=media_type, generate_examples=False)


#: The errors any request may get.
_ERRORS = {
    400: _doc(schemas.Error, "A bad request: the error's field names what is wrong. Nothing was recorded."),
    401: _doc(schemas.Error, "The token is missing or wrong. Nothing ran."),
    404: _doc(schemas.Error, "No workflow (schedule, limit, object) with that ID or name."),
}
#: The answers of the checks made before any handler, on requests that change something.
_WRITE_ERRORS = {
    403: _doc(schemas.Error, "The request comes from another site (its Origin, Sec-Fetch-Site or Referer)."),
    413: _doc(schemas.Error, "The body is over the server's limit (16 MiB unless configured)."),
    415: _doc(schemas.Error, "The body is not sent as Content-Type: application/json."),
}
_ENDED = _doc(schemas.Error, "The run has ended (or the request conflicts with its state).")
_STALE = _doc(schemas.Error, "The state no longer has the version if_version names: read it again.")


def _reads(ok: ResponseSpec, status: int = 200, **more: ResponseSpec) -> dict[int, ResponseSpec]:
    """The answers of a GET: ``ok``, the errors, and ``more`` (by status: ``e409=...``)."""
    return {status: ok, **_ERRORS, **{int(k[1:]): v for k, v in more.items()}}


def _writes(ok: ResponseSpec, status: int = 200, **more: ResponseSpec) -> dict[int, ResponseSpec]:
    """The answers of a request with a body: those of a read and the write checks'."""
    return {**_reads(ok, status, **more), **_WRITE_ERRORS}


def _field(name: str | None) -> dict[str, Any]:
    """The handler's ``opt``: the request field an engine ``TypeError``/``ValueError`` is about."""
    return {"field": name}


_SEGMENT = "Percent-encoded, one path segment (send a '/' as %2F)"
WorkflowId = Annotated[str, PathParameter(description=f"The run's workflow ID. {_SEGMENT}")]
ScheduleId = Annotated[str, PathParameter(description=f"The schedule's ID. {_SEGMENT}")]
Where = Annotated[str | None, QueryParameter(
    description="A query such as status = 'paused' and started_at > now() - 1h, which may end with an "
                "order: ... order by started_at desc (an unknown status is refused as UnknownStatus; see "
                "docs/api.md); left out: every run")]


# --- reading runs --------------------------------------------------------------------


async def _exists(engine: fusee.Engine, wid: str) -> Any:
    """The run's summary; NotFound (404) for an unknown ID."""
    return await _read(engine, lambda: engine.describe(wid))


@get("/api/runs", operation_id="listRuns", opt=_field("where"),
     summary="List runs matching a where query, a page at a time (Engine.list)",
     responses=_reads(_doc(schemas.RunPage, "A page of runs, oldest first (or newest first, or in the "
                                      "where query's order by).")))
async def list_runs(
    engine: Engine,
    where: Where = None,
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_LIMIT, description="Runs in the page")] = 100,
    cursor: Annotated[str | None, QueryParameter(description="The cursor of the previous page (with the same where "
                                                        "and order)")] = None,
    order: Annotated[Literal["oldest", "newest"], QueryParameter(
        description="oldest: first seen first; newest: last seen first (with an order by in where, "
                    "newest is refused)")] = "oldest",
) -> dict[str, Any]:
    """A page of the runs ``where`` matches and the cursor of the next page (null: no more)."""
    where, cursor = where or None, cursor or None
    try:
        page = await _read(engine, lambda: engine.list(where, limit=limit, cursor=cursor, order=order))
    except errors.InvalidQuery as e:
        if cursor is not None and e.query == cursor and e.query != where:
            raise BadRequest(str(e), "cursor", type="InvalidQuery") from None
        raise
    return views.page(page)


@get("/api/counts", operation_id="countRuns", opt=_field("where"),
     summary="How many runs match a where query, by status (Engine.counts)",
     responses=_reads(_doc(schemas.Counts, "Every status, zeros included.")))
async def count_runs(engine: Engine, where: Where = None) -> dict[str, Any]:
    """The number of runs ``where`` matches in each status."""
    where = where or None
    return {"where": where, "counts": await _read(engine, lambda: engine.counts(where))}


@get("/api/runs/{workflow_id:str}", operation_id="describeRun", opt=_field(None),
     summary="Describe a run (Engine.describe)", responses=_reads(_doc(schemas.RunSummary, "The run.")))
async def describe_run(engine: Engine, workflow_id: WorkflowId) -> dict[str, Any]:
    """Its status, times, attributes, retries, paused steps, audit and every step attempt."""
    return views.summary(await _exists(engine, segment(workflow_id)))


@get("/api/runs/{workflow_id:str}/journal", operation_id="getRunJournal", opt=_field(None),
     summary="The run's durable journal, readable, and its timeline",
     responses=_reads(_doc(schemas.Journal, "The journal.")))
async def get_run_journal(engine: Engine, workflow_id: WorkflowId) -> dict[str, Any]:
    """The durable records (ISO times, decoded payloads) and one timeline entry per operation."""
    wid = segment(workflow_id)
    summary = await _exists(engine, wid)
    records = await _call(engine, lambda: engine.journal(wid))
    return {"workflow_id": wid, "run_id": summary.run_id,
            "records": views.journal(records), "timeline": views.timeline(records)}


@get("/api/runs/{workflow_id:str}/export", operation_id="exportRun", opt=_field(None),
     summary="The run's durable journal as a .fjnl file (Engine.export)",
     responses=_reads(_doc(bytes, "The .fjnl bytes.", "application/octet-stream")))
async def export_run(engine: Engine, workflow_id: WorkflowId) -> Response[bytes]:
    """The journal as ``fusee import`` and ``Engine.import_journal`` read it."""
    wid = segment(workflow_id)
    records = await _call(engine, lambda: engine.journal(wid))
    return Response(journal_file.dumps(records), media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{_safe(wid)}.fjnl"'})


@get("/api/runs/{workflow_id:str}/streams/{name:str}", operation_id="followStream", opt=_field("offset"),
     summary="Follow a stream as Server-Sent Events (Engine.read_stream_batch)",
     responses=_reads(_doc(str, "Events 'chunk' (data: the chunk as JSON; id: the offset after it), then 'end' "
                               "(data: {offset, status, run_id}; status 'ok', 'failed', ...). One connection "
                               "follows one run (run_id pins it; an 'error' event RunNotCurrent once another "
                               "run is current). Reconnect with Last-Event-ID.", "text/event-stream")))
async def follow_stream(
    engine: Engine,
    workflow_id: WorkflowId,
    name: Annotated[str, PathParameter(description=f"The stream's name. {_SEGMENT}")],
    offset: Annotated[int, QueryParameter(ge=0, le=1 << 62, description="Chunks to skip")] = 0,
    run_id: Annotated[int | None, QueryParameter(ge=1, le=1 << 62, description="The run to follow (default: the "
                                                                         "current one)")] = None,
    last_event_id: Annotated[str | None, HeaderParameter(name="Last-Event-ID", description="The id of the last event "
                                                   "received: the stream goes on after it")] = None,
) -> ASGIApp:
    """The stream's chunks from ``offset`` as they come, until the run ends."""
    wid, name = segment(workflow_id), segment(name)
    if last_event_id is not None:
        try:
            offset = max(offset, int(last_event_id))
        except ValueError:
            raise BadRequest(f"Last-Event-ID must be a stream offset, got {last_event_id!r}",
                             "Last-Event-ID") from None
    await _exists(engine, wid)

    async def events() -> AsyncIterator[sse.Event]:
        at, pinned = offset, run_id
        while True:
            try:
                # One connection follows one run: the first answer's, or the one asked for.
                b = await _call(engine, functools.partial(engine.stream_batch, wid, name, at, wait=STREAM_POLL,
                                                          run_id=pinned))
                chunks, nxt, ended, pinned = b.chunks, b.next_offset, b.ended, b.run_id
            except errors.FuseeError as e:
                yield sse.event(json.dumps({"type": type(e).__name__, "message": str(e)}), event="error")
                return
            if not chunks and not ended:
                yield sse.event(comment="waiting")  # keeps proxies from closing an idle stream
            for i, chunk in enumerate(chunks):
                # The id is the offset after this chunk: a reconnect sends it as Last-Event-ID.
                yield sse.event(json.dumps(chunk), event="chunk", id=str(at + i + 1))
            at = nxt
            if ended:
                end = {"offset": at, "status": b.end_status, "run_id": pinned}
                yield sse.event(json.dumps(end), event="end")
                return

    # sse-starlette: the event encoding, client disconnects and the server's shutdown.
    return cast(ASGIApp, sse.response(events(), headers={"Cache-Control": "no-cache"}))


@get("/api/metrics", operation_id="getMetrics", opt=_field(None), summary="Engine metrics (Engine.metrics)",
     responses=_reads(_doc(schemas.Metrics, "A snapshot.")))
async def get_metrics(engine: Engine) -> dict[str, Any]:
    """Runs by status per shard, steps, timers, flushes and the journal's latency."""
    return views.metrics(await _read(engine, engine.metrics))


# --- acting on runs ------------------------------------------------------------------


@post("/api/runs", operation_id="startRun", opt=_field("input"), status_code=201,
      summary="Start a workflow (Engine.start)",
      responses=_writes(_doc(schemas.Started, "Started, and durable."), 201,
                        e409=_doc(schemas.Error, "The ID is running (if_running='fail') or finished "
                                                 "(if_finished='fail').")))
async def start_run(engine: Engine, data: JSONBody[schemas.StartRequest]) -> dict[str, Any]:
    """Starts ``workflow`` as ``workflow_id`` with ``input``."""
    if not data.workflow_id:
        raise BadRequest("workflow_id must be a non-empty string", "workflow_id")
    timeout = _timeout(data.timeout)
    handle = await _call(engine, lambda: engine.start(
        data.workflow, data.workflow_id, data.input, if_running=data.if_running,
        if_finished=data.if_finished, timeout=timeout))
    return {"workflow_id": handle.workflow_id, "run_id": handle.run_id}


_ACCEPTED = _doc(schemas.Accepted, "Done, and durable.")


@post("/api/runs/{workflow_id:str}/signal", operation_id="signalRun", opt=_field("value"), status_code=200,
      summary="Send a signal (Engine.signal)", responses=_writes(_ACCEPTED, e409=_ENDED))
async def signal_run(engine: Engine, request: Request[Any, Any, Any], workflow_id: WorkflowId,
                     data: JSONBody[schemas.SignalRequest]) -> dict[str, Any]:
    """Sends the signal ``name`` with ``value`` (checked against what the run waits for); resent with
    the ``dedup_key`` of one the run received, it answers as the first did."""
    wid = segment(workflow_id)
    # By name only (no fusee.signal declaration): the engine checks the value against the
    # run's wait or the declared type, and refuses an unknown name.
    sig: fusee.SignalDef[Any] = _named(fusee.SignalDef, data.name)
    by = _who(request, data.by)
    try:
        await _call(engine, lambda: engine.signal(wid, sig, data.value, dedup_key=data.dedup_key, by=by))
    except errors.UnknownSignal as e:
        raise BadRequest(str(e), "name", type="UnknownSignal") from None
    return {"workflow_id": wid, "action": "signal"}


@post("/api/runs/{workflow_id:str}/query", operation_id="queryRun", opt=_field("arg"), status_code=200,
      summary="Ask a query (Engine.query)",
      responses=_writes(_doc(schemas.Result, "The query's answer."), e409=_ENDED,
                        e422=_doc(schemas.Error, "The query's handler failed.")))
async def query_run(engine: Engine, workflow_id: WorkflowId, data: JSONBody[schemas.QueryRequest]) -> Response[bytes]:
    """Asks the query ``name`` with ``arg``; nothing is recorded."""
    wid = segment(workflow_id)
    q = _named(fusee.query, data.name)
    return _result(await _call(engine, lambda: engine.query(wid, q, data.arg)))


@post("/api/runs/{workflow_id:str}/update", operation_id="updateRun", opt=_field("arg"), status_code=200,
      summary="Run an update (Engine.update)",
      responses=_writes(_doc(schemas.Result, "The update's answer, durable."), e409=_ENDED,
                        e422=_doc(schemas.Error, "The update's handler failed.")))
async def update_run(engine: Engine, workflow_id: WorkflowId, data: JSONBody[schemas.UpdateRequest]) -> Response[bytes]:
    """Runs the update ``name`` with ``arg`` (once per ``update_id``); a validator's refusal is 400
    UpdateRejected and records nothing."""
    wid = segment(workflow_id)
    u = _named(fusee.update, data.name)
    if data.update_id is not None and not data.update_id:
        raise BadRequest("update_id must be a non-empty string (or left out)", "update_id")
    try:
        result = await _call(engine, lambda: engine.update(wid, u, data.arg, update_id=data.update_id))
    except errors.FuseeError:
        raise
    except Exception as e:  # the workflow's validator refused it: nothing was recorded
        raise BadRequest(f"the update was rejected: {str(e) or type(e).__name__}", "arg",
                         type="UpdateRejected") from None
    return _result(result)


@post("/api/runs/{workflow_id:str}/cancel", operation_id="cancelRun", opt=_field("reason"), status_code=200,
      summary="Request cancellation (Engine.cancel)", responses=_writes(_ACCEPTED, e409=_ENDED))
async def cancel_run(engine: Engine, request: Request[Any, Any, Any], workflow_id: WorkflowId,
                     data: JSONBody[schemas.ReasonRequest]) -> dict[str, Any]:
    """Asks the run to cancel (its workflow sees a cancellation and may clean up)."""
    wid = segment(workflow_id)
    by = _who(request, data.by)
    await _call(engine, lambda: engine.cancel(wid, data.reason, by=by))
    return {"workflow_id": wid, "action": "cancel"}


@post("/api/runs/{workflow_id:str}/terminate", operation_id="terminateRun", opt=_field("reason"),
      status_code=200, summary="Terminate (Engine.terminate)", responses=_writes(_ACCEPTED, e409=_ENDED))
async def terminate_run(engine: Engine, request: Request[Any, Any, Any], workflow_id: WorkflowId,
                        data: JSONBody[schemas.ReasonRequest]) -> dict[str, Any]:
    """Ends the run now, without running its code again."""
    wid = segment(workflow_id)
    by = _who(request, data.by)
    await _call(engine, lambda: engine.terminate(wid, data.reason, by=by))
    return {"workflow_id": wid, "action": "terminate"}


@post("/api/runs/{workflow_id:str}/resume", operation_id="resumeRun", opt=_field("by"), status_code=200,
      summary="Resume paused steps (Engine.resume); 409 NothingPaused when no step is paused",
      responses=_writes(_ACCEPTED, e409=_ENDED))
async def resume_run(engine: Engine, request: Request[Any, Any, Any], workflow_id: WorkflowId,
                     data: JSONBody[schemas.ResumeRequest]) -> dict[str, Any]:
    """Retries the steps whose retries ran out (describe shows them as paused_steps)."""
    wid = segment(workflow_id)
    by = _who(request, data.by)

    async def resume() -> None:
        # Checked and resumed in one turn of the engine's loop: nothing pauses in between.
        s = engine.describe(wid)
        # (A follower's view may lag its owner's: it leaves the answer to the owner.)
        if s.ended_at is None and not s.paused_steps and engine.is_owner:
            raise BadRequest(f"run {wid!r} has no paused step to resume: resume is for steps whose "
                             "retries ran out (describe shows them as paused_steps)", None, status=409,
                             type="NothingPaused")
        await engine.resume(wid, by=by)

    await _call(engine, resume)
    return {"workflow_id": wid, "action": "resume"}


def _cut(before_step: str | None, before_position: int | None) -> None:
    if before_step is None and before_position is None:
        raise BadRequest("give before_step (a step's name) or before_position (a journal position)",
                         "before_step")
    if before_position is not None and before_position < 0:
        raise BadRequest("before_position must be >= 0", "before_position")


@post("/api/runs/{workflow_id:str}/reset", operation_id="resetRun", opt=_field("before_step"), status_code=200,
      summary="Reset to before a step (Engine.reset)",
      responses=_writes(_doc(schemas.Started, "The new run, durable."), e409=_ENDED))
async def reset_run(engine: Engine, request: Request[Any, Any, Any], workflow_id: WorkflowId,
                    data: JSONBody[schemas.ResetRequest]) -> dict[str, Any]:
    """Starts the run again from its journal before a step or a position."""
    wid = segment(workflow_id)
    _cut(data.before_step, data.before_position)
    by = _who(request, data.by)
    handle = await _call(engine, lambda: engine.reset(
        wid, before_step=data.before_step, before_position=data.before_position,
        reapply_signals=data.reapply_signals, version=data.version, by=by))
    return {"workflow_id": handle.workflow_id, "run_id": handle.run_id}


@post("/api/runs/{workflow_id:str}/fork", operation_id="forkRun", opt=_field("before_step"), status_code=201,
      summary="Start new_id from the run's journal before a step, leaving the run alone (Engine.fork)",
      responses=_writes(_doc(schemas.Started, "The new run, durable."), 201, e409=_ENDED))
async def fork_run(engine: Engine, request: Request[Any, Any, Any], workflow_id: WorkflowId,
                   data: JSONBody[schemas.ForkRequest]) -> dict[str, Any]:
    """Starts ``new_id`` from the run's journal before a step or a position."""
    wid = segment(workflow_id)
    if not data.new_id:
        raise BadRequest("new_id must be a non-empty string: the ID of the new run", "new_id")
    _cut(data.before_step, data.before_position)
    by = _who(request, data.by)
    handle = await _call(engine, lambda: engine.fork(
        wid, data.new_id, before_step=data.before_step, before_position=data.before_position,
        reapply_signals=data.reapply_signals, version=data.version, by=by))
    return {"workflow_id": handle.workflow_id, "run_id": handle.run_id}


@post("/api/completions", operation_id="completeAwait", opt=_field("token"), status_code=200,
      summary="Complete or fail an await_completion by its token (Engine.complete)",
      responses=_writes(_doc(schemas.Completed, "Whether it was completed (durable).")))
async def complete_await(engine: Engine, request: Request[Any, Any, Any],
                         data: JSONBody[schemas.CompleteRequest]) -> dict[str, Any]:
    """Completes (or, with ``failed``, fails) the operation the token was handed out for."""
    if not data.token:
        raise BadRequest("token must be the non-empty token handed out by ctx.await_completion", "token")
    by = _who(request, data.by)
    try:
        if data.failed:
            done = await _call(engine, lambda: engine.fail_completion(data.token, data.message, by=by))
        else:
            done = await _call(engine, lambda: engine.complete(data.token, data.value, by=by))
    except errors.SerializationError as e:
        raise BadRequest(str(e), "value", type="SerializationError") from None
    except ValueError as e:  # a token that does not parse
        raise BadRequest(str(e), "token") from None
    return {"completed": done}


@post("/api/bulk/{action:str}", operation_id="bulkAct", opt=_field("where"), status_code=200,
      summary=f"Cancel, terminate, resume, signal or reset every run a where query matches, at most {MAX_BULK} "
              "per request; dry_run counts them and does nothing (Engine.bulk)",
      responses=_writes(_doc(schemas.BulkResult, "Counted (dry run), or done and durable for the runs in done; "
                                                 "the others are in failed.")))
async def bulk_act(
    engine: Engine,
    request: Request[Any, Any, Any],
    action: Annotated[str, PathParameter(description="The action", enum=list(BULK_ACTIONS))],
    data: JSONBody[schemas.BulkRequest],
) -> dict[str, Any]:
    """Acts on the first ``limit`` runs ``where`` matches; the rest are counted in ``remaining``."""
    if action not in BULK_ACTIONS:
        raise BadRequest(f"no bulk action {action!r}: use one of {', '.join(BULK_ACTIONS)}", "path",
                         status=404, type="NotFound")
    if not data.where.strip():
        raise BadRequest("where must name the runs (e.g. status = 'paused'); to act on every run, say so: "
                         "workflow_id != ''", "where")
    if not 1 <= data.limit <= MAX_BULK:
        raise BadRequest(f"limit must be from 1 to {MAX_BULK}, got {data.limit}", "limit")
    if data.before_position is not None and data.before_position < 0:
        raise BadRequest("before_position must be >= 0", "before_position")
    by = _who(request, data.by)
    options = {"reason": data.reason, "signal": data.signal, "value": data.value,
               "before_step": data.before_step, "before_position": data.before_position,
               "reapply_signals": data.reapply_signals}
    try:
        result = await _call(engine, lambda: engine.bulk(
            action, data.where, dry_run=data.dry_run, by=by, limit=data.limit, **options))
    except ValueError as e:
        if isinstance(e, errors.InvalidQuery):
            raise
        field = next((k for k in (*options, "where") if k in str(e)), "body")
        raise BadRequest(str(e), field) from None
    return views.bulk(result)


# --- schedules ---------------------------------------------------------------------

_SCHEDULE_NOW = _doc(schemas.Schedule, "Done, and durable: the schedule now.")


@get("/api/schedules", operation_id="listSchedules", opt=_field(None), summary="Every schedule (Engine.schedules)",
     responses=_reads(_doc(schemas.ScheduleList, "The schedules, by ID.")))
async def list_schedules(engine: Engine) -> dict[str, Any]:
    """Each schedule's spec, state, next time and what it fired or skipped."""
    async def every_schedule() -> list[Any]:
        return list(await engine.schedules())  # awaited: on several parts it asks every holder

    infos = await _call(engine, every_schedule)
    return {"schedules": [views.schedule(i) for i in infos]}


@post("/api/schedules", operation_id="createSchedule", opt=_field("input"), status_code=201,
      summary="Make a schedule; the same ID and spec again does nothing (Engine.schedule)",
      responses=_writes(_doc(schemas.Schedule, "Made, and durable."), 201,
                        e409=_doc(schemas.Error, "The ID is scheduled with another spec: delete it first.")))
async def create_schedule(engine: Engine, data: JSONBody[schemas.ScheduleRequest]) -> dict[str, Any]:
    """Starts ``workflow`` with ``input`` every period or on a cron spec."""
    if not data.schedule_id:
        raise BadRequest("schedule_id must be a non-empty string", "schedule_id")
    for name in ("every", "jitter", "catchup_window"):
        value = getattr(data, name)
        if isinstance(value, float | int) and value <= 0:
            raise BadRequest(f"{name} must be positive (seconds or a duration such as '1h'), got {value}", name)
    try:
        await _call(engine, lambda: engine.schedule(
            data.schedule_id, data.workflow, data.input, every=data.every, cron=data.cron,
            timezone=data.timezone, jitter=data.jitter, overlap=data.overlap,
            catchup_window=data.catchup_window, paused=data.paused))
    except (errors.InvalidSchedule, errors.InvalidDuration) as e:
        text = str(e)
        field = "every" if "exactly one of" in text else next(
            (f for f in ("timezone", "cron", "every", "jitter", "catchup_window", "overlap") if f in text),
            "every")
        raise BadRequest(text, field, type=type(e).__name__) from None
    sid = data.schedule_id
    return views.schedule(await _call(engine, lambda: engine.describe_schedule(sid)))


@get("/api/schedules/{schedule_id:str}", operation_id="describeSchedule", opt=_field(None),
     summary="One schedule, once durable (Engine.describe_schedule)",
     responses=_reads(_doc(schemas.Schedule, "The schedule.")))
async def describe_schedule(engine: Engine, schedule_id: ScheduleId) -> dict[str, Any]:
    """The schedule's spec, state, next time and what it fired or skipped."""
    sid = segment(schedule_id)
    return views.schedule(await _call(engine, lambda: engine.describe_schedule(sid)))


async def _schedule_op(engine: fusee.Engine, schedule_id: str, op: Callable[[str], Awaitable[Any]]) -> dict[str, Any]:
    sid = segment(schedule_id)
    return views.schedule(await _call(engine, lambda: op(sid)))


@post("/api/schedules/{schedule_id:str}/pause", operation_id="pauseSchedule", opt=_field(None), status_code=200,
      summary="Stop starting runs (Engine.pause_schedule)", responses=_writes(_SCHEDULE_NOW))
async def pause_schedule(engine: Engine, schedule_id: ScheduleId, data: JSONBody[schemas.Empty]) -> dict[str, Any]:
    """Its runs go on; no new run starts until it is unpaused."""
    return await _schedule_op(engine, schedule_id, engine.pause_schedule)


@post("/api/schedules/{schedule_id:str}/unpause", operation_id="unpauseSchedule", opt=_field(None),
      status_code=200, summary="Start runs again from the next time (Engine.unpause_schedule)",
      responses=_writes(_SCHEDULE_NOW))
async def unpause_schedule(engine: Engine, schedule_id: ScheduleId, data: JSONBody[schemas.Empty]) -> dict[str, Any]:
    """The times missed while paused are skipped."""
    return await _schedule_op(engine, schedule_id, engine.unpause_schedule)


@post("/api/schedules/{schedule_id:str}/trigger", operation_id="triggerSchedule", opt=_field(None),
      status_code=200, summary="Start a run now, under the overlap policy (Engine.trigger_schedule)",
      responses=_writes(_SCHEDULE_NOW))
async def trigger_schedule(engine: Engine, schedule_id: ScheduleId, data: JSONBody[schemas.Empty]) -> dict[str, Any]:
    """One run now, as if its time had come."""
    return await _schedule_op(engine, schedule_id, engine.trigger_schedule)


@post("/api/schedules/{schedule_id:str}/delete", operation_id="deleteSchedule", opt=_field(None),
      status_code=200, summary="End the schedule; its runs go on (Engine.delete_schedule)",
      responses=_writes(_SCHEDULE_NOW))
async def delete_schedule(engine: Engine, schedule_id: ScheduleId, data: JSONBody[schemas.Empty]) -> dict[str, Any]:
    """No run starts from it again."""
    return await _schedule_op(engine, schedule_id, engine.delete_schedule)


@post("/api/schedules/{schedule_id:str}/backfill", operation_id="backfillSchedule", opt=_field(None),
      status_code=200, summary="Run the scheduled times in [start, end) (Engine.backfill_schedule)",
      responses=_writes(_SCHEDULE_NOW))
async def backfill_schedule(engine: Engine, schedule_id: ScheduleId,
                            data: JSONBody[schemas.BackfillRequest]) -> dict[str, Any]:
    """Starts a run for each time the schedule had in the window, under its overlap policy."""
    sid = segment(schedule_id)
    start, end = _time(data.start, "start"), _time(data.end, "end")
    if end <= start:
        raise BadRequest(f"end ({data.end}) must come after start ({data.start})", "end")
    try:
        info = await _call(engine, lambda: engine.backfill_schedule(sid, start, end))
    except errors.InvalidSchedule as e:
        raise BadRequest(str(e), "end", type="InvalidSchedule") from None
    return views.schedule(info)


# --- step limits ---------------------------------------------------------------------


@get("/api/limits", operation_id="listLimits", opt=_field(None),
     summary="Step limits with permits in use and steps waiting (Engine.limits)",
     responses=_reads(_doc(schemas.LimitList, "The limits, by name.")))
async def list_limits(engine: Engine) -> dict[str, Any]:
    """Each limit's concurrency, rate, permits in use and steps waiting."""
    status = await _read(engine, engine.limits)
    return {"limits": [views.limit(s) for _, s in sorted(status.items())]}


@post("/api/limits/{name:str}", operation_id="setLimit", opt=_field(None), status_code=200,
      summary="Resize a limit now; not durable: the next Engine.open takes its own (Engine.set_limit)",
      responses=_writes(_doc(schemas.LimitView, "The limit now.")))
async def set_limit(engine: Engine, name: Annotated[str, PathParameter(description=f"The limit's name. {_SEGMENT}")],
                    data: JSONBody[schemas.SetLimitRequest]) -> dict[str, Any]:
    """A field left out keeps its value; null removes that bound."""
    name = segment(name)
    changes: dict[str, Any] = {}
    if data.concurrency is not msgspec.UNSET:
        if data.concurrency is not None and data.concurrency < 1:
            raise BadRequest(f"concurrency must be at least 1 (or null: no bound), got {data.concurrency}",
                             "concurrency")
        changes["concurrency"] = data.concurrency
    if data.per_second is not msgspec.UNSET:
        if data.per_second is not None and not data.per_second > 0:
            raise BadRequest(f"per_second must be more than 0 (or null: no bound), got {data.per_second}",
                             "per_second")
        changes["per_second"] = data.per_second
    if not changes:
        raise BadRequest("give concurrency, per_second or both", "concurrency")
    await _read(engine, lambda: engine.set_limit(name, **changes))
    status = await _read(engine, engine.limits)
    return views.limit(status[name])


# --- keyed objects' state --------------------------------------------------------------

ObjectName = Annotated[str, PathParameter(description=f"The keyed object's name. {_SEGMENT}")]
ObjectKey = Annotated[str, PathParameter(description=f"The key. {_SEGMENT}")]
_STATE = "/api/objects/{object:str}/{key:str}/state"
_STATE_NOW = _doc(schemas.ObjectStateView, "The state now, durable.")


def _object(engine: fusee.Engine, name: str, key: str) -> tuple[Any, str]:
    """The keyed object named in the path (404 naming ``object`` if the engine has none)."""
    name, key = segment(name), segment(key)
    owner = objects.declared(engine._rt.versions).get(name)
    if owner is None:
        raise BadRequest(f"this engine has no keyed object named {name!r}", "object", status=404, type="NotFound")
    return owner, key


async def _precheck(engine: fusee.Engine, obj: Any, key: str, if_version: int | None,
                    patch: list[dict[str, Any]] | None = None) -> None:
    """Refuses an edit that would fail, from a read (which records nothing): a stale
    ``if_version`` (409) or a patch that does not apply (400). The object's run checks
    again when it applies the edit (the state may change in between)."""
    import jsonpatch

    got = await _call(engine, lambda: engine.object_state(obj, key))
    if if_version is not None and if_version != got.version:
        raise BadRequest(f"the state of {obj.name} {key!r} is at version {got.version}, not {if_version}: "
                         "read it again and retry", "if_version", status=409, type="ObjectVersionConflict")
    if patch is not None:
        try:
            jsonpatch.apply_patch(objects.to_plain(got.value, obj.state_type, "the state"), patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as e:
            raise BadRequest(f"the patch does not apply to the state of {obj.name} {key!r}: {e}", "patch",
                             type="PatchFailed") from None


async def _state_answer(engine: fusee.Engine, obj: Any, key: str) -> Response[bytes]:
    got = await _call(engine, lambda: engine.object_state(obj, key))
    return _encoded({"object": obj.name, "key": key, "value": got.value, "version": got.version})


@get(_STATE, operation_id="getObjectState", opt=_field(None),
     summary="A keyed object's state and version (Engine.object_state)",
     responses=_reads(_doc(schemas.ObjectStateView, "The durable state.")))
async def get_object_state(engine: Engine, object: ObjectName, key: ObjectKey) -> Response[bytes]:
    """The state (the initial state if never written) and its version."""
    obj, k = _object(engine, object, key)
    return await _state_answer(engine, obj, k)


@put(_STATE, operation_id="setObjectState", opt=_field("value"), status_code=200,
     summary="Replace the state, if it still has if_version (Engine.set_object_state)",
     responses=_writes(_STATE_NOW, e409=_STALE))
async def set_object_state(engine: Engine, object: ObjectName, key: ObjectKey,
                           data: JSONBody[schemas.SetObjectStateRequest]) -> Response[bytes]:
    """``value`` becomes the state (converted to the object's state type)."""
    obj, k = _object(engine, object, key)
    try:
        value = msgspec.convert(data.value, obj.state_type, strict=False)
    except (msgspec.ValidationError, TypeError) as e:
        message, _ = schemas.explain(str(e), obj.state_type)
        raise BadRequest(f"value is not a state of object {obj.name!r}: {message}", "value") from None
    await _precheck(engine, obj, k, _ver(data.if_version))
    await _call(engine, lambda: engine.set_object_state(obj, k, value, if_version=_ver(data.if_version)))
    return await _state_answer(engine, obj, k)


@patch(_STATE, operation_id="patchObjectState", opt=_field("patch"), status_code=200,
       summary="Apply a JSON Patch (RFC 6902) to the state (Engine.patch_object_state)",
       responses=_writes(_STATE_NOW, e409=_STALE))
async def patch_object_state(engine: Engine, object: ObjectName, key: ObjectKey,
                             data: JSONBody[schemas.PatchObjectStateRequest]) -> Response[bytes]:
    """Applies the operations in order, all or none."""
    obj, k = _object(engine, object, key)
    await _precheck(engine, obj, k, _ver(data.if_version), data.patch)
    try:
        await _call(engine, lambda: engine.patch_object_state(obj, k, data.patch, if_version=_ver(data.if_version)))
    except errors.ObjectCallFailed as e:
        raise BadRequest(str(e), "patch", type="PatchFailed") from None
    return await _state_answer(engine, obj, k)


@post(f"{_STATE}/clear", operation_id="clearObjectState", opt=_field("if_version"), status_code=200,
      summary="Put the state back to the initial state (Engine.clear_object_state)",
      responses=_writes(_STATE_NOW, e409=_STALE))
async def clear_object_state(engine: Engine, object: ObjectName, key: ObjectKey,
                             data: JSONBody[schemas.ClearObjectStateRequest]) -> Response[bytes]:
    """The state becomes the object's initial state."""
    obj, k = _object(engine, object, key)
    await _precheck(engine, obj, k, _ver(data.if_version))
    await _call(engine, lambda: engine.clear_object_state(obj, k, if_version=_ver(data.if_version)))
    return await _state_answer(engine, obj, k)


#: Every endpoint of the API, in the order the document lists them.
HANDLERS = [
    list_runs, start_run, count_runs, describe_run, get_run_journal, export_run, follow_stream,
    signal_run, query_run, update_run, cancel_run, terminate_run, resume_run, reset_run, fork_run,
    complete_await, bulk_act, get_metrics,
    list_schedules, create_schedule, describe_schedule, pause_schedule, unpause_schedule, trigger_schedule,
    delete_schedule, backfill_schedule,
    list_limits, set_limit,
    get_object_state, set_object_state, patch_object_state, clear_object_state,
]


# --- small parsers and answers ---------------------------------------------------------


def _timeout(value: float | str | None) -> Any:
    if isinstance(value, float | int) and value <= 0:
        raise BadRequest(f"timeout must be positive (seconds or a duration such as '1h'), got {value}", "timeout")
    return value


def _time(text: str, field: str) -> datetime.datetime:
    try:
        at = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"{field} must be an ISO 8601 time such as 2026-01-01T00:00:00Z, got {text!r}",
                         field) from None
    if at.tzinfo is None:
        raise BadRequest(f"{field} must name its timezone (end it with Z or +00:00), got {text!r}", field)
    return at


def _ver(version: int | None) -> int | None:
    if version is not None and version < 0:
        raise BadRequest(f"if_version must be >= 0 (a version object_state returned), got {version}",
                         "if_version")
    return version


def _encoded(body: dict[str, Any]) -> Response[bytes]:
    """``body`` encoded as the journal encodes payloads (dataclasses, pydantic models, datetimes...
    become JSON as they do in the journal)."""
    try:
        data = codec.encode(body)
    except errors.SerializationError as e:
        raise BadRequest(f"the answer does not convert to JSON: {e}", None, status=500,
                         type="SerializationError") from None
    return Response(data, media_type="application/json")


def _result(value: Any) -> Response[bytes]:
    """``{"result": value}``, encoded as the journal encodes payloads."""
    return _encoded({"result": value})


def _named(make: Callable[[str], T], name: str) -> T:
    if not name:
        raise BadRequest("name must be a non-empty string", "name")
    return make(name)


def _who(request: Request[Any, Any, Any], by: str | None) -> str | None:
    """The name the audit records: the authenticated person's (a per-person token or the host's
    ``authenticate``), else what the request says in ``by``."""
    if by is not None and not by:
        raise BadRequest("by names who asks: a non-empty string (or left out)", "by")
    user = user_of(request.scope)  # type: ignore[arg-type]
    if user is None:
        return by
    if by is not None and by != user:
        raise BadRequest(f"by is {by!r} but this request is authenticated as {user!r}: the audit records "
                         "who signed in (leave by out)", "by", status=403, type="Forbidden")
    return user


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "journal"


# --- refusals ------------------------------------------------------------------------


def _error(status: int, type: str, message: str, field: str | None = None,
           headers: Mapping[str, str] | None = None) -> Response[Any]:
    """The API's error answer: ``{"error": {"type", "message", "field"}}``."""
    return Response(error_body(type, message, field), status_code=status, headers=dict(headers or {}),
                    media_type="application/json")


def _refused(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A refused request or an engine error as JSON; ``field`` is the request field the handler
    names (``opt``) for an engine ``TypeError``/``ValueError``. Anything else is a bug: raised on, the
    outer app answers 500 and the server logs it."""
    handler = request.scope.get("route_handler")
    field = handler.opt.get("field") if handler is not None else None
    if isinstance(exc, BadRequest):
        return _error(exc.status, exc.type, exc.message, exc.field)
    if isinstance(exc, errors.InvalidQuery):
        return _error(400, type(exc).__name__, str(exc), "where")
    if isinstance(exc, errors.UnknownWorkflow):
        return _error(400, "UnknownWorkflow", str(exc), "workflow")
    if isinstance(exc, errors.InvalidWorkflowId):
        return _error(400, "InvalidWorkflowId", str(exc), "workflow_id")
    if isinstance(exc, errors.InvalidDuration):
        return _error(400, "InvalidDuration", str(exc), "timeout")
    if isinstance(exc, errors.FuseeError):
        status = next((s for t, s in _STATUS.items() if isinstance(exc, t)), 400)
        return _error(status, type(exc).__name__, str(exc), None if status != 400 else field)
    if isinstance(exc, TypeError | ValueError):
        return _error(400, "BadRequest", str(exc), field)
    raise exc


def _path_shown(request: Request[Any, Any, Any]) -> tuple[str, str]:
    """The path as sent, and that path under the API's root (``/api/...``)."""
    path: str = request.scope["path"]  # as the Gateway made it: routing failed, so nothing rewrote it
    root: str = request.scope.get("root_path", "")
    return path, path[len(root):] if path.startswith(root) else path


_RUN_WORD = re.compile(r"/api/runs/[^/]+/([^/]+)")
_SCHEDULE_WORD = re.compile(r"/api/schedules/[^/]+/([^/]+)")


def _http_refused(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Litestar's own refusals (no such route, a method the route has not, a query parameter
    that does not parse) in the API's words."""
    path, under = _path_shown(request)
    if isinstance(exc, NotFoundException):
        if m := _RUN_WORD.fullmatch(under):
            return _error(404, "NotFound", f"a run has no endpoint {segment(m[1])!r}: GET {', '.join(RUN_READS)} or "
                          f"streams/NAME; POST {', '.join(RUN_ACTIONS)} (a '/' in an ID is sent as %2F)", "path")
        if m := _SCHEDULE_WORD.fullmatch(under):
            return _error(404, "NotFound", f"no schedule action {segment(m[1])!r}: use one of "
                          f"{', '.join(SCHEDULE_OPS)} (a '/' in an ID is sent as %2F)", "path")
        return _error(404, "NotFound", f"no such endpoint: {request.method} {path} (IDs are one path segment: "
                      "send a '/' in an ID as %2F)", "path")
    if isinstance(exc, MethodNotAllowedException):
        allow = (exc.headers or {}).get("allow", "")
        methods = [m.strip() for m in allow.split(",") if m.strip() and m.strip() != "OPTIONS"]
        use = f": use {' or '.join(methods)}" if methods else ""
        return _error(405, "MethodNotAllowed", f"{request.method} is not allowed on {path}{use}", "method",
                      headers={"Allow": allow} if allow else None)
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        return _bad_parameter(request, exc.extra[0])
    status = exc.status_code
    kind = "BadRequest" if status == 400 else HTTPStatus(status).phrase.replace(" ", "")
    return _error(status, kind, str(exc.detail), None)


def _bad_parameter(request: Request[Any, Any, Any], problem: Any) -> Response[Any]:
    """A path, query or header parameter that does not parse or is out of its range (as the handler
    declares it), naming it."""
    key = str(problem.get("key", "")) if isinstance(problem, dict) else ""
    said = str(problem.get("message", "")) if isinstance(problem, dict) else str(problem)
    handler = request.scope.get("route_handler")
    params = handler.parsed_fn_signature.parameters if handler is not None else {}
    definition = params.get(key) or next(
        (d for d in params.values() if getattr(d.kwarg_definition, "query", None) == key
         or getattr(d.kwarg_definition, "header", None) == key), None)
    raw = request.query_params.get(key)
    got = f", got {raw!r}" if raw is not None else ""
    if definition is None:
        return _error(400, "BadRequest", f"{key}: {said}", key or None)
    kind: Any = definition.annotation
    if definition.is_optional:
        kind = next((a for a in get_args(kind) if a is not NoneType), kind)
    constraint = definition.kwarg_definition
    if kind is int:
        low, high = getattr(constraint, "ge", None), getattr(constraint, "le", None)
        span = f" from {low} to {high}" if low is not None and high is not None else ""
        message = f"{key} must be a whole number{span}{got}"
    elif get_origin(kind) is Literal:
        message = f"{key} must be one of {', '.join(repr(c) for c in get_args(kind))}{got}"
    else:
        message = f"{key}: {said}{got}"
    return _error(400, "BadRequest", message, key)


# --- the app ---------------------------------------------------------------------------


def build(engine: fusee.Engine | None) -> Litestar:
    """The API app of ``engine`` (None: for its document only), routed as :class:`Gateway` hands it
    requests. Behind the outer app's checks (``fusee.http.guard``), which answer for the body's
    size and media type: Litestar's own body limit is off."""

    def provide() -> Any:
        return engine

    return Litestar(
        route_handlers=HANDLERS,
        dependencies={"engine": Provide(provide, use_cache=True, sync_to_thread=False)},
        dto=StrictBody,
        return_dto=None,
        exception_handlers={HTTPException: _http_refused, Exception: _refused},
        openapi_config=OpenAPIConfig(
            title="Fusee",
            version="1",
            description="Operate the runs of a Fusee engine: list, inspect, start, signal, query, update, cancel, "
                        "terminate, resume, reset, fork, complete, follow streams; operate schedules, step limits "
                        "and keyed objects' state. Generated from the API's route handlers (fusee.http.api).",
            use_handler_docstrings=True,
            components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
            security=[{"bearer": []}, {}],
            render_plugins=[JsonRenderPlugin()],  # served by the outer app at /openapi.json
        ),
        plugins=[StructSchemas()],
        request_max_body_size=None,
        logging_config=None,
        debug=False,
    )


def document(api: Litestar) -> dict[str, Any]:
    """The OpenAPI document Litestar generates for ``api``, as plain JSON values."""
    schema: dict[str, Any] = msgspec.to_builtins(api.openapi_schema.to_schema())
    return schema


class Gateway:
    """``api`` as the outer app mounts it (``Mount("/api", ...)``): routed on the path as sent
    (:func:`fusee.http.paths.encoded_path`: an ID's ``%2F`` stays in its segment), under the outer
    app's root (the API's routes spell out ``/api``), and with a write's body read whole before
    Litestar sees it: a blank one is ``{}`` (every field left out), and one over the size limit is
    refused by the outer app's checks (413) before any handler runs. A HEAD gets the answer to a
    GET, without its body."""

    def __init__(self, api: Litestar, prefix: str = "/api") -> None:
        # (Litestar types its ASGI messages as TypedDicts, Starlette as plain mappings: the same messages.)
        self.api = cast(StarletteApp, api)
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        root: str = scope.get("root_path", "")
        path = encoded_path(scope)
        if "//" in path[len(root):]:
            # An empty segment (an empty ID): no route has one, and none may slide into its place.
            raise StarletteHTTPException(404)
        outer = root[: -len(self.prefix)] if root.endswith(self.prefix) else root
        scope = {**scope, "path": path, "root_path": outer}
        if scope["method"] == "HEAD":
            # A GET's answer without its body, as every GET route answered HEAD before.
            scope["method"] = "GET"
            send = _headers_only(send)
        elif scope["method"] not in SAFE_METHODS:
            receive = await _whole(receive)
        await self.api(scope, receive, send)


def _headers_only(send: Send) -> Send:
    """``send`` for a HEAD request: the status and headers, then an empty end."""
    done = False

    async def head(message: Message) -> None:
        nonlocal done
        if message["type"] == "http.response.start":
            await send(message)
        elif message["type"] == "http.response.body" and not done:
            done = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return head


async def _whole(receive: Receive) -> Receive:
    """``receive`` with the request's body read whole first: one message (``{}`` if blank)."""
    chunks: list[bytes] = []
    later: list[Message] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            later.append(message)  # the client went away: what came, then that
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    first: list[Message] = [{"type": "http.request", "body": body if body.strip() else b"{}", "more_body": False}]
    pending = first + later

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
