"""A parted directory's layout on disk: the parts file, fixed at creation, and each part's directory.

    <dir>/parts          {"format": 1, "parts": N}, written once at creation
    <dir>/members/NNN    one slot per open process (fusee.scale.parts)
    <dir>/members/limits the limit changes ``set_limit`` made while processes have it open
    <dir>/part-NNN/      one engine directory per part

Here, below the engine, so that what reads or rebuilds a parted directory
without running it (a backup's restore) knows the layout the parts layer
(:mod:`fusee.scale.parts`) creates.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable

from fusee.errors import NotAnEngineDirectory

#: ``<dir>/parts``: the part count, fixed when the directory is created.
PARTS_FILE = "parts"
MEMBERS_DIR = "members"
#: ``<dir>/members/limits``: beside the member slots, since a change lasts only while members live.
LIMITS_FILE = "limits"
#: The most parts a directory may have.
MAX_PARTS = 256


def part_name(part: int) -> str:
    """The name of part ``part``'s directory inside a parted directory (and of its backup's folder)."""
    return f"part-{part:03d}"


def part_path(root: str, part: int) -> str:
    return f"{root}/{part_name(part)}"


def read_parts(root: str) -> int | None:
    """The part count of a parted directory ``root`` (None: not a parted directory)."""
    try:
        with open(f"{root}/{PARTS_FILE}", "rb") as f:
            data = json.loads(f.read(4096))
    except (FileNotFoundError, NotADirectoryError):
        return None  # not parted (or not a directory at all: the plain open says so)
    except (OSError, ValueError) as e:
        raise NotAnEngineDirectory(f"{root}/{PARTS_FILE} cannot be read ({e}): is this a Fusee directory?") from e
    n = data.get("parts") if isinstance(data, dict) else None
    if data.get("format") != 1 or not isinstance(n, int) or not 1 <= n <= MAX_PARTS:
        raise NotAnEngineDirectory(f"{root}/{PARTS_FILE} is not a parts file Fusee wrote: {data!r}")
    return n


def is_new_directory(root: str) -> bool:
    """Whether ``root`` holds no engine yet: missing, empty, or only what a parted directory's
    creation in progress leaves (another process creating it at this moment)."""
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return True
    return all(e in (MEMBERS_DIR, PARTS_FILE) or e.startswith(f"{PARTS_FILE}.tmp") for e in entries)


def create_parts(root: str, parts: int) -> int:
    """Makes ``root`` a parted directory of ``parts`` parts, or returns the count it already has.

    The parts file is written once, atomically and durably (temp file, fsync, link); two
    processes creating it at once agree on the first one's count."""
    if not isinstance(parts, int) or isinstance(parts, bool) or not 1 <= parts <= MAX_PARTS:
        raise ValueError(f"parts must be an int from 1 to {MAX_PARTS}, not {parts!r}")
    existing = read_parts(root)
    if existing is not None:
        return existing
    os.makedirs(root, exist_ok=True)
    # Another process creating it at the same moment leaves only these.
    entries = {e for e in os.listdir(root) if e not in (MEMBERS_DIR, PARTS_FILE)
               and not e.startswith(f"{PARTS_FILE}.tmp")}
    if entries:
        # Another process may have created the parts file (then its parts) between our first look
        # and the listing: the parts file is linked before any part exists, so it is there now.
        existing = read_parts(root)
        if existing is not None:
            return existing
        raise NotAnEngineDirectory(
            f"{root} already holds files an engine without parts wrote, or other files ({sorted(entries)[:3]}): "
            "parts= applies when a directory is created; open it without parts=, or use a new directory")
    tmp = f"{root}/{PARTS_FILE}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(json.dumps({"format": 1, "parts": parts}).encode())
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, f"{root}/{PARTS_FILE}")  # fails if another process created it first
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    n = read_parts(root)
    assert n is not None
    return n


def _members_dir(root: str) -> int:
    os.makedirs(f"{root}/{MEMBERS_DIR}", exist_ok=True)
    return os.open(f"{root}/{MEMBERS_DIR}", os.O_RDONLY | os.O_DIRECTORY)


def _read_at(dir_fd: int, name: str) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_limits_file(root: str) -> bytes | None:
    """The limit changes file's bytes (None: no change made, or not a parted directory)."""
    try:
        dir_fd = os.open(f"{root}/{MEMBERS_DIR}", os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        return _read_at(dir_fd, LIMITS_FILE)
    finally:
        os.close(dir_fd)


def update_limits_file(root: str, change: Callable[[bytes | None], bytes | None]) -> None:
    """Replaces the limit changes file with ``change(its bytes)`` (None removes it).

    Writers take turns on a lock file; readers see the old file or the new one whole (a rename),
    never a half-written one. Not fsynced: the changes end with the processes, so a power cut,
    which ends them all, needs none of it."""
    dir_fd = _members_dir(root)
    try:
        lock = os.open(f"{LIMITS_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=dir_fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            new = change(_read_at(dir_fd, LIMITS_FILE))
            if new is None:
                try:
                    os.unlink(LIMITS_FILE, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
                return
            tmp = f"{LIMITS_FILE}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=dir_fd)
            with os.fdopen(fd, "wb") as f:
                f.write(new)
            os.replace(tmp, LIMITS_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            os.close(lock)
    finally:
        os.close(dir_fd)
