"""Backups of an engine directory: continuous (``Engine.open(..., backup=Backup(...))``), one-off
(``backup_once``, ``fusee backup``) and restore (``restore``, ``fusee restore``).

See docs/operations.md ("Backup and restore"). What is uploaded are the
directory's files as written (with a codec, its payloads stay encrypted); a
point is consistent (a checkpoint and the log up to one batch), so a restored
directory holds every record acknowledged up to the point and nothing after it.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from fusee.backup.restore import PointInfo, Restored, list_points
from fusee.backup.restore import restore as _restore
from fusee.backup.targets import LocalTarget, Target, open_target
from fusee.backup.uploader import BackupStatus, BackupThread, Uploader
from fusee.durations import to_ms
from fusee.storage.directory import read_meta
from fusee.storage.log import SharedLog
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

    def start(self, log: SharedLog) -> BackupThread:
        """Starts backing up ``log``'s directory (the engine calls it once the log is open)."""
        storage = log.storage
        if not isinstance(storage, RootedPosixStorage):
            raise ValueError("backup= needs an engine directory on the disk (not an engine in "
                             "memory, a simulation or a PostgreSQL namespace)")
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
    if not os.path.isfile(os.path.join(path, "meta")):
        raise NotAnEngineDirectory(f"{path} is not an engine directory (no meta file): nothing to back up")
    source = _DirectorySource(path)
    try:
        point = Uploader(source, open_target(target, **options)).cycle()
    finally:
        source.close()
    return PointInfo(point.key, datetime.datetime.fromtimestamp(point.time, datetime.UTC), point.position)


def points(target: str | os.PathLike[str] | Target, **options: Any) -> list[PointInfo]:
    """The points ``target`` holds, oldest first (``restore`` takes their time or position)."""
    return list_points(open_target(target, **options))


def restore(target: str | os.PathLike[str] | Target, directory: str | os.PathLike[str], *,
            at: datetime.datetime | float | None = None, position: int | None = None,
            **options: Any) -> Restored:
    """Rebuilds ``directory`` (new or empty) from ``target``: its newest point, the newest at or
    before ``at`` (a datetime or Unix time), or cut after the batch at ``position``. Opening it
    needs the codec keys of the records it holds. See :func:`fusee.backup.restore.restore`."""
    return _restore(open_target(target, **options), directory, at=at, position=position)
