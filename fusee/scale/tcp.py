"""Routing between machines: the owner of a PostgreSQL namespace serves other engines over TCP.

An address is ``host:port`` (``[v6]:port`` for IPv6; port 0 picks a free
one). The owner listens on it and publishes ``tcp:HOST:PORT`` in the lease row;
other engines of the namespace connect there.

Each connection starts with a mutual proof of the namespace's routing secret
(a random key in the namespace's ``routing`` table: only who can read the
namespace's tables has it), so no one else on the network can make or answer
calls: each side sends a fresh nonce and answers the other's with
HMAC-SHA256(secret, role + nonce). Payloads then travel in clear, unless the
engines were opened with ``route_tls=`` (:mod:`fusee.tls`): the owner then
publishes ``tls:HOST:PORT`` and every connection is mutual TLS, with the same
handshake inside it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket

from fusee.errors import RoutingRefused

#: Where an owner listens unless ``Engine.open(..., route_address=)`` says otherwise: this
#: machine only (engines on other machines need an address they can reach).
DEFAULT_ROUTE_ADDRESS = "127.0.0.1:0"
_NONCE = 32
_PREFIX = "tcp:"
_TLS_PREFIX = "tls:"


def parse_address(address: object) -> tuple[str, int]:
    """(host, port) of ``host:port`` or ``[v6]:port``; ``ValueError`` saying what is expected."""
    if not isinstance(address, str):
        raise ValueError(f"route_address must be 'host:port', got {address!r}")
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"route_address must be 'host:port' (port 0 picks a free one), got {address!r}")
    return host, int(port)


def published(host: str, port: int, tls: bool = False) -> str:
    """The address other engines dial (``tls:`` when the owner serves TLS only): a wildcard host
    is replaced by this machine's name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    prefix = _TLS_PREFIX if tls else _PREFIX
    return f"{prefix}[{host}]:{port}" if ":" in host else f"{prefix}{host}:{port}"


def is_tcp(address: str) -> bool:
    """Whether ``address`` is one an owner published for TCP, in clear or TLS."""
    return address.startswith((_PREFIX, _TLS_PREFIX))


def is_tls(address: str) -> bool:
    """Whether the owner that published ``address`` serves TLS only."""
    return address.startswith(_TLS_PREFIX)


def dial_target(address: str) -> tuple[str, int]:
    """(host, port) of a published ``tcp:`` or ``tls:`` address."""
    return parse_address(address[len(_TLS_PREFIX if is_tls(address) else _PREFIX):])


def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


async def client_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes) -> None:
    """The connecting side: proves the secret and checks that the owner has it too."""
    mine = os.urandom(_NONCE)
    writer.write(mine)
    theirs = await reader.readexactly(_NONCE)
    proof = await reader.readexactly(32)
    if not hmac.compare_digest(proof, _mac(secret, b"owner", mine)):
        raise RoutingRefused("the engine at the namespace's published address does not hold its routing "
                              "secret: it is not the namespace's owner")
    writer.write(_mac(secret, b"caller", theirs))
    await writer.drain()


async def server_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes) -> bool:
    """The owner's side: True once the caller proved the secret (else the connection is to be dropped)."""
    mine = os.urandom(_NONCE)
    theirs = await reader.readexactly(_NONCE)
    writer.write(mine + _mac(secret, b"owner", theirs))
    await writer.drain()
    proof = await reader.readexactly(32)
    return hmac.compare_digest(proof, _mac(secret, b"caller", mine))
