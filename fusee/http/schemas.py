"""The HTTP API's request bodies (decoded strictly) and the shapes of its answers (for OpenAPI).

Request bodies are msgspec structs that refuse unknown fields and wrong types;
the decoder's message names the field, which the API returns as the error's
``field``. Answer shapes mirror :mod:`fusee.views` (a test validates real
answers against them).
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

import msgspec

# --- requests -------------------------------------------------------------------


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class StartRequest(_Body):
    """Start a workflow (``Engine.start``)."""

    workflow: str
    workflow_id: str
    input: Any = None
    if_running: Literal["fail", "attach", "terminate"] = "fail"
    if_finished: Literal["fail", "attach", "start"] = "fail"
    #: Seconds (or a duration text such as "1h30m") the whole workflow may take.
    timeout: float | str | None = None


class SignalRequest(_Body):
    """Send a signal (``Engine.signal``)."""

    name: str
    value: Any = None
    dedup_key: str | None = None
    by: str | None = None


class QueryRequest(_Body):
    """Ask a query (``Engine.query``)."""

    name: str
    arg: Any = None


class UpdateRequest(_Body):
    """Run an update (``Engine.update``)."""

    name: str
    arg: Any = None
    update_id: str | None = None


class ReasonRequest(_Body):
    """Cancel or terminate a run (``Engine.cancel``, ``Engine.terminate``)."""

    reason: str = ""
    by: str | None = None


class ResumeRequest(_Body):
    """Resume a run's paused steps (``Engine.resume``)."""

    by: str | None = None


class ResetRequest(_Body):
    """Reset a run to before a step or a position (``Engine.reset``)."""

    before_step: str | None = None
    before_position: int | None = None
    reapply_signals: bool = True
    version: int | None = None
    by: str | None = None


class ForkRequest(_Body):
    """Start a new run from a run's journal before a step or a position, leaving the run alone
    (``Engine.fork``)."""

    new_id: str
    before_step: str | None = None
    before_position: int | None = None
    reapply_signals: bool = True
    version: int | None = None
    by: str | None = None


class CompleteRequest(_Body):
    """Complete (or, with ``failed``, fail) an ``await_completion`` by its token
    (``Engine.complete``, ``Engine.fail_completion``)."""

    token: str
    value: Any = None
    failed: bool = False
    message: str = ""
    by: str | None = None


# --- the decoder's refusals, in the API's words ------------------------------------


_AT = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?")
#: How the decoder names JSON kinds, in the words of the API's documentation.
_KINDS = {"str": "a string", "int": "a whole number", "float": "a number", "bool": "true or false",
          "null": "null", "array": "a list", "object": "an object", "bytes": "a string"}


def _kinds(text: str) -> str:
    names = [_KINDS.get(k.strip(), k.strip()) for k in text.split("|")]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _struct_fields(kind: Any) -> tuple[Any, ...]:
    try:
        return tuple(msgspec.structs.fields(kind))
    except TypeError:  # not a struct (an object's state may be a dataclass): no fields to name
        return ()


def _fields(kind: Any) -> list[str]:
    return [f.encode_name for f in _struct_fields(kind)]


def explain(text: str, kind: Any) -> tuple[str, str]:
    """The decoder's refusal of a body of ``kind`` in the API's words, and the field it is about."""
    m = _AT.fullmatch(text)
    what, path = (m["what"], (m["path"] or "").lstrip(".")) if m else (text, "")
    top = re.split(r"[.\[]", path)[0] if path else ""
    fields = _fields(kind)
    if e := re.fullmatch(r"Expected `([^`]+)`, got `([^`]+)`", what):
        got = "a number" if e[2] in ("int", "float") else _kinds(e[2])
        return f"{path or 'the body'} must be {_kinds(e[1])}, got {got}", top or "body"
    if e := re.fullmatch(r"Object missing required field `([^`]+)`", what):
        name = f"{path}.{e[1]}" if path else e[1]
        return f"{name} is missing: the request needs it", top or e[1]
    if e := re.fullmatch(r"Object contains unknown field `([^`]+)`", what):
        name = f"{path}.{e[1]}" if path else e[1]
        takes = f": this request takes {', '.join(fields)}" if not path else ""
        return f"unknown field {name}{takes}", top or e[1]
    if e := re.fullmatch(r"Invalid enum value (.+)", what):
        choices = next((get_args(f.type) for f in _struct_fields(kind) if f.encode_name == top), ())
        allowed = f": use one of {', '.join(repr(c) for c in choices)}" if choices else ""
        return f"{path} cannot be {e[1]}{allowed}", top
    return f"{path or 'the body'}: {what}", top or "body"


class BulkRequest(_Body):
    """Make one action on every run ``where`` matches (``Engine.bulk``); ``dry_run`` only counts them."""

    where: str
    dry_run: bool = False
    #: Runs acted on by this request, at most 1000: the rest are counted in ``remaining``.
    limit: int = 1000
    by: str | None = None
    #: cancel, terminate: why (journaled).
    reason: str | None = None
    #: signal: its name and value.
    signal: str | None = None
    value: Any = None
    #: reset: the cut, and whether signals after it are delivered again.
    before_step: str | None = None
    before_position: int | None = None
    reapply_signals: bool | None = None


# --- answers --------------------------------------------------------------------


class ErrorDetail(msgspec.Struct, kw_only=True):
    #: The error's type: a Fusee error's class name, or BadRequest / Unauthorized / NotFound.
    type: str
    message: str
    #: The request field at fault (a body field, a query parameter or a path part), if one is.
    field: str | None = None


class Error(msgspec.Struct, kw_only=True):
    error: ErrorDetail


class AuditEntry(msgspec.Struct, kw_only=True):
    action: str
    by: str
    detail: str


class StepAttempt(msgspec.Struct, kw_only=True):
    """One journaled attempt of a step (``fusee.StepAttempt``)."""

    position: int
    name: str
    attempt: int
    #: ok, failed, cancelled, timed_out, retried (a next attempt followed) or paused.
    status: str
    #: When its function began and its outcome was known (null: journaled before step times).
    started_at: str | None
    ended_at: str | None
    duration_ms: float | None
    #: How long it waited for a limit's permit or a thread of the step pool before it began.
    queued_ms: float
    error: str | None


class RunSummary(msgspec.Struct, kw_only=True):
    workflow_id: str
    run_id: int
    workflow: str
    status: str
    shard: int
    started_at: str | None
    ended_at: str | None
    attributes: dict[str, Any]
    stuck_reason: str | None
    attempt: int
    last_error: str | None
    next_retry: str | None
    paused_steps: list[str]
    audit: list[AuditEntry]
    #: Every journaled step attempt (filled when one run is described; empty in lists).
    steps: list[StepAttempt] = []


class RunPage(msgspec.Struct, kw_only=True):
    items: list[RunSummary]
    #: Pass it back as ``cursor`` (with the same ``where``) for the next page; null: no more.
    cursor: str | None


class Journal(msgspec.Struct, kw_only=True):
    workflow_id: str
    run_id: int
    #: The durable records: ``position``, ``kind`` and the record's fields (times as ISO text).
    records: list[dict[str, Any]]
    #: One entry per operation (see ``fusee.views.timeline``).
    timeline: list[dict[str, Any]]


class Started(msgspec.Struct, kw_only=True):
    workflow_id: str
    run_id: int


class Result(msgspec.Struct, kw_only=True):
    result: Any


class Accepted(msgspec.Struct, kw_only=True):
    workflow_id: str
    #: What was done: "signal", "cancel", "terminate" or "resume".
    action: str


class Completed(msgspec.Struct, kw_only=True):
    #: False: the operation was completed already, the token is stale or the run ended.
    completed: bool


class Counts(msgspec.Struct, kw_only=True):
    where: str | None
    #: Runs matching ``where`` by status (every status is a key, zeros included).
    counts: dict[str, int]


class BulkResult(msgspec.Struct, kw_only=True):
    action: str
    where: str
    dry_run: bool
    #: Runs the query matched that the action applies to.
    matched: int
    #: The first ``limit`` of them: those a dry run would act on, or that this request acted on.
    workflow_ids: list[str]
    #: The runs the action is durable for.
    done: list[str]
    #: The runs that refused it, with the error ("Type: message").
    failed: dict[str, str]
    #: Matching runs past the bound, left for another request.
    remaining: int


class ShardMetrics(msgspec.Struct, kw_only=True):
    shard: int
    runs: dict[str, int]
    parked: int
    loaded: int
    durable_lsn: int


class Metrics(msgspec.Struct, kw_only=True):
    shards: list[ShardMetrics]
    steps_run: int
    steps_executing: int
    steps_gated: int
    timers_pending: int
    flushes: int
    inline_flushes: int
    records_flushed: int
    records_pending: int
    flush_p50_ms: float
    flush_p99_ms: float
    indexed: int
    stats: dict[str, int]
    loaded_bytes: int = 0
    memory_budget: int | None = None
    runs_to_load: int = 0


# --- schedules, limits and keyed objects (issue 12's operator side) --------------


class ScheduleRequest(_Body):
    """Make a schedule (``Engine.schedule``); the same ID with the same spec again does nothing."""

    schedule_id: str
    workflow: str
    input: Any = None
    #: Seconds, or a duration text such as "1h" (give this or cron).
    every: float | str | None = None
    cron: str | None = None
    timezone: str = "UTC"
    jitter: float | str | None = None
    overlap: Literal["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other", "terminate_other"] = "skip"
    catchup_window: float | str = "1h"
    paused: bool = False


class Empty(_Body):
    """A request with nothing to say (pause, unpause, trigger, delete a schedule)."""


class BackfillRequest(_Body):
    """Run a schedule's times in ``[start, end)`` (``Engine.backfill_schedule``)."""

    #: ISO 8601 times with a timezone, e.g. "2026-01-01T00:00:00Z".
    start: str
    end: str


class SetLimitRequest(_Body):
    """Resize a step limit now (``Engine.set_limit``); a field left out keeps its value,
    null removes that bound."""

    concurrency: int | msgspec.UnsetType | None = msgspec.UNSET
    per_second: float | msgspec.UnsetType | None = msgspec.UNSET


class SetObjectStateRequest(_Body):
    """Replace a keyed object's state (``Engine.set_object_state``)."""

    value: Any
    if_version: int | None = None


class ClearObjectStateRequest(_Body):
    """Put a keyed object's state back to its initial state (``Engine.clear_object_state``)."""

    if_version: int | None = None


class PatchObjectStateRequest(_Body):
    """Apply a JSON Patch (RFC 6902) to a keyed object's state (``Engine.patch_object_state``)."""

    patch: list[dict[str, Any]]
    if_version: int | None = None


class Schedule(msgspec.Struct, kw_only=True):
    schedule_id: str
    workflow: str
    #: The period in seconds (None for a cron schedule).
    every: float | None
    cron: str | None
    timezone: str
    overlap: str
    paused: bool
    #: ISO 8601 UTC.
    next_time: str | None
    fired: int
    skipped_overlap: int
    skipped_catchup: int
    skipped_paused: int
    buffered: int
    running: str | None
    last_run: str | None
    last_error: str | None


class ScheduleList(msgspec.Struct, kw_only=True):
    schedules: list[Schedule]


class LimitView(msgspec.Struct, kw_only=True):
    name: str
    concurrency: int | None
    per_second: float | None
    in_use: int
    waiting: int


class LimitList(msgspec.Struct, kw_only=True):
    limits: list[LimitView]


class ObjectStateView(msgspec.Struct, kw_only=True):
    object: str
    key: str
    value: Any
    #: Writes so far (0: never written); send it as if_version to edit only this state.
    version: int


REQUESTS: tuple[type[_Body], ...] = (
    StartRequest, SignalRequest, QueryRequest, UpdateRequest, ReasonRequest, ResumeRequest,
    ResetRequest, ForkRequest, CompleteRequest, ScheduleRequest, Empty, BackfillRequest, SetLimitRequest, SetObjectStateRequest,
    ClearObjectStateRequest, PatchObjectStateRequest, BulkRequest,
)
ANSWERS: tuple[type[msgspec.Struct], ...] = (
    Error, RunSummary, RunPage, Journal, Started, Result, Accepted, Completed, Metrics, Counts, BulkResult,
    Schedule, ScheduleList, LimitView, LimitList, ObjectStateView,
)
