"""Rebuilding an engine directory from a backup point, as of its time or cut at a position.

The directory is assembled under a temporary name beside the destination, every
object checked against the sha256 its point recorded, then opened read-only
(the log's own recovery checks every batch's crc and chain), and only then
renamed into place: a restore that fails leaves no half directory behind.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil

from fusee.backup import manifest as mf
from fusee.backup.targets import Target
from fusee.errors import BackupCorrupted, BackupError, NoBackupPoint, StorageError
from fusee.storage.batch import BatchHeader, SegmentHeader, align_up
from fusee.storage.directory import read_meta
from fusee.storage.log import SharedLog, newest_note
from fusee.storage.posix import PosixStorage


@dataclasses.dataclass(frozen=True)
class Restored:
    """What ``restore`` rebuilt."""

    directory: str
    #: The position (batch seq) of the last batch the directory holds.
    position: int
    #: When the point restored from was taken (UTC).
    time: datetime.datetime
    #: The point's key in the target.
    point: str
    #: A parted directory's parts, each as restored (then ``position`` is their sum, ``time``
    #: the oldest of their points' and ``point`` the target's parts marker).
    parts: tuple[Restored, ...] = ()


@dataclasses.dataclass(frozen=True)
class PointInfo:
    """A point in a backup target, as its key names it (nothing is downloaded)."""

    key: str
    time: datetime.datetime
    position: int


def list_points(target: Target) -> list[PointInfo]:
    """The target's points, oldest first."""
    out = []
    for key in target.list(mf.POINTS):
        if not key.endswith(".json"):
            continue
        try:
            position = int(key[:-5].rsplit("-", 1)[1])
            when = mf.key_time(key)
        except (ValueError, IndexError):
            continue  # not ours
        out.append(PointInfo(key, datetime.datetime.fromtimestamp(when, datetime.UTC), position))
    return out


def _get(target: Target, ref: mf.ObjectRef) -> bytes:
    try:
        data = target.get(ref.key)
    except FileNotFoundError:
        raise BackupCorrupted(f"{target.name} lacks {ref.key}, which the point needs: restore an "
                              "earlier point (--at or --position)") from None
    if mf.sha256(data) != ref.sha256:
        raise BackupCorrupted(f"{target.name}: {ref.key} does not match the checksum its point "
                              "recorded (damaged in the store): restore an earlier point")
    return data


def _choose(target: Target, at: datetime.datetime | float | None, position: int | None) -> mf.Point:
    points = list_points(target)
    if not points:
        raise NoBackupPoint(f"{target.name} holds no backup point (no backup was taken there yet, "
                            "or it is another target)")
    if at is not None:
        ts = at.timestamp() if isinstance(at, datetime.datetime) else float(at)
        earlier = [p for p in points if p.time.timestamp() <= ts]
        if not earlier:
            raise NoBackupPoint(f"{target.name} holds no point at or before {_show(ts)}: the oldest "
                                f"is from {points[0].time.isoformat()}")
        chosen = earlier[-1]
        return mf.decode(_get_raw(target, chosen.key), chosen.key)
    if position is None:
        return mf.decode(_get_raw(target, points[-1].key), points[-1].key)
    # The newest point that holds the position and whose checkpoint was written no later.
    for info in reversed(points):
        if info.position < position:
            break
        point = mf.decode(_get_raw(target, info.key), info.key)
        if point.checkpoint_position <= position:
            return point
    newest = points[-1].position
    raise NoBackupPoint(f"{target.name} holds no point from which position {position} can be "
                        f"restored (the newest holds up to {newest}; a position before a "
                        "checkpoint's needs a point taken before that checkpoint)")


def _get_raw(target: Target, key: str) -> bytes:
    try:
        return target.get(key)
    except FileNotFoundError:
        raise BackupCorrupted(f"{target.name} lacks {key}, which it just listed") from None


def _show(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()


def _write(path: str, data: bytes, size: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if size is not None and size > len(data):
            os.ftruncate(fd, size)  # zeros after the last batch, at the size the log created it with
        os.fsync(fd)
    finally:
        os.close(fd)


def new_destination(directory: str | os.PathLike[str]) -> str:
    """``directory`` as an absolute path, which must be new or empty (``BackupError`` otherwise)."""
    dest = os.path.abspath(os.fspath(directory))
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise BackupError(f"{dest} exists and is not an empty directory: restore into a new one "
                          "(nothing was changed)")
    return dest


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut(data: bytes, h: SegmentHeader, position: int) -> int:
    """Where the batches of a segment with seq up to ``position`` end."""
    off = h.align
    while off + 40 <= len(data):
        bh = BatchHeader.decode(data, off)
        if bh is None or bh.seq > position:
            break
        off += align_up(bh.length, h.align)
    return min(off, len(data))


def restore(target: Target, directory: str | os.PathLike[str], *,
            at: datetime.datetime | float | None = None, position: int | None = None) -> Restored:
    """Rebuilds ``directory`` (new, or empty) from the newest point of ``target``, or the newest
    taken at or before ``at``, or cut after the batch at ``position``.

    The directory then opens like any other: it holds every batch up to the point and nothing
    after it. Raises ``NoBackupPoint``, ``BackupCorrupted`` (an object missing or damaged in
    the target), ``BackupError`` (the destination is not empty).
    """
    if at is not None and position is not None:
        raise ValueError("give at= or position=, not both")
    if position is not None and (not isinstance(position, int) or position < 0):
        raise ValueError(f"position must be an int ≥ 0, not {position!r}")
    dest = new_destination(directory)
    point = _choose(target, at, position)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{dest}.restoring-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "log"))
    os.makedirs(os.path.join(tmp, "blobs"))
    try:
        last = _assemble(target, point, tmp, position)
        shards = read_meta(PosixStorage(), tmp)
        try:
            log, _ = SharedLog.open(PosixStorage(), tmp, shards, read_only=True)
        except StorageError as e:
            raise BackupCorrupted(f"the directory restored from {point.key} of {target.name} does "
                                  f"not open: {e}") from None
        try:
            got = log.durable_end()[2]
        finally:
            log.close()
        if got != last:
            raise BackupCorrupted(f"the directory restored from {point.key} of {target.name} ends "
                                  f"at position {got}, not {last}: the backup is damaged")
        if os.path.isdir(dest):
            os.rmdir(dest)
        os.rename(tmp, dest)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Restored(dest, last, datetime.datetime.fromtimestamp(point.time, datetime.UTC), point.key)


def _assemble(target: Target, point: mf.Point, tmp: str, position: int | None) -> int:
    """Writes the point's files under ``tmp``; returns the position the log ends at."""
    _write(os.path.join(tmp, "meta"), point.meta.encode())
    if point.epoch is not None:
        _write(os.path.join(tmp, "epoch"), point.epoch.encode())
    if point.checkpoint is not None:
        _write(os.path.join(tmp, "checkpoint"), _get(target, point.checkpoint))
    end_position = point.position if position is None else min(position, point.position)
    newest = 0
    for i, seg in enumerate(point.segments):
        data = bytearray()
        for chunk in seg.chunks:
            if chunk.start != len(data):
                raise BackupCorrupted(f"{point.key}: the chunks of segment {seg.number} leave a gap")
            body = _get(target, chunk.ref)
            if len(body) != chunk.end - chunk.start:
                raise BackupCorrupted(f"{target.name}: {chunk.ref.key} holds {len(body)} bytes, "
                                      f"not {chunk.end - chunk.start}")
            data += body
        if len(data) < seg.end:
            raise BackupCorrupted(f"{point.key}: segment {seg.number} has {len(data)} of its {seg.end} bytes")
        del data[seg.end:]
        h = SegmentHeader.decode(bytes(data[:512]))
        if h is None:
            raise BackupCorrupted(f"{target.name}: segment {seg.number}'s header is damaged")
        if position is not None:
            if i > 0 and h.base_seq > position:
                break  # it starts after the cut
            del data[_cut(bytes(data), h, position):]
        _write(os.path.join(tmp, "log", f"{seg.number:012d}.seg"), bytes(data), h.size or None)
        newest = seg.number
    if newest:
        _write(os.path.join(tmp, "log", "newest"), newest_note(newest))
    for blob in point.blobs:
        _write(os.path.join(tmp, "blobs", blob.name), _get(target, blob.ref))
    for sub in ("log", "blobs", ""):
        fsync_dir(os.path.join(tmp, sub) if sub else tmp)
    return end_position
