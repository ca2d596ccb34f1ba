"""Visibility through the public API: list and its query language (order by, now() on the engine's
clock, answers against a direct evaluation), attributes, metrics, keep_history."""

from __future__ import annotations

import asyncio
import base64
import datetime
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusee
from fusee.engine.query_grammar import Query, SortKey
from fusee.engine.visibility import MAX_LIMIT
from fusee.testing import TestEngine
from tests.engine.query_strategies import KEYS, evaluate, queries, rendered, sort
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


# --- order by, now() and the language against a direct evaluation -----------------------

go = fusee.signal("go")


@fusee.workflow("alpha")
async def alpha(ctx: fusee.Ctx, attrs: dict[str, Any]) -> None:
    ctx.set_attributes(attrs)
    await ctx.wait_for(go)


@fusee.workflow("beta")
async def beta(ctx: fusee.Ctx, attrs: dict[str, Any]) -> None:
    ctx.set_attributes(attrs)
    await ctx.wait_for(go)


async def _runs(env: TestEngine, n: int, seed: int = 7) -> None:
    """``n`` runs a minute apart (``t-0`` first) with attributes drawn from the strategies' pools;
    some end ``ok``, some are terminated."""
    rnd = random.Random(seed)
    for i in range(n):
        attrs = {"n": rnd.choice([0, 1, 2, 3, "2", True, None, 1.5])}
        for key in KEYS[1:]:
            if rnd.random() < 0.6:
                attrs[key] = rnd.choice([None, True, False, -1, 0, 2, 0.5, "a", "b", "acme", ""])
        await env.start(alpha if rnd.random() < 0.6 else beta, f"t-{i}", attrs)
        await env.skip("1m")
    await until(lambda: all(r.attributes for r in env.runs()))
    for i in range(n):
        if rnd.random() < 0.3:
            await env.signal(f"t-{i}", go)
            await env.get(f"t-{i}").result()
        elif rnd.random() < 0.2:
            await env.terminate(f"t-{i}")
        await env.skip("10s")


async def test_order_by_lists_in_that_order_across_pages() -> None:
    async with TestEngine([alpha, beta], frozen_clock=True, skip_time=False, shards=3) as env:
        await _runs(env, 12)
        first_seen = [f"t-{i}" for i in range(12)]
        assert ids(env.list("order by started_at desc")) == first_seen[::-1]
        assert ids(env.list("order by started_at")) == first_seen
        assert ids(env.list("workflow = 'alpha' or workflow = 'beta' ORDER BY Started_At DESC")) == first_seen[::-1]
        ended = [r for r in env.runs() if r.ended_at is not None]
        assert ended and len(ended) < 12
        by_end = sorted(ended, key=lambda r: r.ended_at or 0, reverse=True)
        # Nulls (running runs: no ended_at) come last, in either direction; ties go first seen first.
        assert ids(env.list("order by ended_at desc")) == [r.workflow_id for r in by_end] + [
            w for w in first_seen if w not in ids(fusee.RunPage(ended, None))]
        expected = [r.workflow_id for r in sort([r for r in env.runs() if r.workflow == "alpha"],
                                                (SortKey("status"), SortKey("attrs.n", True)))]
        assert ids(env.list("workflow = 'alpha' order by status, attrs.n desc")) == expected
        # Pages: the cursor continues the order.
        for where in ("order by attrs.n desc, shard", "attrs.s != 'zz' order by status desc", "order by workflow_id"):
            whole = ids(env.list(where, limit=MAX_LIMIT))
            walked: list[str] = []
            page = env.list(where, limit=5)
            walked += ids(page)
            while page.cursor is not None:
                page = env.list(where, limit=5, cursor=page.cursor)
                walked += ids(page)
            assert walked == whole and len(whole) >= 5, where
        assert ids(env.list("order by workflow_id", limit=12)) == sorted(first_seen)
        assert env.list("order by workflow_id", limit=12).cursor is None  # exactly the last match
        # counts and bulk actions take the order by too: counts ignore it, bulk picks in its order.
        assert env.counts("workflow = 'alpha' order by started_at desc") == env.counts("workflow = 'alpha'")
        running = [w for w in first_seen[::-1] if env.describe(w).status == "running"]
        picked = await env.bulk("cancel", "status = 'running' order by started_at desc", dry_run=True, limit=2)
        assert picked.workflow_ids == tuple(running[:2]) and picked.matched == len(running)

        # order='newest' and an order by both set the order: refused where the order by is.
        with pytest.raises(fusee.InvalidQuery, match="both set the order") as e:
            env.list("workflow = 'alpha' order by started_at", order="newest")
        assert e.value.position == 19
        # A cursor continues only the listing it came from.
        sorted_cursor = env.list("order by shard", limit=2).cursor
        plain_cursor = env.list(limit=2).cursor
        assert sorted_cursor is not None and plain_cursor is not None
        with pytest.raises(fusee.InvalidQuery, match="ordered by shard asc"):
            env.list("order by shard desc", cursor=sorted_cursor)
        with pytest.raises(fusee.InvalidQuery, match="without an 'order by'"):
            env.list("order by shard", cursor=plain_cursor)
        with pytest.raises(fusee.InvalidQuery, match="with an 'order by'"):
            env.list(cursor=sorted_cursor)
        for forged in ("s", "sbm90IGpzb24", "s" + base64.urlsafe_b64encode(b'["shard asc", [["x", 1]], 3]').decode(),
                       "s" + base64.urlsafe_b64encode(b'["shard asc", [[2, "text"]], 3]').decode()):
            with pytest.raises(fusee.InvalidQuery, match="not a cursor"):
                env.list("order by shard", cursor=forged)


async def test_now_is_the_engines_clock() -> None:
    async with TestEngine([alpha], frozen_clock=True, skip_time=False) as env:
        await env.start(alpha, "a-1", {"n": 1})
        await env.skip("2h")  # the engine's clock only: real time hardly moved
        await env.start(alpha, "a-2", {"n": 2})
        await env.signal("a-2", go)
        await env.get("a-2").result()
        assert ids(env.list("started_at > now() - 1h")) == ["a-2"]
        assert ids(env.list("started_at <= now() - 2h")) == ["a-1"]
        assert ids(env.list("started_at > now() - 121m order by started_at desc")) == ["a-2", "a-1"]
        assert ids(env.list("ended_at <= now()")) == ["a-2"]
        assert ids(env.list("ended_at > now() + 1s or ended_at = null")) == ["a-1"]
        assert env.counts("started_at > now() - 1h")["ok"] == 1
        await env.skip("1h")
        assert ids(env.list("started_at > now() - 1h")) == []  # now() is read when the query runs


@pytest.mark.timeout(600)
async def test_answers_match_a_direct_evaluation_of_the_query() -> None:
    async with TestEngine([alpha, beta], frozen_clock=True, skip_time=False, shards=2) as env:
        await _runs(env, 30, seed=11)
        runs = env.runs()
        now_ms = round(env.now().timestamp() * 1000)

        @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(queries(), st.data(), st.integers(1, 7))
        def check(query: Query, data: st.DataObject, limit: int) -> None:
            text = data.draw(rendered(query), label="text")
            matched = [r for r in runs if query.filter is None or evaluate(query.filter, r, now_ms)]
            expected = [r.workflow_id for r in sort(matched, query.order)]
            assert ids(env.list(text, limit=MAX_LIMIT)) == expected
            assert sum(env.counts(text).values()) == len(expected)
            walked: list[str] = []
            cursor = None
            while True:
                page = env.list(text, limit=limit, cursor=cursor)
                walked += ids(page)
                if page.cursor is None:
                    break
                cursor = page.cursor
            assert walked == expected

        check()
