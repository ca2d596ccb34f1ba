"""Several engines on one PostgreSQL namespace: one owner, followers routing over TCP, takeover."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

import fusee
from fusee.errors import LeaseHeld, RoutingRefused
from fusee.scale import tcp
from tests.helpers import until

approve = fusee.signal("approve", int)
ran: list[str] = []


@fusee.workflow("pg_order")
async def order(ctx: fusee.Ctx, qty: int) -> int:
    price = await ctx.step("quote", lambda: ran.append(f"{ctx.workflow_id}/quote") or 7)
    ok = await ctx.wait_for(approve)
    return price * qty * (ok or 0)


def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def crash(engine: Any) -> None:
    """As a killed process would, for the owner: renewals stop, connections and the server drop."""
    log: Any = engine._log
    log.lease.stop_renewing()
    log._conn.close()
    log.lease._conn.close()
    engine._rt.closed = True
    engine._closed = True
    if engine._route_server is not None and engine._route_server._server is not None:
        engine._route_server._server.close()
        for w in list(engine._route_server._conns):
            w.close()


async def test_a_second_engine_follows_and_routes_every_call(pg_dsn: str) -> None:
    owner = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=2)
    follower = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=2)
    try:
        assert owner.is_owner and not follower.is_owner
        assert follower.epoch == owner.epoch == 1
        address = rows(pg_dsn, "SELECT address FROM fusee.lease")[0][0]
        assert tcp.is_tcp(address)
        run = await follower.start(order, "o-1", 3)  # durable on the owner when it returns
        assert owner.describe("o-1").status == "running"
        await follower.signal("o-1", approve, 1)
        assert await run.result() == 21
        assert await owner.get("o-1").result() == 21
        await follower.refresh()
        assert follower.describe("o-1").status == "ok"  # from its read-only view of the namespace
        assert [r.workflow_id for r in follower.runs()] == ["o-1"]
        with pytest.raises(fusee.AlreadyExists):
            await follower.start(order, "o-1", 3)
        with pytest.raises(LeaseHeld):
            await fusee.Engine.open(pg_dsn, workflows=[order], exclusive=True)
    finally:
        await follower.close()
        await owner.close()


async def test_a_caller_without_the_routing_secret_is_refused(pg_dsn: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[order]) as owner:
        address = rows(pg_dsn, "SELECT address FROM fusee.lease")[0][0]
        host, port = tcp.dial_target(address)
        reader, writer = await asyncio.open_connection(host, port)
        with pytest.raises((RoutingRefused, asyncio.IncompleteReadError)):
            await tcp.client_handshake(reader, writer, b"not the secret" * 3)
        writer.close()
        # A caller that proves a wrong secret gets no frame answered.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"\0" * 32)
        await reader.readexactly(64)
        writer.write(b"\0" * 32)  # a wrong proof
        assert await reader.read() == b""  # the owner hung up
        writer.close()
        assert owner._route_server is not None and owner._route_server.served == 0


async def test_a_follower_takes_over_when_the_owner_dies(pg_dsn: str) -> None:
    ran.clear()
    owner = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=1)
    follower = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=1, route_timeout=20)
    await follower.start(order, "o-2", 2)
    await until(lambda: "o-2/quote" in ran)
    crash(owner)
    # The signal waits for the next owner: the follower itself, once the lease expired.
    t0 = time.monotonic()
    await follower.signal("o-2", approve, 1)
    assert follower.is_owner and follower.epoch == 2
    assert time.monotonic() - t0 < 15
    assert await follower.get("o-2").result() == 14
    assert ran.count("o-2/quote") == 1  # its recorded result was not run again
    await follower.close()
    assert rows(pg_dsn, "SELECT epoch, owner FROM fusee.lease") == [(2, None)]
