"""Telemetry: OpenTelemetry spans and metrics (with the SDK's in-memory exporters), and log lines."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fusee
from fusee.core import records as rec
from tests.helpers import until

ROOT = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("otel_app.py")


class Otel:
    """A tracer provider and a meter provider whose data the test reads."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.config = fusee.Telemetry(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)
        self.tracer = self.tracer_provider.get_tracer("app")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str, **attributes: Any) -> ReadableSpan:
        found = [s for s in self.spans(name) if all(s.attributes.get(k) == v for k, v in attributes.items())]  # type: ignore[union-attr]
        assert len(found) == 1, (name, attributes, [dict(s.attributes or {}) for s in self.spans(name)])
        return found[0]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, value or histogram count) of each data point of ``metric``."""
        data = self.reader.get_metrics_data()
        out = []
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        for p in m.data.data_points:
                            out.append((dict(p.attributes or {}), getattr(p, "value", None)
                                        if hasattr(p, "value") else p.count))  # type: ignore[attr-defined]
        return out

    def value(self, metric: str, **attributes: Any) -> Any:
        for attrs, value in self.points(metric):
            if all(attrs.get(k) == v for k, v in attributes.items()):
                return value
        return None


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.tracer_provider.shutdown()
    o.meter_provider.shutdown()


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# --- workflows -------------------------------------------------------------------

ATTEMPTS: list[int] = []
go = fusee.signal("go", int)
bump = fusee.update("bump", int, int)
TOKENS: list[str] = []


def flaky(info: fusee.StepInfo) -> int:
    ATTEMPTS.append(info.attempt)
    if info.attempt < 2:
        raise ValueError("not yet")
    return info.attempt


def broken() -> int:
    raise KeyError("gone")


@fusee.workflow("tel-job")
async def job(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("first", lambda: n)
    b = await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=3, initial="1ms"))
    return a + b


@fusee.workflow("tel-failing")
async def failing(ctx: fusee.Ctx) -> int:
    return await ctx.step("broken", broken, retry=fusee.Retry(attempts=1))


def hand_out(info: fusee.StepInfo) -> None:
    assert info.token is not None
    TOKENS.append(info.token)


@fusee.workflow("tel-talk")
async def talk(ctx: fusee.Ctx) -> int:
    total = 0

    def on_bump(by: int) -> int:
        nonlocal total
        total += by
        return total

    ctx.on_update(bump, on_bump)
    got = await ctx.wait_for(go)
    done = await ctx.await_completion("approval", hand_out, result_type=int)
    return total + (got or 0) + done


@fusee.workflow("tel-child")
async def child(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: 2 * n)


@fusee.workflow("tel-parent")
async def parent(ctx: fusee.Ctx, n: int) -> int:
    if n > 0:
        await ctx.step("before", lambda: n)
        await ctx.continue_as_new(n - 1)
    return await ctx.child(child, "tel-kid", 21)


@pytest.fixture(autouse=True)
def _clear() -> None:
    ATTEMPTS.clear()
    TOKENS.clear()


# --- spans -------------------------------------------------------------------------


async def test_runs_and_step_attempts_are_children_of_the_callers_span(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[job, failing], telemetry=otel.config) as engine:
        with otel.tracer.start_as_current_span("caller") as caller:
            h = await engine.start(job, "j-1", 40)
            f = await engine.start(failing, "f-1")
        assert await h.result() == 42
        with pytest.raises(fusee.WorkflowFailed):
            await f.result()
    ctx = caller.get_span_context()
    start = otel.one("fusee.start", **{"fusee.workflow.id": "j-1"})
    assert start.kind == trace.SpanKind.CLIENT and _parent(start) == ctx.span_id
    assert start.attributes["fusee.workflow.type"] == "tel-job"  # type: ignore[index]
    assert start.attributes["fusee.run.id"] == h.run_id  # type: ignore[index]
    run = otel.one("fusee.run", **{"fusee.workflow.id": "j-1"})
    assert run.context.trace_id == ctx.trace_id and _parent(run) == ctx.span_id
    assert run.attributes["fusee.run.outcome"] == "ok"  # type: ignore[index]
    assert run.attributes["fusee.run.replayed_records"] == 0  # type: ignore[index]
    steps = sorted(otel.spans("fusee.step"), key=lambda s: s.start_time or 0)
    mine = [s for s in steps if s.attributes["fusee.workflow.id"] == "j-1"]  # type: ignore[index]
    assert [(s.attributes["fusee.step.name"], s.attributes["fusee.step.attempt"],  # type: ignore[index]
             s.attributes["fusee.step.outcome"]) for s in mine] == [  # type: ignore[index]
        ("first", 1, "ok"), ("flaky", 1, "retry"), ("flaky", 2, "ok")]
    assert all(_parent(s) == run.context.span_id and s.context.trace_id == ctx.trace_id for s in mine)
    retry = mine[1]
    assert retry.attributes["error.type"] == "ValueError"  # type: ignore[index]
    assert retry.status.status_code == StatusCode.ERROR
    assert "error.type" not in (mine[2].attributes or {})
    # A step that fails for good, and its run.
    bad = otel.one("fusee.step", **{"fusee.workflow.id": "f-1"})
    assert bad.attributes["fusee.step.outcome"] == "failed"  # type: ignore[index]
    assert bad.attributes["error.type"] == "KeyError"  # type: ignore[index]
    frun = otel.one("fusee.run", **{"fusee.workflow.id": "f-1"})
    assert frun.attributes["fusee.run.outcome"] == "failed"  # type: ignore[index]
    assert frun.status.status_code == StatusCode.ERROR


async def test_the_callers_context_is_journaled_in_the_start_record(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[job], telemetry=otel.config) as engine:
        with otel.tracer.start_as_current_span("caller") as caller:
            h = await engine.start(job, "j-1", 1)
        await h.result()
        start = (await engine.journal("j-1"))[0]
        assert isinstance(start, rec.Start) and start.trace is not None
        ctx = caller.get_span_context()
        assert start.trace.decode().startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")


async def test_without_a_callers_span_the_run_joins_its_start_spans_trace(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[job], telemetry=otel.config) as engine:
        await (await engine.start(job, "j-1", 1)).result()
    start = otel.one("fusee.start")
    run = otel.one("fusee.run")
    assert _parent(start) is None
    assert run.context.trace_id == start.context.trace_id and _parent(run) == start.context.span_id


async def test_a_step_functions_spans_are_children_of_its_attempt(otel: Otel) -> None:
    tracer = otel.tracer

    def sync_work() -> int:
        with tracer.start_as_current_span("inside-sync"):
            return 1

    async def async_work() -> int:
        await asyncio.sleep(0)  # suspends: a task carries it on
        with tracer.start_as_current_span("inside-async"):
            return 2

    @fusee.workflow("tel-inner")
    async def inner(ctx: fusee.Ctx) -> int:
        return await ctx.step("sync", sync_work) + await ctx.step("async", async_work)

    async with fusee.Engine.open(workflows=[inner], telemetry=otel.config) as engine:
        assert await (await engine.start(inner, "i-1")).result() == 3
    for name, step in (("inside-sync", "sync"), ("inside-async", "async")):
        attempt = otel.one("fusee.step", **{"fusee.step.name": step})
        assert _parent(otel.one(name)) == attempt.context.span_id


async def test_signal_update_and_completion_spans(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[talk], telemetry=otel.config) as engine:
        with otel.tracer.start_as_current_span("caller") as caller:
            h = await engine.start(talk, "t-1")
        with otel.tracer.start_as_current_span("operator") as operator:
            assert await engine.update("t-1", bump, 5, update_id="u-1") == 5
            await engine.signal("t-1", go, 10)
        await until(lambda: bool(TOKENS))
        await until(lambda: any(isinstance(r, rec.Awaiting) for r in engine._rt.wf["t-1"].journal))
        assert await engine.complete(TOKENS[0], 100) is True
        assert await engine.complete(TOKENS[0], 100) is False  # completed already
        assert await h.result() == 115
    op = operator.get_span_context()
    update = otel.one("fusee.update")
    assert update.kind == trace.SpanKind.CLIENT and _parent(update) == op.span_id
    assert update.attributes == {"fusee.workflow.id": "t-1", "fusee.update.name": "bump", "fusee.update.id": "u-1"}
    sig = otel.one("fusee.signal")
    assert _parent(sig) == op.span_id
    assert sig.attributes == {"fusee.workflow.id": "t-1", "fusee.signal.name": "go"}
    first, second = sorted(otel.spans("fusee.complete"), key=lambda s: s.start_time or 0)
    assert first.attributes["fusee.workflow.id"] == "t-1"  # type: ignore[index]
    assert first.attributes["fusee.run.id"] == h.run_id  # type: ignore[index]
    assert first.attributes["fusee.completion.status"] == "ok"  # type: ignore[index]
    assert first.attributes["fusee.completion.accepted"] is True  # type: ignore[index]
    assert second.attributes["fusee.completion.accepted"] is False  # type: ignore[index]
    # Each call links to the run's trace (the caller's span its start was made under).
    for span in (update, sig, first, second):
        assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
            (caller.get_span_context().trace_id, caller.get_span_context().span_id)]
    # The token function's attempt is a step span too.
    assert otel.one("fusee.step", **{"fusee.step.name": "approval"}).attributes["fusee.step.outcome"] == "ok"  # type: ignore[index]


async def test_a_terminated_runs_span_says_so(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[talk], telemetry=otel.config) as engine:
        h = await engine.start(talk, "t-1")
        await engine.terminate("t-1", "no longer needed")
        with pytest.raises(fusee.WorkflowTerminated):
            await h.result()
        assert otel.value("fusee.runs.ended", **{"fusee.run.status": "terminated"}) == 1
    assert otel.one("fusee.run").attributes["fusee.run.outcome"] == "terminated"  # type: ignore[index]


async def test_a_failed_client_call_records_its_error(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[job], telemetry=otel.config) as engine:
        with pytest.raises(fusee.NotFound):
            await engine.signal("nobody", go, 1)
    span = otel.one("fusee.signal")
    assert span.status.status_code == StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


async def test_children_and_continued_runs_share_the_trace(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[parent, child], telemetry=otel.config) as engine:
        with otel.tracer.start_as_current_span("caller") as caller:
            h = await engine.start(parent, "p-1", 2)
        assert await h.result() == 42
    ctx = caller.get_span_context()
    runs = otel.spans("fusee.run")
    assert sorted(str(r.attributes["fusee.workflow.id"]) for r in runs) == ["p-1", "p-1", "p-1", "tel-kid"]  # type: ignore[index]
    assert all(r.context.trace_id == ctx.trace_id and _parent(r) == ctx.span_id for r in runs)
    assert sorted(str(r.attributes["fusee.run.outcome"]) for r in runs) == ["continued", "continued", "ok", "ok"]  # type: ignore[index]
    assert all(s.context.trace_id == ctx.trace_id for s in otel.spans("fusee.step"))


async def test_a_parked_run_ends_its_span_and_a_woken_one_continues_the_trace(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[talk], telemetry=otel.config, park_after=0) as engine:
        with otel.tracer.start_as_current_span("caller") as caller:
            await engine.start(talk, "t-1")
        await until(lambda: engine._rt.wf["t-1"].packed is not None)
        parked = otel.one("fusee.run")
        assert parked.attributes["fusee.run.outcome"] == "suspended"  # type: ignore[index]
        await engine.signal("t-1", go, 1)  # wakes it: a new run span, replaying its records
        await until(lambda: bool(TOKENS))
    ctx = caller.get_span_context()
    runs = otel.spans("fusee.run")
    assert len(runs) >= 2
    assert all(r.context.trace_id == ctx.trace_id and _parent(r) == ctx.span_id for r in runs)
    assert any(int(r.attributes["fusee.run.replayed_records"]) > 0 for r in runs)  # type: ignore[arg-type, index]


# --- metrics --------------------------------------------------------------------------


async def test_metrics_count_steps_attempts_flushes_and_runs(otel: Otel, tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[job, failing, talk], telemetry=otel.config) as engine:
        await (await engine.start(job, "j-1", 1)).result()
        with pytest.raises(fusee.WorkflowFailed):
            await (await engine.start(failing, "f-1")).result()
        await engine.start(talk, "t-1")
        assert otel.value("fusee.steps", **{"fusee.step.outcome": "ok"}) == 2
        assert otel.value("fusee.steps", **{"fusee.step.outcome": "failed"}) == 1
        assert otel.value("fusee.step.attempts", **{"fusee.step.outcome": "retry"}) == 1
        assert otel.value("fusee.step.attempts", **{"fusee.step.outcome": "ok"}) == 2
        assert otel.value("fusee.runs.ended", **{"fusee.run.status": "ok"}) == 1
        assert otel.value("fusee.runs.ended", **{"fusee.run.status": "failed"}) == 1
        m = engine.metrics()
        assert otel.value("fusee.flushes") == m.flushes > 0
        assert otel.value("fusee.flush.duration") == m.flushes  # one histogram sample per flush
        assert otel.value("fusee.flush.records") == m.records_flushed
        # Durations: one sample per execution, by workflow type, step name and outcome; one per ended run.
        step = {"fusee.workflow.type": "tel-job", "fusee.step.name": "flaky"}
        assert otel.value("fusee.step.duration", **step, **{"fusee.step.outcome": "retry"}) == 1
        assert otel.value("fusee.step.duration", **step, **{"fusee.step.outcome": "ok"}) == 1
        assert otel.value("fusee.step.duration", **{"fusee.step.name": "first", "fusee.step.outcome": "ok"}) == 1
        assert otel.value("fusee.step.duration", **{"fusee.workflow.type": "tel-failing",
                                                     "fusee.step.outcome": "failed"}) == 1
        assert otel.value("fusee.run.duration", **{"fusee.workflow.type": "tel-job", "fusee.run.status": "ok"}) == 1
        assert otel.value("fusee.run.duration", **{"fusee.workflow.type": "tel-failing",
                                                    "fusee.run.status": "failed"}) == 1
        assert otel.value("fusee.run.duration", **{"fusee.workflow.type": "tel-talk"}) is None  # still running
        # Gauges read the engine's metrics().
        path = str(tmp_path)
        assert otel.value("fusee.runs", **{"fusee.run.status": "running", "fusee.engine.path": path}) == 1
        assert otel.value("fusee.runs", **{"fusee.run.status": "ok"}) == 1
        assert otel.value("fusee.runs", **{"fusee.run.status": "failed"}) == 1
        for gauge in ("fusee.runs.parked", "fusee.runs.loaded", "fusee.steps.executing", "fusee.steps.gated",
                      "fusee.timers.pending", "fusee.records.pending"):
            assert otel.value(gauge, **{"fusee.engine.path": path}) is not None, gauge
        assert otel.value("fusee.runs.loaded") == 1


async def test_gauges_read_from_an_exporter_thread_ask_the_engines_loop(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[talk], telemetry=otel.config, park_after=0) as engine:
        await engine.start(talk, "t-1")
        await until(lambda: engine._rt.wf["t-1"].packed is not None)
        seen: list[Any] = []
        # A periodic exporter collects on its own thread: the table is read on the loop.
        thread = threading.Thread(target=lambda: seen.append(otel.value("fusee.runs.parked")))
        thread.start()
        await until(lambda: not thread.is_alive())
        assert seen == [1]
    # Closed: its gauges stop reporting.
    assert otel.value("fusee.runs.parked") is None


async def test_metrics_only(otel: Otel) -> None:
    config = fusee.Telemetry(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider, traces=False)
    async with fusee.Engine.open(workflows=[job], telemetry=config) as engine:
        await (await engine.start(job, "j-1", 1)).result()
        assert otel.value("fusee.step.attempts", **{"fusee.step.outcome": "ok"}) == 2
        assert otel.value("fusee.step.attempts", **{"fusee.step.outcome": "retry"}) == 1
    assert otel.spans() == []


# --- turning it on and off ---------------------------------------------------------------


async def test_off_engines_journal_no_trace(otel: Otel) -> None:
    async with fusee.Engine.open(workflows=[job], telemetry=False) as engine:
        with otel.tracer.start_as_current_span("caller"):
            await (await engine.start(job, "j-1", 1)).result()
        start = (await engine.journal("j-1"))[0]
        assert isinstance(start, rec.Start) and start.trace is None
        assert engine._telemetry is None and engine._rt.steps.telemetry is None
    assert [s.name for s in otel.spans()] == ["caller"]


async def test_asking_for_telemetry_without_opentelemetry_is_a_typed_error(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)  # as if not installed
    with pytest.raises(fusee.TelemetryUnavailable, match=r"pip install 'fusee\[otel\]'"):
        await fusee.Engine.open(tmp_path, workflows=[job], telemetry=True)
    assert list(tmp_path.iterdir()) == []  # refused before anything was opened
    with pytest.raises(TypeError, match="telemetry takes"):
        await fusee.Engine.open(workflows=[job], telemetry="yes")  # type: ignore[arg-type]


def _python(code: str, tmp_path: Path) -> str:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_by_default_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    out = _python("""
        import asyncio, sys
        import fusee

        @fusee.workflow("w")
        async def w(ctx: fusee.Ctx) -> int:
            return await ctx.step("s", lambda: 1)

        async def main() -> None:
            async with fusee.Engine.open(workflows=[w]) as engine:
                await (await engine.start(w, "w-1")).result()
        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """, tmp_path)
    assert out.strip() == "[]"


def test_a_global_tracer_provider_turns_it_on(tmp_path: Path) -> None:
    out = _python("""
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import fusee

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)

        @fusee.workflow("w")
        async def w(ctx: fusee.Ctx) -> int:
            return await ctx.step("s", lambda: 1)

        async def main() -> None:
            async with fusee.Engine.open(workflows=[w]) as engine:
                await (await engine.start(w, "w-1")).result()
        asyncio.run(main())
        print(sorted(s.name for s in exporter.get_finished_spans()))
    """, tmp_path)
    assert out.strip() == "['fusee.run', 'fusee.start', 'fusee.step']"


# --- across a crash ------------------------------------------------------------------------


def _spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_after_sigkill_the_reopened_run_continues_the_callers_trace(tmp_path: Path) -> None:
    """Kill mid-run, reopen in a new process: its run and step spans share the caller's trace,
    the run span's parent is the caller's span, and the steps are children of the new run span."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.Popen([sys.executable, str(APP), str(tmp_path), "1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    assert first.stdout is not None
    line = first.stdout.readline()
    assert line, first.communicate()
    caller = json.loads(line)  # printed once the second step is running (and the first one's span dumped)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    before = _spans(tmp_path / "spans-1.jsonl")
    assert [s["name"] for s in before if s["name"] == "fusee.step"] == ["fusee.step"]
    step1 = next(s for s in before if s["name"] == "fusee.step")
    assert step1["trace_id"] == caller["trace_id"]

    second = subprocess.run([sys.executable, str(APP), str(tmp_path), "2"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.splitlines()[-1]) == {"result": 6}
    after = _spans(tmp_path / "spans-2.jsonl")
    run = next(s for s in after if s["name"] == "fusee.run")
    assert run["trace_id"] == caller["trace_id"] and run["parent_id"] == caller["span_id"]
    assert run["attributes"]["fusee.run.replayed_records"] > 0
    steps = [s for s in after if s["name"] == "fusee.step"]
    # "first" had its result journaled: it does not run again; "second" and "third" run here.
    assert sorted(s["attributes"]["fusee.step.name"] for s in steps) == ["second", "third"]
    for s in steps:
        assert s["trace_id"] == caller["trace_id"] and s["parent_id"] == run["span_id"]
        assert s["attributes"]["fusee.step.outcome"] == "ok"


# --- log lines -----------------------------------------------------------------------------


async def test_operators_log_lines(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.INFO, logger="fusee")
    async with fusee.Engine.open(tmp_path, workflows=[job, failing]) as engine:
        await (await engine.start(job, "j-1", 1)).result()
        ok_lines = [r for r in caplog.records if r.levelno >= logging.INFO and "opened" not in r.getMessage()]
        # A successful step never logs at INFO; a retried attempt does (once).
        assert [r.getMessage() for r in ok_lines if "retrying" not in r.getMessage()] == []
        with pytest.raises(fusee.WorkflowFailed):
            await (await engine.start(failing, "f-1")).result()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step 'broken' failed for good at attempt 1 (KeyError" in m for m in warnings), warnings
    assert any("workflow 'f-1': run" in m and "failed: KeyError" in m for m in warnings), warnings
    caplog.clear()
    async with fusee.Engine.open(tmp_path, workflows=[job, failing]):
        pass
    opened = [r.getMessage() for r in caplog.records if "opened" in r.getMessage()]
    assert len(opened) == 1 and "2 workflows" in opened[0]


async def test_a_failed_flush_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fusee")
    engine = await fusee.Engine.open(workflows=[talk])
    engine._log.storage.fail_next_fdatasync()
    with pytest.raises(fusee.EngineClosed):
        await engine.start(talk, "t-1")
    await engine.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(m.startswith("the log failed; nothing more is acknowledged") for m in errors), errors


async def test_backup_gauges(otel: Otel, tmp_path: Path) -> None:
    """With backup=, its lag and failures reach OpenTelemetry as gauges (issue 28)."""
    async with fusee.Engine.open(tmp_path / "data", workflows=[talk], telemetry=otel.config,
                                 backup=fusee.Backup(tmp_path / "target", interval=0.01)) as engine:
        await engine.start(talk, "t-1")
        await until(lambda: (s := engine.metrics().backup) is not None and s.points >= 1)
        path = str(tmp_path / "data")
        assert otel.value("fusee.backup.failures", **{"fusee.engine.path": path}) == 0
        assert otel.value("fusee.backup.lag", **{"fusee.engine.path": path}) is not None


class _Kept:
    """A push exporter that keeps what it is sent (the SDK's periodic reader pushes to it)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

        kept: list[Any] = []
        self.batches = kept

        class Exporter(MetricExporter):
            def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
                kept.append(metrics_data)
                return MetricExportResult.SUCCESS

            def force_flush(self, timeout_millis: float = 10_000) -> bool:
                return True

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                pass

        self.exporter = Exporter()

    def value(self, metric: str, **attributes: Any) -> Any:
        found = None
        for data in self.batches:
            for rm in data.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == metric:
                            for p in m.data.data_points:
                                if all((p.attributes or {}).get(k) == v for k, v in attributes.items()):
                                    found = p.value
        return found


@fusee.workflow("counted")
async def counted(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("add", lambda: n + 1)


async def test_the_counters_are_exported_one_last_time_at_close_and_step_spans_name_the_workflow() -> None:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    kept = _Kept()
    # A period far longer than the test: only the close's flush exports.
    reader = PeriodicExportingMetricReader(kept.exporter, export_interval_millis=3_600_000)
    meter_provider = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    try:
        config = fusee.Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
        async with fusee.Engine.open(workflows=[counted], telemetry=config) as engine:
            for i in range(3):
                assert await engine.execute(counted, f"c-{i}", i) == i + 1
        assert kept.value("fusee.steps", **{"fusee.step.outcome": "ok"}) == 3
        assert kept.value("fusee.runs.ended", **{"fusee.run.status": "ok"}) == 3
        steps = [s for s in spans.get_finished_spans() if s.name == "fusee.step"]
        assert len(steps) == 3
        assert all((s.attributes or {}).get("fusee.workflow.type") == "counted"
                   and (s.attributes or {}).get("fusee.step.name") == "add" for s in steps)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()


_flaky_calls: list[int] = []


def _flaky_once() -> str:
    _flaky_calls.append(1)
    if len(_flaky_calls) == 1:
        raise ConnectionError("the ledger is down")
    return "ok"


@fusee.workflow("tel-flaky")
async def tel_flaky(ctx: fusee.Ctx) -> str:
    return await ctx.step("post", _flaky_once, retry=fusee.Retry(attempts=2, initial="1ms"))


async def test_a_failed_attempt_span_carries_an_exception_event_with_the_message(otel: Otel) -> None:
    _flaky_calls.clear()
    async with fusee.Engine.open(workflows=[tel_flaky], telemetry=otel.config) as engine:
        assert await engine.execute(tel_flaky, "fl-1") == "ok"
    failed = otel.one("fusee.step", **{"fusee.step.outcome": "retry"})
    events = [(e.name, dict(e.attributes or {})) for e in failed.events]
    assert events == [("exception", {"exception.type": "ConnectionError", "exception.message": "the ledger is down"})]
    assert otel.one("fusee.step", **{"fusee.step.outcome": "ok"}).events == ()
