"""The shared log: one append-only log of record batches for all shards of an engine.

Appends go into an in-memory batch (``append`` never blocks and does no I/O).
A flush takes the whole pending batch as a ``FlushJob``; the job's ``run``
does the blocking I/O (blobs, then one pwrite and one fdatasync) and may run
on a worker thread while the owner keeps appending to the next batch.
``finish_flush`` (owner thread) makes the result visible: every record of the
batch becomes durable at once. One job is in flight at a time.

Recovery (in ``open``) reads the latest checkpoint, then the segments after
it, and accepts batches while length, crc, sequence, chain and life agree. An
invalid batch with nothing valid after it is a torn tail (never acknowledged);
one followed by valid data is corruption, and ``open`` refuses with
``LogCorrupted`` unless the operator passes ``truncate_corrupt=True``.
The format and the rules are described in docs/storage.md.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import errno
import os
import random
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from fusee import sabotage
from fusee.errors import (
    TRUNCATE_ADVICE,
    DirectoryMoved,
    DiskFull,
    LeaseLost,
    LogCorrupted,
    LogFailed,
    StorageError,
)
from fusee.storage import batch as fmt
from fusee.storage.batch import BatchBuilder, BatchHeader, BlobRef, SegmentHeader
from fusee.storage.blobs import entry, read_pack, write_pack
from fusee.storage.checkpoint import NAME as CKPT_NAME
from fusee.storage.checkpoint import Checkpoint
from fusee.storage.directory import EngineDirectory
from fusee.storage.holding import Holding
from fusee.storage.seam import FileHandle, LockHandle, Storage, read_whole, write_durably

SEG_SUFFIX = ".seg"
#: Only names this exact shape are segments; anything else in log/ is not ours and is left alone.
_SEG_NAME = re.compile(r"[0-9]{12}\.seg")
#: ``log/newest``: the number of the newest segment whose creation completed (magic, number, crc).
NEWEST = "newest"
_NEWEST = struct.Struct("<8sQI")
_NEWEST_MAGIC = b"FUSENEWS"
#: ``log/durable``: the last batch this machine's writer made durable (magic, seq, segment,
#: end offset, crc). Overwritten after every flush and never synced: it costs one write into
#: the page cache, and survives a killed process (not always a power loss), so that an open
#: after a kill can tell batches zeroed or cut since from a log that ended there.
DURABLE = "durable"
_DURABLE = struct.Struct("<8sQQQI")
_DURABLE_MAGIC = b"FUSEDURA"
#: Only names this exact shape are blobs: anything else in blobs/ is not ours and is left alone.
_BLOB_NAME = re.compile(r"[0-9a-f]{16}-[0-9]{8}\.blob")
#: How much of a segment recovery reads at once past the batches (a multiple of every align).
_CHUNK = 1 << 20
#: How many times a read-only open scans a live directory before reporting what it met.
LIVE_SCAN_TRIES = 8
#: Advice where truncating cannot help.
RESTORE_ADVICE = ("truncate_corrupt=True cannot repair this. Restore the named file (or the whole "
                  "directory) from a backup.")


def newest_note(number: int) -> bytes:
    """The content of ``log/newest`` naming segment ``number`` (a restore writes it too)."""
    body = _NEWEST.pack(_NEWEST_MAGIC, number, 0)[:-4]
    return body + fmt.U32.pack(fmt.crc(body))


def read_head(storage: Storage, path: str) -> SegmentHeader | None:
    """The header of the segment at ``path`` (None: not a complete, intact one)."""
    fh = storage.open(path)
    try:
        return SegmentHeader.decode(storage.pread(fh, 512, 0))
    finally:
        storage.close(fh)


def segment_name(number: int) -> str:
    return f"{number:012d}{SEG_SUFFIX}"


@dataclasses.dataclass
class Recovery:
    """What ``SharedLog.open`` found on disk."""

    #: The opaque state of the latest checkpoint (None: no checkpoint yet).
    checkpoint: bytes | None
    #: Per shard, the last LSN the checkpoint's state covers (0 without one).
    checkpoint_lsns: list[int]
    #: Every record after the checkpoint, as (shard, lsn, bytes), in log order.
    records: list[tuple[int, int, bytes]]
    #: The last segment ended in an invalid batch (a write the crash interrupted).
    torn_tail: bool = False
    #: Batches accepted (including those wholly covered by the checkpoint).
    batches: int = 0
    segments: int = 0
    bytes_scanned: int = 0
    #: Records read from the blob area.
    blobs: int = 0
    #: Where the scan stopped: (file, offset) of the end of the valid log.
    tail: tuple[str, int] | None = None
    #: ``truncate_corrupt`` cut the log at this damage (file, offset).
    truncated_at: tuple[str, int] | None = None
    #: Per accepted batch holding records after the checkpoint: (index of its first record, file, offset).
    batch_starts: list[tuple[int, str, int]] = dataclasses.field(default_factory=list)

    def where(self, index: int) -> tuple[str, int] | None:
        """The (file, batch offset) that held ``records[index]``."""
        i = bisect.bisect_right(self.batch_starts, (index, "\uffff", 0)) - 1
        if i < 0:
            return None
        return self.batch_starts[i][1], self.batch_starts[i][2]


@dataclasses.dataclass
class _Segment:
    number: int
    path: str
    #: Per shard, the highest LSN the segment holds (or any earlier one held).
    max_lsns: list[int]
    blobs: list[str]


class FlushJob:
    """One batch on its way to disk. ``run`` is the blocking part; call it once, from any thread."""

    def __init__(self, log: SharedLog, builder: BatchBuilder, covers: list[int]) -> None:
        self._log = log
        self.builder = builder
        #: Per shard, the last LSN this batch makes durable.
        self.covers = covers
        self.records = builder.records
        self.error: BaseException | None = None
        self.finished = False
        self._state = 0  # 0 new, 1 running, 2 done
        self._mutex = threading.Lock()
        # Held from the moment the job starts running until it is done, so a waiter on another
        # thread acquires it: a bare lock rather than an Event (a Condition and two locks) per flush.
        self._running = threading.Lock()

    @property
    def done(self) -> bool:
        return self._state == 2

    def run(self) -> None:
        """Writes blobs, then the batch, then fdatasyncs. Never raises: a failure is stored in ``error``.

        A second call (or one after ``SharedLog.checkpoint`` ran it) does nothing.
        """
        with self._mutex:
            if self._state != 0:
                return
            self._state = 1
            self._running.acquire()
        self._execute()

    def wait(self) -> None:
        """Makes sure the job ran to completion: runs it here if nobody started it, else waits."""
        with self._mutex:
            start = self._state == 0
            if start:
                self._state = 1
                self._running.acquire()
        if start:
            self._execute()
        else:
            with self._running:  # released once the job is done
                pass

    def _execute(self) -> None:
        t0 = time.perf_counter()
        try:
            self._log._write_batch(self)
        except BaseException as e:  # stored for finish_flush on the owner thread
            self.error = e
        finally:
            # An I/O statistic (metrics only): no decision of the engine reads it.
            self._log.flush_seconds.append(time.perf_counter() - t0)
            self._state = 2
            self._running.release()


class FlushLifecycle:
    """What every log does with its flush jobs, whatever holds its records (files, PostgreSQL).

    A subclass sets these attributes and implements ``begin_flush``, ``_fail`` and ``failure``.
    """

    failed: BaseException | None
    on_flushed: Callable[[], None] | None
    _job: FlushJob | None
    _durable: list[int]

    def begin_flush(self) -> FlushJob | None:
        raise NotImplementedError

    def _fail(self, error: BaseException) -> None:
        raise NotImplementedError

    def failure(self) -> LogFailed:
        raise NotImplementedError

    def finish_flush(self, job: FlushJob) -> list[int]:
        """Makes a completed job's records durable and returns the durable LSN per shard.

        If the job failed, the log fails for good (the fdatasync is never
        retried: the page cache cannot be trusted after it) and this raises
        ``LogFailed`` or ``DiskFull``. Calling it again for the same job
        returns the same outcome.
        """
        if job.finished:
            if job.error is not None:
                raise self.failure()
            return list(self._durable)
        assert job is self._job, "finish_flush got a job this log did not begin"
        assert job.done, "finish_flush called before the job's run() returned"
        job.finished = True
        self._job = None
        if job.error is not None:
            self._fail(job.error)
            raise self.failure()
        for i, lsn in enumerate(job.covers):
            if lsn > self._durable[i]:
                self._durable[i] = lsn
        return list(self._durable)

    def flush(self) -> list[int]:
        """Blocks until everything appended so far is durable (finishing any job in flight); returns the durable LSNs."""
        if self.failed is not None:
            raise self.failure()
        if self._job is not None:
            job = self._job
            job.wait()
            self.finish_flush(job)
        job2 = self.begin_flush()
        if job2 is not None:
            job2.run()
            self.finish_flush(job2)
        if self.on_flushed is not None:
            self.on_flushed()
        return list(self._durable)


class SharedLog(FlushLifecycle):
    """The engine's durable log. Owned by one thread; only ``FlushJob.run`` may run elsewhere."""

    def __init__(self, storage: Storage, directory: EngineDirectory, shards: int, *,
                 segment_bytes: int, blob_threshold: int, align: int, rng: random.Random) -> None:
        self.storage = storage
        self.dir = directory
        self.shards = shards
        #: Called before every write (flush, checkpoint); raises ``LeaseLost`` when the writer no
        #: longer holds an expiring lease (the simulator's lease store; a directory's flock needs none).
        self.fence: Callable[[], None] | None = None
        #: The writer's own deadline under that lease (see ``may_act``); None: a flock, which
        #: holds until the process dies.
        self.holding: Holding | None = None
        self.segment_bytes = segment_bytes
        self.blob_threshold = blob_threshold
        self.align = align
        self.life = rng.getrandbits(63) | 1  # never 0: zeroed bytes never look like our life
        self._salt_seed = rng.getrandbits(64)
        #: Set once an I/O failure made the log unusable: owners must reopen.
        self.failed: BaseException | None = None
        #: How long the latest flushes took (write + fdatasync), seconds; for metrics.
        self.flush_seconds: collections.deque[float] = collections.deque(maxlen=1024)
        self._appended = [0] * shards
        self._durable = [0] * shards
        self._builder = BatchBuilder()
        self._job: FlushJob | None = None
        self._blob_count = 0
        self._closed = False
        self.read_only = False
        # Writer state: touched only while running a job (one at a time) or while no job is in flight.
        self._segments: list[_Segment] = []
        self._fh: FileHandle | None = None
        self._header: SegmentHeader | None = None
        self._offset = 0
        self._seq = 0
        self._prev_crc = 0
        self._highest_seen = 0  # highest segment number on disk (dead ones included)
        self._last_segment: tuple[int, int, int, int] = (0, 0, 0, 0)  # (number, end, crc, seq)
        self._dead: list[int] = []  # segment files recovery found useless
        self._note_fh: FileHandle | None = None  # log/durable, open for the writer's life
        #: Called (owner thread) after ``flush``/``checkpoint`` made records durable
        #: behind the back of whoever drives flushes (the GroupCommitter wakes its waiters).
        self.on_flushed: Callable[[], None] | None = None
        #: Called (owner thread) once, with the error, when the log fails for good.
        self.on_failed: Callable[[BaseException], None] | None = None
        self.batches_written = 0
        self.records_written = 0
        self.blobs_written = 0
        #: Bytes appended since the last checkpoint, and the amount after which
        #: ``on_checkpoint_due`` is called (once, until the next checkpoint): recovery
        #: time and the log's disk use stay bounded by size, not only by record count.
        self.since_checkpoint = 0
        self.checkpoint_bytes = segment_bytes
        self.on_checkpoint_due: Callable[[], None] | None = None

    # --- opening and recovery -------------------------------------------------

    @classmethod
    def open(cls, storage: Storage, path: str, shards: int, *, segment_bytes: int = 64 << 20,
             blob_threshold: int = 256 << 10, truncate_corrupt: bool = False,
             rng: random.Random | None = None, align: int = 4096,
             read_only: bool = False, lock: LockHandle | None = None,
             epoch: int | bool = False) -> tuple[SharedLog, Recovery]:
        """Locks the directory, checks its meta file, recovers, and starts a new segment.

        ``align`` is where batches start (a power of two ≥ 512): no write ever
        touches a sector that holds an earlier batch. Raises ``DirectoryLocked``,
        ``NotAnEngineDirectory``, ``ShardCountMismatch``, ``InvalidMeta``,
        ``LogCorrupted`` (damage a crash cannot explain; with
        ``truncate_corrupt=True`` the log is cut there instead where that helps,
        and the cut reported in ``Recovery.truncated_at``) or
        ``DiskFull``/``LogFailed``. Recovery makes what it read durable before
        anything builds on it. ``read_only`` reads the log under a shared lock
        and writes nothing (no segment, no sync, no cleanup): the log then
        takes no appends. ``lock`` and ``epoch``: see ``EngineDirectory.open``.
        """
        if align < 512 or align & (align - 1):
            raise ValueError(f"align must be a power of two of at least 512, not {align}")
        if segment_bytes < 2 * align:
            raise ValueError(f"segment_bytes ({segment_bytes}) must hold at least two blocks of {align}")
        if read_only and truncate_corrupt:
            raise ValueError("truncate_corrupt writes: it cannot be combined with read_only")
        rng = rng if rng is not None else random.Random(os.urandom(16))
        try:
            directory = EngineDirectory.open(storage, path, shards, read_only=read_only, lock=lock,
                                             epoch=epoch)
        except OSError as e:  # e.g. the meta file's fdatasync failed: the same errors as the log's
            raise _io_error(e, "opening the engine directory", at_open=True) from e
        # Every file from here on is reached through the directory opened, never by name.
        log = cls(directory.storage, directory, shards, segment_bytes=segment_bytes,
                  blob_threshold=blob_threshold, align=align, rng=rng)
        log.read_only = read_only
        try:
            if read_only and directory.live:
                return log, log._recover_live()
            recovery = log._recover(truncate_corrupt)
            if not read_only:
                log._start_segment()
                log._open_durable_note()
                log._collect_garbage(recovery)
        except OSError as e:
            log._release()
            raise _io_error(e, "opening the log", at_open=True) from e
        except BaseException:
            log._release()
            raise
        return log, recovery

    def _release(self) -> None:
        """Closes the segment (if any) and the directory lock after a failed open."""
        for fh in (self._fh, self._note_fh):
            if fh is not None:
                try:
                    self.storage.close(fh)
                except OSError:
                    pass
        self._fh = self._note_fh = None
        self._closed = True
        self.dir.close()

    def _recover(self, truncate_corrupt: bool) -> Recovery:
        s = self.storage
        ckpt_path = f"{self.dir.path}/{CKPT_NAME}"
        ckpt: Checkpoint | None = None
        if s.exists(ckpt_path):
            ckpt = Checkpoint.decode(read_whole(s, ckpt_path))
            if ckpt is None:
                raise LogCorrupted(ckpt_path, 0, "the checkpoint's checksum or format is wrong",
                                   RESTORE_ADVICE)
            if len(ckpt.lsns) != self.shards:
                raise LogCorrupted(ckpt_path, 0,
                                   f"the checkpoint holds {len(ckpt.lsns)} shards but the meta file "
                                   f"says {self.shards}: one of the two is not this directory's",
                                   "truncate_corrupt=True cannot repair this. Restore the meta file "
                                   "or the checkpoint from a backup.")
        base = list(ckpt.lsns) if ckpt else [0] * self.shards
        start = ckpt.start_segment if ckpt else 1
        rec = Recovery(ckpt.state if ckpt else None, list(base), [])
        newest = self._read_newest()
        scan = _Scan(self, base, rec, truncate_corrupt, newest)
        numbers = sorted(int(n[:-len(SEG_SUFFIX)]) for n in s.listdir(self.dir.log_dir)
                         if _SEG_NAME.fullmatch(n)) if s.exists(self.dir.log_dir) else []
        self._dead.extend(n for n in numbers if n < start)  # covered; a crash interrupted their removal
        if not self.read_only:
            self._sync_before_reading(self._left_unsynced([n for n in numbers if n >= start], newest))
        scan.run([n for n in numbers if n >= start], start, ckpt is not None)
        if ckpt is not None:
            scan.check_checkpoint(ckpt_path, ckpt)
        scan.check_durable_note(self._read_durable_note())
        self._appended = list(scan.last)
        self._durable = list(scan.last)
        self._last_segment = scan.chain_end
        rec.blobs = scan.blob_reads
        return rec

    def _recover_live(self) -> Recovery:
        """``_recover`` of a directory a writer holds: its scan may meet the writer's
        checkpoint removing segments, or a batch half written; both pass, so scan again."""
        for attempt in range(LIVE_SCAN_TRIES):
            try:
                return self._recover(False)
            except (OSError, StorageError):
                if attempt == LIVE_SCAN_TRIES - 1:
                    raise
                self._dead.clear()
                self._segments.clear()
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def _read_newest(self) -> int | None:
        """The newest segment whose creation completed, per ``log/newest`` (None: no note)."""
        path = f"{self.dir.log_dir}/{NEWEST}"
        if not self.storage.exists(path):
            return None
        fh = self.storage.open(path)
        try:
            raw = self.storage.pread(fh, _NEWEST.size + 1, 0)
        finally:
            self.storage.close(fh)
        if len(raw) == _NEWEST.size:
            magic, number, value = _NEWEST.unpack(raw)
            if magic == _NEWEST_MAGIC and value == fmt.crc(raw[:-4]):
                return int(number)
        raise LogCorrupted(path, 0, "the note of the newest segment is damaged",
                           "Check that every segment in log/ is intact, then delete log/newest and "
                           "reopen with truncate_corrupt=True, which writes it again.")

    def _read_durable_note(self) -> tuple[int, int, int] | None:
        """(seq, segment, end) of the last batch the last writer made durable, per ``log/durable``;
        None when there is none, or it is torn (it is never synced: a power loss may tear it)."""
        path = f"{self.dir.log_dir}/{DURABLE}"
        if not self.storage.exists(path):
            return None
        fh = self.storage.open(path)
        try:
            raw = self.storage.pread(fh, _DURABLE.size + 1, 0)
        finally:
            self.storage.close(fh)
        if len(raw) != _DURABLE.size:
            return None
        magic, seq, segment, end, value = _DURABLE.unpack(raw)
        if magic != _DURABLE_MAGIC or value != fmt.crc(raw[:-4]):
            return None
        return int(seq), int(segment), int(end)

    def _open_durable_note(self) -> None:
        """Opens ``log/durable`` for this life and notes where the log ends now (after recovery,
        and after ``truncate_corrupt`` accepted a cut: the next open checks against this)."""
        self._note_fh = self.storage.open(f"{self.dir.log_dir}/{DURABLE}", create=True)
        self._note_durable()

    def _note_durable(self) -> None:
        if self._note_fh is None:
            return
        number, end, _, seq = self._last_segment
        body = _DURABLE.pack(_DURABLE_MAGIC, seq, number, end, 0)[:-4]
        self.storage.pwrite(self._note_fh, body + fmt.U32.pack(fmt.crc(body)), 0)  # never synced

    def _check_place(self) -> None:
        """Raises ``DirectoryMoved`` when the directory's path no longer names the directory
        this log writes into: a restart on the path would not find what it acknowledges."""
        why = self.dir.moved()
        if why is not None and not sabotage.active.ignore_moved_directory:
            raise DirectoryMoved(
                f"{why}. This engine writes only into the directory it locked (wherever it is "
                "now: nothing it wrote went into what the path names), but a restart on the path "
                "would not find it, so its log takes no more records and acknowledges nothing "
                "more. Everything acknowledged before is in the directory it locked. Close the "
                "engine, decide which of the two directories to keep, and open that one.")

    def _write_newest(self, number: int) -> None:
        write_durably(self.storage, self.dir.log_dir, NEWEST, newest_note(number))

    def _left_unsynced(self, numbers: list[int], newest: int | None) -> list[int]:
        """The segments the last life to open the log may have left with writes not synced.

        A life syncs every segment at its open (``_sync_before_reading``) before it creates
        its first one, and then writes only to segments it creates: so only the segments of
        the life that created the newest one (per ``log/newest``), and any whose creation did
        not complete, can hold unsynced writes. Recovery's syncs then follow what the last
        life wrote, not the length of the log. Without a note, or with a header that does
        not read, every segment is synced.
        """
        if newest is None or newest not in numbers:
            return numbers
        last = self._head(newest)
        if last is None:
            return numbers
        first = newest
        for n in reversed([n for n in numbers if n < newest]):
            head = self._head(n)
            if head is None:
                return numbers  # unreadable: the scan decides; sync it and all after it
            if head.life != last.life:
                break
            first = n
        return [n for n in numbers if n >= first]

    def _head(self, number: int) -> SegmentHeader | None:
        # Read again by the scan after the sync: this read only tells whose segment it is.
        return read_head(self.storage, f"{self.dir.log_dir}/{segment_name(number)}")

    def _sync_before_reading(self, numbers: list[int]) -> None:
        """Makes the segments durable, then reads them from the disk, before recovery trusts them.

        A process crash keeps the page cache: a segment may hold writes that were
        never synced and would vanish at a power cut after this life acknowledged
        work built on them. And after a failed fdatasync (in an earlier life) the
        cache may show bytes the disk never got: dropping the clean pages makes
        the scan read what the disk holds.
        """
        s = self.storage
        for d in (self.dir.blob_dir, self.dir.log_dir, self.dir.path):
            self._fsync_dir(d)
        if sabotage.active.skip_recovery_sync:
            return
        for n in numbers:
            fh = s.open(f"{self.dir.log_dir}/{segment_name(n)}")
            try:
                s.fdatasync(fh)
                s.drop_cache(fh)
            finally:
                s.close(fh)

    def _start_segment(self) -> None:
        """Creates the next segment (preallocated, header synced, name synced)."""
        prev_number, prev_end, prev_crc, last_seq = self._last_segment
        number = max(prev_number, self._highest_seen) + 1
        header = SegmentHeader(self.align, number, self.life, fmt.salt_for(self._salt_seed, number),
                               last_seq + 1, prev_number, prev_end, prev_crc, self.segment_bytes)
        path = f"{self.dir.log_dir}/{segment_name(number)}"
        s = self.storage
        try:
            fh = s.open(path, exclusive=True)
        except FileExistsError:
            raise LogFailed(
                f"{path} appeared while this process held the engine directory: another process is "
                "writing to it. Stop every other process using the directory, then reopen it."
            ) from None
        try:
            s.preallocate(fh, self.segment_bytes)
            raw = header.encode()
            s.pwrite(fh, raw, 0)
            s.fdatasync(fh)
        except BaseException:
            # Never leave a half-made segment behind: remove it, and make the removal
            # durable (its creation may already be). If that fails too, recovery still
            # recognises it as dead: it holds no batch and no later segment chains to it.
            try:
                s.close(fh)
                s.remove(path)
                self._fsync_dir(self.dir.log_dir)
            except OSError:
                pass
            raise
        try:
            self._fsync_dir(self.dir.log_dir)
            # Only now is the segment whole: recovery refuses a log that lacks it.
            self._write_newest(number)
        except BaseException:
            # Keep the file: the note may name it already (a rename can be durable before
            # its fsync returns). Empty, it is harmless either way: newest and pinning
            # nothing, or newer than the note and dead.
            try:
                s.close(fh)
            except OSError:
                pass
            self._highest_seen = number
            raise
        sealed = SegmentHeader.decode(raw)  # the same header, now with its crc
        assert sealed is not None
        if self._fh is not None:
            s.close(self._fh)
        self._fh, self._header = fh, sealed
        self._offset = self.align
        self._seq = last_seq
        self._prev_crc = sealed.chain_start()
        self._highest_seen = number
        carried = self._segments[-1].max_lsns if self._segments else list(self._durable)
        self._segments.append(_Segment(number, path, list(carried), []))
        self._last_segment = (number, self._offset, self._prev_crc, last_seq)

    def _collect_garbage(self, rec: Recovery) -> None:
        """Removes segments wholly covered by the checkpoint, dead segment tails and orphan blobs."""
        s = self.storage
        for n in self._dead:
            s.remove(f"{self.dir.log_dir}/{segment_name(n)}")
        keep = {b for seg in self._segments for b in seg.blobs}
        orphans = [name for name in s.listdir(self.dir.blob_dir)
                   if name not in keep and _BLOB_NAME.fullmatch(name)]
        for name in orphans:
            s.remove(f"{self.dir.blob_dir}/{name}")
        if self._dead:
            self._fsync_dir(self.dir.log_dir)
        if orphans:
            self._fsync_dir(self.dir.blob_dir)
        self._dead = []

    # --- the owner's API ------------------------------------------------------

    def append(self, shard: int, data: bytes | bytearray | memoryview) -> int:
        """Adds a record to the pending batch and returns its shard-local LSN (1, 2, 3...).

        Does no I/O and never blocks. The record is durable once ``durable(shard)``
        reaches the LSN. Raises ``LogFailed`` (or ``DiskFull``) once the log failed.
        """
        if self.failed is not None:
            raise self.failure()
        if self._closed or self.read_only:
            raise LogFailed("the log is closed (or opened read-only): reopen the engine directory to append")
        lsn = self._appended[shard] + 1
        self._appended[shard] = lsn
        b = self._builder
        if shard != b.shard:
            b.open_section(shard, lsn)
        n = len(data)
        if n > self.blob_threshold:
            payload = bytes(data)
            if not b.blobs:
                self._blob_count += 1  # the batch's pack: every record it offloads goes there
            ref = BlobRef(self.life, self._blob_count, n, fmt.crc(payload))
            b.blobs.append((ref, payload))
            b.buf += fmt.U32.pack(fmt.BLOB_FLAG)
            b.buf += fmt.BLOB_REF.pack(ref.life, ref.number, ref.size, ref.crc)
        else:
            assert n <= fmt.MAX_RECORD
            b.buf += fmt.U32.pack(n)
            b.buf += data
        b.count += 1
        b.records += 1
        before = self.since_checkpoint
        self.since_checkpoint = before + n + 4
        if before < self.checkpoint_bytes <= self.since_checkpoint and self.on_checkpoint_due is not None:
            self.on_checkpoint_due()
        return lsn

    def appended(self, shard: int) -> int:
        """The last LSN given out for ``shard`` (0: none yet)."""
        return self._appended[shard]

    def durable(self, shard: int) -> int:
        """The last LSN of ``shard`` known durable (every record up to it survives a crash)."""
        return self._durable[shard]

    def durable_lsns(self) -> list[int]:
        return list(self._durable)

    def appended_lsns(self) -> list[int]:
        return list(self._appended)

    def durable_end(self) -> tuple[int, int, int]:
        """(segment, byte offset, batch seq) where the batches made durable end: what a backup may
        copy. Safe to call from any thread (one read of a tuple the writer replaces whole)."""
        number, end, _crc, seq = self._last_segment
        return number, end, seq

    @property
    def pending_records(self) -> int:
        """Records appended that no flush has taken yet."""
        return self._builder.records

    def has_pending(self) -> bool:
        """Whether records were appended that no flush has taken yet."""
        return self._builder.records > 0

    @property
    def flushing(self) -> bool:
        """Whether a flush job is in flight (begun, not yet finished)."""
        return self._job is not None

    def begin_flush(self) -> FlushJob | None:
        """Takes everything appended so far as one job; None if nothing is pending, a job is in flight or the log failed."""
        if self.failed is not None or self._job is not None or self._builder.records == 0:
            return None
        b = self._builder
        b.close_section()
        self._builder = BatchBuilder()
        self._job = FlushJob(self, b, list(self._appended))
        return self._job

    def checkpoint(self, state: bytes, covers: Sequence[int] | None = None) -> None:
        """Durably records ``state`` as covering, per shard, every record up to ``covers`` (default: all appended).

        Flushes pending records first (blocking), then writes the checkpoint
        (temp file, fdatasync, rename, directory fsync) and deletes segments the
        checkpoint wholly covers. After it returns, recovery starts from this
        checkpoint. An I/O failure fails the log like a failed flush.
        """
        covered = list(self._appended) if covers is None else list(covers)
        assert len(covered) == self.shards
        assert all(0 <= c <= a for c, a in zip(covered, self._appended, strict=True)), \
            "a checkpoint cannot cover records that were never appended"
        self.flush()
        self.since_checkpoint = 0
        start = self._segments[-1].number
        for seg in self._segments:
            if any(m > c for m, c in zip(seg.max_lsns, covered, strict=True)):
                start = seg.number
                break
        try:
            if self.fence is not None:
                self.fence()
            self._check_place()
            write_durably(self.storage, self.dir.path, CKPT_NAME,
                          Checkpoint(tuple(covered), start, bytes(state), self._last_segment[3]).encode())
            gone = [seg for seg in self._segments if seg.number < start]
            for seg in gone:
                self.storage.remove(seg.path)
                for b in seg.blobs:
                    self.storage.remove(f"{self.dir.blob_dir}/{b}")
            if gone:
                self._fsync_dir(self.dir.log_dir)
                if any(seg.blobs for seg in gone):
                    self._fsync_dir(self.dir.blob_dir)
        except (OSError, DirectoryMoved) as e:
            self._fail(e)
            raise self.failure() from e
        self._segments = [seg for seg in self._segments if seg.number >= start]

    def close(self) -> None:
        """Releases the segment and the directory lock. Pending (unflushed) records are dropped: ``flush`` first."""
        if self._closed:
            return
        self._closed = True
        if self._job is not None and not self._job.done:
            self._job.wait()
        for fh in (self._fh, self._note_fh):
            if fh is not None:
                try:
                    self.storage.close(fh)
                except OSError:
                    pass  # a crashed SimDisk already closed it; nothing to release
        self._fh = self._note_fh = None
        self.dir.close()

    @property
    def segment_numbers(self) -> list[int]:
        """Segments the log still holds (oldest first)."""
        return [seg.number for seg in self._segments]

    # --- the writer (FlushJob.run) ------------------------------------------------

    def _write_batch(self, job: FlushJob) -> None:
        if self.fence is not None:
            self.fence()  # raises LeaseLost: the writer no longer holds the lease
        s = self.storage
        b = job.builder
        names: list[str] = []
        early = sabotage.active.early_blobs
        if b.blobs:
            name = b.blobs[0][0].name
            assert all(ref.name == name for ref, _ in b.blobs)
            write_pack(s, self.dir.blob_dir, name, b.blobs, sync=not early)
            names.append(name)
        if names and not early:
            self._fsync_dir(self.dir.blob_dir)
        total = fmt.align_up(len(b.buf), self.align)
        if self._offset + total > self.segment_bytes and self._offset > self.align:
            self._start_segment()
        assert self._header is not None and self._fh is not None
        seq = self._seq + 1
        value = fmt.seal(b.buf, salt=self._header.salt, sections=b.sections, records=b.records,
                         seq=seq, prev_crc=self._prev_crc, life=self.life)
        s.pwrite(self._fh, b.buf, self._offset)
        try:
            s.fdatasync(self._fh)
        except OSError:
            if not sabotage.active.retry_failed_fsync:
                raise
            s.fdatasync(self._fh)  # sabotage: trusts the page cache after a failed sync
        # Durable, but not where a restart on the path looks if the directory was moved:
        # then acknowledge nothing (the check is one stat, beside a sync of 100 µs or more).
        self._check_place()
        self._offset += total
        self._seq = seq
        self._prev_crc = value
        seg = self._segments[-1]
        seg.max_lsns = list(job.covers)
        seg.blobs.extend(names)
        self._last_segment = (seg.number, self._offset, value, seq)
        self._note_durable()
        self.batches_written += 1
        self.records_written += b.records
        self.blobs_written += len(b.blobs)

    def may_act(self) -> bool:
        """Whether a step's function may begin now: no expiring lease, or one still held by the
        writer's own clock (``fusee.storage.holding``). Safe to ask from any thread."""
        return self.holding is None or self.holding.holds()

    def lease_lapsed(self) -> None:
        """A step found the lease lapsed (``may_act``): the log fails as at a fenced write (call on
        the thread that owns the log)."""
        if self.failed is None and not self._closed:
            self._fail(LeaseLost(
                f"the lease of {self.dir.path} lapsed by this engine's clock (it was stopped or "
                "starved past its TTL): it begins no more steps and the log takes no more records. "
                "Another engine may serve it: close this one; nothing it acknowledged is lost."))

    # --- helpers ------------------------------------------------------------------

    def _fsync_dir(self, path: str) -> None:
        if not sabotage.active.skip_dir_fsync:
            self.storage.fsync_dir(path)

    def _fail(self, error: BaseException) -> None:
        if self.failed is None:
            self.failed = _io_error(error, "flushing the log")
            if self.on_failed is not None:
                self.on_failed(self.failed)

    def failure(self) -> LogFailed:
        assert self.failed is not None
        err = self.failed
        again = type(err)(*err.args) if isinstance(err, LogFailed) else LogFailed(str(err))
        again.__cause__ = err
        return again


def _io_error(error: BaseException, doing: str, *, at_open: bool = False) -> StorageError:
    """The storage error an OSError (or other failure) becomes."""
    if isinstance(error, StorageError):
        return error
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return DiskFull(
            f"the disk is full ({doing}): nothing acknowledged is lost, but the log takes no more "
            "records. Free space and reopen the engine directory."
        )
    if at_open:
        return LogFailed(
            f"I/O failure {doing}: {error}. Nothing acknowledged is lost and the directory's lock "
            "is released. Fix the cause (permissions, a file where a directory should be, a "
            "failing disk) and open it again."
        )
    return LogFailed(
        f"I/O failure {doing}: {error}. Records not yet acknowledged are not durable and the "
        "log takes no more (a failed sync is never retried). Close the engine and reopen the "
        "directory; recovery reads what the disk really holds."
    )


class _Scan:
    """Recovery's walk over the segments after the checkpoint, one segment in memory at a time."""

    def __init__(self, log: SharedLog, base: list[int], rec: Recovery, truncate: bool,
                 newest: int | None) -> None:
        self.log = log
        self.s = log.storage
        self.base = base
        self.rec = rec
        self.truncate = truncate
        #: The newest segment whose creation completed (``log/newest``); None for an older directory.
        self.newest = newest
        #: Per shard, the highest LSN seen (starting from the checkpoint's).
        self.last = list(base)
        self.seen = [False] * log.shards
        #: Per shard, the LSN of the record seen last in the scan.
        self.prev = [0] * log.shards
        self.blob_reads = 0
        self.seg_blobs: list[str] = []
        #: (segment, valid end, last crc, last seq) of the last valid segment: the next one chains to it.
        self.chain_end: tuple[int, int, int, int] = (0, 0, 0, 0)

    def corrupt(self, path: str, offset: int, reason: str, advice: str = TRUNCATE_ADVICE,
                repairable: bool | None = None) -> None:
        """Damage a crash cannot explain: refuse, or (the operator's choice) note the cut and go on.

        ``repairable`` (default: whether the advice is to truncate) says whether
        ``truncate_corrupt`` may accept it.
        """
        if repairable is None:
            repairable = advice is TRUNCATE_ADVICE
        if not self.truncate or not repairable:
            raise LogCorrupted(path, offset, reason, advice)
        self.rec.truncated_at = (path, offset)

    def run(self, numbers: list[int], start: int, has_ckpt: bool) -> None:
        log = self.log
        log._highest_seen = max(numbers, default=max(start - 1, 0))
        if self.newest is not None:
            log._highest_seen = max(log._highest_seen, self.newest)
        paths = {n: f"{log.dir.log_dir}/{segment_name(n)}" for n in numbers}
        # Headers first (a few bytes each); a segment's body is read only when its turn comes.
        headers = {n: read_head(self.s, paths[n]) for n in numbers}
        newest = self.newest
        if newest is not None and newest < start:
            raise LogCorrupted(f"{log.dir.log_dir}/{NEWEST}", 0,
                               f"it names segment {newest}, older than segment {start} where the "
                               "checkpoint starts: it is not this log's note",
                               "Check that the checkpoint and log/ come from the same directory; if "
                               "they do, delete log/newest and reopen with truncate_corrupt=True, which "
                               "writes it again.")
        if newest is not None and newest not in numbers:
            # The newest segment was complete and synced once: only an outside hand removes it.
            self.corrupt(f"{log.dir.log_dir}/{segment_name(newest)}", 0,
                         "the newest segment the log created is missing (deleted?): its records "
                         "would be lost silently")
        first = True
        noted_batches = False  # a segment of this version holds batches (so log/newest was written)
        for i, n in enumerate(numbers):
            h = headers[n]
            later = next((headers[m] for m in numbers[i + 1:] if headers[m] is not None), None)
            confirmed = newest is not None and n <= newest  # its creation completed
            if h is None:
                # A bad header is a dead tail (its creation never became durable) only
                # if no batch is in the file and the next valid segment skips it.
                holds_batches = self._holds_magic(paths[n])
                if (holds_batches or (later is not None and later.prev_segment >= n)
                        or (newest is not None and n == newest)):
                    self.corrupt(paths[n], 0, "the segment header is damaged")
                    return self._cut(numbers[i:])
                log._dead.append(n)
                continue
            if first:
                ok = n == start if has_ckpt else h.prev_segment == 0
                if not ok:
                    missing = start if has_ckpt else 1
                    if has_ckpt:
                        self.corrupt(paths[n], 0, f"segment {missing}, where the checkpoint starts, is missing",
                                     RESTORE_ADVICE)
                    else:
                        self.corrupt(paths[n], 0,
                                     f"segment {missing} before it is missing, and so is the checkpoint "
                                     "that would have covered it",
                                     "Restore the checkpoint (or the missing segments) from a backup. "
                                     "truncate_corrupt=True would remove every segment.")
                    return self._cut(numbers[i:])
            else:
                end_num, end_off, end_crc, end_seq = self.chain_end
                if (h.prev_segment, h.prev_end, h.prev_crc, h.base_seq) != (
                        end_num, end_off, end_crc, end_seq + 1):
                    # The segment before was read up to the end this header records (or
                    # refused), so it is this segment that does not continue the log.
                    self.corrupt(paths[n], 0,
                                 f"it does not continue the log: its header says it follows segment "
                                 f"{h.prev_segment} at byte {h.prev_end}, but the log ends in segment "
                                 f"{end_num} at byte {end_off} (a file from another log, or segments "
                                 "between them are missing)")
                    return self._cut(numbers[i:])
            was_first, chain_end, tail = first, self.chain_end, self.rec.tail
            first = False
            bound = later.prev_end if later is not None and later.prev_segment == n else None
            self.rec.segments += 1
            ok = self._scan_segment(paths[n], h, bound, confirmed)
            if not ok:
                return self._cut(numbers[i + 1:])
            noted_batches = noted_batches or (h.size > 0 and self.chain_end[1] > h.align)
            if (self.chain_end[1] == h.align and not (has_ckpt and n == start)
                    and (later is None or later.prev_segment != n)):
                # No batch, and no later segment chains to it: a segment an open created
                # whose life then wrote nothing, or whose creation failed (its header may
                # read intact now only because it is still cached, and be gone after the
                # next power loss). It holds nothing; never chain to it: remove it.
                log._segments.pop()
                log._dead.append(n)
                self.rec.segments -= 1
                first, self.chain_end, self.rec.tail = was_first, chain_end, tail
            elif newest is not None and n > newest:
                # Batches go only into a segment whose creation completed (and was noted).
                self.corrupt(paths[n], h.align, "a segment newer than the newest the log created "
                             "holds batches")
                return self._cut(numbers[i + 1:])
        if first and has_ckpt:
            self.corrupt(f"{log.dir.log_dir}/{segment_name(start)}", 0,
                         "the segment the checkpoint starts from is missing", RESTORE_ADVICE)
        if newest is None and noted_batches:
            # This version notes a segment before any batch goes in: batches without the
            # note mean it was deleted, and the newest segment with it, perhaps.
            self.corrupt(f"{log.dir.log_dir}/{NEWEST}", 0,
                         "the note of the newest segment is missing although the log holds batches",
                         "If every segment is there, reopen with truncate_corrupt=True to accept the "
                         "log as it is (the note is written again); else restore the directory.",
                         repairable=True)
        return None

    def check_checkpoint(self, path: str, ckpt: Checkpoint) -> None:
        """Refuses a checkpoint that claims more than the log holds (its LSNs or its last batch)."""
        end_seq = self.chain_end[3]
        if self.rec.truncated_at is None and ckpt.end_seq > end_seq:
            raise LogCorrupted(path, 0,
                               f"the checkpoint was written after batch {ckpt.end_seq} but the log "
                               f"ends at batch {end_seq}: the log lost its end, or the checkpoint is "
                               "from another directory",
                               "Restore the missing log segments from a backup; truncate_corrupt=True "
                               "cannot repair this.")
        for shard, (covered, seen, last) in enumerate(zip(ckpt.lsns, self.seen, self.prev, strict=True)):
            # Records are appended in order: if the log after the checkpoint's start holds
            # any record of the shard, it holds every one up to what the checkpoint covers.
            if seen and last < covered:
                raise LogCorrupted(path, 0,
                                   f"the checkpoint covers shard {shard} up to position {covered} "
                                   f"but the log holds it only up to {last}",
                                   "Restore the missing log segments (or the right checkpoint) from a "
                                   "backup; truncate_corrupt=True cannot repair this.")

    def check_durable_note(self, note: tuple[int, int, int] | None) -> None:
        """Refuses a log that ends before the last batch its last writer made durable (per
        ``log/durable``): batches zeroed or cut after a killed process, before any restart."""
        log = self.log
        if note is None or self.rec.truncated_at is not None:
            return
        seq, segment, end = note
        end_num, end_off, _, end_seq = self.chain_end
        if seq <= end_seq:
            return
        if log.read_only and log.storage.held(log.dir.path):
            return  # a writer opened meanwhile and wrote on: nothing is missing
        path = f"{log.dir.log_dir}/{segment_name(segment)}"
        self.corrupt(path, end_off if segment == end_num else 0,
                     f"the log ends at batch {end_seq}, but its last writer made batch {seq} durable "
                     f"(up to byte {end} of this segment), as log/{DURABLE} records: acknowledged "
                     "batches were zeroed or cut since it stopped (or this directory is a copy "
                     "taken while the engine wrote)")

    def _cut(self, gone: list[int]) -> None:
        """truncate_corrupt: drops the given segments (everything after the damage)."""
        assert self.rec.truncated_at is not None
        self.log._dead.extend(gone)

    def _chunks(self, fh: FileHandle, start: int, size: int) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of ``[start, size)`` in pieces of _CHUNK: a segment is never held whole."""
        pos = start
        while pos < size:
            data = self.s.pread(fh, min(_CHUNK, size - pos), pos)
            if not data:
                return
            yield pos, data
            pos += len(data)

    def _holds_magic(self, path: str) -> bool:
        """Whether a batch magic appears anywhere past the first 512 bytes (a header-damaged segment)."""
        fh = self.s.open(path)
        try:
            tail = b""
            for _, data in self._chunks(fh, 512, self.s.size(fh)):
                if fmt.BATCH_MAGIC_BYTES in tail + data[:3] or fmt.BATCH_MAGIC_BYTES in data:
                    return True
                tail = data[-3:]
            return False
        finally:
            self.s.close(fh)

    def _scan_segment(self, path: str, h: SegmentHeader, bound: int | None, confirmed: bool) -> bool:
        """Accepts the segment's batches, reading one batch at a time; False if it was cut at damage."""
        s = self.s
        fh = s.open(path)
        try:
            return self._scan_open_segment(fh, path, h, bound, confirmed)
        finally:
            s.close(fh)

    def _scan_open_segment(self, fh: FileHandle, path: str, h: SegmentHeader, bound: int | None,
                           confirmed: bool) -> bool:
        s = self.s
        size = s.size(fh)
        if confirmed and h.size and size < h.size:
            # Preallocated and synced before any batch: only an outside hand makes it shorter.
            self.corrupt(path, size, f"the segment is {size} bytes long but was created "
                         f"with {h.size}: it was cut")
            self._truncate_file(path, size, h.size)  # truncate_corrupt: accept the cut
        off = h.align
        seq = h.base_seq
        prev = h.chain_start()
        limit = size if bound is None else min(bound, size)
        torn = False
        reason = "the segment ends before its recorded end"
        self.seg_blobs = []
        while off < limit:
            head = s.pread(fh, fmt.BATCH_HEADER.size, off)
            bh = BatchHeader.decode(head, 0)
            if bh is None:
                torn = any(head)
                reason = "no batch header where one should be"
                break
            end = off + bh.length
            batch = s.pread(fh, bh.length, off) if end <= size else b""
            good = (end <= size and bh.life == h.life and bh.seq == seq and bh.prev_crc == prev
                    and fmt.batch_crc(batch, h.salt) == bh.crc)
            if not good:
                torn = True
                reason = "a batch fails its length, checksum, sequence, chain or life check"
                if (bound is None and sabotage.active.accept_torn_batch and end <= size
                        and bh.life == h.life and self._accept(path, off, memoryview(batch), bh)):
                    off += fmt.align_up(bh.length, h.align)
                    seq += 1
                    prev = bh.crc
                break
            if not self._accept(path, off, memoryview(batch), bh):
                reason = "a batch with a valid checksum does not parse"
                torn = True
                break
            off += fmt.align_up(bh.length, h.align)
            seq += 1
            prev = bh.crc
        self.rec.bytes_scanned += off
        self.chain_end = (h.segment, off, prev, seq - 1)
        self.log._segments.append(_Segment(h.segment, path, list(self.last), self.seg_blobs))
        why: str | None = reason if bound is not None and off != bound else None
        if bound is None:
            why = self._after_tail(fh, size, off, h, seq, prev)
        if why is not None:
            self.corrupt(path, off, why)
            self._truncate_file(path, off, h.size)
            self.rec.tail = (path, off)
            return False
        self.rec.torn_tail = bound is None and torn
        self.rec.tail = (path, off)
        return True

    def _after_tail(self, fh: FileHandle, size: int, off: int, h: SegmentHeader, seq: int,
                    prev: int) -> str | None:
        """Why what follows the last valid batch cannot be one torn write (None: it can).

        Only one batch is ever in flight and the segment was preallocated with
        zeros, so a crash leaves at most one damaged slot at the end, and
        zeros after it.
        """
        if off >= size:
            return None
        # A later batch header of this life (intact or not) proves the damaged slot
        # was not the last write, whatever the slot's own header says.
        life = struct.pack("<Q", h.life)
        magic = fmt.BATCH_MAGIC_BYTES
        for _, data in self._chunks(fh, off + h.align, size):  # chunks start on slot boundaries
            pos = data.find(magic)
            while pos >= 0:
                if pos % h.align == 0:
                    later = BatchHeader.decode(data, pos)
                    if later is not None and data[pos + 32:pos + 40] == life and later.seq >= seq:
                        return "a damaged batch is followed by a later batch of the same writer"
                pos = data.find(magic, pos + 1)
        bh = BatchHeader.decode(self.s.pread(fh, fmt.BATCH_HEADER.size, off), 0)
        if bh is not None and bh.life == h.life and bh.seq == seq and bh.prev_crc == prev:
            # The slot's header survived (its fields after the length match), so its
            # length is true: nothing of the torn write lies past it.
            end = off + fmt.align_up(bh.length, h.align)
            for _, data in self._chunks(fh, end, size):
                if data.count(0) != len(data):
                    return "bytes follow a damaged batch: it was not the last write"
        return None

    def _accept(self, path: str, off: int, batch: memoryview, bh: BatchHeader) -> bool:
        try:
            records = fmt.parse_body(batch, bh.sections, bh.records)
        except fmt.MalformedBatch:
            return False
        if any(shard >= len(self.last) for shard, _, _ in records):
            return False
        last, base, out = self.last, self.base, self.rec.records
        prev = self.prev
        first_index = len(out)
        packs: dict[str, int] = {}
        loaded: dict[str, list[tuple[int, int, bytes]] | None] = {}
        for shard, lsn, payload in records:
            # Positions run on by one from the first one seen (which the checkpoint may cover).
            ok = (lsn == prev[shard] + 1) if self.seen[shard] else (lsn <= base[shard] + 1)
            if not ok:
                raise LogCorrupted(path, off, f"shard {shard} jumps to position {lsn} after {prev[shard]}",
                                   RESTORE_ADVICE)
            self.seen[shard] = True
            prev[shard] = lsn
            last[shard] = max(last[shard], lsn)
            index = 0
            if isinstance(payload, BlobRef):
                name = payload.name
                index = packs.get(name, 0)
                packs[name] = index + 1  # the batch's i-th reference to a pack is its i-th entry
                if index == 0:
                    self.seg_blobs.append(name)
            if lsn <= base[shard]:
                continue  # the checkpoint's state holds it
            if isinstance(payload, BlobRef):
                if name not in loaded:
                    loaded[name] = read_pack(self.s, self.log.dir.blob_dir, name)
                data = entry(loaded[name], index, payload)
                if data is None:
                    raise LogCorrupted(f"{self.log.dir.blob_dir}/{payload.name}", 0,
                                       f"a blob that the intact batch at byte {off} of {path} "
                                       "references is missing or damaged", RESTORE_ADVICE)
                self.blob_reads += 1
                out.append((shard, lsn, data))
            else:
                out.append((shard, lsn, payload))
        if len(out) > first_index:
            self.rec.batch_starts.append((first_index, path, off))
        self.rec.batches += 1
        return True

    def _truncate_file(self, path: str, off: int, size: int) -> None:
        # Zeros from the cut on, at the size the segment was created with (a shorter file is refused).
        fh = self.s.open(path)
        try:
            self.s.truncate(fh, off)
            if size > off:
                self.s.truncate(fh, size)
            self.s.fdatasync(fh)
        finally:
            self.s.close(fh)
