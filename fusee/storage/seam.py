"""The storage seam: every file operation the engine makes goes through a ``Storage``.

The log, checkpoints and blobs never call ``os`` directly, so the simulator can
put a simulated disk (``SimDisk``) under the unchanged log code. Paths are plain
strings; file handles are opaque values that only the storage that issued them
understands. Failures are ``OSError`` with a meaningful ``errno`` (``EIO`` for a
failed sync, ``ENOSPC`` for a full disk), exactly as the OS reports them, and
naming the file; a path that names something other than a regular file where a
file is opened raises ``NotARegularFile``.

An engine directory is used through a *rooted* storage (``Storage.root``): the
directory is opened once, and every path under it is resolved through that
open directory, not by name. A lock is on the directory's inode, so the writes
must go to that inode too: renaming the directory, or putting a copy in its
place, then cannot make two writers share one directory.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias

from fusee import sabotage

#: An open file, as issued by ``Storage.open``. Opaque to callers.
FileHandle: TypeAlias = Any
#: A held directory lock, as issued by ``Storage.lock``. Opaque to callers.
LockHandle: TypeAlias = Any


class Storage(Protocol):
    """A file system as the engine sees it.

    Writes become durable only once ``fdatasync`` of the file returned (and, for
    a file's name, once ``fsync_dir`` of its directory returned): a crash may
    lose or tear anything written since.
    """

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> FileHandle:
        """Opens ``path`` for reading and writing (creating it empty when ``create``).

        With ``exclusive`` the file must not exist yet (``FileExistsError`` otherwise).
        """
        ...

    def close(self, fh: FileHandle) -> None:
        """Releases the handle; unsynced writes stay in the cache."""
        ...

    def pwrite(self, fh: FileHandle, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Writes all of ``data`` at ``offset`` (extending the file if needed)."""
        ...

    def pread(self, fh: FileHandle, size: int, offset: int) -> bytes:
        """Reads up to ``size`` bytes at ``offset`` (fewer at the end of the file)."""
        ...

    def fdatasync(self, fh: FileHandle) -> None:
        """Makes the file's data (and its size) durable; raises ``OSError`` if it cannot."""
        ...

    def fsync_dir(self, path: str) -> None:
        """Makes the directory's entries (creations, renames, removals) durable."""
        ...

    def drop_cache(self, fh: FileHandle) -> None:
        """Drops the file's clean cached pages, so that reads come from the disk itself.

        After a failed fdatasync the kernel marks the pages clean although the
        disk may not hold them: only a read from the disk tells what survived.
        """
        ...

    def size(self, fh: FileHandle) -> int:
        """The file's current size in bytes."""
        ...

    def truncate(self, fh: FileHandle, size: int) -> None:
        """Cuts (or extends with zeros) the file to ``size`` bytes."""
        ...

    def preallocate(self, fh: FileHandle, size: int) -> None:
        """Reserves ``size`` bytes of zeros so later writes in range need no allocation."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically renames ``src`` to ``dst`` (replacing ``dst``)."""
        ...

    def remove(self, path: str) -> None:
        """Removes a file."""
        ...

    def listdir(self, path: str) -> list[str]:
        """Names in a directory, sorted."""
        ...

    def exists(self, path: str) -> bool:
        """Whether a file or directory exists at ``path``."""
        ...

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory."""
        ...

    def makedirs(self, path: str) -> None:
        """Creates a directory and its parents (no error if it exists)."""
        ...

    def lock(self, directory: str, *, shared: bool = False) -> LockHandle:
        """Locks the directory itself (not a file in it, which a cleanup job could delete).

        Exclusive for a writer, ``shared`` for a reader; creates nothing. Raises
        ``DirectoryLocked`` (naming the PID in ``<directory>/lock`` if any) when
        another holder's lock conflicts, including another open in this process.
        """
        ...

    def unlock(self, handle: LockHandle) -> None:
        """Releases a lock taken by ``lock``."""
        ...

    def held(self, directory: str) -> bool:
        """Whether a writer holds ``directory``'s lock now, found without taking or waiting for
        any lock (a read-only inspection must not delay a writer that opens meanwhile)."""
        ...

    def root(self, directory: str, lock: LockHandle | None = None) -> RootedStorage:
        """A storage in which every path under ``directory`` resolves inside the directory
        ``directory`` names now (the one ``lock`` locks, when given), whatever is renamed later.

        Without ``lock`` the directory is opened here (and closed by ``release``); with it,
        the lock's own hold on the directory is used, and must outlive the rooted storage.
        """
        ...


class RootedStorage(Storage, Protocol):
    """A storage pinned to one opened directory (see ``Storage.root``)."""

    def moved(self) -> str | None:
        """Why the directory's path no longer names the pinned directory (renamed, deleted,
        replaced), or None while it does."""
        ...

    def release(self) -> None:
        """Lets go of the pinned directory (idempotent); the storage must not be used after."""
        ...


def read_whole(storage: Storage, path: str) -> bytes:
    """The whole content of the file at ``path``."""
    fh = storage.open(path)
    try:
        return storage.pread(fh, storage.size(fh), 0)
    finally:
        storage.close(fh)


def write_durably(storage: Storage, directory: str, name: str, data: bytes) -> None:
    """Replaces ``directory/name`` with ``data`` atomically and durably.

    Temp file, fdatasync, rename, directory fsync: after a crash the file holds
    either the old or the new content, never a mix.
    """
    tmp = f"{directory}/{name}.tmp"
    fh = storage.open(tmp, create=True)
    try:
        storage.truncate(fh, 0)
        storage.pwrite(fh, data, 0)
        storage.fdatasync(fh)
    finally:
        storage.close(fh)
    storage.rename(tmp, f"{directory}/{name}")
    if not sabotage.active.skip_dir_fsync:
        storage.fsync_dir(directory)
