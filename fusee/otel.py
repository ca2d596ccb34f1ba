"""OpenTelemetry spans and metrics for an engine (the ``fusee[otel]`` extra).

Imported only when an engine is opened with telemetry on (see
``fusee.telemetry``): it needs ``opentelemetry-api``, never the SDK (the
application chooses providers and exporters). Every hook runs on the engine's
loop; the metrics' observable gauges may be read from an exporter's thread and
then ask the loop for a snapshot.

Span names, attributes and instruments are listed in ``docs/telemetry.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from fusee import sabotage
from fusee.errors import FuseeError
from fusee.runtime.telemetry import decode_trace, encode_trace
from fusee.runtime.tokens import parse_token
from fusee.version import __version__

if TYPE_CHECKING:
    from fusee.engine.visibility import Metrics
    from fusee.runtime.telemetry import TracedRun

logger = logging.getLogger("fusee")

#: The instrumentation scope of every span and instrument.
SCOPE = "fusee"

_PROPAGATOR = TraceContextTextMapPropagator()

#: Inside a start's span: the trace context its Start record journals.
_START_TRACE: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("fusee_start_trace", default=None)

#: Outcomes of an attempt that mark its span as an error.
_ERROR_OUTCOMES = frozenset({"failed", "retry", "paused", "timed_out", "stuck"})

#: How long a gauge read from another thread waits for the engine's loop.
_SNAPSHOT_TIMEOUT_S = 2.0
#: How long one snapshot serves gauges (the callbacks of one collection follow each other).
_SNAPSHOT_REUSE_S = 0.05


def _version() -> str:
    return __version__


def trace_of(ctx: otel_context.Context) -> bytes | None:
    """The W3C context of ``ctx``'s current span as ``Start.trace`` bytes (None: no valid span)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    parent = carrier.get("traceparent")
    if not parent:
        return None
    return encode_trace(parent, carrier.get("tracestate"))


def context_of(data: bytes | None) -> otel_context.Context:
    """The context a journaled trace names (an empty one, for a root span, when none is)."""
    headers = decode_trace(data)
    if not headers:
        return otel_context.Context()
    return _PROPAGATOR.extract(headers, context=otel_context.Context())


#: Outcomes of an attempt, and statuses a run ends with (counted per engine from the start).
STEP_OUTCOMES = ("ok", "failed", "cancelled", "retry", "paused", "abandoned")
RUN_STATUSES = ("ok", "failed", "cancelled", "timed_out", "terminated", "continued")


class _Counts:
    """An engine's counters: plain ints bumped on its loop (an OpenTelemetry ``add`` per step
    would cost more than the step), reported by observable counters. Every key exists from
    the start, so a reader on another thread never sees a dict change size."""

    def __init__(self) -> None:
        self.steps = dict.fromkeys(STEP_OUTCOMES[:3], 0)
        self.attempts = dict.fromkeys(STEP_OUTCOMES, 0)
        self.runs_ended = dict.fromkeys(RUN_STATUSES, 0)
        self.flushes = 0
        self.flush_records = 0


class _Instruments:
    """The instruments of one meter provider, shared by every engine that reports to it
    (an instrument is created once per provider; its callbacks read every live engine)."""

    def __init__(self, meter_provider: Any) -> None:
        self.provider = meter_provider
        meter = otel_metrics.get_meter(SCOPE, _version(), meter_provider=meter_provider)
        #: Every live engine reporting here (replaced, never changed in place: readers on
        #: other threads iterate it without a lock).
        self.sources: dict[int, OTelTelemetry] = {}
        counters: list[tuple[str, str, str, Callable[[_Counts], Iterable[tuple[int, dict[str, str]]]]]] = [
            ("fusee.steps", "{step}", "Step results journaled, by fusee.step.outcome (ok, failed, cancelled)",
             lambda c: [(n, {"fusee.step.outcome": k}) for k, n in list(c.steps.items())]),
            ("fusee.step.attempts", "{attempt}", "Step function executions, by fusee.step.outcome",
             lambda c: [(n, {"fusee.step.outcome": k}) for k, n in list(c.attempts.items())]),
            ("fusee.runs.ended", "{run}", "Runs that ended, by fusee.run.status",
             lambda c: [(n, {"fusee.run.status": k}) for k, n in list(c.runs_ended.items())]),
            ("fusee.flushes", "{flush}", "Group commits (write + fdatasync) completed",
             lambda c: [(c.flushes, {})]),
            ("fusee.flush.records", "{record}", "Records made durable by group commits",
             lambda c: [(c.flush_records, {})]),
        ]
        for name, unit, description, count in counters:
            meter.create_observable_counter(name, callbacks=[self._counter(count)], unit=unit,
                                            description=description)
        self.flush_duration = meter.create_histogram(
            "fusee.flush.duration", unit="s", description="Time of one group commit (write + fdatasync)")
        self.step_duration = meter.create_histogram(
            "fusee.step.duration", unit="s",
            description="Time of one step execution (attempt), by fusee.workflow.type, fusee.step.name and "
                        "fusee.step.outcome")
        self.run_duration = meter.create_histogram(
            "fusee.run.duration", unit="s",
            description="Time from a run's start to its end, by fusee.workflow.type and fusee.run.status")
        gauges: list[tuple[str, str, str, Callable[[Metrics], Iterable[tuple[float, dict[str, str]]]]]] = [
            ("fusee.runs", "{run}", "Workflows by fusee.run.status (running, stuck, ok, failed, ...)",
             lambda m: _by_status(m)),
            ("fusee.runs.parked", "{run}", "Suspended runs parked out of memory",
             lambda m: [(sum(s.parked for s in m.shards), {})]),
            ("fusee.runs.loaded", "{run}", "Running runs whose code is in memory",
             lambda m: [(sum(s.loaded for s in m.shards), {})]),
            ("fusee.runs.loaded.bytes", "By", "Bytes the loaded runs are counted as holding",
             lambda m: [(m.loaded_bytes, {})]),
            ("fusee.runs.to_load", "{run}", "Unfinished runs recovery has still to load",
             lambda m: [(m.runs_to_load, {})]),
            ("fusee.steps.executing", "{step}", "Step functions running now",
             lambda m: [(m.steps_executing, {})]),
            ("fusee.steps.gated", "{step}", "Steps waiting for their run's records to become durable",
             lambda m: [(m.steps_gated, {})]),
            ("fusee.timers.pending", "{timer}", "Timers, deadlines and park checks queued",
             lambda m: [(m.timers_pending, {})]),
            ("fusee.records.pending", "{record}", "Records appended and not yet flushed",
             lambda m: [(m.records_pending, {})]),
            ("fusee.backup.lag", "s", "How long the log has held durable batches the backup target lacks",
             lambda m: [(m.backup.lag_s, {})] if m.backup is not None else []),
            ("fusee.backup.failures", "{attempt}", "Backup uploads that failed in a row (0: the last worked)",
             lambda m: [(m.backup.failures, {})] if m.backup is not None else []),
        ]
        for name, unit, description, read in gauges:
            meter.create_observable_gauge(name, callbacks=[self._gauge(read)], unit=unit,
                                          description=description)

    def _counter(
        self, count: Callable[[_Counts], Iterable[tuple[int, dict[str, str]]]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(value, {"fusee.engine.path": source.path, **attributes})
                for source in list(self.sources.values())
                for value, attributes in count(source.counts)
            ]

        return observe

    def _gauge(
        self, read: Callable[[Metrics], Iterable[tuple[float, dict[str, str]]]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            timeout = min(_SNAPSHOT_TIMEOUT_S, options.timeout_millis / 1000)
            out = []
            for source in list(self.sources.values()):
                m = source.snapshot(timeout)
                if m is None:
                    continue
                for value, attributes in read(m):
                    out.append(Observation(value, {"fusee.engine.path": source.path, **attributes}))
            return out

        return observe


def _by_status(m: Metrics) -> list[tuple[int, dict[str, str]]]:
    total: dict[str, int] = {}
    for shard in m.shards:
        for status, n in shard.runs.items():
            total[status] = total.get(status, 0) + n
    return [(n, {"fusee.run.status": status}) for status, n in sorted(total.items())]


_instruments: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_instruments_lock = threading.Lock()


def _instruments_for(meter_provider: Any) -> _Instruments:
    provider = meter_provider if meter_provider is not None else otel_metrics.get_meter_provider()
    with _instruments_lock:
        found = _instruments.get(provider)
        if found is None:
            found = _instruments[provider] = _Instruments(provider)
        return found


class OTelTelemetry:
    """The runtime's telemetry hooks (``fusee.runtime.telemetry.TelemetryHooks``) on OpenTelemetry."""

    def __init__(
        self,
        *,
        tracer_provider: Any,
        meter_provider: Any,
        traces: bool,
        metrics: bool,
        path: str,
        snapshot: Callable[[], Metrics],
        loop: asyncio.AbstractEventLoop,
        trace_of: Callable[[str], bytes | None],
    ) -> None:
        self._tracer = trace.get_tracer(SCOPE, _version(), tracer_provider=tracer_provider) if traces else None
        self._instruments = _instruments_for(meter_provider) if metrics else None
        #: Executions begun and not ended: their spans (None when traces are off).
        self._steps: dict[tuple[TracedRun, int], trace.Span | None] = {}
        #: When each execution began (perf_counter) and its histogram attributes (taken then:
        #: the step may be gone from its run when it ends).
        self._began: dict[tuple[TracedRun, int], tuple[float, dict[str, str]]] = {}
        self.path = path
        self.counts = _Counts()
        self._metrics = snapshot
        #: A workflow's journaled trace context (signals, updates and completions link to it).
        self._trace_of = trace_of
        #: The latest snapshot and when it was taken: one collection reads several gauges.
        self._cached: tuple[float, Metrics] | None = None
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._closed = False
        if self._instruments is not None:
            with _instruments_lock:  # a collection on another thread copies the sources
                self._instruments.sources = {**self._instruments.sources, id(self): self}

    def close(self) -> None:
        """The engine closed: its counters are exported one last time (a push exporter's
        next period would not see them), then its gauges stop reporting; attempts still
        open end as abandoned."""
        if self._instruments is not None:
            flush = getattr(self._instruments.provider, "force_flush", None)
            if callable(flush):
                try:
                    flush(int(_SNAPSHOT_TIMEOUT_S * 1000))
                except Exception as e:  # an exporter's failure must not fail the close
                    logger.warning("telemetry: the final export of the counters failed: %s", e)
        self._closed = True
        if self._instruments is not None:
            with _instruments_lock:
                self._instruments.sources = {
                    k: v for k, v in self._instruments.sources.items() if k != id(self)}
        for span in self._steps.values():
            if span is not None:
                span.set_attribute("fusee.step.outcome", "abandoned")
                span.end()
        self._steps.clear()
        self._began.clear()

    # --- gauges ----------------------------------------------------------------

    def snapshot(self, timeout: float) -> Metrics | None:
        """The engine's ``metrics()``, computed on its loop (the table is the loop's alone);
        None when the engine closed or its loop did not answer within ``timeout`` seconds.

        One computation serves the gauges of one collection (it walks every workflow).
        """
        if self._closed:
            return None
        cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < _SNAPSHOT_REUSE_S:
            return cached[1]
        m = self._compute(timeout)
        if m is not None:
            self._cached = (time.monotonic(), m)
        return m

    def _compute(self, timeout: float) -> Metrics | None:
        if threading.get_ident() == self._loop_thread:
            return self._metrics()
        if self._loop.is_closed():
            return None
        done: concurrent.futures.Future[Metrics] = concurrent.futures.Future()

        def compute() -> None:
            try:
                done.set_result(self._metrics())
            except BaseException as e:  # handed to the exporter's thread, which drops the reading
                done.set_exception(e)

        try:
            self._loop.call_soon_threadsafe(compute)
            return done.result(timeout)
        except (RuntimeError, concurrent.futures.TimeoutError):
            return None  # the loop stopped, or is too busy: this collection skips the engine

    # --- client spans -------------------------------------------------------------

    @contextlib.contextmanager
    def client_span(self, op: str, args: dict[str, Any]) -> Iterator[trace.Span | None]:
        """The span of a client call (``engine.start``, ``signal``, ``update``, ``complete``...)."""
        if self._tracer is None:
            yield None
            return
        caller = otel_context.get_current()
        attributes = _client_attributes(op, args)
        span = self._tracer.start_span(f"fusee.{op}", kind=SpanKind.CLIENT, attributes=attributes,
                                       links=self._run_link(op, attributes.get("fusee.workflow.id")))
        entered = otel_context.attach(trace.set_span_in_context(span))
        start_token = None
        if op in ("start", "update_with_start"):
            # The caller's context is journaled (runs are children of the caller's
            # span); with no caller span, this start span's own (one trace per run).
            start_token = _START_TRACE.set(trace_of(caller) or trace_of(otel_context.get_current()))
        abandoned = False
        try:
            yield span
        except GeneratorExit:
            # The call's coroutine was closed from outside its task (it was never
            # finished): the context it ran in is gone, there is nothing to restore.
            abandoned = True
            raise
        except Exception as e:
            span.record_exception(e)
            span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
            raise
        finally:
            span.end()
            if not abandoned:
                if start_token is not None:
                    _START_TRACE.reset(start_token)
                otel_context.detach(entered)

    def _run_link(self, op: str, wid: Any) -> list[Link]:
        """A call to a run links to the trace the run belongs to (often another one than the caller's)."""
        if op in ("start", "update_with_start") or not isinstance(wid, str):
            return []
        try:
            journaled = self._trace_of(wid)
        except FuseeError:
            return []  # a journal that does not read: the call itself will say so
        target = trace.get_current_span(context_of(journaled)).get_span_context()
        return [Link(target)] if target.is_valid else []

    def client_done(self, span: trace.Span | None, op: str, result: Any) -> None:
        """What a client call returned, on its span."""
        if span is None:
            return
        run_id = getattr(result, "run_id", None)
        if isinstance(run_id, int):
            span.set_attribute("fusee.run.id", run_id)
        if op in ("complete", "fail_completion") and isinstance(result, bool):
            span.set_attribute("fusee.completion.accepted", result)

    def start_trace(self) -> bytes | None:
        """The trace context to journal in a Start record made now (inside a start's span)."""
        return _START_TRACE.get()

    # --- runs ------------------------------------------------------------------

    def run_begin(self, run: TracedRun, replayed: int) -> Any:
        if self._tracer is None:
            return None
        info = run.machine.info
        journaled = None if sabotage.active.lose_trace_on_replay and replayed else info.trace
        return self._tracer.start_span(
            "fusee.run",
            context=context_of(journaled),
            kind=SpanKind.INTERNAL,
            attributes={
                "fusee.workflow.id": info.id,
                "fusee.workflow.type": info.wtype,
                "fusee.workflow.version": info.version,
                "fusee.run.id": info.run,
                "fusee.run.replayed_records": replayed,
            },
        )

    def run_end(self, run: TracedRun, outcome: str, error: str | None) -> None:
        if self._instruments is not None and outcome not in ("suspended", "stuck"):
            info = run.machine.info
            self._instruments.run_duration.record(
                max(0.0, time.time() - info.started_ms / 1000),
                {"fusee.workflow.type": info.wtype, "fusee.run.status": outcome})
        span, run.span = run.span, None
        if span is None:
            return
        span.set_attribute("fusee.run.outcome", outcome)
        if error is not None:
            span.set_attribute("error.type", error)
        if outcome in _ERROR_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR, error or outcome))
        span.end()

    def run_ended(self, status: str) -> None:
        ended = self.counts.runs_ended
        if status in ended:
            ended[status] += 1

    # --- steps -----------------------------------------------------------------

    def step_begin(self, run: TracedRun, seq: int) -> None:
        if self._instruments is not None:
            named = run.steps.get(seq)
            self._began[(run, seq)] = (time.perf_counter(), {
                "fusee.workflow.type": run.machine.info.wtype,
                "fusee.step.name": named.name if named is not None else ""})
        if self._tracer is None:
            self._steps[(run, seq)] = None  # counted when it ends
            return
        call = run.steps.get(seq)
        parent = trace.set_span_in_context(run.span) if run.span is not None else context_of(run.machine.info.trace)
        self._steps[(run, seq)] = self._tracer.start_span(
            "fusee.step",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "fusee.workflow.id": run.workflow_id,
                "fusee.workflow.type": run.machine.info.wtype,
                "fusee.run.id": run.run_id,
                "fusee.step.name": call.name if call is not None else "",
                "fusee.step.position": seq,
                "fusee.step.attempt": call.attempt if call is not None else 0,
            },
        )

    def enter_step(self, run: TracedRun, seq: int) -> Any:
        span = self._steps.get((run, seq))
        if span is None:
            return None
        return otel_context.attach(trace.set_span_in_context(span))

    def leave_step(self, entered: Any) -> None:
        otel_context.detach(entered)

    def step_end(self, run: TracedRun, seq: int, outcome: str, error: str | None) -> None:
        key = (run, seq)
        if key not in self._steps:
            return  # its outcome was reported already
        span = self._steps.pop(key)
        attempts = self.counts.attempts
        if outcome in attempts:
            attempts[outcome] += 1
        began = self._began.pop(key, None)
        if began is not None and self._instruments is not None:
            t0, attributes = began
            self._instruments.step_duration.record(time.perf_counter() - t0,
                                                   {**attributes, "fusee.step.outcome": outcome})
        if span is None:
            return
        span.set_attribute("fusee.step.outcome", outcome)
        if error is not None:
            span.set_attribute("error.type", error)
            # A failed attempt's "Type: message" (the runner notes it before reporting a retry
            # or a pause): the span gets OpenTelemetry's exception event with the message.
            call = run.steps.get(seq)
            noted = getattr(call, "last_error", None)
            if isinstance(noted, str) and noted.startswith(error + ": "):
                span.add_event("exception", {"exception.type": error,
                                             "exception.message": noted[len(error) + 2:]})
        if outcome in _ERROR_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR, error or outcome))
        span.end()

    def step_done(self, status: str) -> None:
        steps = self.counts.steps
        if status in steps:
            steps[status] += 1

    # --- the log ---------------------------------------------------------------

    def flushed(self, records: int, seconds: float) -> None:
        counts = self.counts
        counts.flushes += 1
        counts.flush_records += records
        if self._instruments is not None:
            self._instruments.flush_duration.record(seconds)


def _client_attributes(op: str, args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    wid = args.get("workflow_id")
    if op in ("complete", "fail_completion"):
        try:
            wid, run_id, seq, _ = parse_token(args.get("token"))
        except (FuseeError, TypeError):
            wid = None
        else:
            out["fusee.run.id"] = run_id
            out["fusee.step.position"] = seq
        out["fusee.completion.status"] = "ok" if op == "complete" else "failed"
    if isinstance(wid, str):
        out["fusee.workflow.id"] = wid
    workflow = args.get("workflow")
    name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
    if isinstance(name, str):
        out["fusee.workflow.type"] = name
    for key, what in (("signal", "fusee.signal.name"), ("update", "fusee.update.name")):
        definition = args.get(key)
        if definition is not None and isinstance(getattr(definition, "name", None), str):
            out[what] = definition.name
    update_id = args.get("update_id")
    if isinstance(update_id, str):
        out["fusee.update.id"] = update_id
    return out

