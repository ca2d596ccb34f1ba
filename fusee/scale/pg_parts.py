"""Parts on a PostgreSQL namespace: the part count, the members and each part's place.

A namespace ``ns`` opened with ``parts=N`` holds two tables of its own::

    "ns".parts     one row: the part count, written once at creation
    "ns".members   one row per open engine: its slot, who it is, until when (server time)

and each part ``p`` is a namespace of its own, ``ns_pNNN`` (its records, checkpoint,
lease with epoch and expiry, routing secret), so no two engines ever write the same
part's rows: the part's lease row fences them, as it fences one namespace's engines.
A member renews its row every third of ``lease_ttl``; one paused or cut off past it
drops out of the live members, its parts fall to the others, and its part leases lapse
too, so it writes nothing more when it wakes (its flushes find their leases gone).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fusee.errors import NotAnEngineDirectory
from fusee.scale.places import PostgresPlace
from fusee.storage.postgres.connection import connect, describe
from fusee.storage.postgres.lease import Lease, new_owner_id
from fusee.storage.postgres.schema import check_namespace, table
from fusee.tls import RouteTLS

logger = logging.getLogger("fusee.scale")

#: How long a read of the live members or of a part's epoch serves before it is read again.
READ_TTL_S = 0.1


def part_namespace(namespace: str, part: int) -> str:
    """The namespace of part ``part`` of ``namespace``."""
    return check_namespace(f"{namespace}_p{part:03d}")


class PostgresHome:
    """Where the parts of a PostgreSQL namespace live (see the module's docstring)."""

    def __init__(self, dsn: str, namespace: str, ttl: float, route_tls: RouteTLS | None,
                 max_parts: int, max_members: int) -> None:
        self.dsn = dsn
        self.namespace = check_namespace(namespace)
        part_namespace(namespace, max_parts - 1)  # a clear error now if the parts' names would be too long
        self.ttl = float(ttl)
        self.route_tls = route_tls
        self.max_members = max_members
        self.label = f"{describe(dsn)}#{namespace}"
        self.key: Any = None
        self._epochs: dict[int, tuple[float, int]] = {}
        self._mutex = threading.Lock()
        self._conn: Any = None
        self._limits_table = False

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        with self._mutex:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.dsn, "parts")
            return self._conn.execute(sql, args).fetchall()

    def read_parts(self) -> int | None:
        """The part count, or None when the namespace has no parts table."""
        found = self._query("SELECT to_regclass(%s)", (f'"{self.namespace}".parts',))
        if not found or found[0][0] is None:
            return None
        rows = self._query(f"SELECT parts FROM {table(self.namespace, 'parts')}")
        return int(rows[0][0]) if rows else None

    def is_new(self) -> bool:
        """Whether the namespace holds no engine yet (neither parts nor an engine without them)."""
        found = self._query("SELECT to_regclass(%s), to_regclass(%s)",
                            (f'"{self.namespace}".parts', f'"{self.namespace}".meta'))
        return not found or (found[0][0] is None and found[0][1] is None)

    def create_parts(self, parts: int) -> int:
        """Makes the namespace parted with ``parts`` parts, or returns the count it has; refuses a
        namespace that holds an engine without parts."""
        ns = f'"{self.namespace}"'
        with self._mutex:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.dsn, "parts")
            conn = self._conn
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"fusee:{self.namespace}",))
                plain = conn.execute("SELECT to_regclass(%s)", (f'"{self.namespace}".meta',)).fetchone()
                if plain is not None and plain[0] is not None:
                    raise NotAnEngineDirectory(
                        f"namespace {self.namespace!r} of {describe(self.dsn)} holds an engine without parts: "
                        "parts= applies when a namespace is created; open it without parts=, or use a new "
                        "namespace")
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ns}")
                conn.execute(f"""CREATE TABLE IF NOT EXISTS {ns}.parts (
                                     id boolean PRIMARY KEY DEFAULT true CHECK (id),
                                     parts integer NOT NULL)""")
                conn.execute(f"""CREATE TABLE IF NOT EXISTS {ns}.members (
                                     slot integer PRIMARY KEY,
                                     holder text NOT NULL,
                                     expires_at timestamptz NOT NULL)""")
                conn.execute(f"INSERT INTO {ns}.parts (id, parts) VALUES (true, %s) ON CONFLICT (id) DO NOTHING",
                             (parts,))
                row = conn.execute(f"SELECT parts FROM {ns}.parts").fetchone()
        return int(row[0])

    def join(self) -> PostgresMembership:
        return PostgresMembership(self.dsn, self.namespace, self.ttl, self.max_members)

    def part_target(self, part: int) -> str:
        return self.dsn

    def part_options(self, part: int) -> dict[str, Any]:
        return {"namespace": part_namespace(self.namespace, part), "lease_ttl": self.ttl}

    def part_place(self, part: int, gate: Callable[[], bool]) -> GatedPostgresPlace:
        return GatedPostgresPlace(self.dsn, part_namespace(self.namespace, part), self.ttl, self.route_tls, gate)

    def prepare_part(self, part: int) -> None:
        pass  # the part's namespace is made by its first holder

    def part_epoch(self, part: int) -> int:
        """The epoch of part ``part``'s lease (read at most every READ_TTL_S; 0: never held)."""
        now = time.monotonic()
        seen = self._epochs.get(part)
        if seen is not None and now - seen[0] < READ_TTL_S:
            return seen[1]
        ns = part_namespace(self.namespace, part)
        found = self._query("SELECT to_regclass(%s)", (f'"{ns}".lease',))
        epoch = 0
        if found and found[0][0] is not None:
            rows = self._query(f"SELECT epoch FROM {table(ns, 'lease')} WHERE id")
            epoch = int(rows[0][0]) if rows else 0
        self._epochs[part] = (now, epoch)
        return epoch

    def read_limits(self) -> bytes | None:
        """The limit changes ``set_limit`` stored (``"ns".limits``; None: none made)."""
        if not self._limits_table:
            found = self._query("SELECT to_regclass(%s)", (f'"{self.namespace}".limits',))
            if not found or found[0][0] is None:
                return None
            self._limits_table = True
        rows = self._query(f"SELECT body FROM {table(self.namespace, 'limits')} WHERE id")
        return bytes(rows[0][0]) if rows else None

    def update_limits(self, change: Callable[[bytes | None], bytes | None]) -> None:
        """Replaces the stored limit changes with ``change(them)`` (None deletes them), in one
        transaction that writers of this namespace take turns on."""
        ns = f'"{self.namespace}"'
        with self._mutex:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.dsn, "parts")
            conn = self._conn
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"fusee:{self.namespace}:limits",))
                conn.execute(f"""CREATE TABLE IF NOT EXISTS {ns}.limits (
                                     id boolean PRIMARY KEY DEFAULT true CHECK (id),
                                     body bytea NOT NULL)""")
                row = conn.execute(f"SELECT body FROM {ns}.limits WHERE id").fetchone()
                new = change(None if row is None else bytes(row[0]))
                if new is None:
                    conn.execute(f"DELETE FROM {ns}.limits")
                else:
                    conn.execute(f"INSERT INTO {ns}.limits (id, body) VALUES (true, %s) "
                                 "ON CONFLICT (id) DO UPDATE SET body = excluded.body", (new,))
        self._limits_table = True

    def close(self) -> None:
        with self._mutex:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class PostgresMembership:
    """This engine's member slot of a parted namespace: a row it renews every third of the TTL.

    ``live`` lists the slots whose rows have not expired (by the server's clock). A member
    whose row lapsed (it was paused, or cut off) takes a new slot when it can renew again."""

    def __init__(self, dsn: str, namespace: str, ttl: float, max_members: int) -> None:
        self._dsn = dsn
        self._table = table(namespace, "members")
        self._ttl = ttl
        self._max = max_members
        self._holder = new_owner_id()
        self._mutex = threading.Lock()
        self._conn: Any = connect(dsn, "members")
        self._live: tuple[float, list[int]] | None = None
        self._stop = threading.Event()
        self.slot = -1
        self._claim()
        if self.slot < 0:
            self._conn.close()
            raise NotAnEngineDirectory(f"namespace {namespace!r} has {max_members} members already")
        self._thread = threading.Thread(target=self._renew_loop, name=f"fusee-members-{namespace}", daemon=True)
        self._thread.start()

    def _claim(self) -> None:
        for slot in range(self._max):
            row = self._conn.execute(
                f"""INSERT INTO {self._table} (slot, holder, expires_at)
                    VALUES (%s, %s, now() + %s * interval '1 second')
                    ON CONFLICT (slot) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
                     WHERE {self._table}.expires_at <= now()
                 RETURNING slot""", (slot, self._holder, self._ttl)).fetchone()
            if row is not None:
                self.slot = int(row[0])
                return

    def live(self) -> list[int]:
        """The slots of the live members, this one among them (read at most every READ_TTL_S)."""
        with self._mutex:
            if self._stop.is_set():
                raise OSError("the membership was released")
            now = time.monotonic()
            if self._live is not None and now - self._live[0] < READ_TTL_S:
                return self._live[1]
            try:
                rows = self._conn.execute(
                    f"SELECT slot FROM {self._table} WHERE expires_at > now() ORDER BY slot").fetchall()
            except Exception as e:
                self._reconnect()
                raise OSError(f"reading the members: {e}") from e
            live = sorted({int(r[0]) for r in rows} | {self.slot})
            self._live = (now, live)
            return live

    def _reconnect(self) -> None:
        if self._conn.closed or self._conn.broken:
            with contextlib.suppress(Exception):
                self._conn = connect(self._dsn, "members")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            with self._mutex:
                try:
                    row = self._conn.execute(
                        f"""UPDATE {self._table} SET expires_at = now() + %s * interval '1 second'
                             WHERE slot = %s AND holder = %s AND expires_at > now() RETURNING slot""",
                        (self._ttl, self.slot, self._holder)).fetchone()
                    if row is None:
                        # Our row lapsed (a pause): the others took our parts; come back as a new member.
                        logger.warning("member slot %d of %s lapsed; joining again", self.slot, self._table)
                        self._claim()
                        self._live = None
                except Exception as e:
                    logger.warning("renewing member slot %d of %s failed: %s", self.slot, self._table, e)
                    self._reconnect()

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._mutex:
            with contextlib.suppress(Exception):
                self._conn.execute(f"DELETE FROM {self._table} WHERE slot = %s AND holder = %s",
                                   (self.slot, self._holder))
            with contextlib.suppress(Exception):
                self._conn.close()


class _GatedPgLease(Lease):
    """A part's lease that a follower takes only once the part falls to its engine."""

    def __init__(self, dsn: str, namespace: str, ttl: float, gate: Callable[[], bool]) -> None:
        super().__init__(dsn, namespace, ttl)
        self._gate = gate

    def wait_acquire(self, stop: threading.Event) -> bool:
        while not stop.is_set():
            try:
                if self._gate() and self.try_acquire():
                    return True
            except Exception as e:
                logger.warning("waiting for the lease of %s: %s", self.namespace, e)
            stop.wait(min(self.ttl / 3, 0.05))
        return False


class GatedPostgresPlace(PostgresPlace):
    """A part's namespace, as its followers see it: takeover waits for the part to fall to them."""

    def __init__(self, dsn: str, namespace: str, ttl: float, tls: RouteTLS | None,
                 gate: Callable[[], bool]) -> None:
        super().__init__(dsn, namespace, ttl, tls)
        self._gate = gate

    def new_lease(self) -> Any:
        return _GatedPgLease(self.target, self.namespace, self.ttl, self._gate)
