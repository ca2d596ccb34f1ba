"""Connecting to PostgreSQL: psycopg 3 (the ``postgres`` extra), one clear error for every way it fails."""

from __future__ import annotations

from typing import Any

from fusee.errors import DatabaseUnavailable
from fusee.storage import forks

#: What ``synchronous_commit`` becomes on our sessions when the server's default is weaker:
#: an acknowledgement means the commit's WAL is on the server's disk.
_WEAK_COMMIT = ("off", "local")


def driver() -> Any:
    """The psycopg module, or ``DatabaseUnavailable`` saying how to install it."""
    try:
        import psycopg
    except ImportError as e:
        raise DatabaseUnavailable(
            "Engine.open('postgresql://...') needs psycopg 3, which is not installed: "
            "pip install 'fusee[postgres]'"
        ) from e
    return psycopg


def describe(dsn: str) -> str:
    """The DSN as a message may show it: user, host, port and database, never the password."""
    psycopg = driver()
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an unparsable PostgreSQL DSN"
    host = info.get("host") or "localhost"
    port = f":{info['port']}" if info.get("port") else ""
    user = f"{info['user']}@" if info.get("user") else ""
    return f"postgresql://{user}{host}{port}/{info.get('dbname') or ''}"


def connect(dsn: str, purpose: str) -> Any:
    """An autocommit ``psycopg.Connection`` whose commits wait for the server's WAL flush.

    Raises ``DatabaseUnavailable`` (naming the server, the database and
    ``purpose``) when the DSN is malformed or the server refuses or cannot be
    reached.
    """
    psycopg = driver()
    try:
        conn = psycopg.connect(dsn, autocommit=True, application_name=f"fusee {purpose}",
                               connect_timeout=10)
    except (psycopg.Error, ValueError) as e:
        raise DatabaseUnavailable(
            f"cannot connect to {describe(dsn)} ({purpose}): {str(e).strip()}. Check the DSN "
            "(host, port, database, user, password) and that the server is running; nothing "
            "was created or changed."
        ) from e
    try:
        # A server configured to acknowledge commits before their WAL is flushed would make
        # our acknowledgements lies; stronger settings (remote_write, remote_apply) stay.
        level = conn.execute("SHOW synchronous_commit").fetchone()
        if level is not None and level[0] in _WEAK_COMMIT:
            conn.execute("SET synchronous_commit = on")
    except BaseException:
        conn.close()
        raise
    # A forked child lets go of the session's socket: libpq's goodbye, sent from the child,
    # would end the parent's session, and the child would keep a dead parent's session open.
    forks.hold(conn, _socket)
    return conn


def _socket(conn: Any) -> list[int]:
    return [] if conn.closed else [conn.pgconn.socket]
