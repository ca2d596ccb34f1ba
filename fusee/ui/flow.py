"""The web UI's Schedules and Limits pages (``engine.schedules()``, ``engine.limits()``).

Actions are POST forms behind a confirmation dialog, checked like the run
actions (the signed CSRF token and a same-origin ``Origin``); a refused
request calls nothing on the engine.
"""

from __future__ import annotations

import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from fusee.errors import FuseeError, NotFound, UnknownLimit
from fusee.ui.pages import Pages, on_engine

#: Scheduled runs listed per schedule (the newest).
LAST_RUNS = 5
SCHEDULE_ACTIONS = ("pause", "unpause", "trigger", "backfill", "delete")
FLASH = {
    "pause": "Schedule paused: it starts no run until unpaused (running ones go on).",
    "unpause": "Schedule unpaused: it starts runs again from its next time.",
    "trigger": "Run started now, under the schedule's overlap policy.",
    "backfill": "Backfill recorded: the range's scheduled times run one after another (all at once with "
                "allow_all); a time that already ran is not run again.",
    "delete": "Schedule deleted: its runs go on; the ID may be scheduled again.",
    "resize": "Limit resized (in memory: the application's next Engine.open sets its own).",
}


def spec_text(info: Any) -> str:
    """``every 1h`` or ``cron 0 2 * * * (Europe/Paris)``."""
    if info.cron:
        return f"cron {info.cron} ({info.timezone})"
    if info.every is None:
        return ""
    return f"every {_period(info.every)}"


def _period(every: datetime.timedelta) -> str:
    seconds = every.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


class FlowPages:
    """The two pages and their actions, on the UI's engine, renderer and CSRF guard."""

    def __init__(self, ui: Pages) -> None:
        self.ui = ui

    @property
    def engine(self) -> Any:
        return self.ui.engine

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:

        return await on_engine(self.engine, fn, *args, **kwargs)

    # --- schedules -------------------------------------------------------------------

    async def schedule_rows(self) -> list[dict[str, Any]]:
        infos = list(await self.call(self.engine.schedules))  # awaited: on several parts it asks every holder
        runs = await self.call(self.engine.runs)
        by_schedule: dict[str, list[Any]] = {}
        for s in runs:
            sid, at, _ = s.workflow_id.rpartition("@")
            if at:
                by_schedule.setdefault(sid, []).append(s)
        rows = []
        for info in infos:
            # Run IDs carry their ISO time: sorting them sorts by scheduled time.
            last = sorted(by_schedule.get(info.schedule_id, []), key=lambda s: s.workflow_id, reverse=True)
            rows.append({"info": info, "spec": spec_text(info), "last": last[:LAST_RUNS],
                         "skipped": info.skipped_overlap + info.skipped_catchup + info.skipped_paused})
        return rows

    async def schedules(self, request: Request, error: str | None = None, status_code: int = 200) -> Response:
        return self.ui.render(request, "schedules.html", status_code=status_code, rows=await self.schedule_rows(),
                              error=error, flash=FLASH.get(request.query_params.get("done", "")))

    async def schedule_action(self, request: Request) -> Response:
        what, sid = request.path_params["action"], request.path_params["sid"]
        refused = await self.ui.refused(request)
        if refused is not None:
            return refused
        act = {"pause": self.engine.pause_schedule, "unpause": self.engine.unpause_schedule,
               "trigger": self.engine.trigger_schedule, "backfill": self.engine.backfill_schedule,
               "delete": self.engine.delete_schedule}.get(what)
        if act is None:
            return self.ui.render(request, "error.html", status_code=404, title="Unknown action",
                                  message=f"no schedule action {what!r}: {', '.join(SCHEDULE_ACTIONS)}")
        try:
            if what == "backfill":
                form = await self.ui.form(request)  # read already: the fields are kept
                start, end = _utc(form.get("start", ""), "start"), _utc(form.get("end", ""), "end")
                if not start < end:
                    raise ValueError(f"the range is empty: the end ({end:%Y-%m-%d %H:%M}) must come after the "
                                     f"start ({start:%Y-%m-%d %H:%M})")
                await self.call(act, sid, start, end)
            else:
                await self.call(act, sid)
        except NotFound as e:
            return await self.schedules(request, error=f"{what} refused: {e}", status_code=404)
        except (FuseeError, ValueError, TypeError) as e:
            return await self.schedules(request, error=f"{what} refused: {e}", status_code=400)
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/schedules?done={what}", status_code=303)

    # --- limits ------------------------------------------------------------------------

    async def limits(self, request: Request, error: str | None = None, status_code: int = 200) -> Response:
        status = await self.call(self.engine.limits)
        return self.ui.render(request, "limits.html", status_code=status_code,
                              limits=[s for _, s in sorted(status.items())], error=error,
                              flash=FLASH.get(request.query_params.get("done", "")))

    async def resize(self, request: Request) -> Response:
        name = request.path_params["name"]
        refused = await self.ui.refused(request)
        if refused is not None:
            return refused
        form = await self.ui.form(request)  # read already: the fields are kept
        try:
            changes = {"concurrency": _bound(form.get("concurrency", ""), "concurrency", int),
                       "per_second": _bound(form.get("per_second", ""), "per second", float)}
            await self.call(self.engine.set_limit, name, **changes)
        except UnknownLimit as e:
            return await self.limits(request, error=f"resize refused: {e}", status_code=404)
        except (FuseeError, ValueError, TypeError) as e:
            return await self.limits(request, error=f"resize refused: {e}", status_code=400)
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/limits?done=resize", status_code=303)



def _utc(text: str, what: str) -> datetime.datetime:
    """A form's date and time (``2026-11-30T02:00``, as a datetime-local input sends it), in UTC."""
    text = text.strip()
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"the {what} must be a date and time such as 2026-11-30T02:00 (UTC), got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when


def _bound(text: str, what: str, kind: type) -> Any:
    """A form's bound: empty for none, else a positive number of ``kind``."""
    text = text.strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{what} must be a {'whole ' if kind is int else ''}number above 0, or empty for no "
                         f"bound; got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{what} must be above 0 (or empty for no bound), got {text}")
    return value


def routes(ui: Pages) -> list[BaseRoute]:
    pages = FlowPages(ui)
    guard = ui.guard
    return [
        Route("/schedules", guard(pages.schedules), name="ui-schedules"),
        Route("/schedules/action/{action}/{sid:path}", guard(pages.schedule_action), methods=["POST"]),
        Route("/limits", guard(pages.limits), name="ui-limits"),
        Route("/limits/resize/{name:path}", guard(pages.resize), methods=["POST"]),
    ]



