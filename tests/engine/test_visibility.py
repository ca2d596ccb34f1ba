"""Visibility through the public API: list and its query language, attributes, metrics, keep_history."""

from __future__ import annotations

import asyncio
import datetime
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fusee
from tests.engine.visibility_app import tagged
from tests.helpers import crash_in_process, until

APP = Path(__file__).with_name("visibility_app.py")
ROOT = Path(__file__).resolve().parents[2]

poke = fusee.signal("poke", int)
status_q = fusee.query("status")


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, customer: str) -> str:
    ctx.set_attributes({"customer": customer, "tier": 1})
    ctx.on_query(status_q, lambda _: "waiting")
    n = await ctx.wait_for(poke)
    ctx.set_attributes({"tier": n, "vip": n > 5})
    await ctx.step("ship", lambda: "shipped")
    return f"{customer}:{n}"


@fusee.workflow("plain")
async def plain(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


def ids(page: fusee.RunPage) -> list[str]:
    return [s.workflow_id for s in page.items]


async def test_list_filters_by_attributes_and_fields() -> None:
    async with fusee.Engine.open(workflows=[order, plain]) as engine:
        for i, c in enumerate(["acme", "zed", "acme", "bolt"]):
            await engine.start(order, f"o-{i}", c)
        assert await engine.execute(plain, "p-0", 2) == 4
        await until(lambda: len(engine.list("attrs.tier = 1").items) == 4)
        assert ids(engine.list("attrs.customer = 'acme'")) == ["o-0", "o-2"]
        assert ids(engine.list("workflow = 'plain'")) == ["p-0"]
        assert ids(engine.list("status = 'ok'")) == ["p-0"]
        assert ids(engine.list("status in ('running', 'paused') and not attrs.customer = 'acme'")) == ["o-1", "o-3"]
        assert ids(engine.list("attrs.customer in ('zed', 'bolt') or workflow_id = 'p-0'")) == ["o-1", "o-3", "p-0"]
        assert ids(engine.list("attrs.customer = null")) == ["p-0"]
        assert ids(engine.list("attrs.customer != 'acme' and workflow = 'order'")) == ["o-1", "o-3"]
        assert ids(engine.list("ATTRS.customer = 'acme'")) == ["o-0", "o-2"]
        assert ids(engine.list("attrs.Customer = 'acme'")) == []  # keys are case-sensitive
        assert ids(engine.list("attrs.tier = '1'")) == []  # text is not a number
        assert ids(engine.list("attrs.tier >= 1 AND attrs.customer < 'b'")) == ["o-0", "o-2"]
        assert ids(engine.list("shard = 0 and run_id != 0 and workflow_id = 'o-3'")) == ["o-3"]
        assert ids(engine.list("started_at > '2000-01-01T00:00:00Z' and ended_at = null")) == [
            "o-0", "o-1", "o-2", "o-3"]
        assert ids(engine.list("ended_at >= '2000-01-01'")) == ["p-0"]
        assert ids(engine.list("started_at < '2000-01-01T00:00:00+02:00'")) == []

        # Later attributes merge over earlier ones; the summary shows the current run's.
        await engine.signal("o-2", poke, 9)
        assert await engine.get("o-2").result() == "acme:9"
        s = engine.describe("o-2")
        assert s.attributes == {"customer": "acme", "tier": 9, "vip": True}
        assert s.status == "ok" and s.started_at is not None and s.ended_at is not None
        assert s.started_at <= s.ended_at and s.started_at.tzinfo == datetime.UTC
        assert hash(s) == hash(engine.describe("o-2"))  # summaries stay hashable
        assert ids(engine.list("attrs.vip = true")) == ["o-2"]
        assert ids(engine.list("attrs.tier = 1")) == ["o-0", "o-1", "o-3"]
        running = engine.describe("o-0")
        assert running.ended_at is None and running.attributes == {"customer": "acme", "tier": 1}


async def test_pages_follow_first_seen_order_with_a_cursor() -> None:
    async with fusee.Engine.open(workflows=[order]) as engine:
        for i in range(7):
            await engine.start(order, f"o-{i}", "acme" if i % 2 else "zed")
        await until(lambda: len(engine.list("attrs.tier = 1").items) == 7)
        for where in (None, "workflow = 'order'", "attrs.tier = 1"):
            seen: list[str] = []
            cursor = None
            while True:
                page = engine.list(where, limit=3, cursor=cursor)
                seen += ids(page)
                if page.cursor is None:
                    break
                cursor = page.cursor
            assert seen == [f"o-{i}" for i in range(7)], where
        # A page that ends exactly at the last match says so.
        assert engine.list("attrs.customer = 'acme'", limit=3).cursor is None
        # A workflow that leaves the table does not disturb the walk.
        page = engine.list(limit=2)
        await engine.terminate("o-0")
        engine._rt.wf.pop("o-0")  # as a retention expiry does
        assert ids(engine.list(limit=10, cursor=page.cursor)) == [f"o-{i}" for i in range(2, 7)]


@pytest.mark.parametrize(
    ("where", "position"),
    [
        ("workflow = ", 11),
        ("workflow = 'order' and", 22),
        ("status in ('running' 'ok')", 21),
        ("colour = 'red'", 0),
        ("attrs.x = 'open", 10),
        ("(workflow = 'a'", 15),
        ("workflow = 'a')", 14),
        ("shard = 'one'", 8),
        ("started_at > 'yesterday'", 13),
        ("workflow ~ 'a'", 9),
        ("", 0),
    ],
)
async def test_bad_queries_raise_naming_the_position(where: str, position: int) -> None:
    async with fusee.Engine.open(workflows=[order]) as engine:
        with pytest.raises(fusee.InvalidQuery) as info:
            engine.list(where)
        assert info.value.position == position
        assert f"position {position}" in str(info.value)
        assert isinstance(info.value, ValueError)
        with pytest.raises(ValueError):
            engine.list(limit=0)
        with pytest.raises(fusee.InvalidQuery):
            engine.list(cursor="nonsense")


@pytest.mark.parametrize("where", [
    "(" * 400 + "workflow = 'order'" + ")" * 400,
    "not " * 1000 + "workflow = 'order'",
    "(not " * 300 + "workflow = 'order'" + ")" * 300,
])
async def test_a_query_nested_too_deep_is_an_invalid_query_not_a_recursion_error(where: str) -> None:
    async with fusee.Engine.open(workflows=[order]) as engine:
        with pytest.raises(fusee.InvalidQuery, match="deeper than 64") as info:
            engine.list(where)
        assert 0 < info.value.position < len(where)
        nested = "(" * 64 + "workflow = 'order'" + ")" * 64  # as deep as allowed: answered
        assert engine.list(nested).items == []
        assert engine.list("not " * 64 + "workflow = 'x'").items == []


async def test_attributes_survive_a_reopen_from_a_checkpoint(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[order]) as engine:
        for i, c in enumerate(["acme", "zed", "acme"]):
            await engine.start(order, f"o-{i}", c)
        await until(lambda: len(engine.list("attrs.tier = 1").items) == 3)
        await engine.signal("o-1", poke, 7)
        await engine.get("o-1").result()
    async with fusee.Engine.open(tmp_path, workflows=[order]) as engine:
        assert engine.recovered_records == 0  # all from the checkpoint
        assert ids(engine.list("attrs.customer = 'acme'")) == ["o-0", "o-2"]
        assert engine.describe("o-1").attributes == {"customer": "zed", "tier": 7, "vip": True}
        # The parked runs were not woken to answer.
        assert engine.metrics().stats["woken"] == 0
        await engine.signal("o-0", poke, 2)
        assert await engine.get("o-0").result() == "acme:2"
        assert ids(engine.list("attrs.tier = 2")) == ["o-0"]


def test_attributes_survive_sigkill_from_the_log(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, str(APP), str(tmp_path), "9"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT)})
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "ready", p.stderr.read() if p.stderr else ""
    p.send_signal(signal.SIGKILL)
    p.wait(30)

    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[tagged]) as engine:
            assert engine.recovered_records > 0
            assert ids(engine.list("attrs.customer = 'acme'")) == ["t-0", "t-3", "t-6"]
            assert engine.describe("t-4").attributes == {"customer": "other", "i": 4}
        # And again from the checkpoint the close wrote.
        async with fusee.Engine.open(tmp_path, workflows=[tagged]) as engine:
            assert engine.recovered_records == 0
            assert ids(engine.list("attrs.customer = 'acme' and attrs.i > 0")) == ["t-3", "t-6"]

    asyncio.run(main())


async def test_a_new_run_starts_without_attributes() -> None:
    @fusee.workflow("looper")
    async def looper(ctx: fusee.Ctx, n: int) -> int:
        if n == 0:
            ctx.set_attributes({"first": True})
            await ctx.continue_as_new(1)
        return n

    async with fusee.Engine.open(workflows=[looper]) as engine:
        assert await engine.execute(looper, "l-1", 0) == 1
        assert engine.describe("l-1").attributes == {}
        assert ids(engine.list("attrs.first = true")) == []


async def test_metrics_count_runs_by_shard_and_status() -> None:
    async with fusee.Engine.open(workflows=[order, plain], shards=2) as engine:
        for i in range(4):
            await engine.start(order, f"o-{i}", "acme")
        for i in range(3):
            assert await engine.execute(plain, f"p-{i}", i) == 2 * i
        m = engine.metrics()
        assert len(m.shards) == 2
        assert sum(s.runs.get("running", 0) for s in m.shards) == 4
        assert sum(s.runs.get("ok", 0) for s in m.shards) == 3
        assert sum(s.loaded + s.parked for s in m.shards) == 4
        assert m.steps_run >= 3 and m.flushes >= 1 and m.records_flushed >= 3 * 3
        assert m.steps_executing == 0 and m.timers_pending >= 0
        assert m.indexed == 4
        assert 0.0 < m.flush_p50_ms <= m.flush_p99_ms  # the memory disk's flushes take some time


async def test_keep_history_off_keeps_start_and_ending(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[order, plain], keep_history=False) as engine:
        await engine.start(order, "o-1", "acme")
        await until(lambda: len(engine.list("attrs.tier = 1").items) == 1)
        assert await engine.query("o-1", status_q) == "waiting"  # a running run keeps its journal
        await engine.signal("o-1", poke, 3)
        assert await engine.get("o-1").result() == "acme:3"
        await until(lambda: [type(r).__name__ for r in engine._rt.journal_of(engine._rt.wf["o-1"])[0]]
                    == ["Start", "Done"])
        journal = await engine.journal("o-1")
        assert [type(r).__name__ for r in journal] == ["Start", "Done"]
        assert engine.describe("o-1").attributes == {"customer": "acme", "tier": 3, "vip": False}
        with pytest.raises(fusee.HistoryUnavailable, match="keep_history=True"):
            await engine.query("o-1", status_q)
        with pytest.raises(fusee.HistoryUnavailable):
            await engine.fork("o-1", "o-2", before_step="ship")
        assert await engine.execute(plain, "p-1", 5) == 10
    async with fusee.Engine.open(tmp_path, workflows=[order, plain], keep_history=False) as engine:
        assert [type(r).__name__ for r in await engine.journal("p-1")] == ["Start", "Done"]
        assert await engine.get("o-1").result() == "acme:3"
        assert ids(engine.list("attrs.customer = 'acme' and status = 'ok'")) == ["o-1"]
    # A run that ended in the log after the last checkpoint is trimmed at open too.
    engine = await fusee.Engine.open(tmp_path, workflows=[order, plain], keep_history=False,
                                     checkpoint_every=10_000)
    assert await engine.execute(plain, "p-2", 1) == 2
    await crash_in_process(engine)  # no close, no final checkpoint
    async with fusee.Engine.open(tmp_path, workflows=[order, plain], keep_history=False) as engine:
        assert engine.recovered_records > 0
        assert [type(r).__name__ for r in await engine.journal("p-2")] == ["Start", "Done"]
        assert engine.describe("p-2").status == "ok"
    # With history (the default) an ended run keeps its whole journal and answers queries.
    async with fusee.Engine.open(workflows=[order]) as engine:
        await engine.start(order, "o-1", "acme")
        await engine.signal("o-1", poke, 3)
        await engine.get("o-1").result()
        assert await engine.query("o-1", status_q) == "waiting"
        assert len(await engine.journal("o-1")) > 2
