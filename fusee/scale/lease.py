"""Leases: who owns an engine directory, under which epoch, and where it serves.

:class:`Lease` is the shape every place of ownership has (a local directory
here, a PostgreSQL table elsewhere); :class:`DirectoryLease` is the local one:
the directory's ``flock``. The kernel releases it when its process dies, so it
has no expiry: a stopped (SIGSTOP) owner keeps it, and nobody takes over
behind its back. Each new holder writes the next epoch durably before it
appends anything, so epochs only grow. The lock is on the directory's inode,
so the lease reads and writes its files through that opened directory, and
counts itself lost once the path names another directory (renamed, replaced
by a copy): the lease is over what others open by that path.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
from typing import Protocol, runtime_checkable

from fusee.storage.directory import bump_epoch, read_epoch
from fusee.storage.posix import PosixStorage, RootedPosixStorage

#: ``<dir>/owner``: where the current owner serves routed calls.
OWNER_FILE = "owner"


@runtime_checkable
class Lease(Protocol):
    """The right to write one engine directory (or shard set), held under an epoch.

    Only the holder appends; every new holder has a larger epoch than any before.
    """

    #: This holder's epoch (0 until acquired).
    epoch: int

    def try_acquire(self) -> bool:
        """Takes the lease if it is free (then writes the next epoch); never blocks."""
        ...

    def wait_acquire(self, stop: threading.Event) -> bool:
        """Blocks (in a thread) until the lease is taken (True) or ``stop`` is set (False)."""
        ...

    def still_held(self) -> bool:
        """The fencing check: whether this holder still holds the lease under its epoch."""
        ...

    def publish(self, address: str) -> None:
        """Tells others where this holder serves routed calls."""
        ...

    def owner_address(self) -> str | None:
        """Where the current holder said it serves (None: nobody said so yet)."""
        ...

    def release(self) -> None:
        """Gives the lease up (idempotent)."""
        ...


class DirectoryLease:
    """The local lease: an exclusive ``flock`` on the engine directory itself.

    ``adopt`` wraps a lock the engine's open already took; ``try_acquire`` and
    ``wait_acquire`` take it (a follower waiting for the owner to die). The
    lock's descriptor is handed to the engine that opens on it
    (:meth:`handover`): closing that engine releases the lease.
    """

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/") or "/"
        self.epoch = 0
        self._fd: int | None = None
        #: The locked directory, through which the epoch and the owner file are read and written.
        self._root: RootedPosixStorage | None = None
        self._handed_over = False
        self._mutex = threading.Lock()

    @classmethod
    def adopt(cls, path: str, fd: int, epoch: int) -> DirectoryLease:
        """The lease of an engine that opened the directory itself (``fd`` is its lock, now its)."""
        lease = cls(path)
        lease._fd, lease.epoch, lease._handed_over = fd, epoch, True
        lease._root = PosixStorage().root(lease.path, fd)
        return lease

    def _take(self, blocking: bool, stop: threading.Event | None = None) -> bool:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        if stop is not None and stop.is_set():
            os.close(fd)  # won after the waiter was told to stop: give it back, no epoch taken
            return False
        root = PosixStorage().root(self.path, fd)
        if root.moved() is not None:
            # Waited on a directory that was renamed (or replaced) meanwhile: its lock is not
            # the lease of what the path names now. Give it back; the caller tries the path again.
            os.close(fd)
            return False
        with self._mutex:
            self._fd, self._root = fd, root
            self.epoch = bump_epoch(root, self.path)
        return True

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        return self._take(blocking=False)

    def wait_acquire(self, stop: threading.Event) -> bool:
        """Blocks in ``flock`` (the kernel wakes us the moment the holder's process is gone);
        a lock won after ``stop`` was set is given back at once."""
        if self._fd is not None:
            return True
        while not stop.is_set():
            if self._take(blocking=True, stop=stop):
                return True
        return False

    def handover(self) -> int:
        """The lock's descriptor, for the engine that opens on it (it closes it at close)."""
        assert self._fd is not None, "handover of a lease not held"
        self._handed_over = True
        return self._fd

    def still_held(self) -> bool:
        """Whether the path still names the directory locked and its epoch is still ours (a
        ``flock`` cannot be taken from a live holder, so this fails only if someone renamed or
        replaced the directory, or removed or rewrote its epoch file)."""
        root = self._root
        if self._fd is None or root is None:
            return False
        try:
            return root.moved() is None and read_epoch(root, self.path) == self.epoch
        except Exception:
            return False

    def publish(self, address: str) -> None:
        """Writes ``<dir>/owner`` in the directory locked (atomically: a reader sees the old or
        the new content), never in another one that the path names now."""
        root = self._root
        assert root is not None, "publish of a lease not held"
        data = json.dumps({"epoch": self.epoch, "address": address, "pid": os.getpid()}).encode()
        tmp = f"{self.path}/{OWNER_FILE}.tmp"
        fh = root.open(tmp, create=True)
        try:
            root.truncate(fh, 0)
            root.pwrite(fh, data, 0)
        finally:
            root.close(fh)
        root.rename(tmp, f"{self.path}/{OWNER_FILE}")

    def owner_address(self) -> str | None:
        found = read_owner(self.path)
        return found[1] if found else None

    def release(self) -> None:
        with self._mutex:
            fd, self._fd = self._fd, None
            root, self._root = self._root, None
            if root is not None:
                root.release()
            if fd is not None and not self._handed_over:
                os.close(fd)


def read_owner(path: str) -> tuple[int, str, int] | None:
    """``(epoch, address, pid)`` from ``<path>/owner``, or None when there is none (or it is torn)."""
    try:
        with open(f"{path.rstrip('/') or '/'}/{OWNER_FILE}", "rb") as f:
            d = json.loads(f.read(4096))
        return int(d["epoch"]), str(d["address"]), int(d["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
