"""SimDisk: the crash model the log is tested (and simulated) against."""

from __future__ import annotations

import errno
import random

import pytest

from fusee.errors import DirectoryLocked, NotARegularFile
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


def test_a_process_crash_keeps_the_page_cache_until_a_power_loss() -> None:
    d = SimDisk(random.Random(4))
    d.makedirs("/a")
    write(d, "/a/f", b"synced", sync=True)
    d.fsync_dir("/a")
    write(d, "/a/f", b"cached", sync=False)
    write(d, "/a/new", b"never synced", sync=False)
    d.crash_process()
    assert read(d, "/a/f") == b"cached" and read(d, "/a/new") == b"never synced"
    d.crash_process()  # a later life changes nothing: still cached, still unsynced
    d.power_loss(drop_all=True)
    assert read(d, "/a/f") == b"synced" and not d.exists("/a/new")


def test_a_kill_inside_fdatasync_leaves_the_write_cached_and_the_process_mute() -> None:
    from fusee.storage.simdisk import ProcessKilled

    d = SimDisk(random.Random(4))
    d.makedirs("/a")
    d.arm_kills(random.Random(1), 1.0)
    fh = d.open("/a/f", create=True)
    d.pwrite(fh, b"batch", 0)
    d.fdatasync(fh)  # not armed: syncs
    d.fsync_dir("/a")
    d.pwrite(fh, b"BATCH", 0)
    d.kill_armed = True
    with pytest.raises(ProcessKilled):
        d.fdatasync(fh)
    with pytest.raises(ProcessKilled):  # a dead process writes nothing more
        d.pwrite(fh, b"after", 0)
    d.crash_process()
    assert read(d, "/a/f") == b"BATCH"
    d.power_loss(drop_all=True)
    assert read(d, "/a/f") == b"batch"


def test_drop_cache_shows_what_a_failed_sync_left_on_the_platter() -> None:
    d = SimDisk(random.Random(4), tear=False)
    d.makedirs("/a")
    write(d, "/a/f", bytes(SECTOR), sync=True)
    d.fsync_dir("/a")
    fh = d.open("/a/f")
    d.pwrite(fh, b"\x01" * SECTOR, 0)
    d.fail_next_fdatasync()
    with pytest.raises(OSError):
        d.fdatasync(fh)
    platter = d.durable_bytes("/a/f")
    d.fdatasync(fh)  # "succeeds": the pages are clean, nothing is written
    d.drop_cache(fh)
    assert d.pread(fh, SECTOR, 0) == platter
    d.close(fh)


def test_a_pinned_directory_keeps_its_lock_and_files_through_a_rename_and_a_restored_copy() -> None:
    """The outside hands of the simulator: mv, cp -a, rm -r. A lock and a pin (``root``) follow
    the directory, as a flock and an open descriptor do; the path then names the copy."""
    d = SimDisk(random.Random(1))
    d.makedirs("/e/log")
    lock = d.lock("/e")
    pinned = d.root("/e", lock)
    write(pinned, "/e/log/a", b"before", sync=True)  # type: ignore[arg-type]
    pinned.fsync_dir("/e/log")
    assert pinned.moved() is None
    d.move_dir("/e", "/e.old")
    assert "no longer exists" in (pinned.moved() or "")
    d.copy_dir("/e.old", "/e")
    assert "no longer names" in (pinned.moved() or "")
    d.lock("/e")  # the copy is not locked: another process may take it
    with pytest.raises(DirectoryLocked):
        d.lock("/e.old")  # the lock went with the original
    write(pinned, "/e/log/a", b"after!", sync=True)  # type: ignore[arg-type]
    assert read(d, "/e.old/log/a") == b"after!" and read(d, "/e/log/a") == b"before"
    assert read(pinned, "/e/log/a") == b"after!"  # type: ignore[arg-type]
    d.crash()  # the copy and the move were durable at once
    assert read(d, "/e/log/a") == b"before" and read(d, "/e.old/log/a") == b"after!"
    d.remove_dir("/e.old")
    assert not pinned.exists("/e/log/a") and not d.exists("/e.old")


def test_a_directory_opened_as_a_file_is_refused_naming_it() -> None:
    d = SimDisk(random.Random(1))
    d.makedirs("/e/log")
    with pytest.raises(NotARegularFile, match="/e/log is a directory"):
        d.open("/e/log")


def test_a_failed_sync_names_its_file() -> None:
    d = SimDisk(random.Random(1))
    d.makedirs("/e")
    fh = d.open("/e/f", create=True)
    d.fail_next_fdatasync()
    with pytest.raises(OSError, match="/e/f") as info:
        d.fdatasync(fh)
    assert info.value.errno == errno.EIO


def test_worst_case_image_keeps_only_what_is_synced_and_leaves_the_disk_alone() -> None:
    d = SimDisk(random.Random(1))
    d.makedirs("/a")
    write(d, "/a/synced", b"kept", sync=True)
    d.fsync_dir("/a")
    write(d, "/a/synced", b"more", sync=False, offset=4)  # unsynced tail of a durable file
    write(d, "/a/unnamed", b"data", sync=True)  # synced bytes, but its name never was
    image = d.worst_case_image()
    assert read(image, "/a/synced") == b"kept"
    assert not image.exists("/a/unnamed")
    # The disk itself still reads everything, and a power loss that drops it all agrees.
    assert read(d, "/a/synced") == b"keptmore" and d.exists("/a/unnamed")
    d.power_loss(drop_all=True)
    assert read(d, "/a/synced") == b"kept" and not d.exists("/a/unnamed")
