"""Engine.open("postgresql://...") end to end on a real PostgreSQL: the API, the lease, fencing, errors."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import psycopg
import pytest

import fusee
from fusee.errors import (
    DatabaseUnavailable,
    LeaseHeld,
    LeaseLost,
    SchemaVersionMismatch,
    ShardCountMismatch,
)
from fusee.storage.postgres import schema
from tests.engine import test_engine as suite

ran: list[str] = []


@fusee.workflow("pg_chain")
async def chain(ctx: fusee.Ctx, n: int) -> int:
    v = 0
    for i in range(n):
        v = await ctx.step(f"s{i}", lambda v=v, i=i: ran.append(f"{ctx.workflow_id}/{i}") or v + 1)
    return v


def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def crash(engine: fusee.Engine) -> None:
    """As a killed process would: renewals stop, connections drop, no checkpoint, no release.

    (The subprocess tests in test_pg_crash.py kill real processes.)
    """
    log: Any = engine._log
    log.lease.stop_renewing()
    log._conn.close()
    log.lease._conn.close()


async def wait_expired(dsn: str, namespace: str = "fusee", timeout: float = 20) -> None:
    """Waits until the server's clock says the namespace's lease has expired."""
    deadline = time.monotonic() + timeout
    while rows(dsn, f"SELECT 1 FROM {namespace}.lease WHERE expires_at > now()"):
        assert time.monotonic() < deadline, "the lease never expired"
        await asyncio.sleep(0.05)


async def test_start_steps_result_and_reopen(pg_dsn: str) -> None:
    ran.clear()
    async with await fusee.Engine.open(pg_dsn, workflows=[chain], shards=4) as engine:
        h = await engine.start(chain, "c-1", 5)
        assert await h.result() == 5
    assert ran == [f"c-1/{i}" for i in range(5)]
    # The close checkpointed: the records it covers are gone, the state holds the run.
    assert rows(pg_dsn, "SELECT count(*) FROM fusee.records") == [(0,)]
    assert rows(pg_dsn, "SELECT count(*) FROM fusee.checkpoint") == [(1,)]
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]) as engine:  # shards=4 from the meta row
        assert engine.recovered_records == 0
        assert await engine.get("c-1").result() == 5
        h2 = await engine.start(chain, "c-2", 2)
        assert await h2.result() == 2
    assert ran == [f"c-1/{i}" for i in range(5)] + ["c-2/0", "c-2/1"]
    assert rows(pg_dsn, "SELECT shards FROM fusee.meta") == [(4,)]
    assert rows(pg_dsn, "SELECT max(version) FROM fusee.schema_version") == [(schema.VERSION,)]


async def test_records_after_the_checkpoint_are_read_back(pg_dsn: str) -> None:
    """Without a close (no final checkpoint), recovery reads the records in log order."""
    ran.clear()
    engine = await fusee.Engine.open(pg_dsn, workflows=[chain], shards=2, lease_ttl=1)
    for i in range(4):
        assert await (await engine.start(chain, f"r-{i}", 3)).result() == 3
    n = rows(pg_dsn, "SELECT count(*) FROM fusee.records")[0][0]
    assert n > 0
    crash(engine)
    await wait_expired(pg_dsn)
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]) as again:
        assert again.recovered_records == n
        for i in range(4):
            assert await again.get(f"r-{i}").result() == 3
    assert len(ran) == 12  # no recorded step ran again


async def test_a_second_open_while_the_lease_is_live_names_the_holder(pg_dsn: str) -> None:
    first = await fusee.Engine.open(pg_dsn, workflows=[chain])
    owner = first._log.lease.owner  # type: ignore[attr-defined]
    with pytest.raises(LeaseHeld) as err:
        await fusee.Engine.open(pg_dsn, workflows=[chain], exclusive=True)
    assert err.value.owner == owner and err.value.epoch == 1
    assert owner in str(err.value) and "epoch 1" in str(err.value)
    await first.close()
    # A closed engine released its lease: the next one need not wait for it to expire.
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]) as second:
        assert second._log.lease.epoch == 2  # type: ignore[attr-defined]


async def test_a_fenced_engine_acknowledges_nothing_more(pg_dsn: str) -> None:
    """A's renewals stop past the TTL; B takes over with epoch + 1; A's next flush fails with LeaseLost."""
    a = await fusee.Engine.open(pg_dsn, workflows=[chain], shards=2, lease_ttl=1)
    assert await (await a.start(chain, "before", 1)).result() == 1
    a._log.lease.stop_renewing()  # type: ignore[attr-defined]  # as if A's process were paused
    await wait_expired(pg_dsn)
    b = await fusee.Engine.open(pg_dsn, workflows=[chain], lease_ttl=30)
    assert b._log.lease.epoch == 2  # type: ignore[attr-defined]
    with pytest.raises(fusee.EngineClosed) as err:
        await a.start(chain, "from-a", 1)
    assert isinstance(a.failure, LeaseLost)
    assert "epoch was 1" in str(a.failure) and "epoch 2" in str(a.failure)
    assert isinstance(err.value.__cause__, LeaseLost)
    with pytest.raises(fusee.EngineClosed):
        await a.start(chain, "from-a-again", 1)  # the engine stopped serving
    await a.close()  # releases nothing: the lease is B's
    # B serves: it has A's acknowledged run, nothing A tried after the takeover, and works.
    assert await b.get("before").result() == 1
    with pytest.raises(fusee.NotFound):
        b.get("from-a")
    assert await (await b.start(chain, "from-b", 2)).result() == 2
    await b.close()
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]) as c:
        assert sorted(r.workflow_id for r in c.runs()) == ["before", "from-b"]


async def test_a_newer_schema_version_is_refused(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]):
        pass
    rows(pg_dsn, "INSERT INTO fusee.schema_version (version) VALUES (99) RETURNING version")
    with pytest.raises(SchemaVersionMismatch) as err:
        await fusee.Engine.open(pg_dsn, workflows=[chain])
    assert err.value.found == 99 and err.value.supported == schema.VERSION
    assert "newer Fusee" in str(err.value)


async def test_a_bad_dsn_is_a_clear_error(pg_dsn: str) -> None:
    missing = pg_dsn.replace(pg_dsn.split("/")[3].split("?")[0], "no_such_db")
    with pytest.raises(DatabaseUnavailable) as err:
        await fusee.Engine.open(missing, workflows=[chain])
    assert "no_such_db" in str(err.value)
    with pytest.raises(DatabaseUnavailable) as err:
        await fusee.Engine.open("postgresql://someone:s3cret@127.0.0.1:1/db", workflows=[chain])
    assert "127.0.0.1:1/db" in str(err.value) and "s3cret" not in str(err.value)


async def test_shards_namespaces_and_options_are_checked(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[chain], shards=3):
        pass
    with pytest.raises(ShardCountMismatch, match="created with 3 shards"):
        await fusee.Engine.open(pg_dsn, workflows=[chain], shards=2)
    with pytest.raises(ValueError, match="namespace must be"):
        await fusee.Engine.open(pg_dsn, workflows=[chain], namespace="Robert'); DROP")
    with pytest.raises(ValueError, match="PostgreSQL DSN"):
        await fusee.Engine.open("./somewhere", workflows=[chain], lease_ttl=3)
    with pytest.raises(ValueError, match="lease_ttl"):
        await fusee.Engine.open(pg_dsn, workflows=[chain], lease_ttl=0)


async def test_namespaces_share_one_database(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[chain], namespace="east") as east, \
            await fusee.Engine.open(pg_dsn, workflows=[chain], namespace="west", shards=2) as west:
        assert await (await east.start(chain, "e", 1)).result() == 1
        assert await (await west.start(chain, "w", 2)).result() == 2
        assert [r.workflow_id for r in east.runs()] == ["e"] and [r.workflow_id for r in west.runs()] == ["w"]


async def test_a_fan_out_flushes_many_records_per_transaction(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[chain], shards=8, flush="background") as engine:
        handles = await asyncio.gather(*(engine.start(chain, f"f-{i}", 3) for i in range(100)))
        assert await asyncio.gather(*(h.result() for h in handles)) == [3] * 100
        stats = engine.stats
        assert stats["flushes"] < 400  # group commit: far fewer transactions than records


# --- the engine's own suite, on PostgreSQL ------------------------------------------------

SUITE = [
    "test_execute_returns_typed_result",
    "test_retries_keep_one_idempotency_key",
    "test_step_failure_fails_the_workflow_with_its_cause",
    "test_signal_wakes_a_waiting_workflow_and_query_sees_state",
    "test_signals_are_buffered_in_order_and_deduplicated",
    "test_updates_validate_run_once_per_id_and_return_results",
    "test_children_return_results_and_detached_children_run",
    "test_cancel_runs_compensation_and_result_raises_cancelled",
    "test_continue_as_new_result_follows_the_chain",
    "test_recorded_values",
    "test_concurrent_branches_with_gather",
]
_namespaces = itertools.count()


@pytest.mark.parametrize("name", SUITE)
def test_engine_suite_on_postgres(name: str, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/engine/test_engine.py's memory engines, each opened on PostgreSQL instead."""
    original = fusee.Engine.open.__func__  # type: ignore[attr-defined]

    def open_on_postgres(cls: Any, path: Any = None, **kw: Any) -> Any:
        if path is None:
            path = pg_dsn
            kw.setdefault("namespace", f"suite_{next(_namespaces)}")
        return original(cls, path, **kw)

    monkeypatch.setattr(fusee.Engine, "open", classmethod(open_on_postgres))
    getattr(suite, name)()


@fusee.workflow("pg_big")
async def big(ctx: fusee.Ctx, n: int) -> int:
    blob = await ctx.step("make", lambda: "x" * n)
    return len(blob)


async def test_large_records_round_trip(pg_dsn: str) -> None:
    engine = await fusee.Engine.open(pg_dsn, workflows=[big], lease_ttl=1)
    assert await (await engine.start(big, "b", 3_000_000)).result() == 3_000_000
    crash(engine)
    await wait_expired(pg_dsn)
    async with await fusee.Engine.open(pg_dsn, workflows=[big]) as engine:
        assert engine.recovered_records > 0
        assert await engine.get("b").result() == 3_000_000


async def test_a_fenced_checkpoint_fails_with_lease_lost(pg_dsn: str) -> None:
    a = await fusee.Engine.open(pg_dsn, workflows=[chain], lease_ttl=1)
    assert await (await a.start(chain, "x", 1)).result() == 1
    a._log.lease.stop_renewing()  # type: ignore[attr-defined]
    await wait_expired(pg_dsn)
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]) as b:
        await a.checkpoint()  # the runtime logs a failed checkpoint; the log failed for good
        assert isinstance(a.failure, LeaseLost)
        with pytest.raises(fusee.EngineClosed):
            await a.start(chain, "y", 1)
        await a.close()
        assert await b.get("x").result() == 1
    assert rows(pg_dsn, "SELECT epoch FROM fusee.lease") == [(2,)]


def terminate(dsn: str, application: str) -> None:
    """Ends the server backends of the engine's connections named ``application`` (as a network cut would)."""
    ended = rows(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      f"WHERE application_name = '{application}'")
    assert ended and all(r[0] for r in ended)


async def test_the_lease_survives_a_dropped_connection(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[chain], lease_ttl=1) as engine:
        (cut,) = rows(pg_dsn, "SELECT now()")[0]
        terminate(pg_dsn, "fusee lease")
        # Renewed after the cut (on a new connection): its expiry moved past cut + ttl.
        deadline = time.monotonic() + 20
        while not rows(pg_dsn, f"SELECT 1 FROM fusee.lease WHERE expires_at > '{cut.isoformat()}'::timestamptz "
                               "+ interval '1 second'"):
            assert time.monotonic() < deadline, "the lease was not renewed after its connection dropped"
            await asyncio.sleep(0.05)
        assert await (await engine.start(chain, "after-cut", 1)).result() == 1


async def test_a_dropped_log_connection_fails_the_log(pg_dsn: str) -> None:
    engine = await fusee.Engine.open(pg_dsn, workflows=[chain])
    assert await (await engine.start(chain, "before", 1)).result() == 1
    terminate(pg_dsn, "fusee log")
    with pytest.raises(fusee.EngineClosed):
        await engine.start(chain, "after", 1)
    assert isinstance(engine.failure, fusee.errors.LogFailed)
    assert "writing to PostgreSQL failed" in str(engine.failure)
    await engine.close()  # releases the lease: the next open need not wait
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]) as again:
        assert await again.get("before").result() == 1


async def test_checkpoints_mid_run_then_a_crash_recover_everything(pg_dsn: str) -> None:
    """Frequent checkpoints delete what they cover; a crash after them loses nothing and re-runs no step."""
    ran.clear()
    engine = await fusee.Engine.open(pg_dsn, workflows=[chain], shards=4, lease_ttl=1,
                                     checkpoint_every=7, flush="background")
    handles = await asyncio.gather(*(engine.start(chain, f"k-{i}", 6) for i in range(20)))
    assert await asyncio.gather(*(h.result() for h in handles)) == [6] * 20
    assert engine.stats["checkpoints"] > 0
    (left,) = rows(pg_dsn, "SELECT count(*) FROM fusee.records")[0]
    (covered,) = rows(pg_dsn, "SELECT (SELECT sum(x) FROM unnest(lsns) x) FROM fusee.checkpoint")[0]
    assert covered > 0  # the checkpoint covers records, and they were deleted
    assert rows(pg_dsn, "SELECT count(*) FROM fusee.records r, fusee.checkpoint c "
                        "WHERE r.lsn <= c.lsns[r.shard + 1]") == [(0,)]
    crash(engine)
    await wait_expired(pg_dsn)
    async with await fusee.Engine.open(pg_dsn, workflows=[chain]) as again:
        assert again.recovered_records == left
        for i in range(20):
            assert await again.get(f"k-{i}").result() == 6
        assert await (await again.start(chain, "k-new", 2)).result() == 2
    assert len(ran) == 20 * 6 + 2 and len(set(ran)) == len(ran)


async def test_an_expired_lease_without_a_takeover_still_fences_the_next_flush(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[chain], lease_ttl=0.6) as engine:
        lease: Any = engine._log.lease  # type: ignore[attr-defined]
        rows(pg_dsn, "UPDATE fusee.lease SET expires_at = now() - interval '1 second' RETURNING 1")
        deadline = time.monotonic() + 10
        while not lease.lost.is_set():
            assert time.monotonic() < deadline, "the renewal never noticed"
            await asyncio.sleep(0.02)
        with pytest.raises(fusee.EngineClosed):
            await engine.start(chain, "late", 1)
        assert isinstance(engine.failure, LeaseLost)
        assert "expired and nobody holds it" in str(engine.failure)
