"""The engine directory: its layout, its lock and its meta file.

::

    <dir>/lock          the owner's PID (for the DirectoryLocked message only)
    <dir>/meta          format version and shard count (fixed at creation)
    <dir>/checkpoint    the latest checkpoint
    <dir>/log/          log segments, NNNNNNNNNNNN.seg, ``newest`` (the newest segment's number)
                        and ``durable`` (the last batch made durable: see fusee.storage.log)
    <dir>/blobs/        large records, <life>-<n>.blob (one pack per batch)
    <dir>/epoch         the number of owners the directory had (each writes it + 1, durably,
                        before it appends: see fusee.scale)
    <dir>/owner         where the current owner serves routed calls (fusee.scale), if it does

The lock is a ``flock`` on the directory itself, so deleting ``lock`` cannot
let a second writer in. Everything in the directory is then read and written
through the directory opened once (``Storage.root``), never by name: a
rename or a restored copy of the directory cannot make two writers share one,
and the owner learns of it (``moved``). A read-only open takes no lock: it reads what the
append-only log holds, even while a writer has the directory open, also through
one opened directory. A directory is ours only if it holds our meta file:
anything else that is not empty is refused untouched.
"""

from __future__ import annotations

import json
import os
import posixpath

from fusee import sabotage
from fusee.errors import (
    DirectoryMoved,
    InvalidMeta,
    NotAnEngineDirectory,
    ShardCountMismatch,
    StaleEpoch,
    StorageError,
)
from fusee.storage.seam import LockHandle, RootedStorage, Storage, write_durably

#: The layout and log format this code writes (the original's "format 3": one shared log).
FORMAT = 3
#: The most shards a directory may have: a bound on what a meta file may make us allocate.
MAX_SHARDS = 4096
#: A meta file is a few dozen bytes; anything much larger is not ours.
MAX_META_BYTES = 4096
META = "meta"
EPOCH = "epoch"
#: What an interrupted creation may leave in a directory that has no meta file yet.
_CREATION_LEFTOVERS = frozenset({"meta.tmp", "epoch", "epoch.tmp"})


class EngineDirectory:
    """A locked engine directory whose meta file agrees with the caller's shard count."""

    def __init__(self, storage: RootedStorage, path: str, lock: LockHandle, shards: int,
                 read_only: bool = False, *, locker: Storage | None = None) -> None:
        #: The directory as opened (every path under ``path`` resolves inside it).
        self.storage = storage
        # Who issued the lock (it releases it).
        self._locker = locker if locker is not None else storage
        self.path = path.rstrip("/") or "/"
        self.shards = shards
        self.read_only = read_only
        #: Opened read-only while a writer holds the directory (its log may grow meanwhile).
        self.live = False
        self._lock: LockHandle | None = lock
        #: This owner's epoch (0: the open did not take one, e.g. read-only or in a simulation).
        self.epoch = 0
        self._bump_epoch = False
        self._closed = False

    @property
    def log_dir(self) -> str:
        return f"{self.path}/log"

    @property
    def blob_dir(self) -> str:
        return f"{self.path}/blobs"

    @classmethod
    def open(cls, storage: Storage, path: str, shards: int, *, read_only: bool = False,
             lock: LockHandle | None = None, epoch: int | bool = False) -> EngineDirectory:
        """Creates the directory if needed, takes its lock and checks (or writes) its meta file.

        Raises ``NotAnEngineDirectory`` for a file, or a non-empty directory
        without our meta file (nothing in it is touched), ``DirectoryLocked``
        if another process (or another open in this one) holds it,
        ``ShardCountMismatch`` if it was created with another shard count,
        ``InvalidMeta`` if its meta file is damaged. ``read_only`` writes
        nothing at all and takes no lock: the directory must exist and be an engine
        directory, and may be held by a live writer (then ``live`` is True).
        ``lock``: the directory's lock, already taken by the caller (a lease won by
        waiting); it is released on failure as one taken here would be. ``epoch``:
        True writes the next epoch (the previous + 1) durably before anything else
        is written; an int records an epoch the caller's lease already wrote.
        """
        if not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an int from 1 to {MAX_SHARDS}, not {shards!r}")
        path = path.rstrip("/") or "/"
        if storage.exists(path) and not storage.is_dir(path):
            raise NotAnEngineDirectory(
                f"{path} is a file, not a directory: give Engine.open the path of a directory "
                "(a new one is created)")
        if not storage.exists(path):
            if read_only:
                raise NotAnEngineDirectory(f"{path} does not exist: there is no engine directory to read")
            storage.makedirs(path)
            parent = posixpath.dirname(path)
            if parent and not sabotage.active.skip_dir_fsync:
                storage.fsync_dir(parent)  # the new directory's name survives a crash
        if read_only and not sabotage.active.read_only_locks:
            # No lock at all: a reader must neither be refused by a live writer nor keep one
            # from opening. The log is append-only, so what a scan reads stays true.
            root = storage.root(path)
            try:
                d = cls(root, path, None, shards, read_only)
                d._setup()
                d.live = root.held(path)
            except BaseException:
                root.release()
                raise
            return d
        if lock is None:
            lock = storage.lock(path, shared=read_only)
        try:
            root = storage.root(path, lock)
            try:
                why = root.moved()
                if why is not None:
                    # A lease won by waiting on a directory that was renamed meanwhile (or a
                    # rename between the lock and now): the path names another directory.
                    raise DirectoryMoved(f"{why}. The lock taken is on the other one: nothing was "
                                         f"written. Open {path} again.")
                d = cls(root, path, lock, shards, read_only, locker=storage)
                if epoch is True:
                    d._bump_epoch = True
                elif epoch:
                    d.epoch = int(epoch)
                d._setup()
            except BaseException:
                root.release()
                raise
        except BaseException:
            storage.unlock(lock)
            raise
        return d

    def _setup(self) -> None:
        s = self.storage
        names = set(s.listdir(self.path))
        if META not in names:
            if names - _CREATION_LEFTOVERS:
                raise NotAnEngineDirectory(self._foreign_message(names))
            if self.read_only:
                raise NotAnEngineDirectory(
                    f"{self.path} is empty: it holds no engine directory (nothing was written)")
            # Meta first: a directory with our meta file and nothing else is a valid empty engine.
            meta = {"format": FORMAT, "shards": self.shards}
            write_durably(s, self.path, META, json.dumps(meta).encode())
        else:
            shards = read_meta(s, self.path)
            if shards != self.shards:
                raise ShardCountMismatch(
                    f"{self.path} was created with {shards} shards (its meta file says so) and cannot be "
                    f"opened with {self.shards}: the shard count is fixed at creation. "
                    f"Open it with shards={shards}, or without shards= to use the directory's own count."
                )
        if self.read_only:
            return
        if self._bump_epoch:
            self.epoch = bump_epoch(s, self.path)
        created = False
        for sub in (self.log_dir, self.blob_dir):
            if not s.exists(sub):
                s.makedirs(sub)
                created = True
        if created and not sabotage.active.skip_dir_fsync:
            s.fsync_dir(self.path)
        # Only tells a second opener who holds the directory: never synced, never read back by us.
        pid = getattr(s, "pid", None) or os.getpid()  # a SimDisk plays a process of its own
        fh = s.open(f"{self.path}/lock", create=True)
        try:
            s.truncate(fh, 0)
            s.pwrite(fh, f"{pid}\n".encode(), 0)
        finally:
            s.close(fh)

    def _foreign_message(self, names: set[str]) -> str:
        ours = {"log", "checkpoint", "blobs"} & names
        if ours:
            return (
                f"{self.path} has no meta file but holds {', '.join(sorted(ours))}: its meta file was "
                "lost or deleted. Nothing was changed. Restore meta from a backup, or write it by hand "
                f'as {{"format": {FORMAT}, "shards": N}} with the shard count the directory was '
                "created with (a wrong count misreads the log)."
            )
        shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
        return (
            f"{self.path} is not an engine directory: it is not empty ({shown}) and has no Fusee meta "
            "file. Nothing in it was changed. Give Engine.open a new or empty directory."
        )

    def moved(self) -> str | None:
        """Why the path no longer names the directory opened (renamed, deleted, replaced by a
        copy), or None while it does. What is written goes into the directory opened anyway."""
        return self.storage.moved()

    def close(self) -> None:
        """Releases the opened directory and the lock (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.storage.release()
        if self._lock is not None:
            self._locker.unlock(self._lock)
            self._lock = None


def read_meta(storage: Storage, path: str) -> int:
    """The shard count the meta file of the engine directory ``path`` records.

    Raises ``InvalidMeta`` (naming the file) when it is damaged, too large, or
    holds a format or shard count this version cannot use.
    """
    meta_path = f"{path.rstrip('/') or '/'}/{META}"
    fh = storage.open(meta_path)
    try:
        size = storage.size(fh)
        if size > MAX_META_BYTES:
            raise InvalidMeta(f"{meta_path} holds {size} bytes, not a Fusee meta file (a few dozen bytes)")
        raw = storage.pread(fh, size, 0)
    finally:
        storage.close(fh)
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise InvalidMeta(f"{meta_path} is not a Fusee meta file: it is not JSON ({e})") from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    shards = meta.get("shards") if isinstance(meta, dict) else None
    if type(fmt) is not int:
        raise InvalidMeta(f'{meta_path} is not a Fusee meta file: no integer "format" in {raw[:100]!r}')
    if fmt != FORMAT:
        raise StorageError(
            f"{path} holds storage format {fmt}; this version of Fusee reads format {FORMAT}"
        )
    if type(shards) is not int or not 1 <= shards <= MAX_SHARDS:
        raise InvalidMeta(
            f'{meta_path} is damaged: "shards" must be an integer from 1 to {MAX_SHARDS}, '
            f"found {shards!r}. Restore it from a backup or rewrite it with the directory's shard count."
        )
    return shards


def read_epoch(storage: Storage, path: str) -> int:
    """The epoch ``path/epoch`` holds (0: none yet). Raises ``InvalidMeta`` when it is damaged."""
    f = f"{path.rstrip('/') or '/'}/{EPOCH}"
    if not storage.exists(f):
        return 0
    fh = storage.open(f)
    try:
        raw = storage.pread(fh, 64, 0)
    finally:
        storage.close(fh)
    try:
        value = int(raw.decode().strip())
    except (UnicodeDecodeError, ValueError):
        raise InvalidMeta(f"{f} is damaged: it should hold one integer, found {raw[:40]!r}. "
                          "Write the highest epoch you know (or a large number) into it") from None
    if value < 0:
        raise InvalidMeta(f"{f} holds a negative epoch ({value}); write a positive number into it")
    return value


def bump_epoch(storage: Storage, path: str) -> int:
    """Writes the next epoch (the previous + 1) durably and returns it; call it holding the lock.

    Epochs never go back: a reader that saw epoch N knows every owner after it has a larger one.
    """
    path = path.rstrip("/") or "/"
    previous = read_epoch(storage, path)
    epoch = previous + 1
    data = f"{epoch}\n".encode()
    if sabotage.active.epoch_not_durable:
        fh = storage.open(f"{path}/{EPOCH}", create=True)  # in place, never synced: a power loss undoes it
        try:
            storage.truncate(fh, 0)
            storage.pwrite(fh, data, 0)
        finally:
            storage.close(fh)
        return epoch
    write_durably(storage, path, EPOCH, data)
    if read_epoch(storage, path) != epoch:  # pragma: no cover - a file system that lost a rename
        raise StaleEpoch(f"{path}/{EPOCH} does not hold the epoch {epoch} just written durably")
    return epoch


def existing_shards(storage: Storage, path: str) -> int | None:
    """The shard count of the engine directory at ``path`` if it has a readable meta file, else None."""
    path = path.rstrip("/") or "/"
    try:
        if storage.is_dir(path) and storage.exists(f"{path}/{META}"):
            return read_meta(storage, path)
    except (StorageError, OSError):
        pass  # opening the directory reports it clearly
    return None

