"""The lease object on its own, in the shape routing will reuse: acquire, renew, fence, publish, release."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from fusee.storage.postgres import schema
from fusee.storage.postgres.connection import describe
from fusee.storage.postgres.lease import Lease


@pytest.fixture
def namespace(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        schema.ensure(conn, "leases", 1)
    return "leases"


def expire_now(dsn: str) -> None:
    """Moves the lease's expiry into the past, as the server's clock passing it would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE leases.lease SET expires_at = now() - interval '1 second'")


def test_one_holder_at_a_time_and_epochs_grow(pg_dsn: str, namespace: str) -> None:
    a, b = Lease(pg_dsn, namespace, 30), Lease(pg_dsn, namespace, 30)
    try:
        assert a.try_acquire() and a.epoch == 1 and a.still_held()
        assert not b.try_acquire() and b.epoch == 0 and not b.still_held()
        holder = b.holder()
        assert holder is not None and holder.owner == a.owner and holder.epoch == 1
        assert 25 < holder.expires_in <= 30
        assert a.try_acquire() and a.epoch == 1  # holding it already: renewed, same epoch
        a.publish("10.0.0.1:7000")
        assert b.owner_address() == "10.0.0.1:7000"
        expire_now(pg_dsn)
        assert not a.still_held() and b.owner_address() is None
        assert not a.renew() and a.lost.is_set()  # expired: never extended again
        assert b.try_acquire() and b.epoch == 2 and b.still_held()
        assert not a.try_acquire() and not a.still_held()
        b.release()
        assert a.try_acquire() and a.epoch == 3
    finally:
        a.release()
        b.release()


def test_wait_acquire_returns_when_the_holder_releases_or_stop_is_set(pg_dsn: str, namespace: str) -> None:
    a, b = Lease(pg_dsn, namespace, 0.3), Lease(pg_dsn, namespace, 0.3)
    try:
        assert a.try_acquire()
        a.start_renewing()
        stop = threading.Event()
        stop.set()
        assert not b.wait_acquire(stop)  # told to stop: gives up at once
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(b.wait_acquire(threading.Event())))
        waiter.start()
        a.release()  # a renews until here; b then takes it without waiting out the TTL
        waiter.join(10)
        assert got == [True] and b.epoch == 2
    finally:
        a.release()
        b.release()


def test_renewals_keep_the_lease_past_its_ttl(pg_dsn: str, namespace: str) -> None:
    a = Lease(pg_dsn, namespace, 0.5)
    try:
        assert a.try_acquire()
        a.start_renewing()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            first = conn.execute("SELECT expires_at FROM leases.lease").fetchone()
            deadline = time.monotonic() + 10
            while conn.execute("SELECT expires_at FROM leases.lease").fetchone() == first:
                assert time.monotonic() < deadline, "never renewed"
                time.sleep(0.02)
        assert a.still_held() and a.epoch == 1 and not a.lost.is_set()
    finally:
        a.release()


def test_describe_hides_the_password() -> None:
    assert describe("postgresql://app:s3cret@db.internal:5433/orders") == \
        "postgresql://app@db.internal:5433/orders"
    assert "s3cret" not in describe("host=db password=s3cret dbname=orders")
