"""Telemetry in the simulator: a deterministic OpenTelemetry tracer and the trace checker.

On a third of the seeds (when ``opentelemetry-api`` is installed) the engine
runs with telemetry on, through the real ``fusee.otel`` hooks, reporting to
:class:`SimTracerProvider`: a tracer of the OpenTelemetry API whose IDs come
from a counter (never from randomness, so a seed stays reproducible) and which
keeps every span it ever started, across lives. The client sends every
request for a workflow under that workflow's own caller span (fixed IDs).

The checker holds the engine to its tracing promises:

- every run span of a workflow, in every life (after crashes, parks,
  continue-as-new and resets), is a child of the caller span its start was
  made under (a child workflow: of its parent's caller span);
- every step attempt span is a child of an open run span of the same run, in
  the same life.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, TraceFlags
from opentelemetry.util.types import Attributes, AttributeValue

from fusee.sim.checkers import Observed, Snapshot

#: Outcomes an attempt span may end with.
STEP_OUTCOMES = frozenset({"ok", "failed", "cancelled", "retry", "paused", "abandoned"})


@dataclasses.dataclass
class SimSpan:
    """A span as the simulated tracer recorded it."""

    name: str
    life: int
    #: Order in which spans began (and ended): a logical clock across lives.
    begun: int
    trace_id: int
    span_id: int
    parent: tuple[int, int] | None
    attributes: dict[str, Any]
    ended: int | None = None


class _Span(trace.Span):
    """A recording span of the simulated tracer (only what ``fusee.otel`` uses)."""

    def __init__(self, provider: SimTracerProvider, record: SimSpan) -> None:
        self._provider = provider
        self.record = record
        self._context = SpanContext(record.trace_id, record.span_id, is_remote=False,
                                    trace_flags=TraceFlags(TraceFlags.SAMPLED))

    def get_span_context(self) -> SpanContext:
        return self._context

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        self.record.attributes.update(attributes)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.record.attributes[key] = value

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        pass

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        pass

    def update_name(self, name: str) -> None:
        self.record.name = name

    def is_recording(self) -> bool:
        return self.record.ended is None

    def set_status(self, status: Status | Any, description: str | None = None) -> None:
        pass

    def record_exception(self, exception: BaseException, attributes: Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        pass

    def end(self, end_time: int | None = None) -> None:
        if self.record.ended is None:
            self.record.ended = self._provider.tick()


class _Tracer(trace.Tracer):
    def __init__(self, provider: SimTracerProvider) -> None:
        self._provider = provider

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        return self._provider.new_span(name, context, attributes)

    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]  # the API's own decorator is private
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes)
        with trace.use_span(span, end_on_exit=end_on_exit, record_exception=False,
                            set_status_on_exception=False) as current:
            yield current


class SimTracerProvider(trace.TracerProvider):
    """A deterministic tracer provider that keeps every span of every life."""

    def __init__(self) -> None:
        self.spans: list[SimSpan] = []
        self.life = 0
        self._clock = 0
        self._tracer = _Tracer(self)

    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: str | None = None,
                   schema_url: str | None = None, attributes: Attributes = None) -> trace.Tracer:
        return self._tracer

    def tick(self) -> int:
        self._clock += 1
        return self._clock

    def new_span(self, name: str, context: otel_context.Context | None, attributes: Attributes) -> _Span:
        parent = trace.get_current_span(context).get_span_context()
        n = self.tick()
        if parent.is_valid:
            trace_id, parent_ids = parent.trace_id, (parent.trace_id, parent.span_id)
        else:
            trace_id, parent_ids = (1 << 100) + n, None
        record = SimSpan(name, self.life, n, trace_id, n, parent_ids, dict(attributes or {}))
        self.spans.append(record)
        return _Span(self, record)

    @contextlib.contextmanager
    def caller(self, workflow_id: str) -> Iterator[None]:
        """The client's request for ``workflow_id`` runs under that workflow's caller span."""
        trace_id, span_id = caller_ids(workflow_id)
        span = trace.NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False,
                                                  trace_flags=TraceFlags(TraceFlags.SAMPLED)))
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield
        except GeneratorExit:
            raise  # a dead life's request, closed from outside its task: its context is gone
        except BaseException:
            otel_context.detach(token)
            raise
        else:
            otel_context.detach(token)

    def check(self, obs: Observed, snap: Snapshot) -> list[str]:
        """The tracing promises (see the module docstring); the problems found."""
        return check_traces(self.spans, obs)


def caller_ids(workflow_id: str) -> tuple[int, int]:
    """The (trace ID, span ID) of the client's span for requests about ``workflow_id``."""
    digest = hashlib.sha256(f"caller:{workflow_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") | 1, int.from_bytes(digest[16:24], "big") | 1


def check_traces(spans: Sequence[SimSpan], obs: Observed) -> list[str]:
    """Run spans continue their caller's trace; attempt spans are children of an open run span."""
    parent_of: dict[str, str] = {}
    for parent, kids in obs.children.items():
        for kid, _ in kids:
            parent_of.setdefault(kid, parent)

    def expected(wid: str, depth: int = 0) -> tuple[int, int] | None:
        if wid in obs.starts:
            return caller_ids(wid)
        parent = parent_of.get(wid)
        return expected(parent, depth + 1) if parent is not None and depth < 32 else None

    problems: list[str] = []
    by_id = {(s.life, s.span_id): s for s in spans}
    for s in spans:
        if s.name == "fusee.run":
            wid = str(s.attributes.get("fusee.workflow.id"))
            want = expected(wid)
            if want is not None and s.parent != want:
                problems.append(
                    f"the run span of {wid} (run {s.attributes.get('fusee.run.id')}, life {s.life}, "
                    f"{s.attributes.get('fusee.run.replayed_records')} records replayed) has parent "
                    f"{_ids(s.parent)}, not its caller's span {_ids(want)}: the trace did not continue")
        elif s.name == "fusee.step":
            run = by_id.get((s.life, s.parent[1])) if s.parent is not None else None
            where = (f"the attempt span of step {s.attributes.get('fusee.step.name')!r} of "
                     f"{s.attributes.get('fusee.workflow.id')} (life {s.life})")
            if run is None or run.name != "fusee.run":
                problems.append(f"{where} is not a child of a run span of its life")
            elif (run.attributes.get("fusee.workflow.id"), run.attributes.get("fusee.run.id")) != (
                    s.attributes.get("fusee.workflow.id"), s.attributes.get("fusee.run.id")):
                problems.append(f"{where} is a child of the span of another run")
            elif run.ended is not None and run.ended < s.begun:
                problems.append(f"{where} began after its run's span ended")
            if s.ended is not None and s.attributes.get("fusee.step.outcome") not in STEP_OUTCOMES:
                problems.append(f"{where} ended with outcome {s.attributes.get('fusee.step.outcome')!r}")
    return problems


def _ids(ids: tuple[int, int] | None) -> str:
    return "none" if ids is None else f"{ids[0]:032x}/{ids[1]:016x}"
