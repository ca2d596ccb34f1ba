"""The HTTP API's request bodies (decoded strictly) and the shapes of its answers (for OpenAPI).

Request bodies are msgspec structs that refuse unknown fields and wrong types;
the decoder's message names the field, which the API returns as the error's
``field``. Answer shapes mirror :mod:`fusee.views` (a test validates real
answers against them).
"""

from __future__ import annotations

from typing import Any, Literal

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


class CompleteRequest(_Body):
    """Complete (or, with ``failed``, fail) an ``await_completion`` by its token
    (``Engine.complete``, ``Engine.fail_completion``)."""

    token: str
    value: Any = None
    failed: bool = False
    message: str = ""
    by: str | None = None


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


REQUESTS: tuple[type[_Body], ...] = (
    StartRequest, SignalRequest, QueryRequest, UpdateRequest, ReasonRequest, ResumeRequest,
    ResetRequest, CompleteRequest,
)
ANSWERS: tuple[type[msgspec.Struct], ...] = (
    Error, RunSummary, RunPage, Journal, Started, Result, Accepted, Completed, Metrics,
)
