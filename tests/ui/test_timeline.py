"""The run timeline built from real journals, the charts' SVG, and the metrics sampler."""

from __future__ import annotations

import asyncio
import re

import fusee
import fusee.testing
from fusee.engine.visibility import Metrics, ShardMetrics
from fusee.testing import TestEngine
from fusee.ui import svg, timeline
from fusee.ui.sampler import Sampler

go = fusee.signal("go", int)


@fusee.workflow("sequential")
async def sequential(ctx: fusee.Ctx) -> int:
    a = await ctx.step("a", lambda: 1)
    await ctx.sleep("nap", "1ms")
    b = await ctx.step("b", lambda: 2)
    return a + b


@fusee.workflow("parallel")
async def parallel(ctx: fusee.Ctx) -> list[str]:
    released = asyncio.Event()

    async def slow() -> str:
        await released.wait()  # finishes only after "fast": its outcome is journaled second
        return "slow"

    async def fast() -> str:
        released.set()
        return "fast"

    out = await asyncio.gather(ctx.step("slow", slow), ctx.step("fast", fast))
    await ctx.step("after", lambda: "after")
    return list(out)


_failures = {"n": 0}


def flaky() -> str:
    _failures["n"] += 1
    if _failures["n"] < 3:
        raise ConnectionError(f"try {_failures['n']} failed")
    return "done"


@fusee.workflow("child-kind")
async def child_kind(ctx: fusee.Ctx, n: int) -> int:
    return n * 2


@fusee.workflow("mixed")
async def mixed(ctx: fusee.Ctx) -> int:
    await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=5, initial="1ms"))
    n = await ctx.wait_for(go)
    doubled = await ctx.child(child_kind, "mixed-child", n)
    raise ValueError(f"gave up at {doubled}")


async def test_sequential_operations_are_issued_when_the_previous_one_ends() -> None:
    async with fusee.Engine.open(workflows=[sequential]) as engine:
        assert await engine.execute(sequential, "s") == 3
        tl = timeline.build(await engine.journal("s"))
    a, nap, b = tl.operations
    assert [(o.kind, o.name, o.status) for o in tl.operations] == [
        ("step", "a", "ok"), ("sleep", "nap", "ok"), ("step", "b", "ok")]
    assert a.issued == 0 and a.end is not None
    assert nap.issued == a.end and nap.end is not None and nap.due
    assert b.issued == nap.end
    assert tl.outcome_status == "ok" and tl.outcome == "3" and tl.input == "null"
    assert tl.step_names == ["a", "b"] and tl.started_ms is not None and tl.ended_ms is not None


async def test_parallel_steps_are_drawn_from_the_same_point() -> None:
    async with fusee.Engine.open(workflows=[parallel]) as engine:
        assert await engine.execute(parallel, "p") == ["slow", "fast"]
        tl = timeline.build(await engine.journal("p"))
    slow, fast, after = tl.operations
    assert fast.end is not None and slow.end is not None and fast.end < slow.end
    assert slow.issued == fast.issued == 0  # both issued at the start, though "fast" ended first
    assert after.issued == slow.end


async def test_retries_signals_children_and_a_failure() -> None:
    async with fusee.Engine.open(workflows=[mixed, child_kind]) as engine:
        await engine.start(mixed, "m")
        await engine.signal("m", go, 21, by="ann")
        try:
            await engine.get("m").result()
        except fusee.WorkflowFailed:
            pass
        tl = timeline.build(await engine.journal("m"))
        child_tl = timeline.build(await engine.journal("mixed-child"))
    flaky_op, wait_op, child_op = tl.operations
    assert flaky_op.status == "ok" and [a.attempt for a in flaky_op.attempts] == [1, 2]
    assert flaky_op.attempts[0].error == "ConnectionError: try 1 failed" and flaky_op.attempts[0].retry_at
    assert wait_op.kind == "wait" and wait_op.status == "ok"
    assert [(m.kind, m.label, m.detail) for m in tl.marks] == [("signal", "signal go", "21 by ann")]
    assert child_op.child_id == "mixed-child" and child_op.status == "ok" and child_op.outcome == "42"
    assert tl.children == [child_op]
    assert tl.outcome_status == "failed" and tl.outcome == "ValueError: gave up at 42"
    assert tl.traceback is not None and "gave up at 42" in tl.traceback
    assert child_tl.parent == "m"
    drawn = svg.timeline(tl, "/ui/runs/")
    # A waterfall: one bar per attempt, the two that failed and were retried among them.
    assert drawn.count('data-status="retried"') == 2 and drawn.count('class="op attempt-bar"') == 3
    assert 'href="/ui/runs/mixed-child"' in drawn
    assert drawn.count('class="mark mark-signal"') == 1
    kinds = [e.kind for e in tl.events]
    assert kinds[0] == "Start" and kinds[-1] == "Done" and "Signal" in kinds


async def test_the_waterfall_draws_attempts_queue_delay_and_sleeps_to_scale() -> None:
    """On the testing kit's frozen clock the times are exact, so are the bars (``tests/engine/test_step_times``)."""
    from tests.engine import test_step_times as st

    st.RELEASE.clear()
    st.RELEASE["h1"] = asyncio.Event()
    async with TestEngine([st.waterfall], frozen_clock=True, limits=[fusee.Limit("one", concurrency=1)]) as env:
        st.CLOCK["env"] = env
        h = await env.start(st.waterfall, "w")
        await env.until(lambda: env.limits()["one"].waiting == 1)
        await env.skip("1s")
        st.RELEASE["h1"].set()
        await h.result()
        tl = timeline.build(await env.journal("w"))
    assert tl.timed and tl.started_ms is not None
    by_name = {o.name: o for o in tl.operations}
    assert by_name["nap"].ended_ms - by_name["nap"].began_ms == 2000  # type: ignore[operator]
    assert [(sp.status, sp.took_ms) for sp in by_name["b"].spans] == [("retried", 250.0), ("ok", 100.0)]
    assert [(sp.took_ms, sp.queued_ms) for sp in by_name["h2"].spans] == [(0.0, 1000.0)]
    drawn = svg.timeline(tl, "/ui/runs/")
    # Every bar's width is its duration on one scale (the axis spans the run: 3.35 s).
    scale = svg.WATERFALL_W / 3350
    bars = re.findall(r'<g class="op[^"]*" data-status="[^"]*"(?: data-attempt="\d+")? data-op="([^"]+)"'
                      r'(?: data-kind="[^"]+")? data-ms="([^"]+)"><title>[^<]*</title><rect x="[^"]+" y="[^"]+" '
                      r'width="([^"]+)"', drawn)
    assert len(bars) == 6  # a, the nap, two attempts of b, h1, h2
    for name, ms, width in bars:
        assert abs(float(width) - max(float(ms) * scale, svg.MIN_BAR_W)) < 0.01, name
    queued = re.findall(r'class="queued" data-op="h2" data-attempt="1" data-ms="([^"]+)">.*?width="([^"]+)"', drawn)
    assert [(float(ms), round(float(w), 1)) for ms, w in queued] == [(1000.0, round(1000 * scale, 1))]


def test_a_journal_from_before_step_times_is_drawn_in_journal_order() -> None:
    from tests.engine.test_step_times import FIXTURE

    tl = timeline.build(fusee.testing.load_journal(FIXTURE))
    assert not tl.timed
    drawn = svg.timeline(tl, "/ui/runs/")
    assert "journal order" in drawn and 'class="attempt"' in drawn


def test_svg_escapes_what_it_draws() -> None:
    tl = timeline.Timeline(2, [timeline.Operation(1, "step", "<script>x</script>", 1, end=1, status="ok",
                                                  child_id=None)], [], [])
    drawn = svg.timeline(tl, "/ui/runs/")
    assert "<script>" not in drawn and "&lt;script&gt;" in drawn
    assert "<script>" not in svg.hbars([("<b>", 3.0)])


def test_the_sampler_keeps_rates_and_never_draws_a_negative_one() -> None:
    now = [100.0]
    s = Sampler(every=1.0, clock=lambda: now[0])

    def metrics(steps: int) -> Metrics:
        shard = ShardMetrics(0, {"running": 2, "ok": steps}, 0, 2, 0)
        return Metrics((shard,), steps, 0, 0, 0, 0, 0, 0, 0, 1.0, 2.0, 0, {})

    s.add(metrics(0))
    now[0] += 0.5
    s.add(metrics(5))  # too soon: dropped
    now[0] += 1.5
    s.add(metrics(20))
    now[0] += 2.0
    s.add(metrics(0))  # the engine reopened: counters restart
    assert s.rates("steps_run") == [(-2.0, 10.0), (0.0, 0.0)]
    assert s.statuses("ok") == [(-4.0, 0.0), (-2.0, 20.0), (0.0, 0.0)]
    assert s.values("flush_p99_ms")[-1] == (0.0, 2.0)


def test_a_long_journal_stays_drawable() -> None:
    ops = [timeline.Operation(i, "step", f"s{i}", i + 1, end=i + 1, status="ok", issued=i) for i in range(10_000)]
    tl = timeline.Timeline(10_001, ops, [], [])
    drawn = svg.timeline(tl, "/ui/runs/")
    width = float(drawn.split('width="', 1)[1].split('"', 1)[0])
    assert width <= svg.LABEL_W + svg.MAX_PLOT_W + 16
    assert drawn.count('class="op"') == svg.MAX_LANES
    assert "+ 9,850 more operations" in drawn
