"""What the runtime reports to telemetry, and how a run's trace context is journaled.

The runtime holds ``telemetry``: None (the default, and the only cost then is
one ``is not None`` test at each hook) or an object with the hooks below.
``fusee.otel`` implements them with OpenTelemetry; nothing here imports it.

A run's trace context is journaled in its Start record (``Start.trace``) as the
W3C ``traceparent`` header value, followed by a newline and the ``tracestate``
value when there is one. A replay after a crash, in another process, parents
the run's spans on it again, so the trace goes on across crashes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fusee.core import journal as jm

#: The structured fields a log record about a run carries (``record.workflow_id``, ...):
#: ``fusee.logs.Formatter`` prints them, a JSON or OTLP log handler finds them on the record.
LOG_FIELDS = ("workflow_id", "workflow", "run_id", "step")


def log_fields(workflow_id: str, workflow: str, run_id: int, step: str | None = None) -> dict[str, Any]:
    """The ``extra=`` of a log call about a run (and a step of it)."""
    out: dict[str, Any] = {"workflow_id": workflow_id, "workflow": workflow, "run_id": run_id}
    if step is not None:
        out["step"] = step
    return out


#: Longest journaled trace context: traceparent is 55 characters, tracestate at most 512 by the spec.
MAX_TRACE_BYTES = 1024


def encode_trace(traceparent: str, tracestate: str | None = None) -> bytes:
    """The ``Start.trace`` bytes for a W3C context."""
    text = traceparent if not tracestate else f"{traceparent}\n{tracestate}"
    data = text.encode("ascii", "replace")
    return data[:MAX_TRACE_BYTES]


def decode_trace(data: bytes | None) -> dict[str, str]:
    """The W3C headers (``traceparent``, maybe ``tracestate``) journaled in ``Start.trace``; {} if none."""
    if not data:
        return {}
    text = data.decode("ascii", "replace")
    parent, _, state = text.partition("\n")
    headers = {"traceparent": parent}
    if state:
        headers["tracestate"] = state
    return headers


class TracedRun(Protocol):
    """What telemetry reads of a run (``fusee.runtime.run.Run`` provides it), so that this
    module, below the run, does not import it."""

    #: The run's span while loaded (set by ``run_begin``'s caller, cleared by ``run_end``).
    span: Any

    @property
    def workflow_id(self) -> str: ...
    @property
    def run_id(self) -> int: ...
    @property
    def machine(self) -> jm.RunMachine: ...
    @property
    def steps(self) -> Mapping[int, Any]: ...  # live steps by position (``StepCall``: ``.name``, ``.attempt``)


class TelemetryHooks(Protocol):
    """Called by the runtime and the step runner on the engine's loop (never from a thread)."""

    def run_begin(self, run: TracedRun, replayed: int) -> Any:
        """A run's code was loaded (new, recovered or woken) with ``replayed`` records to replay;
        returns its span (kept on ``run.span``)."""

    def run_end(self, run: TracedRun, outcome: str, error: str | None) -> None:
        """The run left memory: it ended (``outcome`` is its status), parked or the engine
        closed (``"suspended"``), or it is stuck."""

    def run_ended(self, status: str) -> None:
        """A run ended with ``status`` (counted once, when its Done record is appended)."""

    def step_begin(self, run: TracedRun, seq: int) -> None:
        """An execution (attempt) of step ``seq`` begins."""

    def enter_step(self, run: TracedRun, seq: int) -> Any:
        """Makes the execution's span the current trace context while its function is called;
        returns what ``leave_step`` takes back (None: nothing was entered)."""

    def leave_step(self, entered: Any) -> None:
        """Restores the trace context ``enter_step`` replaced."""

    def step_end(self, run: TracedRun, seq: int, outcome: str, error: str | None) -> None:
        """The execution's outcome: ok, failed, cancelled, retry, paused, or abandoned (it
        stopped without one: a cancel or a close came first). A second call does nothing."""

    def step_done(self, status: str) -> None:
        """A step's result was journaled with ``status`` (one per step, whatever its attempts)."""

    def flushed(self, records: int, seconds: float) -> None:
        """A group commit made ``records`` durable in ``seconds``."""
