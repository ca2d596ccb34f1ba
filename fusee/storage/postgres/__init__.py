"""PostgreSQL as the engine's durable store: ``Engine.open("postgresql://...")``.

The server is the arbiter of ownership (a lease row with an epoch) and the
durable store (records, checkpoints): a flush is one transaction, durable
when the server's commit returns. See docs/postgres.md.

- ``connection``: connecting, with a clear error and a DSN without its password
- ``schema``: the namespace's tables, created and migrated under a version table
- ``lease``: who serves the namespace, with which epoch, until when
- ``log``: ``PostgresLog``, the ``SharedLog`` interface on those tables
"""

from __future__ import annotations

DSN_PREFIXES = ("postgresql://", "postgres://")
#: The namespace (PostgreSQL schema) an engine uses unless told otherwise.
DEFAULT_NAMESPACE = "fusee"
#: Seconds a lease lasts without renewal (renewed every third of it).
DEFAULT_LEASE_TTL = 5.0


def is_dsn(path: object) -> bool:
    """Whether ``Engine.open``'s ``path`` names a PostgreSQL database rather than a directory."""
    return isinstance(path, str) and path.startswith(DSN_PREFIXES)
