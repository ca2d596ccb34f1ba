"""``PostgresLog``: the ``SharedLog`` interface on PostgreSQL tables, so the runtime and the committer do not change.

Appends go into an in-memory batch (no I/O). A flush (``FlushJob.run``, on the
log's thread or inline, one at a time) is **one statement, hence one
transaction**: it locks the lease row ``FOR SHARE`` only if it still holds
this engine's owner and epoch and has not expired, and inserts every record
appended since the last flush (all shards) joined to that row. No row, no
insert: the flush fails with ``LeaseLost`` and the log fails for good (the
engine acknowledges nothing more), like a failed fdatasync. A takeover's
update of the lease row waits for a flush holding the share lock, and a flush
that waited for a takeover sees the new epoch: the two never interleave.

Records are durable when the server's commit returns (``synchronous_commit``
at least ``on``: see ``connection``). Records stay the engine's own bytes
(``bytea``), ordered for recovery by (batch, position in it).

A checkpoint is one transaction too: the lease check, the checkpoint row,
and the deletion of every record it covers.

The flush uses a synchronous psycopg connection, not an async pool: it runs
on the log's own thread (or inline on the loop's thread when nothing else
could share it, exactly as the directory log's fdatasync does), one at a time,
so one connection is all it can use, and a blocking call there keeps the
committer unchanged. psycopg releases the GIL while it waits for the server.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

from fusee import sabotage
from fusee.errors import LeaseHeld, LeaseLost, LogFailed, StorageError
from fusee.storage.log import FlushJob, FlushLifecycle, Recovery
from fusee.storage.postgres import DEFAULT_LEASE_TTL, DEFAULT_NAMESPACE, schema
from fusee.storage.postgres.connection import connect, describe, driver
from fusee.storage.postgres.lease import Lease

logger = logging.getLogger("fusee")


@dataclasses.dataclass
class Location:
    """Where the log lives, in the shape the engine reads from a directory (``path``, ``live``)."""

    path: str
    live: bool = False
    #: The lease's epoch this log writes under (0: read-only).
    epoch: int = 0


class _Batch:
    """Records appended since the last flush, as the three arrays the insert takes."""

    __slots__ = ("datas", "lsns", "shards")

    def __init__(self) -> None:
        self.shards: list[int] = []
        self.lsns: list[int] = []
        self.datas: list[bytes] = []

    @property
    def records(self) -> int:
        return len(self.lsns)


class PgFlushJob(FlushJob):
    """One batch on its way to the server: ``run`` executes the fenced insert (blocking)."""

    def __init__(self, log: PostgresLog, batch: _Batch, covers: list[int]) -> None:
        # FlushJob only calls back ``_write_batch`` and reads ``flush_seconds``, which this log has.
        super().__init__(cast(Any, log), cast(Any, batch), covers)
        self.batch = batch


class PostgresLog(FlushLifecycle):
    """The engine's durable log in a PostgreSQL namespace. Owned by one thread; ``FlushJob.run`` may run elsewhere."""

    def __init__(self, dsn: str, namespace: str, shards: int, conn: Any, lease: Lease | None) -> None:
        self.shards = shards
        self.namespace = namespace
        #: None for a read-only log (it appends nothing, so it fences nothing).
        self._lease = lease
        self.dir = Location(f"{describe(dsn)}#{namespace}", epoch=lease.epoch if lease is not None else 0)
        self.read_only = False
        self.failed: BaseException | None = None
        self.flush_seconds: collections.deque[float] = collections.deque(maxlen=1024)
        self.on_flushed: Callable[[], None] | None = None
        self.on_failed: Callable[[BaseException], None] | None = None
        self.on_checkpoint_due: Callable[[], None] | None = None
        self.since_checkpoint = 0
        #: Bytes of records after which ``on_checkpoint_due`` is called (recovery reads what follows the checkpoint).
        self.checkpoint_bytes = 64 << 20
        self.batches_written = 0
        self.records_written = 0
        self._conn = conn
        self._appended = [0] * shards
        self._durable = [0] * shards
        self._batch = _Batch()
        self._job: PgFlushJob | None = None
        self._seq = 0  # the last batch number written (recovery continues after the highest)
        self._closed = False
        t = schema.table
        # The fence (see fusee.scale.expiring): the writer's owner and epoch, not expired.
        held = ("owner = %s AND epoch = %s AND expires_at > now()"
                if not sabotage.active.append_skips_epoch_check else "%s IS NOT NULL AND %s IS NOT NULL")
        self._insert = (
            f"""WITH fence AS (
                    SELECT epoch FROM {t(namespace, 'lease')}
                     WHERE id AND {held} FOR SHARE)
                INSERT INTO {t(namespace, 'records')} (batch, pos, shard, lsn, data)
                SELECT %s, r.pos, r.shard, r.lsn, r.data
                  FROM fence, unnest(%b::integer[], %b::bigint[], %b::bytea[])
                       WITH ORDINALITY AS r(shard, lsn, data, pos)"""
        )
        # One statement too: a transaction held open by the client would let a paused
        # engine keep the lease row locked, and keep a standby from taking over.
        self._checkpoint = (
            f"""WITH fence AS (
                    SELECT epoch FROM {t(namespace, 'lease')}
                     WHERE id AND {held} FOR SHARE),
                saved AS (
                    INSERT INTO {t(namespace, 'checkpoint')} (id, lsns, batch, state)
                    SELECT true, %s, %s, %s FROM fence
                    ON CONFLICT (id) DO UPDATE SET lsns = excluded.lsns, batch = excluded.batch,
                                                   state = excluded.state, written_at = now()
                    RETURNING 1),
                dropped AS (
                    DELETE FROM {t(namespace, 'records')} r
                     USING fence, unnest(%s::bigint[]) WITH ORDINALITY AS c(upto, k)
                     WHERE r.shard = c.k - 1 AND r.lsn <= c.upto)
                SELECT count(*) FROM saved""")

    # --- opening and recovery -------------------------------------------------------

    @classmethod
    def open(cls, dsn: str, shards: int | None, *, namespace: str = DEFAULT_NAMESPACE,
             lease_ttl: float = DEFAULT_LEASE_TTL, lease: Lease | None = None,
             read_only: bool = False) -> tuple[PostgresLog, Recovery]:
        """Connects, creates or migrates the namespace, takes its lease, and reads the log back.

        Raises ``DatabaseUnavailable`` (bad DSN, server unreachable, psycopg
        missing), ``SchemaVersionMismatch``, ``ShardCountMismatch``, or
        ``LeaseHeld`` naming the engine that serves the namespace now. On
        return this engine holds the lease (renewed on a thread) and the
        recovery holds every record after the checkpoint, in log order.
        ``lease`` is one this engine already acquired (a standby taking over).

        ``read_only=True`` takes no lease and changes nothing: the log reads
        what the namespace holds now, and refuses appends.
        """
        schema.check_namespace(namespace)
        psycopg = driver()
        conn = connect(dsn, "log")
        if read_only:
            try:
                try:
                    have = schema.check_readable(conn, namespace)
                    log = cls(dsn, namespace, have, conn, None)
                    log.read_only = True
                    return log, log._recover()
                except psycopg.Error as e:
                    raise StorageError(f"reading the PostgreSQL namespace {namespace!r} on {describe(dsn)} "
                                       f"failed: {str(e).strip()}") from e
            except BaseException:
                conn.close()
                raise
        try:
            try:
                have = schema.ensure(conn, namespace, shards)
                if lease is None:
                    lease = Lease(dsn, namespace, lease_ttl)
                # A holder seen expired by the second statement lost its lease in between: retry once.
                if not lease.try_acquire() and not (lease.holder() is None and lease.try_acquire()):
                    holder = lease.holder()
                    if holder is None:
                        raise LeaseHeld(namespace, "another engine", 0, lease.ttl)
                    raise LeaseHeld(namespace, holder.owner, holder.epoch, holder.expires_in,
                                    holder.address)
                log = cls(dsn, namespace, have, conn, lease)
                recovery = log._recover()
            except psycopg.Error as e:
                raise StorageError(
                    f"opening the PostgreSQL namespace {namespace!r} on {describe(dsn)} failed: "
                    f"{str(e).strip()}. Nothing acknowledged is lost; fix the cause and open it again."
                ) from e
            if not lease.renewing:
                lease.start_renewing()
            return log, recovery
        except BaseException:
            if lease is not None:
                lease.release()
            conn.close()
            raise

    def _recover(self) -> Recovery:
        ns = self.namespace
        t = schema.table
        row = self._conn.execute(f"SELECT lsns, state, batch FROM {t(ns, 'checkpoint')}").fetchone()
        base = [0] * self.shards
        state: bytes | None = None
        if row is not None:
            lsns, state, self._seq = list(row[0]), bytes(row[1]), int(row[2])
            if len(lsns) != self.shards:
                raise StorageError(f"the checkpoint of namespace {ns!r} holds {len(lsns)} shards but "
                                   f"its meta row says {self.shards}: restore the database from a backup")
            base = [int(x) for x in lsns]
        rec = Recovery(state, list(base), [])
        last = list(base)
        cur = self._conn.cursor(binary=True)
        cur.execute(f"SELECT shard, lsn, batch, data FROM {t(ns, 'records')} ORDER BY batch, pos")
        for shard, lsn, batch, data in cur:
            if not 0 <= shard < self.shards:
                raise StorageError(f"namespace {ns!r} holds a record of shard {shard} but has "
                                   f"{self.shards} shards: restore the database from a backup")
            self._seq = max(self._seq, batch)
            if lsn <= base[shard]:
                continue  # covered by the checkpoint; its deletion had not happened
            if lsn != last[shard] + 1:
                raise StorageError(f"namespace {ns!r}: shard {shard} jumps from position {last[shard]} "
                                   f"to {lsn} (records were deleted by hand?): restore the database "
                                   "from a backup; the engine cannot open a log with a gap")
            last[shard] = lsn
            rec.records.append((shard, lsn, bytes(data)))
        cur.close()
        rec.batches = self._seq
        self._appended = list(last)
        self._durable = list(last)
        return rec

    # --- the owner's API (as SharedLog) --------------------------------------------

    @property
    def lease(self) -> Lease:
        """This engine's lease on the namespace (a writing log has one)."""
        assert self._lease is not None, "a read-only log holds no lease"
        return self._lease


    def append(self, shard: int, data: bytes | bytearray | memoryview) -> int:
        """Adds a record to the pending batch (no I/O) and returns its shard-local LSN."""
        if self.read_only:
            raise LogFailed("a read-only view of the namespace takes no records")
        if self.failed is not None:
            raise self.failure()
        if self._closed:
            raise LogFailed("the log is closed: open the engine again to append")
        lsn = self._appended[shard] + 1
        self._appended[shard] = lsn
        b = self._batch
        b.shards.append(shard)
        b.lsns.append(lsn)
        b.datas.append(bytes(data))
        before = self.since_checkpoint
        self.since_checkpoint = before + len(data)
        if before < self.checkpoint_bytes <= self.since_checkpoint and self.on_checkpoint_due is not None:
            self.on_checkpoint_due()
        return lsn

    def appended(self, shard: int) -> int:
        return self._appended[shard]

    def durable(self, shard: int) -> int:
        return self._durable[shard]

    def durable_lsns(self) -> list[int]:
        return list(self._durable)

    def appended_lsns(self) -> list[int]:
        return list(self._appended)

    @property
    def pending_records(self) -> int:
        return self._batch.records

    def has_pending(self) -> bool:
        return self._batch.records > 0

    @property
    def flushing(self) -> bool:
        return self._job is not None

    def begin_flush(self) -> FlushJob | None:
        """Takes everything appended so far as one job; None if nothing is pending, a job is in flight or the log failed."""
        if self.failed is not None or self._job is not None or self._batch.records == 0:
            return None
        batch, self._batch = self._batch, _Batch()
        self._job = PgFlushJob(self, batch, list(self._appended))
        return self._job

    def checkpoint(self, state: bytes, covers: Sequence[int] | None = None) -> None:
        """Flushes, then durably records ``state`` as covering ``covers`` (default: all appended) and deletes the records it covers.

        One statement (one transaction), fenced by the lease like a flush.
        """
        covered = list(self._appended) if covers is None else list(covers)
        assert len(covered) == self.shards
        assert all(0 <= c <= a for c, a in zip(covered, self._appended, strict=True)), \
            "a checkpoint cannot cover records that were never appended"
        if self.read_only:
            raise LogFailed("a read-only view of the namespace writes no checkpoint")
        self.flush()
        self.since_checkpoint = 0
        try:
            row = self._conn.execute(self._checkpoint, (self.lease.owner, self.lease.epoch, covered,
                                                        self._seq, bytes(state), covered)).fetchone()
            if row[0] != 1:
                raise self._lost()
        except BaseException as e:
            self._fail(e)
            raise self.failure() from e

    def close(self) -> None:
        """Releases the lease (if still ours) and the connections. Pending records are dropped: ``flush`` first."""
        if self._closed:
            return
        self._closed = True
        if self._job is not None and not self._job.done:
            self._job.wait()
        if self._lease is not None:
            self._lease.release()
        try:
            self._conn.close()
        except Exception:
            pass

    # --- the writer (FlushJob.run) ---------------------------------------------------

    def _write_batch(self, job: FlushJob) -> None:
        assert isinstance(job, PgFlushJob)
        b = job.batch
        seq = self._seq + 1
        cur = self._conn.execute(self._insert, (self.lease.owner, self.lease.epoch, seq,
                                                b.shards, b.lsns, b.datas))
        if cur.rowcount != b.records:
            assert cur.rowcount == 0, cur.rowcount  # the fence joins zero or one row
            raise self._lost()
        self._seq = seq
        self.batches_written += 1
        self.records_written += b.records

    def lease_lost(self) -> None:
        """A renewal found the lease gone: the log fails now, not at its next flush (call on the
        thread that owns the log). A flush already in flight still completes or fails on its own
        fence: what the server committed under the lease was durable before any takeover."""
        if self.failed is None and not self._closed:
            self._fail(self._lost())

    def may_act(self) -> bool:
        """Whether a step's function may begin now: the lease is surely still this engine's by its
        own clock (``Lease.holds``), whatever the last flush said. Safe to ask from any thread."""
        return self._lease is None or (not isinstance(self.failed, LeaseLost) and self._lease.holds())

    def lease_lapsed(self) -> None:
        """A step found the lease lapsed (``may_act``): the log fails as if a renewal had found it
        gone (call on the thread that owns the log)."""
        if self.failed is None and not self._closed:
            lease = self.lease
            if lease.lost.is_set():  # a renewal found it gone first: say who holds it now
                self._fail(self._lost())
                return
            self._fail(LeaseLost(
                f"the lease of the PostgreSQL namespace {self.namespace!r} (epoch {lease.epoch}) "
                f"lapsed by this engine's clock {-lease.holding.remaining:.3f} s ago (the process was "
                "stopped or starved past its TTL): it begins no more steps and the log takes no more "
                "records. Another engine may serve the namespace: close this one; nothing it "
                "acknowledged is lost."))

    def _lost(self) -> LeaseLost:
        try:
            holder = self.lease.holder()
        except Exception:
            holder = None
        now = (f"it is now held by {holder.owner} with epoch {holder.epoch}" if holder is not None
               else "it expired and nobody holds it now")
        return LeaseLost(
            f"this engine lost the lease of the PostgreSQL namespace {self.namespace!r} (its epoch "
            f"was {self.lease.epoch}; {now}): the flush made nothing durable and the log takes no "
            "more records. Another engine may serve the namespace: close this one; nothing it "
            "acknowledged is lost."
        )

    # --- helpers ------------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        if self.failed is None:
            if isinstance(error, StorageError):
                self.failed = error
            else:
                self.failed = LogFailed(
                    f"writing to PostgreSQL failed ({type(error).__name__}: {str(error).strip()}). "
                    "Records not yet acknowledged may or may not be stored; nothing acknowledged is "
                    "lost. The log takes no more records: close the engine and open it again."
                )
                self.failed.__cause__ = error
            if self._lease is not None:
                self._lease.stop_renewing()
            if self.on_failed is not None:
                self.on_failed(self.failed)

    def failure(self) -> LogFailed:
        assert self.failed is not None
        err = self.failed
        again = type(err)(*err.args) if isinstance(err, LogFailed) else LogFailed(str(err))
        again.__cause__ = err
        return again


