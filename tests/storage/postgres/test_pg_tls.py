"""Routing between engines of one PostgreSQL namespace over mutual TLS (``route_tls=``)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

import fusee
from fusee.errors import RoutingRefused
from fusee.scale import tcp
from tests.storage.postgres.test_pg_engine import rows
from tests.storage.postgres.test_pg_scale import approve, crash, order
from tests.tlscerts import authority, issue


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, fusee.RouteTLS]:
    """The namespace's authority with an owner's and a caller's certificates, and a stranger's."""
    ca = authority(tmp_path, "namespace")
    other = authority(tmp_path, "stranger")
    owner_cert, owner_key = issue(tmp_path, ca, "owner", key_apart=True)
    caller_cert, _ = issue(tmp_path, ca, "caller")
    stranger_cert, _ = issue(tmp_path, other, "stranger")
    return {
        "owner": fusee.RouteTLS(cert=owner_cert, key=owner_key, ca=ca.pem),
        "caller": fusee.RouteTLS(cert=caller_cert, ca=ca.pem),
        # Trusts the namespace's authority but holds a certificate it did not sign.
        "stranger": fusee.RouteTLS(cert=stranger_cert, ca=ca.pem),
        # Holds a good certificate but trusts only another authority (so not the owner).
        "distrustful": fusee.RouteTLS(cert=caller_cert, ca=other.pem),
    }


async def test_calls_route_over_mutual_tls(pg_dsn: str, pki: dict[str, fusee.RouteTLS]) -> None:
    owner = await fusee.Engine.open(pg_dsn, workflows=[order], route_tls=pki["owner"])
    follower = await fusee.Engine.open(pg_dsn, workflows=[order], route_tls=pki["caller"])
    try:
        assert owner.is_owner and not follower.is_owner
        address = rows(pg_dsn, "SELECT address FROM fusee.lease")[0][0]
        assert tcp.is_tls(address), address
        run = await follower.start(order, "t-1", 3)
        await follower.signal("t-1", approve, 1)
        assert await run.result() == 21
        assert await owner.get("t-1").result() == 21

        # Nothing is answered in clear: the routing handshake without TLS gets no reply.
        host, port = tcp.dial_target(address)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"\0" * 32)  # a caller's nonce, in clear
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 30) == b""  # the TLS server hung up
        writer.close()
        # Nor to a TLS client without a certificate.
        bare = ssl.create_default_context(cafile=str(pki["owner"].ca))
        reader, writer = await asyncio.open_connection(host, port, ssl=bare, server_hostname=host)
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await tcp.client_handshake(reader, writer, b"x" * 32)
        writer.close()
    finally:
        await follower.close()
        await owner.close()


@pytest.mark.parametrize("who", ["stranger", "distrustful"])
async def test_a_certificate_the_other_side_does_not_trust_is_refused(
        pg_dsn: str, pki: dict[str, fusee.RouteTLS], who: str) -> None:
    async with await fusee.Engine.open(pg_dsn, workflows=[order], route_tls=pki["owner"]) as owner:
        # A refused certificate shows only as the owner ending each connection (TLS 1.3), which
        # the follower tries again until its route_timeout, then names.
        follower = await fusee.Engine.open(pg_dsn, workflows=[order], route_tls=pki[who], route_timeout=3)
        try:
            with pytest.raises(RoutingRefused, match="certificate"):
                await follower.start(order, "t-2", 1)
        finally:
            await follower.close()
        assert owner._route_server is not None and owner._route_server.served == 0
        assert owner.list().items == []  # nothing was started


async def test_tls_and_clear_engines_do_not_mix(pg_dsn: str, pki: dict[str, fusee.RouteTLS]) -> None:
    # An owner with TLS: a follower without it is told what to do.
    async with await fusee.Engine.open(pg_dsn, workflows=[order], route_tls=pki["owner"]):
        follower = await fusee.Engine.open(pg_dsn, workflows=[order])
        try:
            with pytest.raises(RoutingRefused, match="route_tls="):
                await follower.start(order, "t-3", 1)
        finally:
            await follower.close()
    # An owner in clear: a follower opened with TLS sends nothing to it (no downgrade).
    async with await fusee.Engine.open(pg_dsn, workflows=[order]) as owner:
        follower = await fusee.Engine.open(pg_dsn, workflows=[order], route_tls=pki["caller"])
        try:
            with pytest.raises(RoutingRefused, match="routes in clear"):
                await follower.start(order, "t-4", 1)
        finally:
            await follower.close()
        assert owner.list().items == []


async def test_a_follower_that_takes_over_serves_tls_too(pg_dsn: str, pki: dict[str, fusee.RouteTLS]) -> None:
    owner = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=1, route_tls=pki["owner"])
    follower = await fusee.Engine.open(pg_dsn, workflows=[order], lease_ttl=1, route_timeout=20,
                                       route_tls=pki["caller"])
    await follower.start(order, "t-5", 2)
    crash(owner)
    await follower.signal("t-5", approve, 1)  # waits for the next owner: the follower itself
    assert follower.is_owner
    assert tcp.is_tls(rows(pg_dsn, "SELECT address FROM fusee.lease")[0][0])
    third = await fusee.Engine.open(pg_dsn, workflows=[order], route_tls=pki["owner"])
    try:
        assert not third.is_owner
        assert await third.get("t-5").result() == 14  # routed to the new owner over TLS
    finally:
        await third.close()
        await follower.close()
