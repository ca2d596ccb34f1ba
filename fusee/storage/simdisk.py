"""``SimDisk``: an in-memory disk with a volatile cache and the crash model of DESIGN §9.

Used by the storage tests and by the simulator. Every write lands in a cache
(what reads see) and reaches the "platter" only through a successful
``fdatasync``; names reach it only through ``fsync_dir``. Two kinds of crash:
``crash_process()`` kills the process only (its handles and locks go, the
page cache stays: unsynced writes remain readable, and may still be lost
later); ``power_loss()`` (and ``crash()``, both at once) decides, from the
seeded ``rng``, what each unsynced write left behind:

* per 512-byte sector: written, dropped, or torn (a prefix of the new bytes
  followed by garbage, so partial sectors happen);
* a file that grew may come back at its old size, its new size or in between,
  and garbage may appear just past its old end;
* directory operations since the directory's last fsync survive as a prefix,
  in order (like a journaling file system): a new or renamed file may vanish
  or keep its old name.

A failed ``fdatasync`` (random at ``fail_flush_rate``, or forced with
``fail_next_fdatasync``) resolves the covered sectors the same way at once and
marks them clean, as Linux does: a later successful sync does not bring them
back, although reads still show the new bytes until the next crash.

No threads, no real I/O, no clock: the same rng seed gives the same disk.
Directories are created durable at once (the engine makes them at setup).
It is not thread-safe; the log touches storage from one thread at a time.

A lock belongs to a directory, not to its name, and ``root`` pins a directory
as an open descriptor does: outside hands (``move_dir``, ``copy_dir``,
``remove_dir``: an operator's ``mv``, ``cp -a`` and ``rm -r``, each durable at
once, as if followed by ``sync``) change which directory a path names, never
where a pinned storage writes.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import posixpath
import random
from typing import Any

from fusee.errors import DirectoryLocked, NotARegularFile
from fusee.storage.seam import FileHandle, LockHandle

SECTOR = 512


class ProcessKilled(Exception):
    """Raised by every call of a process the disk killed in the middle of an fdatasync (see ``arm_kills``)."""


class _Inode:
    __slots__ = ("data", "dirty", "disk", "serial")

    def __init__(self, serial: int) -> None:
        self.serial = serial
        self.data = bytearray()  # what reads see (cache)
        self.disk = bytearray()  # what is surely on the platter
        self.dirty: set[int] = set()  # sectors written since the last sync


@dataclasses.dataclass(eq=False)
class _Dir:
    #: The directory's identity (its inode number): locks and pins follow it, not its name.
    serial: int = 0
    durable: dict[str, _Inode] = dataclasses.field(default_factory=dict)
    current: dict[str, _Inode] = dataclasses.field(default_factory=dict)
    # ("link", name, inode) | ("unlink", name, None) | ("rename", src, dst)
    pending: list[tuple[str, str, object]] = dataclasses.field(default_factory=list)


class _Handle:
    __slots__ = ("inode", "open", "path")

    def __init__(self, path: str, inode: _Inode) -> None:
        self.path = path
        self.inode = inode
        self.open = True


@dataclasses.dataclass
class SimDiskStats:
    """What the disk was asked to do (for reports and tests)."""

    writes: int = 0
    bytes_written: int = 0
    fdatasyncs: int = 0
    failed_fdatasyncs: int = 0
    dir_fsyncs: int = 0
    enospc: int = 0
    crashes: int = 0
    power_losses: int = 0
    kills: int = 0
    sectors_kept: int = 0
    sectors_dropped: int = 0
    sectors_torn: int = 0


class SimDisk:
    """An in-memory ``Storage`` whose unsynced writes a ``crash()`` may lose or tear."""

    def __init__(self, rng: random.Random, *, fail_flush_rate: float = 0.0, tear: bool = True,
                 pid: int = 4242) -> None:
        assert 0.0 <= fail_flush_rate <= 1.0
        self.rng = rng
        self.fail_flush_rate = fail_flush_rate
        #: Whether a crash may tear sectors (else each is written or dropped whole).
        self.tear = tear
        #: The PID the simulated process reports as lock holder.
        self.pid = pid
        self.stats = SimDiskStats()
        self._dir_serials = itertools.count(1)
        self._dirs: dict[str, _Dir] = {"/": _Dir(next(self._dir_serials))}
        self._handles: list[_Handle] = []
        self._locks: dict[int, tuple[str, int]] = {}  # directory serial -> (mode, holders)
        self._serials = itertools.count(1)
        self._fail_next = 0
        self._space_left: int | None = None
        #: Kills inside fdatasync: (rng, rate) from ``arm_kills``; only while ``kill_armed``.
        self._kills: tuple[random.Random, float] | None = None
        self.kill_armed = False
        #: The process died inside an fdatasync: its later calls raise ``ProcessKilled``.
        self.killed = False

    # --- fault injection ------------------------------------------------------

    def fail_next_fdatasync(self, count: int = 1) -> None:
        """Makes the next ``count`` fdatasyncs fail with ``EIO``."""
        self._fail_next += count

    def arm_kills(self, rng: random.Random, rate: float) -> None:
        """Lets an fdatasync made while ``kill_armed`` kill the process (chance ``rate``) before it syncs.

        The write it should have synced stays in the page cache, readable by the
        next process; the dead process's later calls raise ``ProcessKilled``
        and change nothing. The owner then calls ``crash_process``.
        """
        self._kills = (rng, rate)

    def _alive(self) -> None:
        if self.killed:
            raise ProcessKilled("the process was killed inside an fdatasync")

    def set_space_left(self, nbytes: int | None) -> None:
        """Lets files grow by ``nbytes`` more in total before writes fail with ``ENOSPC`` (None: no limit)."""
        self._space_left = nbytes

    def crash(self) -> None:
        """The process dies and the power goes with it: ``crash_process`` then ``power_loss``."""
        self.crash_process()
        self.power_loss()

    def crash_process(self) -> None:
        """The process dies; the machine stays up.

        Its handles and locks are gone, but the page cache is not: unsynced
        data and names stay readable (and dirty), and a later ``power_loss``
        may still drop or tear them, whoever reads them meanwhile.
        """
        self.stats.crashes += 1
        self.killed = False
        for h in self._handles:
            h.open = False
        self._handles.clear()
        self._locks.clear()

    def power_loss(self, *, drop_all: bool = False) -> None:
        """The machine loses power: unsynced data and names are resolved per the crash model.

        Reads afterwards see only what survived. ``drop_all`` makes the worst
        case certain (every unsynced write and name is lost), for tests.
        """
        self.stats.power_losses += 1
        seen: set[int] = set()
        for dpath in sorted(self._dirs):
            d = self._dirs[dpath]
            for name in sorted(set(d.current) | set(d.durable)):
                for inode in (d.current.get(name), d.durable.get(name)):
                    if inode is not None and inode.serial not in seen:
                        seen.add(inode.serial)
                        self._settle(inode, crash=True, drop_all=drop_all)
            keep = 0 if drop_all else self.rng.randint(0, len(d.pending))
            names = dict(d.durable)
            for op in d.pending[:keep]:
                _apply(names, op)
            d.durable = names
            d.current = dict(names)
            d.pending.clear()
        for h in self._handles:
            h.open = False
        self._handles.clear()
        self._locks.clear()

    # --- Storage --------------------------------------------------------------

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> FileHandle:
        self._alive()
        d, name = self._parent(path)
        inode = d.current.get(name)
        if inode is not None and exclusive:
            raise FileExistsError(errno.EEXIST, "file exists", path)
        if inode is None and _norm(path) in self._dirs:
            raise NotARegularFile(path, "a directory")
        create = create or exclusive
        if inode is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            inode = _Inode(next(self._serials))
            op = ("link", name, inode)
            d.pending.append(op)
            _apply(d.current, op)
        h = _Handle(path, inode)
        self._handles.append(h)
        return h

    def close(self, fh: FileHandle) -> None:
        h = self._live(fh)
        h.open = False
        self._handles.remove(h)

    def pwrite(self, fh: FileHandle, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._alive()
        h = self._live(fh)
        inode = h.inode
        n = len(data)
        if n == 0:
            return
        self._grow(inode, offset + n, h.path)
        inode.data[offset:offset + n] = data
        inode.dirty.update(range(offset // SECTOR, (offset + n - 1) // SECTOR + 1))
        self.stats.writes += 1
        self.stats.bytes_written += n

    def pread(self, fh: FileHandle, size: int, offset: int) -> bytes:
        return bytes(self._live(fh).inode.data[offset:offset + size])

    def fdatasync(self, fh: FileHandle) -> None:
        self._alive()
        inode = self._live(fh).inode
        self.stats.fdatasyncs += 1
        if self.kill_armed and self._kills is not None and self._kills[0].random() < self._kills[1]:
            self.killed = True
            self.stats.kills += 1
            self._alive()
        fail = False
        if self._fail_next > 0:
            self._fail_next -= 1
            fail = True
        elif self.fail_flush_rate > 0.0 and self.rng.random() < self.fail_flush_rate:
            fail = True
        if fail:
            self.stats.failed_fdatasyncs += 1
            # The kernel marks the pages clean anyway: what reached the disk is now fixed.
            self._settle(inode, crash=False)
            raise OSError(errno.EIO, "simulated fdatasync failure", fh.path)
        size = len(inode.data)
        if len(inode.disk) != size:
            del inode.disk[size:]
            inode.disk.extend(bytes(size - len(inode.disk)))
        for s in inode.dirty:
            lo = s * SECTOR
            inode.disk[lo:lo + SECTOR] = inode.data[lo:lo + SECTOR]
        inode.dirty.clear()

    def fsync_dir(self, path: str) -> None:
        self._alive()
        d = self._dir(path)
        self.stats.dir_fsyncs += 1
        d.durable = dict(d.current)
        d.pending.clear()

    def drop_cache(self, fh: FileHandle) -> None:
        self._alive()
        inode = self._live(fh).inode
        if not inode.dirty and inode.data != inode.disk:  # clean pages are re-read from the platter
            inode.data[:] = inode.disk

    def size(self, fh: FileHandle) -> int:
        return len(self._live(fh).inode.data)

    def truncate(self, fh: FileHandle, size: int) -> None:
        self._alive()
        h = self._live(fh)
        inode = h.inode
        old = len(inode.data)
        if size > old:
            self._grow(inode, size, h.path)
        else:
            del inode.data[size:]
            if self._space_left is not None:
                self._space_left += old - size
        # The sector holding the new end changes on disk too (zeros past it).
        inode.dirty.add(size // SECTOR)

    def preallocate(self, fh: FileHandle, size: int) -> None:
        self._alive()
        h = self._live(fh)
        inode = h.inode
        if size > len(inode.data):
            self._grow(inode, size, h.path)

    def rename(self, src: str, dst: str) -> None:
        self._alive()
        d, a = self._parent(src)
        d2, b = self._parent(dst)
        assert d is d2, "SimDisk renames only within one directory"
        if a not in d.current:
            raise FileNotFoundError(errno.ENOENT, "no such file", src)
        op = ("rename", a, b)
        d.pending.append(op)
        _apply(d.current, op)

    def remove(self, path: str) -> None:
        self._alive()
        d, name = self._parent(path)
        inode = d.current.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        op = ("unlink", name, None)
        d.pending.append(op)
        _apply(d.current, op)
        if self._space_left is not None and inode not in d.current.values():
            self._space_left += len(inode.data)

    def listdir(self, path: str) -> list[str]:
        d = self._dir(path)
        p = _norm(path)
        subdirs = [posixpath.basename(q) for q in self._dirs if q != p and posixpath.dirname(q) == p]
        return sorted([*d.current, *subdirs])

    def exists(self, path: str) -> bool:
        p = _norm(path)
        if p in self._dirs:
            return True
        parent = self._dirs.get(posixpath.dirname(p))
        return parent is not None and posixpath.basename(p) in parent.current

    def is_dir(self, path: str) -> bool:
        return _norm(path) in self._dirs

    def makedirs(self, path: str) -> None:
        p = _norm(path)
        while p not in self._dirs:
            self._dirs[p] = _Dir(next(self._dir_serials))
            p = posixpath.dirname(p)

    def lock(self, directory: str, *, shared: bool = False) -> LockHandle:
        # Like flock on the directory: deleting or replacing a file in it changes nothing, and
        # the lock stays with the directory when it is renamed. The handle is its serial.
        p = _norm(directory)
        key = self._dir(p).serial
        held = self._locks.get(key)
        if held is not None and (not shared or held[0] != "shared"):
            raise DirectoryLocked(p, self.pid)
        self._locks[key] = ("shared" if shared else "exclusive", 1 + (held[1] if held else 0))
        return key

    def unlock(self, handle: LockHandle) -> None:
        held = self._locks.pop(handle, None)
        if held is not None and held[1] > 1:
            self._locks[handle] = (held[0], held[1] - 1)

    def held(self, directory: str) -> bool:
        held = self._locks.get(self._dir(directory).serial)
        return held is not None and held[0] == "exclusive"

    def root(self, directory: str, lock: LockHandle | None = None) -> SimRoot:
        """See ``Storage.root``: pins the directory ``lock`` locks, else the one ``directory`` names."""
        d = self._dir(directory) if lock is None else self._by_serial(lock)
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "the locked directory is gone", directory)
        return SimRoot(self, directory, d)

    # --- outside hands (an operator's mv, cp -a, rm -r) ------------------------

    def move_dir(self, src: str, dst: str) -> None:
        """``mv src dst`` of a directory (durable at once): its locks, open files and pins go with it."""
        a, b = _norm(src), _norm(dst)
        assert a in self._dirs and b not in self._dirs and posixpath.dirname(b) in self._dirs
        moved = {p: d for p, d in self._dirs.items() if p == a or p.startswith(a + "/")}
        for p in moved:
            del self._dirs[p]
        for p, d in moved.items():
            self._dirs[b + p[len(a):]] = d

    def copy_dir(self, src: str, dst: str) -> None:
        """``cp -a src dst`` (then ``sync``): new directories and files holding what reads of
        ``src`` see now; no lock, and durable at once."""
        a, b = _norm(src), _norm(dst)
        assert a in self._dirs and b not in self._dirs and posixpath.dirname(b) in self._dirs
        for p in sorted(q for q in self._dirs if q == a or q.startswith(a + "/")):
            names = {}
            for name, inode in sorted(self._dirs[p].current.items()):
                copy = _Inode(next(self._serials))
                copy.data = bytearray(inode.data)
                copy.disk = bytearray(inode.data)
                names[name] = copy
            self._dirs[b + p[len(a):]] = _Dir(next(self._dir_serials), durable=dict(names), current=names)

    def remove_dir(self, path: str) -> None:
        """``rm -r path`` (durable at once): files still open stay usable, as on Linux."""
        a = _norm(path)
        for p in [q for q in self._dirs if q == a or q.startswith(a + "/")]:
            del self._dirs[p]

    # --- inspection (tests) ---------------------------------------------------

    def worst_case_image(self) -> SimDisk:
        """A new disk holding what surely survives a power loss now: every unsynced write and
        name lost (``power_loss(drop_all=True)`` on a copy, without copying the page cache)."""
        image = SimDisk(random.Random(0), tear=self.tear, pid=self.pid)
        image._dirs = {}
        inodes: dict[int, _Inode] = {}
        for path, d in self._dirs.items():
            names: dict[str, _Inode] = {}
            for name, inode in d.durable.items():
                copy = inodes.get(inode.serial)
                if copy is None:
                    copy = inodes[inode.serial] = _Inode(inode.serial)
                    copy.disk = bytearray(inode.disk)
                    copy.data = bytearray(inode.disk)
                names[name] = copy
            image._dirs[path] = _Dir(d.serial, durable=names, current=dict(names))
        # New files and directories of the image take serials none of the copied ones has
        # (without drawing from this disk's counters, which would change its own run).
        image._serials = itertools.count(1 + max(inodes, default=0) + (1 << 40))
        image._dir_serials = itertools.count(1 + max((d.serial for d in image._dirs.values()), default=0) + (1 << 40))
        return image

    def durable_bytes(self, path: str) -> bytes | None:
        """What surely survives a crash for the file at ``path`` (None if its name may not)."""
        d, name = self._parent(path)
        inode = d.durable.get(name)
        return None if inode is None else bytes(inode.disk)

    def corrupt(self, path: str, offset: int, xor: int = 0x01) -> None:
        """Flips bits of one byte, both in the cache and on the platter (bit rot)."""
        d, name = self._parent(path)
        inode = d.current[name]
        inode.data[offset] ^= xor
        if offset < len(inode.disk):
            inode.disk[offset] ^= xor

    # --- internals ------------------------------------------------------------

    def _grow(self, inode: _Inode, end: int, path: str) -> None:
        delta = end - len(inode.data)
        if delta <= 0:
            return
        if self._space_left is not None:
            if delta > self._space_left:
                self.stats.enospc += 1
                raise OSError(errno.ENOSPC, "simulated disk full", path)
            self._space_left -= delta
        inode.data.extend(bytes(delta))

    def _settle(self, inode: _Inode, *, crash: bool, drop_all: bool = False) -> None:
        """Decides the fate of every unsynced write of ``inode`` (into ``disk``; also ``data`` on a crash)."""
        rng = self.rng
        old, cur = len(inode.disk), len(inode.data)
        size = old
        if drop_all:
            inode.dirty.clear()
            inode.data = bytearray(inode.disk)
            return
        if cur != old:
            choice = rng.randrange(3)
            size = old if choice == 0 else cur if choice == 1 else rng.randint(min(old, cur), max(old, cur))
        disk = inode.disk
        if size < old:
            del disk[size:]
        elif size > old:
            disk.extend(bytes(size - old))
            if rng.random() < 0.5:  # stale blocks may show up past the old end of file
                n = min(size - old, rng.randint(1, 4 * SECTOR))
                disk[old:old + n] = rng.randbytes(n)
        for s in sorted(inode.dirty):
            lo = s * SECTOR
            hi = min(lo + SECTOR, size)
            if lo >= hi:
                continue
            new = bytes(inode.data[lo:hi]).ljust(hi - lo, b"\0")
            fate = rng.randrange(3 if self.tear else 2)
            if fate == 0:
                disk[lo:hi] = new
                self.stats.sectors_kept += 1
            elif fate == 1:
                self.stats.sectors_dropped += 1
            else:
                cut = rng.randint(0, hi - lo)
                disk[lo:hi] = new[:cut] + rng.randbytes(hi - lo - cut)
                self.stats.sectors_torn += 1
        inode.dirty.clear()
        if crash:
            inode.data = bytearray(disk)

    def _live(self, fh: FileHandle) -> _Handle:
        assert isinstance(fh, _Handle), f"not a SimDisk file handle: {fh!r}"
        if not fh.open:
            raise OSError(errno.EBADF, "file handle is closed (or its process crashed)", fh.path)
        return fh

    def _dir(self, path: str) -> _Dir:
        d = self._dirs.get(_norm(path))
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return d

    def _parent(self, path: str) -> tuple[_Dir, str]:
        p = _norm(path)
        return self._dir(posixpath.dirname(p)), posixpath.basename(p)

    def _by_serial(self, serial: int) -> _Dir | None:
        return next((d for d in self._dirs.values() if d.serial == serial), None)

    def _path_of(self, d: _Dir) -> str | None:
        """Where the directory is now (None: removed)."""
        return next((p for p, q in self._dirs.items() if q is d), None)


class SimRoot:
    """A ``SimDisk`` pinned to one directory (``Storage.root``): paths under ``path`` resolve
    inside that directory wherever it is now, as through an open descriptor."""

    def __init__(self, disk: SimDisk, path: str, anchor: _Dir) -> None:
        self.disk = disk
        self.path = _norm(path)
        self._anchor = anchor

    def __getattr__(self, name: str) -> Any:
        # The same disk: its fault injection and inspection (fail_next_fdatasync, stats, pid...).
        return getattr(self.disk, name)

    def _real(self, path: str) -> str:
        p = _norm(path)
        if p != self.path and not p.startswith(self.path.rstrip("/") + "/"):
            return path
        dirs = self.disk._dirs
        if dirs.get(self.path) is self._anchor:
            return p  # not moved: the path names it
        now = self.disk._path_of(self._anchor)
        if now is None:
            raise FileNotFoundError(errno.ENOENT, "the directory was removed", path)
        return now + p[len(self.path):] if self.path != "/" else now + p

    def moved(self) -> str | None:
        if self.disk._dirs.get(self.path) is self._anchor:
            return None
        if self.path in self.disk._dirs:
            return (f"{self.path} no longer names the directory this engine locked: it was renamed "
                    "or deleted and another directory (a copy, say) was put in its place")
        return f"{self.path} no longer exists: the directory was renamed or deleted"

    def release(self) -> None:
        pass

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> FileHandle:
        return self.disk.open(self._real(path), create=create, exclusive=exclusive)

    def close(self, fh: FileHandle) -> None:
        self.disk.close(fh)

    def pwrite(self, fh: FileHandle, data: bytes | bytearray | memoryview, offset: int) -> None:
        self.disk.pwrite(fh, data, offset)

    def pread(self, fh: FileHandle, size: int, offset: int) -> bytes:
        return self.disk.pread(fh, size, offset)

    def fdatasync(self, fh: FileHandle) -> None:
        self.disk.fdatasync(fh)

    def fsync_dir(self, path: str) -> None:
        self.disk.fsync_dir(self._real(path))

    def drop_cache(self, fh: FileHandle) -> None:
        self.disk.drop_cache(fh)

    def size(self, fh: FileHandle) -> int:
        return self.disk.size(fh)

    def truncate(self, fh: FileHandle, size: int) -> None:
        self.disk.truncate(fh, size)

    def preallocate(self, fh: FileHandle, size: int) -> None:
        self.disk.preallocate(fh, size)

    def rename(self, src: str, dst: str) -> None:
        self.disk.rename(self._real(src), self._real(dst))

    def remove(self, path: str) -> None:
        self.disk.remove(self._real(path))

    def listdir(self, path: str) -> list[str]:
        return self.disk.listdir(self._real(path))

    def exists(self, path: str) -> bool:
        try:
            return self.disk.exists(self._real(path))
        except FileNotFoundError:
            return False

    def is_dir(self, path: str) -> bool:
        try:
            return self.disk.is_dir(self._real(path))
        except FileNotFoundError:
            return False

    def makedirs(self, path: str) -> None:
        self.disk.makedirs(self._real(path))

    def lock(self, directory: str, *, shared: bool = False) -> LockHandle:
        return self.disk.lock(self._real(directory), shared=shared)

    def unlock(self, handle: LockHandle) -> None:
        self.disk.unlock(handle)

    def held(self, directory: str) -> bool:
        return self.disk.held(self._real(directory))

    def root(self, directory: str, lock: LockHandle | None = None) -> SimRoot:
        return self.disk.root(self._real(directory), lock)


def _norm(path: str) -> str:
    return posixpath.normpath(posixpath.join("/", path))


def _apply(names: dict[str, _Inode], op: tuple[str, str, object]) -> None:
    kind, a, b = op
    if kind == "link":
        assert isinstance(b, _Inode)
        names[a] = b
    elif kind == "unlink":
        names.pop(a, None)
    else:
        assert isinstance(b, str)
        inode = names.pop(a, None)
        if inode is not None:
            names[b] = inode
