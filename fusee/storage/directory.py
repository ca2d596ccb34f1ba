"""The engine directory: its layout, its lock and its meta file.

::

    <dir>/lock          exclusive lock (flock), holds the owner's PID
    <dir>/meta          format version and shard count (fixed at creation)
    <dir>/checkpoint    the latest checkpoint
    <dir>/log/          log segments, NNNNNNNNNNNN.seg
    <dir>/blobs/        large records, <life>-<n>.blob
"""

from __future__ import annotations

import json

from fusee import sabotage
from fusee.errors import ShardCountMismatch, StorageError
from fusee.storage.seam import LockHandle, Storage, read_whole, write_durably

#: The layout and log format this code writes (the original's "format 3": one shared log).
FORMAT = 3


class EngineDirectory:
    """A locked engine directory whose meta file agrees with the caller's shard count."""

    def __init__(self, storage: Storage, path: str, lock: LockHandle, shards: int) -> None:
        self.storage = storage
        self.path = path.rstrip("/") or "/"
        self.shards = shards
        self._lock: LockHandle | None = lock

    @property
    def log_dir(self) -> str:
        return f"{self.path}/log"

    @property
    def blob_dir(self) -> str:
        return f"{self.path}/blobs"

    @classmethod
    def open(cls, storage: Storage, path: str, shards: int) -> EngineDirectory:
        """Creates the directory if needed, takes its lock and checks (or writes) its meta file.

        Raises ``DirectoryLocked`` if another process (or another open in this
        one) holds it, ``ShardCountMismatch`` if it was created with another
        shard count.
        """
        if shards < 1:
            raise ValueError(f"shards must be at least 1, not {shards}")
        path = path.rstrip("/") or "/"
        storage.makedirs(path)
        lock = storage.lock(f"{path}/lock")
        try:
            d = cls(storage, path, lock, shards)
            d._setup()
        except BaseException:
            storage.unlock(lock)
            raise
        return d

    def _setup(self) -> None:
        s = self.storage
        created = False
        for sub in (self.log_dir, self.blob_dir):
            if not s.exists(sub):
                s.makedirs(sub)
                created = True
        if created and not sabotage.active.skip_dir_fsync:
            s.fsync_dir(self.path)
        meta_path = f"{self.path}/meta"
        if not s.exists(meta_path):
            meta = {"format": FORMAT, "shards": self.shards}
            write_durably(s, self.path, "meta", json.dumps(meta).encode())
            return
        try:
            meta = json.loads(read_whole(s, meta_path))
            fmt, shards = int(meta["format"]), int(meta["shards"])
        except (ValueError, KeyError, TypeError) as e:
            raise StorageError(
                f"{meta_path} is not a Fusee meta file ({e}): is {self.path} an engine directory?"
            ) from None
        if fmt != FORMAT:
            raise StorageError(
                f"{self.path} holds storage format {fmt}; this version of Fusee reads format {FORMAT}"
            )
        if shards != self.shards:
            raise ShardCountMismatch(
                f"{self.path} was created with {shards} shards and cannot be opened with {self.shards}: "
                f"the shard count is fixed at creation. Open it with shards={shards}."
            )

    def close(self) -> None:
        """Releases the lock (idempotent)."""
        if self._lock is not None:
            self.storage.unlock(self._lock)
            self._lock = None
