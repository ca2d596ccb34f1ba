"""Continuous backup: what is durable in an engine directory, copied to a target off the step path.

Each *cycle* reads, through the directory the engine opened (never by name):
the checkpoint, then where the durable batches end (``SharedLog.durable_end``),
the meta file, the segments from the checkpoint's start up to that end, and
the blobs. Only bytes before the durable end are read, and they never change:
the log is append-only. What is new goes to the target (a segment's new bytes as
one chunk; chunks are merged like a binary counter, so a segment has O(log n)
of them), then a *point* naming it all. A checkpoint written meanwhile may
remove segments or blobs the cycle read from the old one: the cycle sees the
checkpoint changed (or a file vanished) and starts over.

``BackupThread`` runs cycles every ``interval`` on its own thread, retries a
failed one with backoff, and reports lag and failures (``status``). It shares no
lock with the engine: a slow or failing target delays only the next cycle.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Protocol

from fusee import sabotage
from fusee.backup import manifest as mf
from fusee.backup.targets import Target
from fusee.storage.batch import SegmentHeader
from fusee.storage.blobs import decode_pack
from fusee.storage.checkpoint import NAME as CKPT_NAME
from fusee.storage.checkpoint import Checkpoint
from fusee.storage.seam import Storage, read_whole

logger = logging.getLogger("fusee")

_SEG_NAME = re.compile(r"[0-9]{12}\.seg")
_BLOB_NAME = re.compile(r"[0-9a-f]{16}-[0-9]{8}\.blob")
#: Bytes read from a segment at once, and the largest chunk uploaded.
_PIECE = 8 << 20
#: Cycles a checkpoint may interrupt in a row before the cycle reports it as a failure.
_TRIES = 8


class Source(Protocol):
    """An engine directory as a backup reads it."""

    @property
    def storage(self) -> Storage:
        """The directory, opened (paths under ``path`` resolve inside it)."""
        ...

    @property
    def path(self) -> str: ...

    def durable_end(self) -> tuple[int, int, int]:
        """(segment, byte offset, batch seq) where the batches known durable end."""
        ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class BackupStatus:
    """How a continuous backup is doing (``Engine.metrics().backup``)."""

    #: The target (a path or an ``s3://`` URL).
    target: str
    #: The position (batch seq) of the newest point in the target (0: none yet).
    position: int
    #: Unix time of the newest point (None: none yet).
    point_time: float | None
    #: Seconds the log has held durable batches the target lacks (0.0: the target is up to date).
    lag_s: float
    #: Per point written, how long its oldest batch waited for it at most (seconds), p50 and p99.
    lag_p50_s: float
    lag_p99_s: float
    #: Points written, and bytes uploaded, since the engine opened.
    points: int
    bytes_uploaded: int
    #: Cycles that failed in a row (0: the last one succeeded), and the latest error.
    failures: int
    last_error: str | None


class Uploader:
    """One directory's uploads to one target; remembers what the target holds already."""

    def __init__(self, source: Source, target: Target, *, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.target = target
        self.clock = clock
        self.last: mf.Point | None = None
        self.bytes_uploaded = 0
        self.points_written = 0
        self._chunks: dict[tuple[int, int], list[mf.Chunk]] = {}
        self._blobs: dict[str, mf.ObjectRef] = {}
        self._checkpoints: dict[str, mf.ObjectRef] = {}
        self._resumed = False

    def _forget(self) -> None:
        self.last = None
        self._chunks.clear()
        self._blobs.clear()
        self._checkpoints.clear()

    def _resume(self) -> None:
        """Learns what the target holds from its newest point (a backup that a crash stopped
        goes on from there instead of uploading everything again)."""
        try:
            data = self.target.get(mf.NEWEST)
        except FileNotFoundError:
            self._resumed = True
            return
        point = mf.decode(data, mf.NEWEST)
        for seg in point.segments:
            self._chunks[(seg.number, seg.life)] = list(seg.chunks)
        self._blobs.update((b.name, b.ref) for b in point.blobs)
        if point.checkpoint is not None:
            self._checkpoints[point.checkpoint.sha256] = point.checkpoint
        self.last = point
        self._resumed = True

    def _put(self, key: str, data: bytes | bytearray | memoryview) -> mf.ObjectRef:
        raw = bytes(data)
        self.target.put(key, raw)
        self.bytes_uploaded += len(raw)
        return mf.ObjectRef(key, mf.sha256(raw))

    def cycle(self) -> mf.Point:
        """Uploads what is new and returns the newest point (a new one if anything changed).

        Raises what the target or the directory raised (the caller retries later).
        """
        if not self._resumed:
            self._resume()
        if self.last is not None and not self.target.exists(self.last.key):
            logger.warning("backup: %s lost the newest point %s (the store was emptied or "
                           "replaced?): uploading everything again", self.target.name, self.last.key)
            self._forget()
        for _ in range(_TRIES):
            point = self._try()
            if point is not None:
                return point
        raise OSError(f"backup of {self.source.path}: checkpoints kept removing the files being "
                      f"copied ({_TRIES} tries in a row); trying again at the next cycle")

    def _read_checkpoint(self) -> bytes | None:
        try:
            return read_whole(self.source.storage, f"{self.source.path}/{CKPT_NAME}")
        except FileNotFoundError:
            return None

    def _try(self) -> mf.Point | None:
        """One attempt at a point; None when a checkpoint removed what it was reading."""
        s, path = self.source.storage, self.source.path
        ck_raw = self._read_checkpoint()
        ck = Checkpoint.decode(ck_raw) if ck_raw is not None else None
        if ck_raw is not None and ck is None:
            return None  # being replaced (never torn: a rename), or damaged: read it again
        # The time first: whatever was acknowledged by then is durable by the read that follows.
        observed = self.clock()
        number, end, seq = self.source.durable_end()
        start = ck.start_segment if ck is not None else 1
        try:
            meta = read_whole(s, f"{path}/meta").decode()
            epoch = read_whole(s, f"{path}/epoch").decode() if s.exists(f"{path}/epoch") else None
            segments = self._segments(start, number, end)
            blobs = self._upload_blobs()
        except FileNotFoundError:
            return None  # a checkpoint removed it: start over from the new checkpoint
        if self._read_checkpoint() != ck_raw and not sabotage.active.backup_no_recheck:
            return None  # its removals may have hit what was listed
        ck_ref = None
        if ck_raw is not None:
            digest = mf.sha256(ck_raw)
            ck_ref = self._checkpoints.get(digest)
            if ck_ref is None:
                ck_ref = self._put(f"checkpoints/{digest}", ck_raw)
                self._checkpoints[digest] = ck_ref
        last = self.last
        point = mf.Point(mf.FORMAT, observed, seq, meta, epoch, ck_ref, ck.end_seq if ck else 0,
                         tuple(segments), tuple(blobs))
        if last is not None and (last.position, last.checkpoint, last.segments, last.blobs, last.meta,
                                 last.epoch) == (seq, ck_ref, point.segments, point.blobs, meta, epoch):
            return last  # nothing new
        self._put(point.key, mf.encode(point))
        self._put(mf.NEWEST, mf.encode(point))
        self.last = point
        self.points_written += 1
        return point

    def _segments(self, start: int, newest: int, newest_end: int) -> list[mf.Segment]:
        s, log_dir = self.source.storage, f"{self.source.path}/log"
        numbers = sorted(int(n[:12]) for n in s.listdir(log_dir) if _SEG_NAME.fullmatch(n))
        numbers = [n for n in numbers if start <= n <= newest]
        headers: dict[int, SegmentHeader | None] = {}
        for n in numbers:
            fh = s.open(f"{log_dir}/{n:012d}.seg")
            try:
                headers[n] = SegmentHeader.decode(s.pread(fh, 512, 0))
            finally:
                s.close(fh)
        out: list[mf.Segment] = []
        for i, n in enumerate(numbers):
            h = headers[n]
            if n == newest:
                seg_end = newest_end
            else:
                # A sealed segment's batches end where the next segment that chains to it says.
                later = [headers[m] for m in numbers[i + 1:]]
                seg_end = next((x.prev_end for x in later if x is not None and x.prev_segment == n), -1)
            if h is None or seg_end < 0:
                continue  # no later segment chains to it: an open that wrote nothing (or never finished)
            out.append(self._upload_segment(n, h.life, seg_end))
        return out

    def _upload_segment(self, number: int, life: int, end: int) -> mf.Segment:
        chunks = self._chunks.setdefault((number, life), [])
        while chunks and chunks[-1].start >= end:
            chunks.pop()  # the log was cut (truncate_corrupt) before bytes uploaded earlier
        if chunks and chunks[-1].end > end:
            last = chunks.pop()
            chunks.append(self._chunk(number, life, last.start, end))
        done = chunks[-1].end if chunks else 0
        while done < end:
            upto = min(end, done + _PIECE)
            chunks.append(self._chunk(number, life, done, upto))
            done = upto
            # Merge like a binary counter: each byte is uploaded O(log n) times, a point lists
            # O(log n) chunks per segment.
            while (len(chunks) >= 2 and chunks[-1].end - chunks[-1].start >= chunks[-2].end - chunks[-2].start
                   and chunks[-1].end - chunks[-2].start <= _PIECE):
                b = chunks.pop()
                a = chunks.pop()
                chunks.append(self._chunk(number, life, a.start, b.end))
        return mf.Segment(number, life, end, tuple(chunks))

    def _chunk(self, number: int, life: int, start: int, end: int) -> mf.Chunk:
        s = self.source.storage
        fh = s.open(f"{self.source.path}/log/{number:012d}.seg")
        try:
            data = s.pread(fh, end - start, start)
        finally:
            s.close(fh)
        if len(data) != end - start:
            raise OSError(f"segment {number} of {self.source.path} holds fewer bytes than its "
                          f"durable end ({start + len(data)} < {end})")
        ref = self._put(mf.chunk_key(number, life, start, end), data)
        return mf.Chunk(start, end, ref)

    def _upload_blobs(self) -> list[mf.Blob]:
        s, blob_dir = self.source.storage, f"{self.source.path}/blobs"
        names = [n for n in s.listdir(blob_dir) if _BLOB_NAME.fullmatch(n)] if s.exists(blob_dir) else []
        out: list[mf.Blob] = []
        for name in names:
            ref = self._blobs.get(name)
            if ref is None:
                raw = read_whole(s, f"{blob_dir}/{name}")
                if decode_pack(raw) is None:
                    continue  # still being written: no durable batch references it yet
                ref = self._put(f"blobs/{name}", raw)
                self._blobs[name] = ref
            out.append(mf.Blob(name, ref))
        return out


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class BackupThread:
    """Runs an ``Uploader``'s cycles every ``interval`` seconds on a daemon thread of its own."""

    def __init__(self, uploader: Uploader, interval: float, *, retry_max: float = 30.0,
                 alert_after: float = 60.0) -> None:
        self.uploader = uploader
        self.interval = interval
        self.retry_max = retry_max
        self.alert_after = alert_after
        self.failures = 0
        self.last_error: str | None = None
        self._failing_since: float | None = None
        self._alerted_at = 0.0
        self._lags: collections.deque[float] = collections.deque(maxlen=1024)
        self._opened = uploader.clock()
        self._last: threading.Thread | None = None
        self._stop = threading.Event()
        self._cycle_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fusee-backup", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            if self.run_cycle():
                delay = self.interval
            else:
                delay = min(self.retry_max, max(0.1, self.interval) * 2 ** min(self.failures - 1, 16))

    def run_cycle(self) -> bool:
        """One cycle now (on the calling thread); whether it succeeded."""
        up = self.uploader
        with self._cycle_lock:
            before = up.last
            try:
                point = up.cycle()
            except Exception as e:  # any failure of the target or the read: retried with backoff
                self._failed(e)
                return False
        now = up.clock()
        if point is not before and point.position > (before.position if before else 0):
            # The oldest batch in it became durable after the previous point was observed.
            self._lags.append(max(0.0, now - (before.time if before else point.time)))
        if self.failures:
            logger.info("backup to %s works again after %d failed attempts", up.target.name, self.failures)
        self.failures = 0
        self.last_error = None
        self._failing_since = None
        return True

    def _failed(self, e: BaseException) -> None:
        up = self.uploader
        now = up.clock()
        self.failures += 1
        self.last_error = f"{type(e).__name__}: {e}"
        if self._failing_since is None:
            self._failing_since = now
        if self.failures == 1:
            logger.warning("backup to %s failed (%s); retrying with backoff", up.target.name, self.last_error)
        elif now - self._failing_since >= self.alert_after and now - self._alerted_at >= self.alert_after:
            self._alerted_at = now
            logger.error("backup to %s has failed for %.0f s (%d attempts; latest: %s): the target "
                         "falls behind the engine; the engine itself is not affected",
                         up.target.name, now - self._failing_since, self.failures, self.last_error)

    def status(self) -> BackupStatus:
        up = self.uploader
        last = up.last
        now = up.clock()
        position = last.position if last is not None else 0
        try:
            _, _, durable = up.source.durable_end()
        except Exception:  # pragma: no cover - a source that cannot tell
            durable = position
        lag = 0.0
        if durable > position:
            lag = max(0.0, now - (last.time if last is not None else self._opened))
        lags = list(self._lags)
        return BackupStatus(
            target=up.target.name, position=position, point_time=last.time if last else None,
            lag_s=lag, lag_p50_s=_percentile(lags, 0.5), lag_p99_s=_percentile(lags, 0.99),
            points=up.points_written, bytes_uploaded=up.bytes_uploaded, failures=self.failures,
            last_error=self.last_error)

    def stop(self, timeout: float) -> bool:
        """Stops the cycles, then runs a last one so that the target holds everything durable now;
        gives up after ``timeout`` seconds (returns whether the target is up to date)."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._thread.join(timeout)
        result: list[bool] = []
        if not self._thread.is_alive():
            last = self._last = threading.Thread(target=lambda: result.append(self.run_cycle()),
                                                 name="fusee-backup-last", daemon=True)
            last.start()
            last.join(max(0.0, deadline - time.monotonic()))
        if not result:
            logger.warning("backup to %s: an upload still runs after %.0f s at close; the target "
                           "lacks the latest records", self.uploader.target.name, timeout)
            return False
        if not result[0]:
            logger.warning("backup to %s: the last upload at close failed (%s); the target lacks "
                           "the latest records", self.uploader.target.name, self.last_error)
        return result[0]

    def release(self) -> None:
        """Closes the source, unless an upload still reads it (then it keeps its descriptor)."""
        if not (self._thread.is_alive() or (self._last is not None and self._last.is_alive())):
            self.uploader.source.close()
