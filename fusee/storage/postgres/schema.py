"""The namespace's tables, created and migrated by the engine under a version table.

A namespace is a PostgreSQL schema; several engines share one database by
using different namespaces. Tables (``{ns}`` is the namespace)::

    {ns}.schema_version  one row per migration applied (the highest is the version)
    {ns}.meta            the shard count, fixed at creation
    {ns}.lease           one row: owner, epoch, expires_at, address
    {ns}.records         (shard, lsn) -> the engine's record bytes, with the flush (batch)
                         and position in it that give recovery the log's order
    {ns}.checkpoint      one row: per-shard LSNs covered, and the engine's opaque state
    {ns}.routing         one row: the secret the namespace's engines authenticate routed calls with

Migrations run in one transaction under an advisory lock, so two engines
opening a new namespace at once create it once. A version higher than this
code knows is refused (``SchemaVersionMismatch``) before anything is touched.
Only what PostgreSQL 14 has is used.
"""

from __future__ import annotations

import os
import re
from typing import Any

from fusee.errors import SchemaVersionMismatch, ShardCountMismatch
from fusee.storage.directory import MAX_SHARDS

#: Lower-case SQL identifiers only: the namespace is spliced into statements, never quoted by hand.
_NAMESPACE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

#: Migration N brings the schema from version N-1 to N; never edit one that shipped: add one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE {ns}.meta (
               id boolean PRIMARY KEY DEFAULT true CHECK (id),
               shards integer NOT NULL,
               created_at timestamptz NOT NULL DEFAULT now())""",
        """CREATE TABLE {ns}.lease (
               id boolean PRIMARY KEY DEFAULT true CHECK (id),
               owner text,
               epoch bigint NOT NULL DEFAULT 0,
               expires_at timestamptz NOT NULL DEFAULT '-infinity',
               address text)""",
        "INSERT INTO {ns}.lease DEFAULT VALUES",
        """CREATE TABLE {ns}.records (
               shard integer NOT NULL,
               lsn bigint NOT NULL,
               batch bigint NOT NULL,
               pos integer NOT NULL,
               data bytea NOT NULL,
               PRIMARY KEY (shard, lsn))""",
        """CREATE TABLE {ns}.checkpoint (
               id boolean PRIMARY KEY DEFAULT true CHECK (id),
               lsns bigint[] NOT NULL,
               batch bigint NOT NULL,
               state bytea NOT NULL,
               written_at timestamptz NOT NULL DEFAULT now())""",
    ),
    (
        # The key engines of one namespace prove themselves with when they route calls
        # to its owner over TCP: only who can read the namespace's tables has it.
        # (``ensure`` fills it from os.urandom: the server's random() is no key generator.)
        """CREATE TABLE {ns}.routing (
               id boolean PRIMARY KEY DEFAULT true CHECK (id),
               secret bytea NOT NULL)""",
    ),
)
#: The schema version this code writes and reads.
VERSION = len(MIGRATIONS)


def check_namespace(namespace: object) -> str:
    """The namespace, if it is a lower-case SQL identifier; else ``ValueError`` saying what is allowed."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(
            f"namespace must be a lower-case PostgreSQL identifier (letters, digits and _, not "
            f"starting with a digit, at most 63 characters), not {namespace!r}"
        )
    return namespace


def table(namespace: str, name: str) -> str:
    """A table's qualified name (the namespace was checked by ``check_namespace``)."""
    return f'"{namespace}".{name}'


def version(conn: Any, namespace: str) -> int:
    """The namespace's schema version (0: no Fusee tables yet)."""
    exists = conn.execute("SELECT to_regclass(%s)", (f'"{namespace}".schema_version',)).fetchone()
    if exists is None or exists[0] is None:
        return 0
    row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {table(namespace, 'schema_version')}"
                       ).fetchone()
    return int(row[0])


def ensure(conn: Any, namespace: str, shards: int | None) -> int:
    """Creates or migrates the namespace's tables and returns its shard count.

    ``shards`` is recorded when the namespace is created (None: 1); an
    existing namespace must match it (None: whatever it holds), else
    ``ShardCountMismatch``. Raises ``SchemaVersionMismatch`` for a namespace
    a newer Fusee wrote.
    """
    if shards is not None and not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be an int from 1 to {MAX_SHARDS}, not {shards!r}")
    ns = f'"{namespace}"'
    with conn.transaction():
        # Serialises engines creating or migrating the same namespace (held until commit).
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"fusee:{namespace}",))
        found = version(conn, namespace)
        if found > VERSION:
            raise SchemaVersionMismatch(namespace, found, VERSION)
        if found == 0:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ns}")
            conn.execute(f"""CREATE TABLE {ns}.schema_version (
                                 version integer PRIMARY KEY,
                                 applied_at timestamptz NOT NULL DEFAULT now())""")
        for v in range(found + 1, VERSION + 1):
            for statement in MIGRATIONS[v - 1]:
                conn.execute(statement.format(ns=ns))
            conn.execute(f"INSERT INTO {ns}.schema_version (version) VALUES (%s)", (v,))
        conn.execute(f"INSERT INTO {ns}.routing (id, secret) VALUES (true, %s) ON CONFLICT (id) DO NOTHING",
                     (os.urandom(32),))
        row = conn.execute(f"SELECT shards FROM {ns}.meta").fetchone()
        if row is None:
            conn.execute(f"INSERT INTO {ns}.meta (shards) VALUES (%s)", (shards or 1,))
            return shards or 1
        have = int(row[0])
        if shards is not None and shards != have:
            raise ShardCountMismatch(
                f"the PostgreSQL namespace {namespace!r} was created with {have} shards and cannot be "
                f"opened with {shards}: the shard count is fixed at creation. Open it with "
                f"shards={have} (or without shards=), or use another namespace."
            )
        return have


def routing_secret(conn: Any, namespace: str) -> bytes:
    """The namespace's routing secret (see migration 2)."""
    row = conn.execute(f"SELECT secret FROM {table(namespace, 'routing')}").fetchone()
    return bytes(row[0])


def check_readable(conn: Any, namespace: str) -> int:
    """The shard count of an existing namespace, touching nothing (a read-only open).

    Raises ``StorageError`` when the namespace has no Fusee tables and
    ``SchemaVersionMismatch`` when a newer Fusee wrote it.
    """
    from fusee.errors import StorageError

    found = version(conn, namespace)
    if found == 0:
        raise StorageError(f"the PostgreSQL namespace {namespace!r} holds no Fusee tables: nothing to "
                           "read (an engine that writes creates them)")
    if found > VERSION:
        raise SchemaVersionMismatch(namespace, found, VERSION)
    row = conn.execute(f"SELECT shards FROM {table(namespace, 'meta')}").fetchone()
    return int(row[0])
