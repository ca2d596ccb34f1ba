"""Finding trouble through ``Engine.list``/``counts``/``metrics``: the statuses ``retrying`` and
``paused``, unknown statuses refused, newest first, ``now() - 1h`` and counts that follow the filter."""

from __future__ import annotations

from pathlib import Path

import pytest

import fusee
from tests.helpers import until

FIXED: set[str] = set()
STATUSES = ("running", "retrying", "paused", "stuck", "ok", "failed", "cancelled", "timed_out", "terminated")


def _flaky(name: str) -> str:
    if name not in FIXED:
        raise ConnectionError(f"{name} is down")
    return f"{name} ok"


@fusee.workflow("flaky")
async def flaky(ctx: fusee.Ctx, name: str) -> str:
    # A long first delay: the run stays "retrying" for the whole test.
    return await ctx.step("call", lambda: _flaky(name), retry=fusee.Retry(attempts=3, initial="1h",
                                                                            max_interval="1h"))


@fusee.workflow("pausing")
async def pausing(ctx: fusee.Ctx, name: str) -> str:
    return await ctx.step("call", lambda: _flaky(name), retry=fusee.Retry(attempts=1, pause_when_exhausted=True))


@fusee.workflow("fine")
async def fine(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


WORKFLOWS = [flaky, pausing, fine]


def ids(page: fusee.RunPage) -> list[str]:
    return [s.workflow_id for s in page.items]


async def _trouble(engine: fusee.Engine) -> None:
    FIXED.clear()
    assert await engine.execute(fine, "f-1", 1) == 2
    await engine.start(flaky, "r-1", "billing")
    await engine.start(pausing, "p-1", "shipping")
    await engine.start(pausing, "p-2", "mail")
    await until(lambda: engine.describe("r-1").attempt == 1 and engine.describe("p-2").paused_steps == ("call",)
                and engine.describe("p-1").paused_steps == ("call",))


def _check_trouble(engine: fusee.Engine) -> None:
    assert [s.status for s in engine.runs()] == ["ok", "retrying", "paused", "paused"]
    assert ids(engine.list("status = 'paused'")) == ["p-1", "p-2"]
    assert ids(engine.list("status = 'retrying'")) == ["r-1"]
    assert ids(engine.list("status in ('running', 'retrying', 'paused')")) == ["r-1", "p-1", "p-2"]
    assert ids(engine.list("status = 'running'")) == []
    assert engine.describe("r-1").status == "retrying" and engine.describe("p-1").status == "paused"
    counts = engine.counts()
    assert list(counts) == list(STATUSES)
    assert {k: v for k, v in counts.items() if v} == {"ok": 1, "retrying": 1, "paused": 2}
    by_status: dict[str, int] = {}
    for shard in engine.metrics().shards:
        for status, n in shard.runs.items():
            by_status[status] = by_status.get(status, 0) + n
    assert by_status == {"ok": 1, "retrying": 1, "paused": 2}


async def test_retrying_and_paused_runs_are_listed_counted_and_selectable() -> None:
    async with fusee.Engine.open(workflows=WORKFLOWS) as engine:
        await _trouble(engine)
        _check_trouble(engine)
        # Counts follow the filter.
        assert {k: v for k, v in engine.counts("workflow = 'pausing'").items() if v} == {"paused": 2}
        assert sum(engine.counts("workflow_id = 'f-1'").values()) == 1

        FIXED.add("shipping")
        await engine.resume("p-1", by="ops")
        assert await engine.get("p-1").result() == "shipping ok"
        assert ids(engine.list("status = 'paused'")) == ["p-2"]
        assert engine.counts()["ok"] == 2


async def test_statuses_survive_a_reopen_with_the_runs_parked(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        await _trouble(engine)
    async with fusee.Engine.open(tmp_path / "e", workflows=WORKFLOWS) as engine:
        _check_trouble(engine)
    # Read offline (nothing loaded: every journal is read from its packed form).
    async with fusee.Engine.open(tmp_path / "e", read_only=True, park_after=None) as engine:
        _check_trouble(engine)


@pytest.mark.parametrize("where", ["status = 'pasued'", "status in ('ok', 'Paused', 'done')",
                                   "status != 'unknown'"])
async def test_an_unknown_status_is_refused_naming_the_known_ones(where: str) -> None:
    async with fusee.Engine.open(workflows=WORKFLOWS) as engine:
        with pytest.raises(fusee.UnknownStatus) as e:
            engine.list(where)
        assert e.value.known == STATUSES
        assert "running, retrying, paused, stuck, ok, failed, cancelled, timed_out, terminated" in str(e.value)
        assert e.value.status in ("pasued", "done", "unknown")
        assert where[e.value.position:].startswith("'" + e.value.status)
        with pytest.raises(fusee.InvalidQuery):  # UnknownStatus is an InvalidQuery
            engine.counts(where)
        assert engine.list("status = 'PAUSED'").items == []  # case does not matter


async def test_newest_first_pages_with_a_cursor() -> None:
    async with fusee.Engine.open(workflows=WORKFLOWS) as engine:
        for i in range(7):
            await engine.execute(fine, f"f-{i}", i)
        page = engine.list(limit=3, order="newest")
        assert ids(page) == ["f-6", "f-5", "f-4"]
        page = engine.list(limit=3, cursor=page.cursor, order="newest")
        assert ids(page) == ["f-3", "f-2", "f-1"]
        await engine.execute(fine, "f-7", 7)  # started meanwhile: not on a later page of this walk
        last = engine.list(limit=3, cursor=page.cursor, order="newest")
        assert ids(last) == ["f-0"] and last.cursor is None
        # With an indexed term too.
        page = engine.list("workflow_id = 'f-2' or workflow_id = 'f-5'", order="newest")
        assert ids(page) == ["f-5", "f-2"]
        with pytest.raises(fusee.InvalidQuery, match="other order"):
            engine.list(cursor=page.cursor or engine.list(limit=1).cursor, order="newest")
        with pytest.raises(ValueError, match="order must be"):
            engine.list(order="latest")


async def test_time_relative_to_now() -> None:
    async with fusee.Engine.open(workflows=WORKFLOWS) as engine:
        await engine.execute(fine, "f-1", 1)
        await engine.start(flaky, "r-1", "x")
        assert ids(engine.list("started_at > now() - 1h")) == ["f-1", "r-1"]
        assert ids(engine.list("started_at > now()-15m and ended_at = null")) == ["r-1"]
        assert ids(engine.list("ended_at >= now() - 1d")) == ["f-1"]
        assert ids(engine.list("started_at < now() - 1h30m")) == []
        assert ids(engine.list("started_at > now() + 1h")) == []
        assert ids(engine.list("started_at <= now()")) == ["f-1", "r-1"]
        assert sum(engine.counts("started_at > now() - 1h").values()) == 2


@pytest.mark.parametrize(("where", "position"), [
    ("started_at > now() 1h", 19),
    ("started_at > now() - 'x'", 21),
    ("started_at > now() - -1h", 21),
    ("started_at > 1h", 13),
    ("started_at > now(1)", 17),
    ("started_at > now() - 1y", 21),
    ("workflow = now()", 11),
])
async def test_bad_relative_times_raise_naming_the_position(where: str, position: int) -> None:
    async with fusee.Engine.open(workflows=WORKFLOWS) as engine:
        with pytest.raises(fusee.InvalidQuery) as e:
            engine.list(where)
        assert e.value.position == position, str(e.value)
