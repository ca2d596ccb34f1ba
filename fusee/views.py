"""Runs, journals and metrics as plain JSON for people: what the HTTP API sends and the CLI shows.

Times are ISO 8601 UTC text, payloads are decoded (JSON values, errors as
``{"type", "module", "message", "traceback"}``, reasons and ``by`` as text),
enums are lower-case names. Nothing here needs an open engine beyond the values
passed in, so the CLI's offline reader and the HTTP API answer with the same
shapes.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
from typing import Any

import msgspec

from fusee.core import records as rec
from fusee.steptimes import at_us

_json = msgspec.json.Decoder()

#: Record fields holding text (UTF-8), not JSON.
_TEXT_FIELDS = frozenset({"reason", "by", "caller"})
#: Record fields holding a time in UTC milliseconds, and the name the view gives them.
_TIME_FIELDS = {
    "started_ms": "started_at",
    "finished_ms": "finished_at",
    "fire_at_ms": "fire_at",
    "deadline_ms": "deadline",
    "retry_at_ms": "retry_at",
    "began_ms": "began_at",
}
#: Record fields timing a step attempt in microseconds (see ``records.Step``), and their view.
_US_FIELDS = {"began_us": "began_at", "took_us": "took_ms", "queued_us": "queued_ms"}


def iso(value: datetime.datetime | int | None) -> str | None:
    """A UTC time (a datetime or epoch milliseconds) as ISO 8601 text; None stays None."""
    if value is None:
        return None
    if isinstance(value, int):
        value = datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    return value.isoformat().replace("+00:00", "Z")


def iso_us(us: int) -> str | None:
    """Epoch microseconds as ISO 8601 text to the microsecond; 0 (not recorded) is None."""
    return iso(at_us(us)) if us else None


def _ms(us: int) -> float:
    return us / 1000


def payload(data: bytes | None) -> Any:
    """Journaled bytes as a JSON value: JSON as itself, else UTF-8 text, else ``{"base64": ...}``."""
    if data is None:
        return None
    if not data:
        return None
    try:
        return _json.decode(data)
    except msgspec.DecodeError:
        pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


def _value(value: Any) -> Any:
    if isinstance(value, bytes):
        return payload(value)
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if isinstance(value, msgspec.Struct):
        return {k: _value(v) for k, v in msgspec.structs.asdict(value).items()}
    return value


def record(r: rec.Record, position: int) -> dict[str, Any]:
    """One journal record as JSON: ``position`` in the journal, ``kind``, then its fields."""
    out: dict[str, Any] = {"position": position, "kind": type(r).__name__}
    for key, value in msgspec.structs.asdict(r).items():
        if key in _US_FIELDS:
            if key == "began_us":
                out["began_at"] = iso_us(value)
            else:
                out[_US_FIELDS[key]] = _ms(value) if getattr(r, "began_us", 0) else None
        elif key in _TIME_FIELDS:
            if key == "retry_at_ms" and value == rec.PAUSED:
                out["retry_at"] = "paused"
            else:
                out[_TIME_FIELDS[key]] = iso(value) if value else None
        elif key in _TEXT_FIELDS:
            out[key] = _text(value)
        elif key == "trace":
            continue  # tracing context: not for people
        elif isinstance(r, rec.Done) and key == "payload" and r.status == rec.Status.TERMINATED:
            out[key] = _text(value)  # the terminate's reason
        else:
            out[key] = _value(value)
    return out


def journal(records: list[rec.Record]) -> list[dict[str, Any]]:
    """A journal as JSON records (see :func:`record`)."""
    return [record(r, i) for i, r in enumerate(records)]


def summary(s: Any) -> dict[str, Any]:
    """A :class:`fusee.RunSummary` as JSON."""
    return {
        "workflow_id": s.workflow_id,
        "run_id": s.run_id,
        "workflow": s.workflow,
        "status": s.status,
        "shard": s.shard,
        "started_at": iso(s.started_at),
        "ended_at": iso(s.ended_at),
        "attributes": dict(s.attributes),
        "stuck_reason": s.stuck_reason,
        "attempt": s.attempt,
        "last_error": s.last_error,
        "next_retry": iso(s.next_retry),
        "paused_steps": list(s.paused_steps),
        "audit": [dataclasses.asdict(a) for a in s.audit],
        "steps": [step_attempt(a) for a in s.steps],
    }


def step_attempt(a: Any) -> dict[str, Any]:
    """A :class:`fusee.StepAttempt` as JSON: times as ISO text, durations in milliseconds."""
    duration = a.duration
    return {"position": a.position, "name": a.name, "attempt": a.attempt, "status": a.status,
            "started_at": iso(a.started_at), "ended_at": iso(a.ended_at),
            "duration_ms": duration / datetime.timedelta(milliseconds=1) if duration is not None else None,
            "queued_ms": a.queued / datetime.timedelta(milliseconds=1), "error": a.error}


def page(p: Any) -> dict[str, Any]:
    """A :class:`fusee.RunPage` as JSON: ``{"items": [...], "cursor": ...}``."""
    return {"items": [summary(s) for s in p.items], "cursor": p.cursor}


def bulk(r: Any) -> dict[str, Any]:
    """A :class:`fusee.BulkResult` as JSON."""
    return {"action": r.action, "where": r.where, "dry_run": r.dry_run, "matched": r.matched,
            "workflow_ids": list(r.workflow_ids), "done": list(r.done), "failed": dict(r.failed),
            "remaining": r.remaining}


def metrics(m: Any) -> dict[str, Any]:
    """A :class:`fusee.Metrics` as JSON (its fields as they are)."""
    return dataclasses.asdict(m)


# --- the timeline ---------------------------------------------------------------


def _error_text(data: bytes) -> str:
    value = payload(data)
    if isinstance(value, dict) and "type" in value:
        message = value.get("message") or ""
        return f"{value['type']}: {message}" if message else str(value["type"])
    return str(value)


def timeline(records: list[rec.Record]) -> list[dict[str, Any]]:
    """What a run did, one entry per operation, in journal order.

    Each entry: ``kind`` (start, step, timer, wait, signal, update, child, await,
    cancel, resume, end, ...), ``name``, ``status`` (ok, failed, waiting, ...),
    ``attempts`` (steps), ``error`` (the latest failure's ``Type: message``),
    ``by`` (who asked), ``at`` (ISO time where the journal records one) and
    ``duration_ms`` where the journal records both ends (timers, the run).
    A step's entry adds ``began_at`` (its first attempt's start), ``ended_at``
    (its latest attempt's end), ``duration_ms`` (from one to the other),
    ``queued_ms`` (what its attempts waited for a permit or a thread) and
    ``attempt_times`` (one entry per attempt: ``attempt``, ``status``,
    ``began_at``, ``ended_at``, ``duration_ms``, ``queued_ms``, ``error``);
    sleeps and waits add ``began_at``. Records written before step times
    leave those out (an old step has no ``began_at``).
    """
    out: list[dict[str, Any]] = []
    by_seq: dict[int, dict[str, Any]] = {}
    updates: list[dict[str, Any]] = []  # by ordinal
    started_ms = 0

    def entry(kind: str, name: str = "", status: str = "", **more: Any) -> dict[str, Any]:
        e: dict[str, Any] = {"kind": kind, "name": name, "status": status, **more}
        out.append(e)
        return e

    for r in records:
        t = type(r)
        if t is rec.Start:
            assert isinstance(r, rec.Start)
            started_ms = r.started_ms
            entry("start", r.wtype, "ok", at=iso(r.started_ms), input=payload(r.input), by=_text(r.by),
                  run=r.run)
            if r.update is not None:
                updates.append(entry("update", r.update.name, "accepted", update_id=r.update.id,
                                     value=payload(r.update.payload)))
        elif t is rec.Step:
            assert isinstance(r, rec.Step)
            e = by_seq.get(r.seq)
            if e is None:
                e = by_seq[r.seq] = entry("step", r.name, "", attempts=0)
            e["attempts"] = max(e.get("attempts", 0), r.attempt)
            e["status"] = r.status.name.lower()
            if r.status != rec.Status.OK:
                e["error"] = _error_text(r.payload)
            _timed(e, r.attempt, e["status"], r.began_us, r.took_us, r.queued_us, e.get("error"))
        elif t is rec.Attempt:
            assert isinstance(r, rec.Attempt)
            e = by_seq.get(r.seq)
            if e is None:
                e = by_seq[r.seq] = entry("step", r.name, "", attempts=0)
            e["attempts"] = r.attempt
            _timed(e, r.attempt, "paused" if r.retry_at_ms == rec.PAUSED else "retried", r.began_us, r.took_us,
                   r.queued_us, _error_text(r.error))
            e["error"] = _error_text(r.error)
            e["status"] = "paused" if r.retry_at_ms == rec.PAUSED else "retrying"
            if r.retry_at_ms != rec.PAUSED:
                e["retry_at"] = iso(r.retry_at_ms)
        elif t is rec.Resume:
            assert isinstance(r, rec.Resume)
            entry("resume", by_seq.get(r.seq, {}).get("name", ""), "ok", by=_text(r.by))
            if r.seq in by_seq:
                by_seq[r.seq]["status"] = "running"
        elif t is rec.Timer:
            assert isinstance(r, rec.Timer)
            began = r.began_ms or started_ms
            e = by_seq[r.seq] = entry("timer", r.name, "waiting", at=iso(r.fire_at_ms),
                                      duration_ms=r.fire_at_ms - began if began else None)
            if r.began_ms:
                e["began_at"] = iso(r.began_ms)
        elif t is rec.Fired:
            assert isinstance(r, rec.Fired)
            if r.seq in by_seq:
                by_seq[r.seq]["status"] = "fired"
        elif t is rec.Signal:
            assert isinstance(r, rec.Signal)
            entry("signal", r.name, "received", value=payload(r.payload), by=_text(r.by))
        elif t is rec.Wait:
            assert isinstance(r, rec.Wait)
            e = by_seq[r.seq] = entry("wait", r.name, "waiting",
                                      deadline=iso(r.deadline_ms) if r.deadline_ms else None)
            if r.began_ms:
                e["began_at"] = iso(r.began_ms)
        elif t is rec.Waited:
            assert isinstance(r, rec.Waited)
            if r.seq in by_seq:
                by_seq[r.seq]["status"] = r.outcome.name.lower()
        elif t is rec.Child:
            assert isinstance(r, rec.Child)
            by_seq[r.seq] = entry("child", r.wtype, "running", workflow_id=r.id)
        elif t is rec.ChildDone:
            assert isinstance(r, rec.ChildDone)
            if r.seq in by_seq:
                by_seq[r.seq]["status"] = r.status.name.lower()
                if r.status != rec.Status.OK:
                    by_seq[r.seq]["error"] = _error_text(r.payload)
        elif t is rec.Chunk:
            continue  # stream output: read it with the stream's reader
        elif t is rec.Send:
            assert isinstance(r, rec.Send)
            entry("send", r.name, "ok", workflow_id=r.target)
        elif t is rec.Update:
            assert isinstance(r, rec.Update)
            updates.append(entry("update", r.name, "accepted", update_id=r.id, value=payload(r.payload)))
        elif t is rec.UpdateDone:
            assert isinstance(r, rec.UpdateDone)
            if 0 <= r.ordinal < len(updates):
                e = updates[r.ordinal]
                e["status"] = r.status.name.lower()
                if r.status == rec.Status.OK:
                    e["result"] = payload(r.payload)
                else:
                    e["error"] = _error_text(r.payload)
        elif t is rec.Awaiting:
            assert isinstance(r, rec.Awaiting)
            by_seq[r.seq] = entry("await", r.name, "waiting", attempts=r.attempt)
        elif t is rec.Completed:
            assert isinstance(r, rec.Completed)
            e = by_seq.get(r.seq)
            if e is not None:
                e["status"] = r.status.name.lower()
                e["by"] = _text(r.by)
        elif t is rec.CancelRequest:
            assert isinstance(r, rec.CancelRequest)
            entry("cancel", "", "requested", reason=_text(r.reason), by=_text(r.by))
        elif t is rec.Cancel:
            assert isinstance(r, rec.Cancel)
            entry("cancel", "", "delivered", reason=_text(r.reason))
        elif t is rec.Done:
            assert isinstance(r, rec.Done)
            e = entry("end", "", r.status.name.lower(), at=iso(r.finished_ms), by=_text(r.by),
                      duration_ms=r.finished_ms - started_ms if started_ms else None)
            if r.status == rec.Status.OK:
                e["result"] = payload(r.payload)
            elif r.status == rec.Status.TERMINATED:
                e["reason"] = _text(r.payload)
            else:
                e["error"] = _error_text(r.payload) if r.payload else None
    for e in by_seq.values():
        e.pop("_began_us", None)
    return out


def _timed(e: dict[str, Any], attempt: int, status: str, began_us: int, took_us: int, queued_us: int,
           error: str | None) -> None:
    """Adds an attempt's times to its step's timeline entry (nothing for an untimed record)."""
    if not began_us:
        return
    ended_us = began_us + took_us
    times = e.setdefault("attempt_times", [])
    times.append({"attempt": attempt, "status": status, "began_at": iso_us(began_us), "ended_at": iso_us(ended_us),
                  "duration_ms": _ms(took_us), "queued_ms": _ms(queued_us), "error": error})
    first = e.setdefault("_began_us", began_us)
    e.setdefault("began_at", iso_us(first))
    e["ended_at"] = iso_us(ended_us)
    e["duration_ms"] = _ms(ended_us - first)
    e["queued_ms"] = e.get("queued_ms", 0.0) + _ms(queued_us)


def schedule(info: Any) -> dict[str, Any]:
    """A :class:`fusee.ScheduleInfo` as JSON (ISO times, the period in seconds)."""
    return {
        "schedule_id": info.schedule_id, "workflow": info.workflow,
        "every": info.every.total_seconds() if info.every is not None else None,
        "cron": info.cron, "timezone": info.timezone, "overlap": info.overlap, "paused": info.paused,
        "next_time": iso(info.next_time), "fired": info.fired, "skipped_overlap": info.skipped_overlap,
        "skipped_catchup": info.skipped_catchup, "skipped_paused": info.skipped_paused,
        "buffered": info.buffered, "running": info.running, "last_run": info.last_run,
        "last_error": info.last_error,
    }


def limit(status: Any) -> dict[str, Any]:
    """A :class:`fusee.LimitStatus` as JSON."""
    return {"name": status.name, "concurrency": status.concurrency, "per_second": status.per_second,
            "in_use": status.in_use, "waiting": status.waiting}
