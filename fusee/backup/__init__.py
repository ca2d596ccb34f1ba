"""Backups of an engine directory: continuous (``Engine.open(..., backup=Backup(...))``), one-off
(``backup_once``, ``fusee backup``) and restore (``restore``, ``fusee restore``).

See docs/operations.md ("Backup and restore"). What is uploaded are the
directory's files as written (with a codec, its payloads stay encrypted); a
point is consistent (a checkpoint and the log up to one batch), so a restored
directory holds every record acknowledged up to the point and nothing after it.
"""

from __future__ import annotations

import copy
import datetime
import os
from typing import Any

from fusee.backup.parted import (
    PARTS_KEY,
    list_parted_points,
    mark_parted,
    part_target,
    parted_count,
    restore_parted,
)
from fusee.backup.restore import PointInfo, Restored, list_points
from fusee.backup.restore import restore as _restore
from fusee.backup.targets import LocalTarget, PrefixedTarget, Target, open_target
from fusee.backup.uploader import BackupStatus, BackupThread, Uploader
from fusee.durations import to_ms
from fusee.errors import BackupError
from fusee.storage.directory import read_meta
from fusee.storage.log import SharedLog
from fusee.storage.partsfile import part_path, read_parts
from fusee.storage.posix import PosixStorage, RootedPosixStorage

__all__ = [
    "Backup",
    "BackupStatus",
    "LocalTarget",
    "PointInfo",
    "Restored",
    "Target",
    "backup_once",
    "points",
    "restore",
]


class Backup:
    """Continuous backup of an engine's directory to ``target``, for ``Engine.open(backup=...)``.

    ``target``: a local directory path, an ``s3://bucket/prefix`` URL (``fusee[s3]``; options
    ``endpoint_url``, ``region``, ``access_key_id``, ``secret_access_key``, ``session_token``,
    else boto3's environment variables), or a :class:`Target`. Every ``interval`` what became
    durable is uploaded on a thread of the backup's own (never on the step path); a failed
    upload is retried with backoff up to ``retry_max`` apart, and reported (log, and
    ``Engine.metrics().backup``) once it has failed for ``alert_after``. ``close()`` uploads
    what is left, for at most ``close_timeout``.
    """

    def __init__(self, target: str | os.PathLike[str] | Target, interval: str | float = "1s", *,
                 retry_max: str | float = "30s", alert_after: str | float = "60s",
                 close_timeout: str | float = "30s", **options: Any) -> None:
        self.interval = _seconds(interval, "interval")
        self.retry_max = _seconds(retry_max, "retry_max")
        self.alert_after = _seconds(alert_after, "alert_after")
        self.close_timeout = _seconds(close_timeout, "close_timeout")
        if self.interval <= 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self.target = open_target(target, **options)

    def under(self, prefix: str) -> Backup:
        """The same backup (interval, retries, alerts) into the objects of this target under
        ``prefix`` (``"part-003/"``): one part's, inside a parted directory's target."""
        twin = copy.copy(self)
        twin.target = PrefixedTarget(self.target, prefix)
        return twin

    def start(self, log: SharedLog) -> BackupThread:
        """Starts backing up ``log``'s directory (the engine calls it once the log is open)."""
        storage = log.storage
        if not isinstance(storage, RootedPosixStorage):
            raise ValueError("backup= needs an engine directory on the disk (not an engine in "
                             "memory, a simulation or a PostgreSQL namespace)")
        try:
            parted = parted_count(self.target) is not None
        except OSError:
            parted = False  # the target is unreachable now: the uploads retry, and report it
        if parted:
            raise BackupError(f"the backup target {self.target.name} holds the backup of a directory "
                              "with parts: give each directory a target of its own")
        thread = BackupThread(Uploader(_EngineSource(log, storage.duplicate()), self.target),
                              self.interval, retry_max=self.retry_max, alert_after=self.alert_after)
        thread.start()
        return thread

    def __repr__(self) -> str:
        return f"Backup({self.target.name!r}, interval={self.interval}s)"


def _seconds(value: str | float, what: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return to_ms(value) / 1000


class _EngineSource:
    """A running engine's directory: read through a duplicate of its locked descriptor."""

    def __init__(self, log: SharedLog, storage: RootedPosixStorage) -> None:
        self.storage = storage
        self.path = log.dir.path
        self.durable_end = log.durable_end

    def close(self) -> None:
        self.storage.release()


class _DirectorySource:
    """A directory, closed or live, read through the read-only view: its end is where a read-only
    scan finds the valid batches end (a live writer may have written, not yet synced, the last)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path).rstrip("/") or "/"
        self.storage = PosixStorage().root(self.path)
        try:
            self.shards = read_meta(self.storage, self.path)
        except BaseException:
            self.storage.release()
            raise

    def durable_end(self) -> tuple[int, int, int]:
        log, _ = SharedLog.open(self.storage, self.path, self.shards, read_only=True)
        try:
            return log.durable_end()
        finally:
            log.close()

    def close(self) -> None:
        self.storage.release()


def backup_once(directory: str | os.PathLike[str], target: str | os.PathLike[str] | Target,
                **options: Any) -> PointInfo:
    """Takes one backup point of ``directory`` (closed, or open in another process: read through
    the read-only view, nothing is locked or written there) into ``target`` and returns it.
    Incremental: what the target holds already is not uploaded again."""
    from fusee.errors import NotAnEngineDirectory

    path = os.fspath(directory)
    parts = read_parts(path)
    if parts is not None:
        into = open_target(target, **options)
        mark_parted(into, parts)
        each = [backup_once(part_path(path, p), part_target(into, p)) for p in range(parts)]
        return PointInfo(PARTS_KEY, min(i.time for i in each), sum(i.position for i in each))
    if not os.path.isfile(os.path.join(path, "meta")):
        raise NotAnEngineDirectory(f"{path} is not an engine directory (no meta file): nothing to back up")
    source = _DirectorySource(path)
    try:
        point = Uploader(source, open_target(target, **options)).cycle()
    finally:
        source.close()
    return PointInfo(point.key, datetime.datetime.fromtimestamp(point.time, datetime.UTC), point.position)


def points(target: str | os.PathLike[str] | Target, **options: Any) -> list[PointInfo]:
    """The points ``target`` holds, oldest first (``restore`` takes their time or position); of a
    parted directory's target, every part's, each key with its part's folder (``part-003/``)."""
    into = open_target(target, **options)
    parts = parted_count(into)
    return list_points(into) if parts is None else list_parted_points(into, parts)


def restore(target: str | os.PathLike[str] | Target, directory: str | os.PathLike[str], *,
            at: datetime.datetime | float | None = None, position: int | None = None,
            **options: Any) -> Restored:
    """Rebuilds ``directory`` (new or empty) from ``target``: its newest point, the newest at or
    before ``at`` (a datetime or Unix time), or cut after the batch at ``position``. Opening it
    needs the codec keys of the records it holds. See :func:`fusee.backup.restore.restore`.

    The backup of a parted directory restores every part, each from its own newest point at or
    before ``at`` (the parts' points are not one cut across them: see docs/operations.md); a
    ``position`` names a batch of one part's log, so it is refused there (``ValueError``)."""
    into = open_target(target, **options)
    parts = parted_count(into)
    if parts is None:
        return _restore(into, directory, at=at, position=position)
    if position is not None:
        raise ValueError(f"{into.name} holds the backup of a directory of {parts} parts: each part's log "
                         "has positions of its own, so restore it with at= (a time), not position=")
    return restore_parted(into, parts, directory, at=at)
