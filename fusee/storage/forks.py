"""What a forked child does with the descriptors it copied from the parent's engines: it lets go.

A ``fork`` copies every descriptor but no thread. A child that outlives the
parent (a gunicorn ``--preload`` worker, a Celery prefork process, a
``multiprocessing`` worker started with ``fork``) would otherwise keep the
directory's ``flock`` (it belongs to the open file description both share),
the owner's sockets and its PostgreSQL sessions, and anything it wrote through
them would land in the parent's files or sessions. Each holder registers here
how to find what it holds; in the child, right after the fork, each of those
descriptors is pointed at ``/dev/null``: the number stays valid (nothing in
the child closes a number it reused) but names nothing of the parent's.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

#: Each live holder and how to list the descriptors it holds (read in the child, one thread).
_HOLDERS: weakref.WeakKeyDictionary[Any, Callable[[Any], Iterable[int]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def hold(holder: Any, descriptors: Callable[[Any], Iterable[int]]) -> None:
    """Registers ``holder`` (kept weakly): in a forked child, ``descriptors(holder)`` are let go."""
    with _lock:
        _HOLDERS[holder] = descriptors


def release(holder: Any) -> None:
    """``holder`` holds nothing any more (it was closed)."""
    with _lock:
        _HOLDERS.pop(holder, None)


def _numbers() -> list[int]:
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return [int(name) for name in os.listdir(listing)]
        except (OSError, ValueError):
            continue
    return []


def files_under(directory: str) -> set[int]:
    """This process's descriptors of ``directory`` and of the files in it (Linux: by their
    paths; elsewhere the directory's own descriptor, which carries the lock)."""
    try:
        root = os.path.realpath(directory)
        st = os.stat(root)
    except OSError:
        return set()
    found: set[int] = set()
    for fd in _numbers():
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = None
        if target is not None:
            if target == root or target.startswith(root + os.sep):
                found.add(fd)
            continue
        try:
            fst = os.fstat(fd)
        except OSError:
            continue
        if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino):
            found.add(fd)
    return found


def let_go(fds: Iterable[int]) -> None:
    """Points each descriptor at /dev/null (opened read-only: a write through it fails)."""
    fds = set(fds)
    if not fds:
        return
    try:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for fd in fds:
            if fd != null and fd >= 0:
                try:
                    os.dup2(null, fd, inheritable=False)
                except OSError:
                    pass  # already closed: nothing held
    finally:
        os.close(null)


def _after_fork_in_child() -> None:
    # The child has one thread: no holder changes while it is read.
    fds: set[int] = set()
    for holder, descriptors in list(_HOLDERS.items()):
        try:
            fds.update(descriptors(holder))
        except Exception:
            continue  # a holder half closed in the parent: it holds what it still listed
    _HOLDERS.clear()
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by a thread that is not here
    let_go(fds)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
