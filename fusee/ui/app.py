"""The web UI's routes: pages rendered on the server from the engine's public API.

Every engine call runs on the engine's event loop: directly when the ASGI
server shares it (``fusee serve``, an app that opens the engine in its
lifespan), else handed to that loop and awaited.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

import fusee
from fusee.engine import visibility
from fusee.errors import FuseeError, InvalidQuery, NotFound
from fusee.http.auth import check_secret, user_of
from fusee.ui import flow, objects, present, svg, timeline
from fusee.ui.csrf import FIELD as CSRF_FIELD
from fusee.ui.csrf import CsrfGuard
from fusee.ui.sampler import Sampler

HERE = Path(__file__).parent
#: Runs per page of the runs list.
PAGE = 50
#: Journal records listed in a run's history table (the first ones).
MAX_EVENTS = 2000
#: Who the journal's audit names for actions taken in the UI.
BY = "web-ui"
#: How long a stream follower waits for a chunk before it sends a keep-alive (seconds).
STREAM_WAIT = 5.0
#: How long one stream response lasts (seconds): the browser reconnects from the last
#: offset it saw, and a server shutting down never waits longer for an open page.
STREAM_SPAN = 30.0
#: The largest action form taken (a signal's value is in it).
MAX_FORM = 1 << 20
#: Where a request's form is kept once read.
_FORM = "fusee.ui.form"
#: The order statuses are shown in.
STATUS_ORDER = ("running", "retrying", "paused", "stuck", "ok", "failed", "cancelled", "terminated", "timed_out", "continued")
#: The pages of the navigation; None: not available in this version.
NAV: tuple[tuple[str, str | None], ...] = (
    ("Runs", "/"), ("Metrics", "/metrics"), ("Schedules", "/schedules"), ("Limits", "/limits"),
    ("Objects", "/objects"))
FLASH = {
    "signal": "Signal sent: it is durable in the run's journal.",
    "cancel": "Cancellation requested: the run's pending operations raise Cancelled.",
    "terminate": "Run terminated.",
    "resume": "Paused steps resumed with a fresh retry budget.",
    "reset": "Run reset: a new run continues from before the chosen step.",
}


async def on_engine(engine: fusee.Engine, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls ``fn`` (an engine method, sync or async) on the engine's loop and returns its result."""

    async def call() -> Any:
        out = fn(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    loop = engine.loop
    if asyncio.get_running_loop() is loop:
        return await call()
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), loop))


def _lit(text: str) -> str:
    """``text`` as a literal of the where language."""
    return "'" + text.replace("'", "''") + "'"


class _UI:
    def __init__(self, engine: fusee.Engine, secret: bytes | None = None) -> None:
        self.engine = engine
        self.csrf = CsrfGuard(secret)
        self.sampler = Sampler()
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            trim_blocks=True,
            lstrip_blocks=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.globals.update(
            present=present, status_color=svg.color, nav=NAV, quote=lambda s: quote(s, safe=""),
            csrf_field=CSRF_FIELD, max_events=MAX_EVENTS,
        )

    # --- helpers ---------------------------------------------------------------

    def guard(self, page: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """``page``, answering 503 with the reason when the engine cannot answer (closed, failed log)."""

        async def guarded(request: Request) -> Response:
            try:
                return await page(request)
            except FuseeError as e:
                return self.render(request, "error.html", status_code=503, title="The engine cannot answer",
                                   message=str(e))

        return guarded

    def render(self, request: Request, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        html = self.env.get_template(name).render(
            base=base, csrf=self.csrf.token(request), path=request.url.path, **ctx)
        return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})

    def fragment(self, request: Request, name: str, **ctx: Any) -> tuple[str, str]:
        """A live region's HTML and its version: the page's script swaps it only when that changed."""
        base = request.scope.get("root_path", "").rstrip("/")
        html = self.env.get_template(name).render(
            base=base, csrf=self.csrf.token(request), path=request.url.path, **ctx)
        return html, hashlib.blake2b(html.encode(), digest_size=8).hexdigest()

    def fragment_response(self, request: Request, name: str, **ctx: Any) -> HTMLResponse:
        html, version = self.fragment(request, name, **ctx)
        return HTMLResponse(html, headers={"Cache-Control": "no-store", "X-Fusee-Version": version})

    @staticmethod
    async def form(request: Request) -> dict[str, str]:
        """An action's form fields (URL-encoded: the UI's forms upload no files); ValueError for a
        form over :data:`MAX_FORM` bytes, found before it is read whole."""
        cached: dict[str, str] | None = request.scope.get(_FORM)
        if cached is not None:
            return cached
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_FORM:
            raise ValueError(f"the form is {declared} bytes: at most {MAX_FORM} are taken")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise ValueError(f"the form is over {MAX_FORM} bytes: at most {MAX_FORM} are taken")
        fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        request.scope[_FORM] = fields  # read once: the body cannot be read again
        return fields

    async def counts(self) -> dict[str, int]:
        m = await on_engine(self.engine, self.engine.metrics)
        self.sampler.add(m)
        by: dict[str, int] = {}
        for s in m.shards:
            for status, n in s.runs.items():
                by[status] = by.get(status, 0) + n
        order = {s: i for i, s in enumerate(STATUS_ORDER)}
        return dict(sorted(by.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])))

    def filters(self, request: Request) -> dict[str, str]:
        p = request.query_params
        return {k: p.get(k, "").strip() for k in ("status", "workflow", "q")}

    @staticmethod
    def where(f: dict[str, str]) -> str | None:
        parts = []
        if f["status"]:
            parts.append(f"status = {_lit(f['status'])}")
        if f["workflow"]:
            parts.append(f"workflow = {_lit(f['workflow'])}")
        if f["q"]:
            parts.append(f"({f['q']})")
        return " and ".join(parts) or None

    async def page(self, request: Request) -> dict[str, Any]:
        f = self.filters(request)
        cursor = request.query_params.get("cursor") or None
        error = None
        items: list[Any] = []
        next_cursor = None
        try:
            if f["q"]:
                visibility.parse(f["q"])  # so a mistake's position is in the user's own text
            page = await on_engine(self.engine, self.engine.list, self.where(f), PAGE, cursor)
            items, next_cursor = page.items, page.cursor
        except InvalidQuery as e:
            error = str(e)
        next_url = None
        if next_cursor is not None:
            next_url = "?" + urlencode({**{k: v for k, v in f.items() if v}, "cursor": next_cursor})
        first_url = "?" + urlencode({k: v for k, v in f.items() if v}) if cursor else None
        return {"filters": f, "runs": items, "error": error, "next_url": next_url, "first_url": first_url,
                "query_string": urlencode({k: v for k, v in f.items() if v} | (
                    {"cursor": cursor} if cursor else {}))}

    def count_links(self, f: dict[str, str], counts: dict[str, int]) -> list[dict[str, Any]]:
        def url(status: str) -> str:
            return "?" + urlencode({k: v for k, v in {**f, "status": status}.items() if v})

        out = [{"status": "", "label": "all", "n": sum(counts.values()), "url": url(""),
                "active": not f["status"]}]
        for status, n in counts.items():
            out.append({"status": status, "label": status.replace("_", " "), "n": n, "url": url(status),
                        "active": f["status"] == status})
        return out

    # --- pages -------------------------------------------------------------------

    async def runs(self, request: Request) -> Response:
        ctx = await self.page(request)
        counts = await self.counts()
        workflows = sorted({s.workflow for s in ctx["runs"]} | ({ctx["filters"]["workflow"]} - {""}))
        links = self.count_links(ctx["filters"], counts)
        return self.render(request, "runs.html", workflows=workflows, statuses=STATUS_ORDER, **ctx,
                           live_counts=self.fragment(request, "_counts.html", counts=links),
                           live_rows=self.fragment(request, "_rows.html", **ctx),
                           status_code=400 if ctx["error"] else 200)

    async def runs_rows(self, request: Request) -> Response:
        return self.fragment_response(request, "_rows.html", **await self.page(request))

    async def runs_counts(self, request: Request) -> Response:
        return self.fragment_response(request, "_counts.html", counts=self.count_links(self.filters(request), await self.counts()))

    async def run_context(self, wid: str) -> dict[str, Any]:
        summary = await on_engine(self.engine, self.engine.describe, wid)
        journal = await on_engine(self.engine, self.engine.journal, wid)
        tl = timeline.build(journal)
        return {"wid": wid, "s": summary, "tl": tl}

    async def run(self, request: Request, error: str | None = None, status_code: int = 200) -> Response:
        wid = request.path_params["wid"]
        try:
            ctx = await self.run_context(wid)
        except NotFound as e:
            return self.render(request, "error.html", status_code=404, title="Run not found", message=str(e))
        base = request.scope.get("root_path", "").rstrip("/")
        done = request.query_params.get("done", "")
        live = self.fragment(request, "_run_live.html", svg=svg.timeline(ctx["tl"], base + "/runs/"), **ctx)
        return self.render(request, "run.html", status_code=status_code, error=error,
                           flash=FLASH.get(done), live=live, **ctx)

    async def run_live(self, request: Request) -> Response:
        wid = request.path_params["wid"]
        try:
            ctx = await self.run_context(wid)
        except NotFound as e:
            return HTMLResponse(f"<p class='alert alert-error'>{html.escape(str(e))}</p>", 404)
        base = request.scope.get("root_path", "").rstrip("/")
        return self.fragment_response(request, "_run_live.html", svg=svg.timeline(ctx["tl"], base + "/runs/"),
                                      **ctx)

    async def stream(self, request: Request) -> Response:
        """A stream's durable chunks as Server-Sent Events (each event's ID is the next offset)."""
        wid = request.path_params["wid"]
        name = request.query_params.get("name", "")
        try:
            offset = int(request.headers.get("last-event-id") or request.query_params.get("offset") or 0)
            if offset < 0:
                raise ValueError
        except ValueError:
            return Response("offset must be a whole number >= 0", 400, media_type="text/plain")
        engine = self.engine

        async def events() -> AsyncIterator[str]:
            at = offset
            loop = asyncio.get_running_loop()
            until = loop.time() + STREAM_SPAN
            yield "retry: 1000\n\n"
            while loop.time() < until:
                try:
                    chunks, at, ended = await on_engine(
                        engine, engine.read_stream_batch, wid, name, at, wait=STREAM_WAIT)
                except FuseeError as e:
                    yield f"event: failure\ndata: {json.dumps(str(e))}\n\n"
                    return
                for chunk in chunks:
                    yield f"data: {json.dumps(chunk, default=str, ensure_ascii=False)}\n\n"
                if chunks:
                    yield f"id: {at}\n\n"
                if ended:
                    yield "event: end\ndata: {}\n\n"
                    return
                if not chunks:
                    yield ": waiting\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def action(self, request: Request) -> Response:
        wid = request.path_params["wid"]
        what = request.path_params["action"]
        try:
            form = await self.form(request)
        except ValueError as e:
            return self.render(request, "error.html", status_code=413, title="Refused", message=str(e))
        refusal = self.csrf.refusal(request, form.get(CSRF_FIELD))
        if refusal is not None:
            return self.render(request, "error.html", status_code=403, title="Refused", message=refusal)
        engine = self.engine
        by = user_of(request.scope) or BY
        try:
            if what == "signal":
                name = str(form.get("name", "")).strip()
                if not name:
                    raise ValueError("the signal needs a name (the one the workflow waits for)")
                raw = str(form.get("value", "")).strip()
                try:
                    value = json.loads(raw) if raw else None
                except ValueError as e:
                    raise ValueError(f"the signal's value is not JSON ({e}): write 42, \"text\", "
                                     "true, {\"k\": 1} or leave it empty for null") from None
                await on_engine(engine, engine.signal, wid, fusee.SignalDef(name), value, by=by)  # by name: checked
            elif what == "cancel":
                await on_engine(engine, engine.cancel, wid, str(form.get("reason", "")), by=by)
            elif what == "terminate":
                await on_engine(engine, engine.terminate, wid, str(form.get("reason", "")), by=by)
            elif what == "resume":
                if not await on_engine(engine, self.resume, wid, by):
                    return await self.run(request, error=f"resume refused: run {wid!r} has no paused step to "
                                          "resume (resume is for steps whose retries ran out)", status_code=409)
            elif what == "reset":
                step = str(form.get("step", "")).strip()
                if not step:
                    raise ValueError("choose the step to reset to: the run continues from before it")
                await on_engine(engine, engine.reset, wid, before_step=step, by=by)
            else:
                return self.render(request, "error.html", status_code=404, title="Unknown action",
                                   message=f"no action {what!r}: signal, cancel, terminate, resume or reset")
        except (FuseeError, ValueError, TypeError) as e:
            return await self.run(request, error=f"{what} refused: {e}", status_code=400)
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/runs/{quote(wid, safe='')}?done={what}", status_code=303)

    async def resume(self, wid: str, by: str) -> bool:
        """Resumes ``wid``'s paused steps; False (nothing done) when none is paused. Checked and
        resumed in one turn of the engine's loop."""
        s = self.engine.describe(wid)
        # (A follower's view may lag its owner's: it leaves the answer to the owner.)
        if s.ended_at is None and not s.paused_steps and self.engine.is_owner:
            return False
        await self.engine.resume(wid, by=by)
        return True

    async def metrics(self, request: Request) -> Response:
        return self.render(request, "metrics.html",
                           live=self.fragment(request, "_metrics.html", **await self.metrics_context()))

    async def metrics_live(self, request: Request) -> Response:
        return self.fragment_response(request, "_metrics.html", **await self.metrics_context())

    async def metrics_context(self) -> dict[str, Any]:
        m = await on_engine(self.engine, self.engine.metrics)
        self.sampler.add(m)
        counts = await self.counts()
        sp = self.sampler
        charts = {
            "status": svg.hbars(list(counts.items())),
            "steps": svg.lines([("steps/s", "#2563eb", sp.rates("steps_run")),
                                ("records flushed/s", "#16a34a", sp.rates("records_flushed"))], "per second"),
            "flush": svg.lines([("p50", "#0d9488", sp.values("flush_p50_ms")),
                                ("p99", "#ea580c", sp.values("flush_p99_ms"))], "milliseconds"),
            "runs": svg.lines([("running", "#2563eb", sp.statuses("running")),
                               ("failed", "#dc2626", sp.statuses("failed"))], "runs"),
        }
        return {"m": m, "charts": charts, "counts": counts}


def routes(engine: fusee.Engine, *, secret: bytes | str | None = None) -> list[BaseRoute]:
    """The web UI's routes, to mount under a prefix: ``Mount("/ui", routes=fusee.ui.routes(engine))``.

    Pages: the runs list (filters, ``where`` search, live counts by status),
    a run (summary, journal timeline, live streams, actions behind a
    confirmation), metrics (charts), schedules (pause, unpause, trigger,
    delete) and step limits (resize). Actions are POST forms checked for a
    signed CSRF token (handed to the person the page was served to, taken for
    12 hours; signed with ``secret``, which every worker of one server shares
    so that a page served by one acts through another and across restarts;
    without it, a key per process) and a same-origin ``Origin``; they are journaled with
    ``by=`` the signed-in person's name (``fusee.http.app``'s ``tokens`` or
    ``authenticate``), else ``"web-ui"``. The routes add no authentication of
    their own: serve them on loopback or behind the app's (see
    docs/operations.md).
    """
    ui = _UI(engine, check_secret(secret))
    guard = ui.guard
    return [
        Route("/", guard(ui.runs), name="ui-runs"),
        Route("/fragments/rows", guard(ui.runs_rows)),
        Route("/fragments/counts", guard(ui.runs_counts)),
        Route("/fragments/metrics", guard(ui.metrics_live)),
        Route("/metrics", guard(ui.metrics), name="ui-metrics"),
        *flow.routes(ui),
        *objects.routes(ui),
        Route("/runs/{wid:path}", guard(ui.run), name="ui-run"),
        Route("/live/{wid:path}", guard(ui.run_live)),
        Route("/stream/{wid:path}", guard(ui.stream)),
        Route("/action/{action}/{wid:path}", guard(ui.action), methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="ui-static"),
    ]
