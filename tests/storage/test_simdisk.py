"""SimDisk: the crash model the log is tested (and simulated) against."""

from __future__ import annotations

import errno
import random

import pytest

from fusee.errors import DirectoryLocked
from fusee.storage.simdisk import SECTOR, SimDisk


def write(d: SimDisk, path: str, data: bytes, *, sync: bool, offset: int = 0) -> None:
    fh = d.open(path, create=True)
    d.pwrite(fh, data, offset)
    if sync:
        d.fdatasync(fh)
    d.close(fh)


def read(d: SimDisk, path: str) -> bytes:
    fh = d.open(path)
    try:
        return d.pread(fh, d.size(fh), 0)
    finally:
        d.close(fh)


def test_synced_data_and_names_survive_every_crash() -> None:
    for seed in range(50):
        d = SimDisk(random.Random(seed))
        d.makedirs("/a")
        write(d, "/a/f", b"x" * 3000, sync=True)
        d.fsync_dir("/a")
        write(d, "/a/f", b"y" * 700, sync=False, offset=3072)  # the next sector on
        d.crash()
        data = read(d, "/a/f")
        assert data[:3000] == b"x" * 3000
        assert len(data) <= 3772


def test_a_torn_write_can_damage_synced_bytes_that_share_its_sector() -> None:
    """Why the log starts every batch on a fresh block: rewriting a sector risks all of it."""
    damaged = 0
    for seed in range(50):
        d = SimDisk(random.Random(seed))
        d.makedirs("/a")
        write(d, "/a/f", b"x" * 3000, sync=True)
        d.fsync_dir("/a")
        write(d, "/a/f", b"y" * 100, sync=False, offset=3000)
        d.crash()
        damaged += read(d, "/a/f")[:3000] != b"x" * 3000
    assert damaged > 0


def test_unsynced_writes_are_kept_dropped_or_torn_per_sector() -> None:
    fates = set()
    for seed in range(200):
        d = SimDisk(random.Random(seed))
        d.makedirs("/a")
        fh = d.open("/a/f", create=True)
        d.pwrite(fh, bytes(4 * SECTOR), 0)
        d.fdatasync(fh)
        d.fsync_dir("/a")
        d.pwrite(fh, b"\xff" * (4 * SECTOR), 0)
        d.crash()
        data = read(d, "/a/f")
        for s in range(4):
            sector = data[s * SECTOR:(s + 1) * SECTOR]
            fates.add("kept" if sector == b"\xff" * SECTOR else "dropped" if sector == bytes(SECTOR) else "torn")
    assert fates == {"kept", "dropped", "torn"}


def test_names_need_a_directory_fsync() -> None:
    outcomes = set()
    for seed in range(100):
        d = SimDisk(random.Random(seed))
        d.makedirs("/a")
        write(d, "/a/old", b"1", sync=True)
        d.fsync_dir("/a")
        write(d, "/a/new", b"2", sync=True)
        d.rename("/a/new", "/a/final")
        d.crash()
        outcomes.add(tuple(d.listdir("/a")))
    # A prefix of the operations survives: none, the creation, or both.
    assert outcomes == {("old",), ("new", "old"), ("final", "old")}


def test_a_failed_sync_is_not_undone_by_a_later_one() -> None:
    lost = 0
    for seed in range(50):
        d = SimDisk(random.Random(seed))
        d.makedirs("/a")
        fh = d.open("/a/f", create=True)
        d.pwrite(fh, bytes(SECTOR), 0)
        d.fdatasync(fh)
        d.fsync_dir("/a")
        d.pwrite(fh, b"\x01" * SECTOR, 0)
        d.fail_next_fdatasync()
        with pytest.raises(OSError) as info:
            d.fdatasync(fh)
        assert info.value.errno == errno.EIO
        assert d.pread(fh, SECTOR, 0) == b"\x01" * SECTOR  # the cache still shows it
        d.fdatasync(fh)  # succeeds, but writes nothing back
        d.crash()
        lost += read(d, "/a/f") != b"\x01" * SECTOR
    assert lost > 0
    assert d.stats.failed_fdatasyncs == 1


def test_enospc_and_space_accounting() -> None:
    d = SimDisk(random.Random(1))
    d.makedirs("/a")
    d.set_space_left(1000)
    fh = d.open("/a/f", create=True)
    d.pwrite(fh, b"x" * 900, 0)
    with pytest.raises(OSError) as info:
        d.pwrite(fh, b"x" * 200, 900)
    assert info.value.errno == errno.ENOSPC and d.size(fh) == 900
    d.truncate(fh, 0)
    d.pwrite(fh, b"x" * 1000, 0)
    d.close(fh)


def test_locks_and_deterministic_crashes() -> None:
    d = SimDisk(random.Random(1), pid=99)
    d.makedirs("/e")
    d.lock("/e")
    with pytest.raises(DirectoryLocked) as info:
        d.lock("/e")
    with pytest.raises(DirectoryLocked):
        d.lock("/e", shared=True)
    assert info.value.pid == 99
    d.crash_process()  # the process died: its lock is gone
    d.lock("/e", shared=True)
    d.lock("/e", shared=True)  # readers share
    with pytest.raises(DirectoryLocked):
        d.lock("/e")

    def run(seed: int) -> bytes:
        disk = SimDisk(random.Random(seed))
        disk.makedirs("/a")
        write(disk, "/a/f", random.Random(3).randbytes(5000), sync=False)
        disk.fsync_dir("/a")
        disk.crash()
        return read(disk, "/a/f")

    assert run(5) == run(5)
