"""The local lease (the directory's flock) and the epoch it writes."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

import fusee
from fusee.errors import InvalidMeta
from fusee.scale.lease import DirectoryLease, Lease, read_owner
from fusee.scale.server import socket_address
from fusee.storage.directory import bump_epoch, read_epoch
from fusee.storage.posix import PosixStorage


def test_the_directory_lease_is_a_lease_with_growing_epochs(tmp_path: Path) -> None:
    a, b = DirectoryLease(str(tmp_path)), DirectoryLease(str(tmp_path))
    assert isinstance(a, Lease)
    assert a.try_acquire() and a.epoch == 1 and a.still_held()
    assert not b.try_acquire()  # a flock is per open file: refused within one process too
    stop = threading.Event()
    won: list[bool] = []
    t = threading.Thread(target=lambda: won.append(b.wait_acquire(stop)))
    t.start()
    a.publish("/some/where")
    assert b.owner_address() == "/some/where" and read_owner(str(tmp_path))[0] == 1  # type: ignore[index]
    a.release()  # the waiter gets it at once, under the next epoch
    t.join(10)
    assert won == [True] and b.epoch == 2 and b.still_held() and not a.still_held()
    b.release()
    stop.set()
    c = DirectoryLease(str(tmp_path))
    assert not c.wait_acquire(stop)  # stopped: gives up (or gives back) at once
    assert read_epoch(PosixStorage(), str(tmp_path)) in (2, 3)


def test_a_damaged_epoch_file_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "epoch").write_text("banana")
    with pytest.raises(InvalidMeta, match="epoch is damaged"):
        bump_epoch(PosixStorage(), str(tmp_path))


def test_each_owner_open_writes_the_next_epoch_first(tmp_path: Path) -> None:
    async def main() -> list[int]:
        seen = []
        for _ in range(3):
            async with fusee.Engine.open(tmp_path) as engine:
                assert engine.is_owner
                seen.append(engine.epoch)
        async with fusee.Engine.open(tmp_path, read_only=True) as engine:
            seen.append(engine.epoch)  # a reader takes no epoch
        return seen

    assert asyncio.run(main()) == [1, 2, 3, 0]
    assert read_epoch(PosixStorage(), str(tmp_path)) == 3


def test_the_owner_listens_on_an_abstract_address_not_a_file_in_the_directory(tmp_path: Path) -> None:
    short = socket_address(str(tmp_path), 1)
    assert short.startswith("@fusee-") and short.endswith("-1")
    assert socket_address(str(tmp_path), 2) != short  # each owner (epoch) its own address
    deep = tmp_path / ("d" * 120)
    address = socket_address(str(deep), 4)
    assert address.startswith("@fusee-") and address.endswith("-4")


def _waiters_on(path: Path) -> int:
    """Blocked ``flock`` waiters on the directory's inode, from the kernel's lock table."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line.split() and inode in line.split())


def test_the_directory_lease_is_lost_once_the_path_names_another_directory(tmp_path: Path) -> None:
    """``mv d d.old && cp -a d.old d``: the holder still holds d.old, which is no longer the lease
    of what others open as d; it says so, and writes only into d.old."""
    d, old = tmp_path / "d", tmp_path / "d.old"
    d.mkdir()
    a = DirectoryLease(str(d))
    assert a.try_acquire() and a.still_held()
    d.rename(old)
    shutil.copytree(old, d)
    assert not a.still_held()
    a.publish("/some/where")  # into the directory it locked, never into the copy
    assert read_owner(str(old)) == (1, "/some/where", os.getpid()) and read_owner(str(d)) is None
    b = DirectoryLease(str(d))
    assert b.try_acquire() and b.epoch == 2 and b.still_held()  # the copy is free: its own lease

    # A waiter blocked on the copy while it is moved away and restored again wins the lease of
    # what the path names when the holder goes, not the lock of the moved directory.
    stop = threading.Event()
    won: list[bool] = []
    c = DirectoryLease(str(d))
    t = threading.Thread(target=lambda: won.append(c.wait_acquire(stop)))
    t.start()
    deadline = time.monotonic() + 20
    while _waiters_on(d) == 0:  # the waiter is blocked in flock on the copy's inode
        assert time.monotonic() < deadline, "the waiter never blocked on the lock"
        time.sleep(0.001)
    moved = tmp_path / "d.moved"
    d.rename(moved)
    shutil.copytree(moved, d)
    b.release()
    t.join(20)
    assert won == [True] and c.still_held()
    assert read_epoch(PosixStorage(), str(d)) == c.epoch == 3
    assert read_epoch(PosixStorage(), str(moved)) == 2  # the moved directory was not taken over
    for lease in (a, c):
        lease.release()
