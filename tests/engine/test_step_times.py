"""Step attempts journal when they ran, how long they took and how long they queued.

Seen through describe(), the HTTP API and the CLI; exact on the testing kit's
frozen clock; the same after a kill and a reopen; and records written before
step times (a journal exported by the engine of before) still load.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

import fusee
import fusee.testing
from fusee import views
from fusee.core import records as rec
from fusee.http.app import app
from fusee.testing import TestEngine
from tests.engine import steptimes_app

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("fixtures") / "pre_step_times.fjnl"
MS = datetime.timedelta(milliseconds=1)

#: The engine under test, for step functions that move its clock.
CLOCK: dict[str, TestEngine] = {}
RELEASE: dict[str, asyncio.Event] = {}


async def slow_then_flaky(info: fusee.StepInfo) -> str:
    await CLOCK["env"].skip("250ms" if info.attempt == 1 else "100ms")
    if info.attempt == 1:
        raise RuntimeError("flaky")
    return "b"


async def hold(tag: str) -> str:
    ev = RELEASE.get(tag)
    if ev is not None:
        await ev.wait()
    return tag


@fusee.workflow("waterfall")
async def waterfall(ctx: fusee.Ctx) -> list[str]:
    a = await ctx.step("a", lambda: "a")
    await ctx.sleep("nap", "2s")
    b = await ctx.step("b", slow_then_flaky, retry=fusee.Retry(initial="1ms"))
    both = await asyncio.gather(ctx.step("h1", hold, "h1", limit="one"), ctx.step("h2", hold, "h2", limit="one"))
    return [a, b, *both]


async def test_describe_times_every_attempt_exactly_on_the_frozen_clock() -> None:
    RELEASE.clear()
    RELEASE["h1"] = asyncio.Event()
    async with TestEngine([waterfall], frozen_clock=True, limits=[fusee.Limit("one", concurrency=1)]) as env:
        CLOCK["env"] = env
        h = await env.start(waterfall, "w-1")
        # h1 holds the only permit; h2 queues behind it while the clock moves a second.
        await env.until(lambda: env.limits()["one"].waiting == 1)
        await env.skip("1s")
        RELEASE["h1"].set()
        assert await h.result() == ["a", "b", "h1", "h2"]
        d = env.describe("w-1")

        t0 = d.started_at
        assert t0 is not None
        got = [(s.name, s.attempt, s.status, s.started_at, s.duration, s.queued, s.error) for s in d.steps]
        nap_end = t0 + 2000 * MS
        assert got == [
            ("a", 1, "ok", t0, 0 * MS, 0 * MS, None),
            # The sleep is drawn to scale: b began when the two-second nap ended.
            ("b", 1, "retried", nap_end, 250 * MS, 0 * MS, "RuntimeError: flaky"),
            ("b", 2, "ok", nap_end + 250 * MS, 100 * MS, 0 * MS, None),
            ("h1", 1, "ok", nap_end + 350 * MS, 1000 * MS, 0 * MS, None),
            ("h2", 1, "ok", nap_end + 1350 * MS, 0 * MS, 1000 * MS, None),
        ]
        assert all(s.ended_at == s.started_at + s.duration for s in d.steps if s.started_at and s.duration)

        # The HTTP API answers the same times, as ISO text and milliseconds.
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app(env.engine)),
                                     base_url="http://127.0.0.1:8233") as c:
            body = (await c.get("/api/runs/w-1")).json()
            journal = (await c.get("/api/runs/w-1/journal")).json()
        shown = [(s["name"], s["attempt"], s["status"], s["duration_ms"], s["queued_ms"]) for s in body["steps"]]
        assert shown == [("a", 1, "ok", 0.0, 0.0), ("b", 1, "retried", 250.0, 0.0), ("b", 2, "ok", 100.0, 0.0),
                         ("h1", 1, "ok", 1000.0, 0.0), ("h2", 1, "ok", 0.0, 1000.0)]
        assert body["steps"][1]["started_at"] == views.iso(nap_end)
        nap = next(e for e in journal["timeline"] if e["kind"] == "timer")
        assert nap["began_at"] == views.iso(t0) and nap["duration_ms"] == 2000
        b = next(e for e in journal["timeline"] if e["name"] == "b")
        assert [a["status"] for a in b["attempt_times"]] == ["retried", "ok"]
        assert b["duration_ms"] == 350.0 and b["began_at"] == views.iso(nap_end)


def test_a_killed_and_reopened_run_shows_the_same_times(tmp_path: Path) -> None:
    """The times come from the journal: the run replayed after a SIGKILL shows what it showed before."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, str(Path(steptimes_app.__file__)), str(tmp_path / "d")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.stderr else ""
        before = json.loads(line)
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=60)
    assert [(s["name"], s["attempt"], s["status"]) for s in before] == [("a", 1, "ok"), ("b", 1, "retried"),
                                                                         ("b", 2, "ok")]
    assert all(s["started_at"] and s["duration_ms"] is not None for s in before)

    async def reopen() -> list[dict[str, Any]]:
        async with fusee.Engine.open(tmp_path / "d", workflows=[steptimes_app.timed]) as engine:
            again = views.summary(engine.describe("t-1"))["steps"]
            await engine.signal("t-1", steptimes_app.go, 5)
            assert await engine.get("t-1").result() == "2 b@2 5"
            assert views.summary(engine.describe("t-1"))["steps"] == before, "finishing changed the old times"
            return again

    assert asyncio.run(reopen()) == before


def _old(record: rec.Record, fields: int) -> bytes:
    """``record`` encoded as the engine of before step times wrote it: its first ``fields`` fields."""
    values = list(msgspec.structs.astuple(record))[:fields]
    return bytes([rec.FORMAT_VERSION]) + msgspec.msgpack.encode([type(record).__struct_config__.tag, *values])


def test_records_written_before_step_times_decode_with_none() -> None:
    step = rec.Step(1, 0, "a", 1, rec.Status.OK, b"1", 1_700_000_000_000_000, 5, 2)
    attempt = rec.Attempt(1, 1, "b", 1, 99, b"{}", 1_700_000_000_000_000, 5, 0)
    assert rec.decode(_old(step, 6)) == rec.Step(1, 0, "a", 1, rec.Status.OK, b"1")
    assert rec.decode(_old(attempt, 6)) == rec.Attempt(1, 1, "b", 1, 99, b"{}")
    assert rec.decode(_old(rec.Timer(1, 2, "nap", 50, 10), 4)) == rec.Timer(1, 2, "nap", 50)
    assert rec.decode(_old(rec.Wait(1, 3, "go", 0, 10), 4)) == rec.Wait(1, 3, "go", 0)
    # And what is written now round-trips.
    assert rec.decode(rec.encode(step)) == step


async def test_a_journal_exported_before_step_times_loads_and_shows_no_times(tmp_path: Path) -> None:
    """``fixtures/pre_step_times.fjnl`` was exported by the engine of before this change."""
    records = fusee.testing.load_journal(FIXTURE)
    assert any(isinstance(r, rec.Step) for r in records) and all(
        r.began_us == 0 for r in records if isinstance(r, rec.Step | rec.Attempt))
    await fusee.testing.replay(FIXTURE, [steptimes_app.timed])  # the code still matches it
    tl = views.timeline(records)
    assert [e["kind"] for e in tl if e["kind"] == "step"] == ["step", "step"]
    assert not any("began_at" in e or "attempt_times" in e for e in tl)
    async with fusee.Engine.open(tmp_path / "d", workflows=[steptimes_app.timed]) as engine:
        h = await engine.import_journal(FIXTURE)
        assert await h.result() == "2 b@2 7"
        steps = engine.describe("old-1").steps
        assert [(s.name, s.attempt, s.status, s.started_at, s.duration) for s in steps] == [
            ("a", 1, "ok", None, None), ("b", 1, "retried", None, None), ("b", 2, "ok", None, None)]


@pytest.mark.parametrize("fields", [6, 9])
def test_views_of_a_step_record_with_and_without_times(fields: int) -> None:
    step = rec.decode(_old(rec.Step(1, 0, "a", 1, rec.Status.OK, b"1", 1_700_000_000_000_123, 2_500, 40), fields))
    shown = views.record(step, 1)
    if fields == 6:
        assert shown["began_at"] is None and shown["took_ms"] is None
    else:
        assert shown["began_at"] == "2023-11-14T22:13:20.000123Z"
        assert shown["took_ms"] == 2.5 and shown["queued_ms"] == 0.04


async def test_cheap_steps_on_the_fast_path_are_timed_too() -> None:
    """A chain of cheap steps (no task, no thread) is timed too: each ends no earlier than it began."""
    @fusee.workflow("chain3")
    async def chain3(ctx: fusee.Ctx) -> int:
        total = 0
        for i in range(3):
            total += await ctx.step(f"s{i}", lambda i=i: i)
        return total

    async with TestEngine([chain3], inline_sync_steps=True) as env:
        assert await env.execute(chain3, "c") == 3
        steps = env.describe("c").steps
        started = [s.started_at for s in steps]
        assert all(s.started_at is not None and s.duration is not None and s.duration >= 0 * MS for s in steps)
        assert started == sorted(started)  # type: ignore[type-var]
