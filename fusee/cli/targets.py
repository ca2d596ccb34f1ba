"""What the ``fusee`` command reads and acts on: a running application's HTTP API, or a
directory read offline.

Both answer with the JSON shapes of :mod:`fusee.views`, so every command prints
the same thing whichever target it was given. A directory is opened read-only:
nothing in it is created, locked or written, and a directory a live process has
open is read too (``live``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fusee import errors, journal_file, views

#: The figures of :meth:`Engine.metrics` that count what a running engine did or holds in memory.
RUNTIME_COUNTERS = ("steps_run", "steps_executing", "steps_gated", "timers_pending", "flushes", "inline_flushes",
                    "records_flushed", "records_pending", "flush_p50_ms", "flush_p99_ms", "stats")
#: Rows of a listing (schedules, limits). An alias: the targets' ``list`` method hides the builtin.
Rows = list[dict[str, Any]]


class Target:
    """A source of runs: :class:`Directory` or :class:`Api`."""

    #: What the target is, for messages.
    label: str = ""
    #: A directory that another process has open (its log may have grown since the read).
    live: bool = False

    def list(self, where: str | None, limit: int, cursor: str | None, order: str = "oldest") -> dict[str, Any]:
        raise NotImplementedError

    def counts(self, where: str | None) -> dict[str, int]:
        raise NotImplementedError

    def describe(self, workflow_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def journal(self, workflow_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def export(self, workflow_id: str) -> bytes:
        raise NotImplementedError

    def metrics(self) -> dict[str, Any]:
        raise NotImplementedError

    def schedules(self) -> Rows:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Directory(Target):
    """An engine directory, read offline and read-only (``Engine.open(read_only=True)``)."""

    def __init__(self, path: str) -> None:
        from fusee.engine.engine import Engine
        from fusee.storage.postgres import is_dsn

        self.label = path
        if not is_dsn(path) and not os.path.exists(path):
            raise errors.NotAnEngineDirectory(f"{path} does not exist: there is no engine directory to read")
        self._runner = asyncio.Runner()
        try:
            # park_after=None: no park timers; read_only: no lock, no write, no workflow code.
            self._engine = self._runner.run(_open(Engine, path))
        except BaseException:
            self._runner.close()
            raise
        self.live = self._engine.live

    def opened(self) -> tuple[int, int]:
        """What the open read: the workflows the directory holds, and the log records after its checkpoint."""
        return sum(self._engine.counts(None).values()), self._engine.recovered_records

    def list(self, where: str | None, limit: int, cursor: str | None, order: str = "oldest") -> dict[str, Any]:
        return views.page(self._engine.list(where, limit=limit, cursor=cursor, order=order))

    def counts(self, where: str | None) -> dict[str, int]:
        counts: dict[str, int] = self._engine.counts(where)
        return counts

    def describe(self, workflow_id: str) -> dict[str, Any]:
        return views.summary(self._engine.describe(workflow_id))

    def journal(self, workflow_id: str) -> dict[str, Any]:
        summary = self._engine.describe(workflow_id)
        records = self._runner.run(self._engine.journal(workflow_id))
        return {"workflow_id": workflow_id, "run_id": summary.run_id,
                "records": views.journal(records), "timeline": views.timeline(records)}

    def export(self, workflow_id: str) -> bytes:
        return journal_file.dumps(self._runner.run(self._engine.journal(workflow_id)))

    def metrics(self) -> dict[str, Any]:
        """What the log holds (runs by status, durable positions, the index); the counters of a
        running engine (steps, flushes, timers, runs in memory) are None: nothing ran here."""
        m = views.metrics(self._engine.metrics())
        for key in RUNTIME_COUNTERS:
            m[key] = None
        for shard in m["shards"]:
            shard["loaded"] = shard["parked"] = None
        return m

    def schedules(self) -> Rows:
        """The schedules as their durable runs show them, offline.

        What the log holds without running the schedule's code: its spec (from
        its run's Start record) and the runs it started (IDs ``{id}@{time}``).
        Its pause flag, next time and skip counts live in the schedule run's
        replayed state: those are None here (``--url`` asks the engine).
        """
        from fusee.flow import schedules

        summaries = self._engine.runs()
        started: dict[str, list[Any]] = {}
        for s in summaries:
            sid, at, _ = s.workflow_id.rpartition("@")
            if at:
                started.setdefault(sid, []).append(s)
        out = []
        for s in summaries:
            if not s.workflow_id.startswith(schedules.PREFIX) or s.status != "running":
                continue
            records = self._runner.run(self._engine.journal(s.workflow_id))
            first = records[0] if records else None
            state = views.payload(getattr(first, "input", None))
            spec = state.get("spec") if isinstance(state, dict) else None
            if not isinstance(spec, dict) or spec.get("id") is None:
                continue  # not a schedule's state (a future format): nothing to show rather than guesses
            sid = spec["id"]
            runs = sorted(started.get(sid, []), key=lambda r: r.workflow_id)
            out.append({
                "schedule_id": sid, "workflow": spec.get("workflow"),
                "every": spec["every_ms"] / 1000 if spec.get("every_ms") else None,
                "cron": spec.get("cron"), "timezone": spec.get("timezone"), "overlap": spec.get("overlap"),
                "paused": None, "next_time": None, "fired": len(runs), "skipped_overlap": None,
                "skipped_catchup": None, "skipped_paused": None, "buffered": None,
                "running": next((r.workflow_id for r in reversed(runs) if r.status == "running"), None),
                "last_run": runs[-1].workflow_id if runs else None, "last_error": None,
            })
        return sorted(out, key=lambda i: str(i["schedule_id"]))

    def close(self) -> None:
        try:
            self._runner.run(self._engine.close())
        finally:
            self._runner.close()


async def _open(engine_cls: Any, path: str) -> Any:
    return await engine_cls.open(path, read_only=True, park_after=None)


class Api(Target):
    """A running application's HTTP API (``fusee.http.app``)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        import httpx

        if not url.startswith(("http://", "https://")):
            raise errors.ApiError(0, "BadUrl", f"--url takes an http:// or https:// address, got {url!r}")
        self.label = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                params: dict[str, Any] | None = None) -> Any:
        """The JSON answer; :class:`fusee.errors.ApiError` for an error answer or no answer."""
        import httpx

        try:
            r = self._http.request(method, path, json=body, params=params)
        except httpx.ConnectError as e:
            raise errors.ApiError(0, "ConnectError", f"cannot reach {self.label}: {_reason(e)} "
                                  "(is the application serving its HTTP API there?)") from None
        except httpx.TimeoutException:
            raise errors.ApiError(0, "Timeout", f"{self.label} did not answer in time") from None
        except httpx.HTTPError as e:
            raise errors.ApiError(0, type(e).__name__, f"{self.label}: {e}") from None
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                raise errors.ApiError(r.status_code, err["type"], err["message"], err.get("field"))
            except (ValueError, KeyError, TypeError):
                said = r.text.strip() if r.headers.get("content-type", "").startswith("text/plain") else ""
                said = f": {said[:200]}" if said else ""
                hint = (" (the server answers only the Host names it was given: fusee serve --allowed-host)"
                        if said == ": Invalid host header" else " (is it a Fusee HTTP API?)")
                raise errors.ApiError(r.status_code, "HttpError",
                                      f"{self.label} answered {r.status_code} {r.reason_phrase}{said}{hint}") from None
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.content

    def list(self, where: str | None, limit: int, cursor: str | None, order: str = "oldest") -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if where:
            params["where"] = where
        if cursor:
            params["cursor"] = cursor
        if order != "oldest":
            params["order"] = order
        out: dict[str, Any] = self.request("GET", "/api/runs", params=params)
        return out

    def counts(self, where: str | None) -> dict[str, int]:
        out: dict[str, int] = self.request("GET", "/api/counts", params={"where": where} if where else None)["counts"]
        return out

    def describe(self, workflow_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", f"/api/runs/{_quote(workflow_id)}")
        return out

    def journal(self, workflow_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", f"/api/runs/{_quote(workflow_id)}/journal")
        return out

    def export(self, workflow_id: str) -> bytes:
        out: bytes = self.request("GET", f"/api/runs/{_quote(workflow_id)}/export")
        return out

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", "/api/metrics")
        return out

    def schedules(self) -> Rows:
        out: Rows = self.request("GET", "/api/schedules")["schedules"]
        return out

    def limits(self) -> Rows:
        out: Rows = self.request("GET", "/api/limits")["limits"]
        return out

    def act(self, workflow_id: str, action: str, body: dict[str, Any]) -> Any:
        return self.request("POST", f"/api/runs/{_quote(workflow_id)}/{action}", body)

    def close(self) -> None:
        self._http.close()


def _quote(workflow_id: str) -> str:
    from urllib.parse import quote

    return quote(workflow_id, safe="")


def _reason(e: Exception) -> str:
    text = str(e)
    if "refused" in text.lower() or "Errno 111" in text:
        return "connection refused"
    return text or type(e).__name__
