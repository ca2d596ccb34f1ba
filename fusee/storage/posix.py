"""``PosixStorage``: the storage seam on the real file system (``os`` calls, ``flock``).

An engine directory is used through ``PosixStorage.root``: the directory is opened
once (``O_DIRECTORY``) and every path under it is opened, renamed, removed and
listed relative to that descriptor (``dir_fd=``). The lock is a ``flock`` on the
same inode, so whatever later happens to the directory's *name* (``mv data
data.old && cp -a data.old data``), a writer only ever writes into the directory
it locked, and ``moved()`` tells it that the path now names another one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from fusee.errors import DirectoryLocked, NotARegularFile
from fusee.storage.seam import FileHandle, LockHandle

#: Zeros written per call when preallocating: big enough to be fast, small
#: enough not to hold much memory.
_ZERO_CHUNK = bytes(1 << 20)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: Errors ``open`` gives for a path that names a directory, a socket or a device.
_NOT_A_FILE = (errno.EISDIR, errno.ENXIO, errno.ENODEV)


class PosixStorage:
    """The real disk. File handles are OS file descriptors.

    ``preallocate`` writes real zeros (not ``fallocate``): on ext4 a write into
    an unwritten extent still commits metadata at ``fdatasync``, which measured
    ~50 µs slower per sync than writing into zeroed blocks. Every ``OSError``
    names the file it is about.
    """

    def __init__(self) -> None:
        # Descriptor -> path, only to name the file in an I/O error (an fd alone names nothing).
        self._names: dict[int, str] = {}

    def _at(self, path: str) -> tuple[int | None, str]:
        """The directory descriptor ``path`` is relative to (None: the working directory) and the rest."""
        return None, path

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> FileHandle:
        d, rel = self._at(path)
        # O_NONBLOCK: a FIFO put where a file should be must not block the open (it is refused below).
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0)
        if exclusive:
            flags |= os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(rel, flags, 0o644, dir_fd=d)
        except OSError as e:
            if e.errno in _NOT_A_FILE:
                self._refuse_special(path, d, rel)
            # Read-only inspection of a directory we may not write (or a read-only mount).
            if create or exclusive or e.errno not in (errno.EACCES, errno.EROFS):
                raise _named(e, path) from None
            try:
                fd = os.open(rel, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=d)
            except OSError as e2:
                raise _named(e2, path) from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise NotARegularFile(path, _kind(mode))
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        self._names[fd] = path
        return fd

    def _refuse_special(self, path: str, d: int | None, rel: str) -> None:
        try:
            mode = os.stat(rel, dir_fd=d).st_mode
        except OSError:
            return
        if not stat.S_ISREG(mode):
            raise NotARegularFile(path, _kind(mode))

    def close(self, fh: FileHandle) -> None:
        self._names.pop(fh, None)
        os.close(fh)

    def pwrite(self, fh: FileHandle, data: bytes | bytearray | memoryview, offset: int) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.pwrite(fh, view, offset)
                view = view[n:]
                offset += n
        except OSError as e:
            raise self._of(e, fh) from None

    def pread(self, fh: FileHandle, size: int, offset: int) -> bytes:
        parts = []
        try:
            while size > 0:
                chunk = os.pread(fh, size, offset)
                if not chunk:
                    break
                parts.append(chunk)
                size -= len(chunk)
                offset += len(chunk)
        except OSError as e:
            raise self._of(e, fh) from None
        return b"".join(parts)

    def fdatasync(self, fh: FileHandle) -> None:
        try:
            os.fdatasync(fh)
        except OSError as e:
            raise self._of(e, fh) from None

    def fsync_dir(self, path: str) -> None:
        d, rel = self._at(path)
        try:
            fd = os.open(rel, _DIR_FLAGS, dir_fd=d)
        except OSError as e:
            raise _named(e, path) from None
        try:
            os.fsync(fd)
        except OSError as e:
            raise _named(e, path) from None
        finally:
            os.close(fd)

    def drop_cache(self, fh: FileHandle) -> None:
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fh, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError as e:
                raise self._of(e, fh) from None

    def size(self, fh: FileHandle) -> int:
        try:
            return os.fstat(fh).st_size
        except OSError as e:
            raise self._of(e, fh) from None

    def truncate(self, fh: FileHandle, size: int) -> None:
        try:
            os.ftruncate(fh, size)
        except OSError as e:
            raise self._of(e, fh) from None

    def preallocate(self, fh: FileHandle, size: int) -> None:
        offset = self.size(fh)
        while offset < size:
            n = min(len(_ZERO_CHUNK), size - offset)
            self.pwrite(fh, memoryview(_ZERO_CHUNK)[:n], offset)
            offset += n

    def rename(self, src: str, dst: str) -> None:
        d1, r1 = self._at(src)
        d2, r2 = self._at(dst)
        try:
            os.replace(r1, r2, src_dir_fd=d1, dst_dir_fd=d2)
        except OSError as e:
            raise _named(e, src, dst) from None

    def remove(self, path: str) -> None:
        d, rel = self._at(path)
        try:
            os.unlink(rel, dir_fd=d)
        except OSError as e:
            raise _named(e, path) from None

    def listdir(self, path: str) -> list[str]:
        d, rel = self._at(path)
        try:
            # A descriptor of our own: listing through a shared one would share its offset.
            fd = os.open(rel, _DIR_FLAGS, dir_fd=d)
        except OSError as e:
            raise _named(e, path) from None
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        d, rel = self._at(path)
        try:
            os.stat(rel, dir_fd=d)
        except (OSError, ValueError):
            return False
        return True

    def is_dir(self, path: str) -> bool:
        d, rel = self._at(path)
        try:
            return stat.S_ISDIR(os.stat(rel, dir_fd=d).st_mode)
        except (OSError, ValueError):
            return False

    def makedirs(self, path: str) -> None:
        d, rel = self._at(path)
        if d is None:
            os.makedirs(path, exist_ok=True)
            return
        parts = [p for p in rel.split("/") if p and p != "."]
        for i in range(len(parts)):
            sub = "/".join(parts[:i + 1])
            try:
                os.mkdir(sub, dir_fd=d)
            except FileExistsError:
                if not stat.S_ISDIR(os.stat(sub, dir_fd=d).st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", path) from None
            except OSError as e:
                raise _named(e, path) from None

    def lock(self, directory: str, *, shared: bool = False) -> LockHandle:
        """A ``flock`` on the directory's own descriptor.

        Deleting or replacing the ``lock`` file (which only tells others our
        PID) cannot release it. ``flock`` belongs to the open file description,
        so a second open of the same directory inside this process is refused too.
        """
        d, rel = self._at(directory)
        fd = os.open(rel, _DIR_FLAGS, dir_fd=d)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DirectoryLocked(directory, self._read_pid(directory)) from None
            raise
        return fd

    def unlock(self, handle: LockHandle) -> None:
        os.close(handle)

    def held(self, directory: str) -> bool:
        """Reads the kernel's table of locks (``/proc/locks``) for a write ``flock`` on the
        directory's inode; where there is no such table, whether the PID in its ``lock``
        file is a live process (a crashed writer's PID may have been reused: a guess)."""
        d, rel = self._at(directory)
        st = os.stat(rel, dir_fd=d)
        try:
            with open("/proc/locks") as f:
                table = f.read()
        except OSError:
            pid = self._read_pid(directory)
            if pid is None:
                return False
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in table.splitlines():
            # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (blocked waiters start with "->")
            parts = line.split()
            if "->" in parts:
                continue
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5] == inode:
                return True
        return False

    def root(self, directory: str, lock: LockHandle | None = None) -> RootedPosixStorage:
        """See ``Storage.root``: ``lock`` is a descriptor from ``lock`` (or a lease's)."""
        if lock is not None:
            return RootedPosixStorage(directory, lock, owns=False)
        d, rel = self._at(directory)
        try:
            fd = os.open(rel, _DIR_FLAGS, dir_fd=d)
        except OSError as e:
            raise _named(e, directory) from None
        return RootedPosixStorage(directory, fd, owns=True)

    def _read_pid(self, directory: str) -> int | None:
        d, rel = self._at(directory)
        try:
            fd = os.open(os.path.join(rel, "lock"), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=d)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return int(os.read(fd, 32).decode().strip())
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def _of(self, error: OSError, fh: FileHandle) -> OSError:
        name = self._names.get(fh)
        return error if name is None else _named(error, name)


class RootedPosixStorage(PosixStorage):
    """``PosixStorage`` pinned to one opened directory: paths under ``path`` resolve through it."""

    def __init__(self, path: str, fd: int, *, owns: bool) -> None:
        super().__init__()
        self.path = path.rstrip("/") or "/"
        self._prefix = "/" if self.path == "/" else self.path + "/"
        self._fd: int | None = fd
        self._owns = owns
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)
        # The check by name: absolute, so that a later chdir of the process changes nothing.
        self._abs = os.path.abspath(self.path)

    def _at(self, path: str) -> tuple[int | None, str]:
        fd = self._fd
        assert fd is not None, f"the rooted storage of {self.path} was released"
        if path == self.path:
            return fd, "."
        if path.startswith(self._prefix):
            return fd, path[len(self._prefix):]
        return None, path

    def moved(self) -> str | None:
        """Whether the path still names the directory opened (a stat: about a microsecond)."""
        try:
            st = os.stat(self._abs)
        except OSError as e:
            return f"{self._abs} no longer exists ({e.strerror}): the directory was renamed or deleted"
        if (st.st_dev, st.st_ino) != self._ident:
            return (f"{self._abs} no longer names the directory this engine locked: it was renamed or "
                    "deleted and another directory (a copy, say) was put in its place")
        return None

    def duplicate(self) -> RootedPosixStorage:
        """A second rooted storage on the same opened directory, released on its own (a reader on
        another thread keeps its own descriptor: none is closed or reused under it). Its
        descriptor is opened anew through this one, not ``dup``'ed: a ``flock`` belongs to an open
        file description, and the copy must not keep the directory locked after its owner let go."""
        assert self._fd is not None, f"the rooted storage of {self.path} was released"
        fd = os.open(".", _DIR_FLAGS, dir_fd=self._fd)
        return RootedPosixStorage(self.path, fd, owns=True)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and self._owns:
            os.close(fd)


def _named(error: OSError, path: str, other: str | None = None) -> OSError:
    """``error`` naming ``path`` as the engine knows it (through a descriptor the OS names
    nothing, or only the part of the path below the directory)."""
    if error.filename == path and error.filename2 == other:
        return error
    if other is None:
        return type(error)(error.errno, error.strerror, path)
    return type(error)(error.errno, error.strerror, path, None, other)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a special file"
