"""A traced program, run as a real process and SIGKILLed (see test_telemetry.py).

Usage: python otel_app.py DIR LIFE

Spans go to the SDK's in-memory exporter; the program dumps them as JSON lines
to DIR/spans-LIFE.jsonl (the page cache survives a process kill). In life 1
the caller starts the workflow under its own span; its second step blocks,
after dumping the spans so far and printing the caller's trace and span IDs:
the test kills the process there. Life 2 reopens the directory and waits for
the result, which the replayed run produces.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fusee

DIR = sys.argv[1]
LIFE = sys.argv[2]

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))


def dump() -> None:
    lines = []
    for s in exporter.get_finished_spans():
        lines.append(json.dumps({
            "name": s.name,
            "trace_id": f"{s.context.trace_id:032x}",
            "span_id": f"{s.context.span_id:016x}",
            "parent_id": f"{s.parent.span_id:016x}" if s.parent is not None else None,
            "attributes": dict(s.attributes or {}),
        }))
    with open(os.path.join(DIR, f"spans-{LIFE}.jsonl"), "w") as f:
        f.write("".join(line + "\n" for line in lines))


CALLER: dict[str, str] = {}


def second() -> int:
    if LIFE == "1":
        dump()
        print(json.dumps(CALLER), flush=True)
        threading.Event().wait()  # blocks until the test kills the process
    return 2


@fusee.workflow("traced-job")
async def job(ctx: fusee.Ctx) -> int:
    a = await ctx.step("first", lambda: 1)
    b = await ctx.step("second", second)
    c = await ctx.step("third", lambda: 3)
    return a + b + c


async def main() -> None:
    data = os.path.join(DIR, "data")
    config = fusee.Telemetry(tracer_provider=provider)
    async with fusee.Engine.open(data, workflows=[job], telemetry=config) as engine:
        if LIFE == "1":
            with provider.get_tracer("app").start_as_current_span("caller") as span:
                ctx = span.get_span_context()
                CALLER.update(trace_id=f"{ctx.trace_id:032x}", span_id=f"{ctx.span_id:016x}")
                handle = await engine.start(job, "job-1")
        else:
            handle = engine.get("job-1")
        result = await handle.result()
    dump()
    print(json.dumps({"result": result}), flush=True)


asyncio.run(main())
