"""``fusee.http.app(engine)``: the engine's public API over HTTP, as a Starlette ASGI app.

Every handler validates its whole request before it calls the engine, so a
refused request records nothing; the engine's own checks (an unknown ID, an
ended run, a rejected update) also come before anything is journaled. Handlers
run on the engine's event loop: mounted in an app served on another loop (or
thread), each call is handed to the engine's loop.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import importlib
import importlib.util
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router
from starlette.types import ASGIApp

import fusee
from fusee import codec, errors, journal_file, objects, views
from fusee.engine.bulk import ACTIONS as BULK_ACTIONS
from fusee.engine.bulk import MAX_BULK
from fusee.engine.visibility import MAX_LIMIT, ORDERS
from fusee.http import openapi, schemas, sse
from fusee.http.auth import Authentication, Authenticator, check_tokens, user_of
from fusee.http.guard import DEFAULT_MAX_BODY, LOOPBACK_HOSTS, error_response, too_large
from fusee.http.guard import middleware as guards
from fusee.http.paths import RawPath, encoded_path, param

T = TypeVar("T")

#: How long one wait of a stream reader lasts before a keep-alive comment is sent (seconds).
STREAM_POLL = 15.0

#: The POST endpoints of a run (``/api/runs/{workflow_id}/{action}``), each the handler of that name.
RUN_ACTIONS = ("signal", "query", "update", "cancel", "terminate", "resume", "reset", "fork")
#: Its GET endpoints (with ``streams/{name}``).
RUN_READS = ("journal", "export")

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


async def _body(request: Request, kind: type[T]) -> T:
    raw = await request.body()
    if not raw.strip():
        raw = b"{}"
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        message, field = schemas.explain(str(e), kind)
        raise BadRequest(message, field) from None
    except msgspec.DecodeError as e:
        raise BadRequest(f"the request body is not JSON: {e}", "body") from None


async def on_engine(engine: fusee.Engine, call: Callable[[], Awaitable[T]]) -> T:
    """Awaits ``call()`` on the engine's loop (here if this is it) and returns its result."""
    if asyncio.get_running_loop() is engine.loop:
        return await call()

    async def run() -> T:
        return await call()

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), engine.loop))


Handler = Callable[[Any, Request], Awaitable[Response]]


def _handler(field: str | None = None) -> Callable[[Handler], Handler]:
    """Turns refused requests and engine errors into JSON errors; ``field`` is the request
    field an engine ``TypeError``/``ValueError`` is about."""

    def wrap(fn: Handler) -> Handler:
        async def handle(api: Any, request: Request) -> Response:
            try:
                return await fn(api, request)
            except BadRequest as e:
                return error_response(e.status, e.type, e.message, e.field)
            except errors.InvalidQuery as e:
                return error_response(400, type(e).__name__, str(e), "where")
            except errors.UnknownWorkflow as e:
                return error_response(400, "UnknownWorkflow", str(e), "workflow")
            except errors.InvalidWorkflowId as e:
                return error_response(400, "InvalidWorkflowId", str(e), "workflow_id")
            except errors.InvalidDuration as e:
                return error_response(400, "InvalidDuration", str(e), "timeout")
            except errors.FuseeError as e:
                status = next((s for t, s in _STATUS.items() if isinstance(e, t)), 400)
                return error_response(status, type(e).__name__, str(e), None if status != 400 else field)
            except (TypeError, ValueError) as e:
                return error_response(400, "BadRequest", str(e), field)

        handle.__name__ = fn.__name__
        handle.__doc__ = fn.__doc__
        return handle

    return wrap


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, got {raw!r}", name) from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be from {low} to {high}, got {value}", name)
    return value


def _timeout(value: float | str | None) -> Any:
    if isinstance(value, float | int) and value <= 0:
        raise BadRequest(f"timeout must be positive (seconds or a duration such as '1h'), got {value}",
                         "timeout")
    return value


class _Api:
    """The handlers, bound to one engine."""

    def __init__(self, engine: fusee.Engine) -> None:
        self.engine = engine

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await on_engine(self.engine, fn)

    async def read(self, fn: Callable[[], T]) -> T:
        """A synchronous engine call (list, describe, metrics), made on the engine's loop."""

        async def run() -> T:
            return fn()

        return await on_engine(self.engine, run)

    def wid(self, request: Request) -> str:
        return param(request, "workflow_id")

    async def exists(self, wid: str) -> Any:
        """The run's summary; NotFound (404) for an unknown ID."""
        return await self.read(lambda: self.engine.describe(wid))

    # --- reading ---------------------------------------------------------------

    @_handler("where")
    async def list_runs(self, request: Request) -> Response:
        where = request.query_params.get("where") or None
        limit = _int_param(request, "limit", 100, 1, MAX_LIMIT)
        cursor = request.query_params.get("cursor") or None
        order = request.query_params.get("order") or "oldest"
        if order not in ORDERS:
            raise BadRequest(f"order must be 'oldest' (first seen first) or 'newest', got {order!r}", "order")
        try:
            page = await self.read(lambda: self.engine.list(where, limit=limit, cursor=cursor, order=order))
        except errors.InvalidQuery as e:
            if cursor is not None and e.query == cursor and e.query != where:
                raise BadRequest(str(e), "cursor", type="InvalidQuery") from None
            raise
        return JSONResponse(views.page(page))

    @_handler("where")
    async def counts(self, request: Request) -> Response:
        where = request.query_params.get("where") or None
        counts = await self.read(lambda: self.engine.counts(where))
        return JSONResponse({"where": where, "counts": counts})

    @_handler()
    async def describe(self, request: Request) -> Response:
        return JSONResponse(views.summary(await self.exists(self.wid(request))))

    @_handler()
    async def journal(self, request: Request) -> Response:
        wid = self.wid(request)
        summary = await self.exists(wid)
        records = await self.call(lambda: self.engine.journal(wid))
        return JSONResponse({"workflow_id": wid, "run_id": summary.run_id,
                             "records": views.journal(records), "timeline": views.timeline(records)})

    @_handler()
    async def export(self, request: Request) -> Response:
        wid = self.wid(request)
        records = await self.call(lambda: self.engine.journal(wid))
        return Response(journal_file.dumps(records), media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{_safe(wid)}.fjnl"'})

    @_handler("offset")
    async def stream(self, request: Request) -> Response:
        wid = self.wid(request)
        name = param(request, "name")
        offset = _int_param(request, "offset", 0, 0, 1 << 62)
        last = request.headers.get("last-event-id")
        if last is not None:
            try:
                offset = max(offset, int(last))
            except ValueError:
                raise BadRequest(f"Last-Event-ID must be a stream offset, got {last!r}", "Last-Event-ID") from None
        pinned = _int_param(request, "run_id", 0, 1, 1 << 62) or None
        await self.exists(wid)
        engine = self.engine

        async def events() -> AsyncIterator[sse.Event]:
            at, run_id = offset, pinned
            while True:
                try:
                    # One connection follows one run: the first answer's, or the one asked for.
                    b = await self.call(
                        functools.partial(engine.stream_batch, wid, name, at, wait=STREAM_POLL, run_id=run_id))
                    chunks, nxt, ended, run_id = b.chunks, b.next_offset, b.ended, b.run_id
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
                    end = {"offset": at, "status": b.end_status, "run_id": run_id}
                    yield sse.event(json.dumps(end), event="end")
                    return

        # sse-starlette: the event encoding, client disconnects and the server's shutdown.
        return sse.response(events(), headers={"Cache-Control": "no-cache"})

    @_handler()
    async def metrics(self, request: Request) -> Response:
        return JSONResponse(views.metrics(await self.read(self.engine.metrics)))

    # --- acting ------------------------------------------------------------------

    @_handler("input")
    async def start(self, request: Request) -> Response:
        body = await _body(request, schemas.StartRequest)
        if not body.workflow_id:
            raise BadRequest("workflow_id must be a non-empty string", "workflow_id")
        timeout = _timeout(body.timeout)
        handle = await self.call(lambda: self.engine.start(
            body.workflow, body.workflow_id, body.input, if_running=body.if_running,
            if_finished=body.if_finished, timeout=timeout))
        return JSONResponse({"workflow_id": handle.workflow_id, "run_id": handle.run_id}, status_code=201)

    @_handler("value")
    async def signal(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.SignalRequest)
        # By name only (no fusee.signal declaration): the engine checks the value against the
        # run's wait or the declared type, and refuses an unknown name.
        sig: fusee.SignalDef[Any] = _named(fusee.SignalDef, body.name)
        try:
            await self.call(lambda: self.engine.signal(wid, sig, body.value, dedup_key=body.dedup_key,
                                                       by=_who(request, body.by)))
        except errors.UnknownSignal as e:
            raise BadRequest(str(e), "name", type="UnknownSignal") from None
        return JSONResponse({"workflow_id": wid, "action": "signal"})

    @_handler("arg")
    async def query(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.QueryRequest)
        q = _named(fusee.query, body.name)
        return _result(await self.call(lambda: self.engine.query(wid, q, body.arg)))

    @_handler("arg")
    async def update(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.UpdateRequest)
        u = _named(fusee.update, body.name)
        if body.update_id is not None and not body.update_id:
            raise BadRequest("update_id must be a non-empty string (or left out)", "update_id")
        try:
            result = await self.call(lambda: self.engine.update(wid, u, body.arg, update_id=body.update_id))
        except errors.FuseeError:
            raise
        except Exception as e:  # the workflow's validator refused it: nothing was recorded
            raise BadRequest(f"the update was rejected: {str(e) or type(e).__name__}", "arg",
                             type="UpdateRejected") from None
        return _result(result)

    @_handler("reason")
    async def cancel(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.ReasonRequest)
        await self.call(lambda: self.engine.cancel(wid, body.reason, by=_who(request, body.by)))
        return JSONResponse({"workflow_id": wid, "action": "cancel"})

    @_handler("reason")
    async def terminate(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.ReasonRequest)
        await self.call(lambda: self.engine.terminate(wid, body.reason, by=_who(request, body.by)))
        return JSONResponse({"workflow_id": wid, "action": "terminate"})

    @_handler("by")
    async def resume(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.ResumeRequest)
        by = _who(request, body.by)
        engine = self.engine

        async def resume() -> None:
            # Checked and resumed in one turn of the engine's loop: nothing pauses in between.
            s = engine.describe(wid)
            # (A follower's view may lag its owner's: it leaves the answer to the owner.)
            if s.ended_at is None and not s.paused_steps and engine.is_owner:
                raise BadRequest(f"run {wid!r} has no paused step to resume: resume is for steps whose "
                                 "retries ran out (describe shows them as paused_steps)", None, status=409,
                                 type="NothingPaused")
            await engine.resume(wid, by=by)

        await self.call(resume)
        return JSONResponse({"workflow_id": wid, "action": "resume"})

    @_handler("before_step")
    async def reset(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.ResetRequest)
        if body.before_step is None and body.before_position is None:
            raise BadRequest("give before_step (a step's name) or before_position (a journal position)",
                             "before_step")
        if body.before_position is not None and body.before_position < 0:
            raise BadRequest("before_position must be >= 0", "before_position")
        handle = await self.call(lambda: self.engine.reset(
            wid, before_step=body.before_step, before_position=body.before_position,
            reapply_signals=body.reapply_signals, version=body.version, by=_who(request, body.by)))
        return JSONResponse({"workflow_id": handle.workflow_id, "run_id": handle.run_id})

    @_handler("before_step")
    async def fork(self, request: Request) -> Response:
        wid = self.wid(request)
        body = await _body(request, schemas.ForkRequest)
        if not body.new_id:
            raise BadRequest("new_id must be a non-empty string: the ID of the new run", "new_id")
        if body.before_step is None and body.before_position is None:
            raise BadRequest("give before_step (a step's name) or before_position (a journal position)",
                             "before_step")
        if body.before_position is not None and body.before_position < 0:
            raise BadRequest("before_position must be >= 0", "before_position")
        handle = await self.call(lambda: self.engine.fork(
            wid, body.new_id, before_step=body.before_step, before_position=body.before_position,
            reapply_signals=body.reapply_signals, version=body.version, by=_who(request, body.by)))
        return JSONResponse({"workflow_id": handle.workflow_id, "run_id": handle.run_id}, status_code=201)

    @_handler("token")
    async def complete(self, request: Request) -> Response:
        body = await _body(request, schemas.CompleteRequest)
        if not body.token:
            raise BadRequest("token must be the non-empty token handed out by ctx.await_completion", "token")
        by = _who(request, body.by)
        try:
            if body.failed:
                done = await self.call(lambda: self.engine.fail_completion(body.token, body.message, by=by))
            else:
                done = await self.call(lambda: self.engine.complete(body.token, body.value, by=by))
        except errors.SerializationError as e:
            raise BadRequest(str(e), "value", type="SerializationError") from None
        except ValueError as e:  # a token that does not parse
            raise BadRequest(str(e), "token") from None
        return JSONResponse({"completed": done})

    @_handler("where")
    async def bulk(self, request: Request) -> Response:
        action = param(request, "action")
        if action not in BULK_ACTIONS:
            raise BadRequest(f"no bulk action {action!r}: use one of {', '.join(BULK_ACTIONS)}", "path",
                             status=404, type="NotFound")
        body = await _body(request, schemas.BulkRequest)
        if not body.where.strip():
            raise BadRequest("where must name the runs (e.g. status = 'paused'); to act on every run, say so: "
                             "workflow_id != ''", "where")
        if not 1 <= body.limit <= MAX_BULK:
            raise BadRequest(f"limit must be from 1 to {MAX_BULK}, got {body.limit}", "limit")
        if body.before_position is not None and body.before_position < 0:
            raise BadRequest("before_position must be >= 0", "before_position")
        by = _who(request, body.by)
        options = {"reason": body.reason, "signal": body.signal, "value": body.value,
                   "before_step": body.before_step, "before_position": body.before_position,
                   "reapply_signals": body.reapply_signals}
        try:
            result = await self.call(lambda: self.engine.bulk(
                action, body.where, dry_run=body.dry_run, by=by, limit=body.limit, **options))
        except ValueError as e:
            if isinstance(e, errors.InvalidQuery):
                raise
            field = next((k for k in (*options, "where") if k in str(e)), "body")
            raise BadRequest(str(e), field) from None
        return JSONResponse(views.bulk(result))

    # --- schedules -----------------------------------------------------------------

    @_handler()
    async def list_schedules(self, request: Request) -> Response:
        infos = await self.read(lambda: list(self.engine.schedules()))
        return JSONResponse({"schedules": [views.schedule(i) for i in infos]})

    @_handler("input")
    async def create_schedule(self, request: Request) -> Response:
        body = await _body(request, schemas.ScheduleRequest)
        if not body.schedule_id:
            raise BadRequest("schedule_id must be a non-empty string", "schedule_id")
        for name in ("every", "jitter", "catchup_window"):
            value = getattr(body, name)
            if isinstance(value, float | int) and value <= 0:
                raise BadRequest(f"{name} must be positive (seconds or a duration such as '1h'), got {value}",
                                 name)
        try:
            await self.call(lambda: self.engine.schedule(
                body.schedule_id, body.workflow, body.input, every=body.every, cron=body.cron,
                timezone=body.timezone, jitter=body.jitter, overlap=body.overlap,
                catchup_window=body.catchup_window, paused=body.paused))
        except (errors.InvalidSchedule, errors.InvalidDuration) as e:
            text = str(e)
            field = "every" if "exactly one of" in text else next(
                (f for f in ("timezone", "cron", "every", "jitter", "catchup_window", "overlap") if f in text),
                "every")
            raise BadRequest(text, field, type=type(e).__name__) from None
        sid = body.schedule_id
        info = await self.call(lambda: self.engine.describe_schedule(sid))
        return JSONResponse(views.schedule(info), status_code=201)

    def sid(self, request: Request) -> str:
        return param(request, "schedule_id")

    @_handler()
    async def describe_schedule(self, request: Request) -> Response:
        sid = self.sid(request)
        return JSONResponse(views.schedule(await self.call(lambda: self.engine.describe_schedule(sid))))

    @_handler()
    async def schedule_action(self, request: Request) -> Response:
        sid, op = self.sid(request), param(request, "op")
        acts = {"pause": self.engine.pause_schedule, "unpause": self.engine.unpause_schedule,
                "trigger": self.engine.trigger_schedule, "delete": self.engine.delete_schedule}
        act = acts.get(op)
        if act is None:
            raise BadRequest(f"no schedule action {op!r}: use one of {', '.join(acts)} or backfill", "path",
                             status=404, type="NotFound")
        await _body(request, schemas.Empty)  # nothing is expected: a stray field is refused
        return JSONResponse(views.schedule(await self.call(lambda: act(sid))))

    @_handler()
    async def backfill_schedule(self, request: Request) -> Response:
        sid = self.sid(request)
        body = await _body(request, schemas.BackfillRequest)
        start, end = _time(body.start, "start"), _time(body.end, "end")
        if end <= start:
            raise BadRequest(f"end ({body.end}) must come after start ({body.start})", "end")
        try:
            info = await self.call(lambda: self.engine.backfill_schedule(sid, start, end))
        except errors.InvalidSchedule as e:
            raise BadRequest(str(e), "end", type="InvalidSchedule") from None
        return JSONResponse(views.schedule(info))

    # --- step limits ---------------------------------------------------------------

    @_handler()
    async def list_limits(self, request: Request) -> Response:
        status = await self.read(self.engine.limits)
        return JSONResponse({"limits": [views.limit(s) for _, s in sorted(status.items())]})

    @_handler()
    async def set_limit(self, request: Request) -> Response:
        name = param(request, "name")
        body = await _body(request, schemas.SetLimitRequest)
        changes: dict[str, Any] = {}
        if body.concurrency is not msgspec.UNSET:
            if body.concurrency is not None and body.concurrency < 1:
                raise BadRequest(f"concurrency must be at least 1 (or null: no bound), got {body.concurrency}",
                                 "concurrency")
            changes["concurrency"] = body.concurrency
        if body.per_second is not msgspec.UNSET:
            if body.per_second is not None and not body.per_second > 0:
                raise BadRequest(f"per_second must be more than 0 (or null: no bound), got {body.per_second}",
                                 "per_second")
            changes["per_second"] = body.per_second
        if not changes:
            raise BadRequest("give concurrency, per_second or both", "concurrency")
        await self.read(lambda: self.engine.set_limit(name, **changes))
        status = await self.read(self.engine.limits)
        return JSONResponse(views.limit(status[name]))

    # --- keyed objects' state ------------------------------------------------------

    def obj(self, request: Request) -> tuple[Any, str]:
        """The keyed object named in the path (404 naming ``object`` if the engine has none)."""
        name, key = param(request, "object"), param(request, "key")
        owner = objects.declared(self.engine._rt.versions).get(name)
        if owner is None:
            raise BadRequest(f"this engine has no keyed object named {name!r}", "object", status=404,
                             type="NotFound")
        return owner, key

    async def precheck(self, obj: Any, key: str, if_version: int | None,
                       patch: list[dict[str, Any]] | None = None) -> None:
        """Refuses an edit that would fail, from a read (which records nothing): a stale
        ``if_version`` (409) or a patch that does not apply (400). The object's run checks
        again when it applies the edit (the state may change in between)."""
        import jsonpatch

        got = await self.call(lambda: self.engine.object_state(obj, key))
        if if_version is not None and if_version != got.version:
            raise BadRequest(f"the state of {obj.name} {key!r} is at version {got.version}, not {if_version}: "
                             "read it again and retry", "if_version", status=409, type="ObjectVersionConflict")
        if patch is not None:
            try:
                jsonpatch.apply_patch(objects.to_plain(got.value, obj.state_type, "the state"), patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as e:
                raise BadRequest(f"the patch does not apply to the state of {obj.name} {key!r}: {e}", "patch",
                                 type="PatchFailed") from None

    async def state_answer(self, obj: Any, key: str) -> Response:
        got = await self.call(lambda: self.engine.object_state(obj, key))
        return _encoded({"object": obj.name, "key": key, "value": got.value, "version": got.version})

    @_handler()
    async def object_state(self, request: Request) -> Response:
        obj, key = self.obj(request)
        return await self.state_answer(obj, key)

    @_handler("value")
    async def set_object_state(self, request: Request) -> Response:
        obj, key = self.obj(request)
        body = await _body(request, schemas.SetObjectStateRequest)
        try:
            value = msgspec.convert(body.value, obj.state_type, strict=False)
        except (msgspec.ValidationError, TypeError) as e:
            message, _ = schemas.explain(str(e), obj.state_type)
            raise BadRequest(f"value is not a state of object {obj.name!r}: {message}", "value") from None
        await self.precheck(obj, key, _ver(body.if_version))
        await self.call(lambda: self.engine.set_object_state(obj, key, value, if_version=_ver(body.if_version)))
        return await self.state_answer(obj, key)

    @_handler("if_version")
    async def clear_object_state(self, request: Request) -> Response:
        obj, key = self.obj(request)
        body = await _body(request, schemas.ClearObjectStateRequest)
        await self.precheck(obj, key, _ver(body.if_version))
        await self.call(lambda: self.engine.clear_object_state(obj, key, if_version=_ver(body.if_version)))
        return await self.state_answer(obj, key)

    @_handler("patch")
    async def patch_object_state(self, request: Request) -> Response:
        obj, key = self.obj(request)
        body = await _body(request, schemas.PatchObjectStateRequest)
        await self.precheck(obj, key, _ver(body.if_version), body.patch)
        try:
            await self.call(lambda: self.engine.patch_object_state(
                obj, key, body.patch, if_version=_ver(body.if_version)))
        except errors.ObjectCallFailed as e:
            raise BadRequest(str(e), "patch", type="PatchFailed") from None
        return await self.state_answer(obj, key)


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


def _encoded(body: dict[str, Any]) -> Response:
    """``body`` encoded as the journal encodes payloads (dataclasses, models, datetimes)."""
    try:
        data = codec.encode(body)
    except errors.SerializationError as e:
        return error_response(500, "SerializationError", f"the answer does not convert to JSON: {e}")
    return Response(data, media_type="application/json")


def _result(value: Any) -> Response:
    """``{"result": value}``, encoded as the journal encodes payloads (dataclasses, pydantic
    models, datetimes... become JSON as they do in the journal)."""
    try:
        body = codec.encode({"result": value})
    except errors.SerializationError as e:
        return error_response(500, "SerializationError", f"the answer does not convert to JSON: {e}")
    return Response(body, media_type="application/json")


def _named(make: Callable[[str], T], name: str) -> T:
    if not name:
        raise BadRequest("name must be a non-empty string", "name")
    return make(name)


def _who(request: Request, by: str | None) -> str | None:
    """The name the audit records: the authenticated person's (a per-person token or the host's
    ``authenticate``), else what the request says in ``by``."""
    if by is not None and not by:
        raise BadRequest("by names who asks: a non-empty string (or left out)", "by")
    user = user_of(request.scope)
    if user is None:
        return by
    if by is not None and by != user:
        raise BadRequest(f"by is {by!r} but this request is authenticated as {user!r}: the audit records "
                         "who signed in (leave by out)", "by", status=403, type="Forbidden")
    return user


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "journal"


def ui_routes(engine: fusee.Engine, secret: bytes | str | None = None) -> list[BaseRoute] | None:
    """The web UI's routes (``fusee.ui.routes``) if the UI is installed, else None."""
    if importlib.util.find_spec("fusee.ui") is None:
        return None
    ui = importlib.import_module("fusee.ui")
    routes: list[BaseRoute] = ui.routes(engine, secret=secret)
    return routes


def app(engine: fusee.Engine, token: str | None = None, *, tokens: Mapping[str, str] | None = None,
        authenticate: Authenticator | None = None, allowed_hosts: Sequence[str] | None = None,
        max_body: int = DEFAULT_MAX_BODY, secret: bytes | str | None = None) -> ASGIApp:
    """The HTTP API of ``engine`` as an ASGI app (Starlette), with the web UI at ``/ui``.

    Endpoints are under ``/api`` (the OpenAPI document is at ``/openapi.json``
    and in docs/operations.md). With ``token``, every request (the UI's too)
    must carry ``Authorization: Bearer <token>``; others get 401 and nothing
    runs. With ``tokens`` (each person's name → their token) a request
    carries one of them and the audit (``by``) records its holder's name,
    which the request cannot change (a different ``by`` gets 403); with
    ``authenticate`` (a function or coroutine function given the request,
    answering the person's name or None) the host's own check decides, for
    requests no token lets in. The three combine. ``secret`` (16 bytes or
    more, the same on every worker) signs the web UI's form tokens, so that a
    page served by one worker, or before a restart, acts through any other;
    without it each process signs with a key of its own. Bad requests get 4xx with ``{"error": {"type", "message", "field"}}``;
    an unknown workflow ID gets 404. Mount it in your own ASGI app or serve it
    with ``fusee serve``; the engine must stay open while the app serves.

    Before any handler runs: a ``Host`` other than ``allowed_hosts`` (default
    127.0.0.1, localhost and [::1]; ``["*"]`` for any) gets 400; a request that
    changes something and comes from another site (its ``Origin``,
    ``Sec-Fetch-Site`` or ``Referer``) gets 403; a write to ``/api`` that is
    not ``application/json`` gets 415; a body over ``max_body`` bytes gets 413,
    refused as it arrives. IDs in paths are one segment each: send a ``/`` in
    an ID as ``%2F``.
    """
    if not isinstance(engine, fusee.Engine):
        raise TypeError(f"fusee.http.app takes an open fusee.Engine, got {engine!r}")
    people = check_tokens(token, tokens, authenticate)
    authentication = (Middleware(Authentication, token=token, tokens=people, authenticate=authenticate)
                      if token is not None or people or authenticate is not None else None)
    checks = guards(LOOPBACK_HOSTS if allowed_hosts is None else allowed_hosts, max_body, authentication)
    api = _Api(engine)
    ui = ui_routes(engine, secret)

    async def spec(request: Request) -> Response:
        return JSONResponse(openapi.document())

    async def index(request: Request) -> Response:
        if ui is not None:
            return RedirectResponse("/ui/")
        return JSONResponse({"fusee": fusee.__version__ if hasattr(fusee, "__version__") else None,
                             "api": "/api", "openapi": "/openapi.json"})

    async def healthz(request: Request) -> Response:
        # Liveness: this process answers HTTP (its engine may still be opening or failed).
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        # Readiness: the engine is open and its log has not failed, so calls can be acknowledged.
        async def check() -> str | None:
            try:
                engine._check_open()
            except errors.FuseeError as e:
                return f"{type(e).__name__}: {e}"
            failure = engine.failure
            return None if failure is None else f"the log failed: {failure}"

        try:
            why = await on_engine(engine, check)
        except RuntimeError as e:  # the engine's loop is gone
            why = f"the engine's loop does not answer: {e}"
        if why is not None:
            return JSONResponse({"status": "not ready", "reason": why}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def prometheus(request: Request) -> Response:
        if importlib.util.find_spec("prometheus_client") is None:
            return error_response(501, "PrometheusUnavailable", "/metrics needs prometheus_client: "
                                  "pip install 'fusee[prometheus]' (GET /api/metrics answers JSON meanwhile)")
        from fusee.http import prometheus as prom

        async def snapshot() -> Any:
            return engine.metrics()

        try:
            m = await on_engine(engine, snapshot)
        except errors.FuseeError as e:
            return error_response(503, type(e).__name__, str(e))
        return Response(prom.render(m), media_type=prom.CONTENT_TYPE)

    async def no_action(request: Request) -> Response:
        what = param(request, "action")
        if what in RUN_ACTIONS or what in RUN_READS:
            use = "POST" if what in RUN_ACTIONS else "GET"
            return error_response(405, "MethodNotAllowed", f"{request.method} is not allowed on "
                                  f"{encoded_path(request.scope)}: use {use}", "method", headers={"Allow": use})
        return error_response(404, "NotFound", f"a run has no endpoint {what!r}: GET {', '.join(RUN_READS)} or "
                              f"streams/NAME; POST {', '.join(RUN_ACTIONS)} (a '/' in an ID is sent as %2F)",
                              "path")

    # Routed on the path as sent: each {param} is one segment, decoded by the handler (paths.py).
    api_routes: list[BaseRoute] = [
        Route("/runs", api.list_runs, methods=["GET"]),
        Route("/runs", api.start, methods=["POST"]),
        Route("/runs/{workflow_id}", api.describe, methods=["GET"]),
        Route("/runs/{workflow_id}/journal", api.journal, methods=["GET"]),
        Route("/runs/{workflow_id}/export", api.export, methods=["GET"]),
        Route("/runs/{workflow_id}/streams/{name}", api.stream, methods=["GET"]),
        *(Route(f"/runs/{{workflow_id}}/{action}", getattr(api, action), methods=["POST"])
          for action in RUN_ACTIONS),
        Route("/runs/{workflow_id}/{action}", no_action, methods=["GET", "POST"]),
        Route("/counts", api.counts, methods=["GET"]),
        Route("/bulk/{action}", api.bulk, methods=["POST"]),
        Route("/completions", api.complete, methods=["POST"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/schedules", api.list_schedules, methods=["GET"]),
        Route("/schedules", api.create_schedule, methods=["POST"]),
        Route("/schedules/{schedule_id}", api.describe_schedule, methods=["GET"]),
        Route("/schedules/{schedule_id}/backfill", api.backfill_schedule, methods=["POST"]),
        Route("/schedules/{schedule_id}/{op}", api.schedule_action, methods=["POST"]),
        Route("/limits", api.list_limits, methods=["GET"]),
        Route("/limits/{name}", api.set_limit, methods=["POST"]),
        Route("/objects/{object}/{key}/state", api.object_state, methods=["GET"]),
        Route("/objects/{object}/{key}/state", api.set_object_state, methods=["PUT"]),
        Route("/objects/{object}/{key}/state", api.patch_object_state, methods=["PATCH"]),
        Route("/objects/{object}/{key}/state/clear", api.clear_object_state, methods=["POST"]),
    ]
    routes: list[BaseRoute] = [
        Route("/", index),
        Route("/openapi.json", spec),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Mount("/api", app=RawPath(Router(api_routes))),
    ]
    if ui is not None:
        routes.append(Mount("/ui", routes=ui))

    async def not_found(request: Request, exc: Exception) -> Response:
        path = encoded_path(request.scope)
        hint = " (IDs are one path segment: send a '/' in an ID as %2F)" if path.startswith("/api/") else ""
        return error_response(404, "NotFound", f"no such endpoint: {request.method} {path}{hint}", "path")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        allow = (getattr(exc, "headers", None) or {}).get("Allow")
        use = f": use {allow.replace(', ', ' or ')}" if allow else ""
        return error_response(405, "MethodNotAllowed",
                              f"{request.method} is not allowed on {encoded_path(request.scope)}{use}", "method")

    async def too_big(request: Request, exc: Exception) -> Response:
        return too_large(max_body)

    async def crashed(request: Request, exc: Exception) -> Response:
        # A bug, not a bad request: the server logs the traceback, the client gets JSON.
        return error_response(500, type(exc).__name__, f"internal error: {exc}")

    return Starlette(routes=routes, middleware=checks,
                     exception_handlers={404: not_found, 405: not_allowed, 413: too_big, Exception: crashed})

