"""The web UI's routes: pages rendered on the server from the engine's public API.

Every engine call runs on the engine's event loop: directly when the ASGI
server shares it (``fusee serve``, an app that opens the engine in its
lifespan), else handed to that loop and awaited.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

import fusee
from fusee import codec
from fusee.core import records as rec
from fusee.engine import visibility
from fusee.engine.query_grammar import split_order
from fusee.errors import FuseeError, InvalidQuery, NotFound
from fusee.http import sse
from fusee.http.auth import check_secret, user_of
from fusee.ui import flow, objects, present, svg, timeline
from fusee.ui.csrf import FIELD as CSRF_FIELD
from fusee.ui.csrf import CsrfGuard
from fusee.ui.pages import on_engine
from fusee.ui.sampler import Sampler

HERE = Path(__file__).parent
#: Runs per page of the runs list.
PAGE = 50
#: Journal records listed in a run's history table (the first ones).
MAX_EVENTS = 2000
#: Who the journal's audit names for actions taken in the UI.
BY = "web-ui"
#: Workflow names the engine runs for itself (objects, schedules, windows): not started by hand.
INTERNAL_PREFIXES = ("fusee.", "fusee:")
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
    "start": "Run started: its start is durable.",
    "fork": "Fork started: a new run from the original's journal before the cut (the original goes on).",
    "signal": "Signal sent: it is durable in the run's journal.",
    "cancel": "Cancellation requested: the run's pending operations raise Cancelled.",
    "terminate": "Run terminated.",
    "resume": "Paused steps resumed with a fresh retry budget.",
    "reset": "Run reset: a new run continues from before the chosen step.",
}


def _cut(form: dict[str, str]) -> dict[str, Any]:
    """Where a reset or fork cuts the journal (a step's name, or an operation's position) and
    whether signals after the cut come again, from its dialog's fields."""
    step = str(form.get("step", "")).strip()
    position = str(form.get("position", "")).strip()
    # A form without the box says nothing of signals (they come again); with it, unticked drops them.
    reapply = "reapply_signals" in form or "signals_choice" not in form
    if position:
        try:
            return {"before_position": int(position), "reapply_signals": reapply}
        except ValueError:
            raise ValueError(f"the position must be an operation's number, got {position!r}") from None
    if not step:
        raise ValueError("choose where to cut: before a step, or before an operation's position")
    return {"before_step": step, "reapply_signals": reapply}


def _internal_page(wid: str, workflow: str) -> tuple[str, str] | None:
    """Where a person acts on what an internal run holds: (label, path under the UI)."""
    from fusee.flow import schedules

    if workflow.startswith(schedules.PREFIX):
        return "the Schedules page", "/schedules"
    name, sep, key = wid[1:].partition("/")
    if wid.startswith("@") and sep:
        return f"the state page of {name} {key}", f"/objects/{quote(name, safe='')}/{quote(key, safe='')}"
    return None


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
        q, order_by = split_order(f["q"]) if f["q"] else ("", "")
        if q:
            parts.append(f"({q})")
        return " ".join(filter(None, [" and ".join(parts), order_by])) or None

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

    async def runs(self, request: Request, start_error: str | None = None, typed: dict[str, str] | None = None,
                   status_code: int | None = None) -> Response:
        ctx = await self.page(request)
        counts = await self.counts()
        workflows = sorted({s.workflow for s in ctx["runs"]} | ({ctx["filters"]["workflow"]} - {""}))
        links = self.count_links(ctx["filters"], counts)
        return self.render(request, "runs.html", workflows=workflows, statuses=STATUS_ORDER, **ctx,
                           live_counts=self.fragment(request, "_counts.html", counts=links),
                           live_rows=self.fragment(request, "_rows.html", **ctx),
                           startable=self.startable(), start_error=start_error, typed=typed or {},
                           status_code=status_code or (400 if ctx["error"] else 200))

    def startable(self) -> list[tuple[str, str]]:
        """The workflows a person may start here (not the engine's internal ones), with their input type."""
        out = []
        for name, wdef in sorted(self.engine._rt.workflows.items()):
            if name.startswith(INTERNAL_PREFIXES) or wdef.window is not None:
                continue
            hint = present.type_name(wdef.input_type) if wdef.takes_input else "no input"
            out.append((name, hint))
        return out

    async def refused(self, request: Request) -> Response | None:
        """The error page for a form that may not act (over the size limit: 413; a missing or
        foreign CSRF token, another site: 403), or None; the form stays read for the caller."""
        try:
            form = await self.form(request)
        except ValueError as e:
            return self.render(request, "error.html", status_code=413, title="Refused", message=str(e))
        refusal = self.csrf.refusal(request, form.get(CSRF_FIELD))
        if refusal is not None:
            return self.render(request, "error.html", status_code=403, title="Refused", message=refusal)
        return None

    async def start(self, request: Request) -> Response:
        """Starts a run from the runs page's form (workflow, ID, input as JSON), then shows it."""
        refused = await self.refused(request)
        if refused is not None:
            return refused
        form = await self.form(request)  # read already: the fields are kept
        typed = {k: str(form.get(k, "")) for k in ("workflow", "workflow_id", "input")}
        wid = typed["workflow_id"].strip()
        try:
            if typed["workflow"] not in dict(self.startable()):
                raise ValueError(f"choose a workflow to start ({', '.join(n for n, _ in self.startable())})")
            if not wid:
                raise ValueError("the run needs a workflow ID: one the engine has not run yet, such as order-42")
            raw = typed["input"].strip()
            try:
                value = json.loads(raw) if raw else None
            except ValueError as e:
                raise ValueError(f"the input is not JSON ({e}): write 42, \"text\", {{\"k\": 1}} or leave it "
                                 "empty for none") from None
            await on_engine(self.engine, self.engine.start, typed["workflow"], wid, value)
        except (FuseeError, ValueError, TypeError) as e:
            status = 409 if type(e).__name__ == "AlreadyExists" else 400
            return await self.runs(request, start_error=f"start refused, nothing started: {e}", typed=typed,
                                   status_code=status)
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/runs/{quote(wid, safe='')}?done=start", status_code=303)

    async def runs_rows(self, request: Request) -> Response:
        return self.fragment_response(request, "_rows.html", **await self.page(request))

    async def runs_counts(self, request: Request) -> Response:
        return self.fragment_response(request, "_counts.html", counts=self.count_links(self.filters(request), await self.counts()))

    async def run_context(self, wid: str) -> dict[str, Any]:
        summary = await on_engine(self.engine, self.engine.describe, wid)
        journal = await on_engine(self.engine, self.engine.journal, wid)
        tl = timeline.build(journal)
        internal = summary.workflow.startswith(INTERNAL_PREFIXES)
        start = next((r for r in journal if isinstance(r, rec.Start)), None)
        input_json = present.payload_json(start.input) if start is not None else ""
        return {"wid": wid, "s": summary, "tl": tl, "internal": internal, "input_json": input_json,
                "startable_here": summary.workflow in dict(self.startable()),
                "internal_page": _internal_page(wid, summary.workflow) if internal else None}

    async def run(self, request: Request, error: str | None = None, status_code: int = 200,
                  answer: dict[str, str] | None = None) -> Response:
        wid = request.path_params["wid"]
        try:
            ctx = await self.run_context(wid)
        except NotFound as e:
            return self.render(request, "error.html", status_code=404, title="Run not found", message=str(e))
        base = request.scope.get("root_path", "").rstrip("/")
        done = request.query_params.get("done", "")
        live = self.fragment(request, "_run_live.html", svg=svg.timeline(ctx["tl"], base + "/runs/"), **ctx)
        return self.render(request, "run.html", status_code=status_code, error=error,
                           flash=FLASH.get(done), live=live, answer=answer, **ctx)

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

        async def events() -> AsyncIterator[sse.Event]:
            at = offset
            loop = asyncio.get_running_loop()
            until = loop.time() + STREAM_SPAN
            yield sse.event(retry=1000)
            while loop.time() < until:
                try:
                    chunks, at, ended = await on_engine(
                        engine, engine.read_stream_batch, wid, name, at, wait=STREAM_WAIT)
                except FuseeError as e:
                    yield sse.event(json.dumps(str(e)), event="failure")
                    return
                for chunk in chunks:
                    yield sse.event(json.dumps(chunk, default=str, ensure_ascii=False))
                if chunks:
                    yield sse.event(id=str(at))
                if ended:
                    yield sse.event("{}", event="end")
                    return
                if not chunks:
                    yield sse.event(comment="waiting")

        # sse-starlette: the event encoding, client disconnects and the server's shutdown.
        return sse.response(events())

    async def action(self, request: Request) -> Response:
        wid = request.path_params["wid"]
        what = request.path_params["action"]
        refused = await self.refused(request)
        if refused is not None:
            return refused
        form = await self.form(request)  # read already: the fields are kept
        engine = self.engine
        by = user_of(request.scope) or BY
        try:
            kind = (await on_engine(engine, engine.describe, wid)).workflow
        except FuseeError as e:
            return await self.run(request, error=f"{what} refused: {e}", status_code=404)
        if kind.startswith(INTERNAL_PREFIXES):
            return await self.run(request, error=f"{what} refused: the engine runs {wid!r} itself (it holds a "
                                  "schedule's or an object's state); act on it from its own page", status_code=409)
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
            elif what in ("query", "update"):
                name = str(form.get("name", "")).strip()
                if not name:
                    raise ValueError(f"the {what} needs the name its handler was registered with")
                raw = str(form.get("arg", "")).strip()
                try:
                    arg = json.loads(raw) if raw else None
                except ValueError as e:
                    raise ValueError(f"the argument is not JSON ({e}): write 42, \"text\", {{\"k\": 1}} or "
                                     "leave it empty for none") from None
                if what == "query":
                    result = await on_engine(engine, engine.query, wid, fusee.query(name), arg)
                else:
                    try:
                        result = await on_engine(engine, engine.update, wid, fusee.update(name), arg)
                    except (FuseeError, ValueError, TypeError):
                        raise
                    except Exception as e:  # the workflow's validator refused it: nothing was recorded
                        raise ValueError(f"the update was rejected: {str(e) or type(e).__name__}") from None
                shown = present.payload_json(codec.encode(result)) or "null"
                return await self.run(request, answer={"what": what, "name": name, "value": shown})
            elif what in ("reset", "fork"):
                cut = _cut(form)
                if what == "reset":
                    await on_engine(engine, engine.reset, wid, **cut, by=by)
                else:
                    new_id = str(form.get("new_id", "")).strip()
                    if not new_id:
                        raise ValueError("the fork needs a workflow ID of its own, one the engine has not run yet")
                    await on_engine(engine, engine.fork, wid, new_id, **cut, by=by)
                    base = request.scope.get("root_path", "").rstrip("/")
                    return RedirectResponse(f"{base}/runs/{quote(new_id, safe='')}?done=fork", status_code=303)
            else:
                return self.render(request, "error.html", status_code=404, title="Unknown action",
                                   message=f"no action {what!r}: signal, query, update, cancel, terminate, resume, "
                                   "reset or fork")
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
        Route("/start", guard(ui.start), methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="ui-static"),
    ]
