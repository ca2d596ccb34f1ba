"""Issue 10: recovery trusts only the disk, the lock holds, and damage past one torn batch is refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fusee.errors import DirectoryLocked, LogCorrupted, LogFailed
from fusee.storage.checkpoint import Checkpoint
from fusee.storage.log import SharedLog, segment_name
from fusee.storage.seam import FileHandle, Storage, read_whole
from fusee.storage.simdisk import SimDisk

SEG = 32 << 10


def open_log(storage: Storage, path: str, **kw: object) -> tuple[SharedLog, list[tuple[int, int, bytes]]]:
    kw.setdefault("segment_bytes", SEG)
    kw.setdefault("align", 512)
    kw.setdefault("rng", random.Random(len(str(kw))))
    log, rec = SharedLog.open(storage, path, 2, **kw)  # type: ignore[arg-type]
    return log, list(rec.records)


def add(log: SharedLog, acked: list[tuple[int, int, bytes]], tag: str, n: int = 4) -> list[tuple[int, int]]:
    """Appends ``n`` records per batch in ``n`` batches; returns each batch's (start, end) offset."""
    extents = []
    for b in range(n):
        for i in range(n):
            data = f"{tag}-{b}-{i}".encode() * 3
            acked.append((i % 2, log.append(i % 2, data), data))
        start = log._offset
        log.flush()
        extents.append((start, log._offset))
    return extents


def rewrite(storage: Storage, path: str, data: bytes) -> None:
    fh = storage.open(path)
    try:
        storage.truncate(fh, 0)
        storage.pwrite(fh, data, 0)
        storage.fdatasync(fh)
    finally:
        storage.close(fh)


def flip(storage: Storage, path: str, offset: int) -> None:
    data = bytearray(read_whole(storage, path))
    data[offset] ^= 0x10
    rewrite(storage, path, bytes(data))


class _Died(Exception):
    """The process dies inside fdatasync: its write is in the page cache, never synced."""


class DyingDisk(SimDisk):
    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng)
        self.die = False

    def fdatasync(self, fh: FileHandle) -> None:
        if self.die:
            self.die = False
            raise _Died()
        super().fdatasync(fh)


# --- 1. recovery makes what it read durable ----------------------------------------------


def test_recovery_syncs_what_a_process_crash_left_in_the_page_cache() -> None:
    """A batch written but not synced when the process died is read by the next life; a power cut
    after that life acknowledged more must not leave a log that refuses to open (or loses those)."""
    disk = DyingDisk(random.Random(3))
    log, _ = open_log(disk, "/e")
    acked: list[tuple[int, int, bytes]] = []
    add(log, acked, "first", 2)
    unsynced = (0, log.append(0, b"cached only"), b"cached only")
    disk.die = True
    with pytest.raises(LogFailed):
        log.flush()
    disk.crash_process()  # the page cache keeps the batch
    log.close()

    log, records = open_log(disk, "/e")
    assert records == [*acked, unsynced]  # read from the cache and accepted...
    acked.append(unsynced)
    add(log, acked, "second", 2)  # ...and built on
    log.close()
    disk.power_loss(drop_all=True)  # every write never synced is gone

    log, records = open_log(disk, "/e")
    assert records == acked
    log.close()


# --- 2. the lock ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sim", "posix"])
def test_deleting_the_lock_file_lets_no_second_writer_in(kind: str, tmp_path: Path) -> None:
    storage: Storage
    if kind == "sim":
        storage, path = SimDisk(random.Random(1)), "/e"
    else:
        from fusee.storage.posix import PosixStorage

        storage, path = PosixStorage(), str(tmp_path / "e")
    log, _ = open_log(storage, path)
    storage.remove(f"{path}/lock")  # a cleanup job removing "stale" lock files
    with pytest.raises(DirectoryLocked):
        open_log(storage, path)
    log.close()
    log, _ = open_log(storage, path)  # released at close
    log.close()


def test_a_segment_that_appears_under_us_is_never_reused(tmp_path: Path) -> None:
    from fusee.storage.posix import PosixStorage

    storage, path = PosixStorage(), str(tmp_path / "e")
    log, _ = open_log(storage, path)
    intruder = f"{path}/log/{segment_name(log.segment_numbers[-1] + 1)}"
    Path(intruder).write_bytes(b"someone else's")
    with pytest.raises(LogFailed, match="another process"):
        log._start_segment()
    assert Path(intruder).read_bytes() == b"someone else's"
    log.close()


# --- 3. damage beyond one torn batch ------------------------------------------------------


@pytest.fixture
def written() -> tuple[SimDisk, list[tuple[int, int, bytes]], list[tuple[int, int]], str]:
    disk = SimDisk(random.Random(5))
    log, _ = open_log(disk, "/e")
    acked: list[tuple[int, int, bytes]] = []
    extents = add(log, acked, "a", 5)
    seg = log._segments[-1].path
    log.close()
    return disk, acked, extents, seg


def test_a_segment_cut_at_a_batch_boundary_is_refused(written: tuple) -> None:  # type: ignore[type-arg]
    disk, _, extents, seg = written
    rewrite(disk, seg, read_whole(disk, seg)[:extents[-2][0]])
    with pytest.raises(LogCorrupted, match="was cut"):
        open_log(disk, "/e")


def test_a_segment_cut_to_its_header_is_refused(written: tuple) -> None:  # type: ignore[type-arg]
    disk, _, _, seg = written
    rewrite(disk, seg, read_whole(disk, seg)[:512])
    with pytest.raises(LogCorrupted, match="was cut"):
        open_log(disk, "/e")


def test_a_deleted_last_segment_is_refused(written: tuple) -> None:  # type: ignore[type-arg]
    disk, acked, _, _ = written
    log, _ = open_log(disk, "/e")  # a second segment, with batches of its own
    add(log, acked, "b", 2)
    last = log._segments[-1].path
    log.close()
    disk.remove(last)
    disk.fsync_dir("/e/log")
    with pytest.raises(LogCorrupted, match="newest segment") as info:
        open_log(disk, "/e")
    assert info.value.path == last


def test_bit_flips_in_each_of_the_last_two_batches_are_refused(written: tuple) -> None:  # type: ignore[type-arg]
    disk, _, extents, seg = written
    for start, _ in extents[-2:]:
        flip(disk, seg, start + 45)
    with pytest.raises(LogCorrupted, match="follow"):
        open_log(disk, "/e")


def test_a_damaged_header_of_the_second_last_batch_with_a_torn_last_is_refused(written: tuple) -> None:  # type: ignore[type-arg]
    disk, _, extents, seg = written
    flip(disk, seg, extents[-2][0])  # its magic: its length is unknown now
    flip(disk, seg, extents[-1][0] + 45)  # and the last batch fails its checksum
    with pytest.raises(LogCorrupted, match="later batch"):
        open_log(disk, "/e")


def test_one_flip_in_the_last_batch_is_a_torn_tail(written: tuple) -> None:  # type: ignore[type-arg]
    """The documented tolerance: the last batch alone may be lost (it looks like the write a crash
    cut), unless log/durable says it was made durable (then it was acknowledged: refused)."""
    disk, acked, extents, seg = written
    flip(disk, seg, extents[-1][0] + 45)
    with pytest.raises(LogCorrupted, match="made batch 5 durable"):
        open_log(disk, "/e")
    disk.remove("/e/log/durable")  # as a power loss may leave it: the note is never synced
    log, records = open_log(disk, "/e")
    assert records == acked[:-5]
    log.close()


# --- 4. a checkpoint that claims more than the log holds ----------------------------------


def _checkpointed() -> tuple[SimDisk, list[tuple[int, int]], str]:
    disk = SimDisk(random.Random(8))
    log, _ = open_log(disk, "/e")
    acked: list[tuple[int, int, bytes]] = []
    add(log, acked, "a", 3)
    log.checkpoint(b"STATE")
    extents = add(log, acked, "b", 3)
    seg = log._segments[-1].path
    log.close()
    return disk, extents, seg


def test_a_checkpoint_whose_lsns_run_past_the_log_is_refused() -> None:
    disk, _, _ = _checkpointed()
    ckpt = Checkpoint.decode(read_whole(disk, "/e/checkpoint"))
    assert ckpt is not None
    forged = Checkpoint(tuple(n + 100 for n in ckpt.lsns), ckpt.start_segment, ckpt.state)
    rewrite(disk, "/e/checkpoint", forged.encode())  # a valid checksum, from "another directory"
    with pytest.raises(LogCorrupted, match="covers shard") as info:
        open_log(disk, "/e")
    assert info.value.path == "/e/checkpoint" and "truncate_corrupt=True cannot" in str(info.value)


def test_a_log_that_lost_batches_a_checkpoint_saw_is_refused() -> None:
    disk = SimDisk(random.Random(8))
    log, _ = open_log(disk, "/e")
    acked: list[tuple[int, int, bytes]] = []
    extents = add(log, acked, "a", 3)
    seg = log._segments[-1].path
    log.checkpoint(b"STATE")  # as at every close
    log.close()
    data = read_whole(disk, seg)
    # Zero the last batch: alone, it would look like a torn write.
    rewrite(disk, seg, data[:extents[-1][0]] + bytes(len(data) - extents[-1][0]))
    with pytest.raises(LogCorrupted, match="written after batch"):
        open_log(disk, "/e")


def test_stray_names_in_the_log_directory_are_left_alone(tmp_path: Path) -> None:
    from fusee.storage.posix import PosixStorage

    storage, path = PosixStorage(), str(tmp_path / "e")
    log, _ = open_log(storage, path)
    acked: list[tuple[int, int, bytes]] = []
    add(log, acked, "a", 2)
    log.close()
    for name in ("0000000000099.seg", "٠٠٠٠٠٠٠٠٠٠٠٩.seg", "notes.txt"):
        Path(path, "log", name).write_bytes(b"not ours")
    log, records = open_log(storage, path)
    assert records == acked
    log.close()
    assert Path(path, "log", "0000000000099.seg").read_bytes() == b"not ours"


def test_recovery_reads_one_segment_at_a_time() -> None:
    """Streaming: the memory recovery needs is about one segment, not the whole log."""
    import tracemalloc

    seg = 64 << 10
    disk = SimDisk(random.Random(2))
    log, _ = open_log(disk, "/e", segment_bytes=seg)
    for i in range(10):  # ten segments, each one big batch
        log.append(0, bytes([i]) * (seg - 2048))
        log.flush()
    log.close()
    assert len([n for n in disk.listdir("/e/log") if n.endswith(".seg")]) >= 10
    tracemalloc.start()
    try:
        log, records = open_log(disk, "/e", segment_bytes=seg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(records) == 10
    held = sum(len(r[2]) for r in records)
    assert peak < held + 5 * seg, (peak, held)  # all ten segments at once would be held + 10 * seg
    log.close()


def test_a_full_disk_while_noting_the_pid_releases_the_lock() -> None:
    disk = SimDisk(random.Random(4))
    log, _ = open_log(disk, "/e")
    log.close()
    disk.remove("/e/lock")
    disk.set_space_left(0)
    from fusee.errors import DiskFull

    with pytest.raises(DiskFull):
        open_log(disk, "/e")
    disk.set_space_left(None)
    log, _ = open_log(disk, "/e")  # "free space and reopen" works in the same process
    log.close()


def test_a_blob_reference_with_a_crafted_size_is_refused_without_reading_it(tmp_path: Path) -> None:
    from fusee.storage.batch import BlobRef
    from fusee.storage.blobs import read_blob, write_blob
    from fusee.storage.posix import PosixStorage

    storage = PosixStorage()
    ref = BlobRef(1, 1, 3, 0)
    write_blob(storage, str(tmp_path), ref, b"abc")
    assert read_blob(storage, str(tmp_path), BlobRef(1, 1, 1 << 60, 0)) is None


class NoteFailsDisk(SimDisk):
    """Fails the directory fsync right after the note of the newest segment was renamed into place."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng)
        self.armed = False

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        if self.armed and dst.endswith("/newest"):
            self.armed = False
            self.fail_dir = True

    def fsync_dir(self, path: str) -> None:
        if getattr(self, "fail_dir", False):
            self.fail_dir = False
            super().fsync_dir(path)  # the rename did reach the disk...
            import errno

            raise OSError(errno.EIO, "simulated: directory fsync reported failure")  # ...but it says no
        super().fsync_dir(path)


def test_a_failed_note_of_the_newest_segment_never_makes_the_log_refuse() -> None:
    disk = NoteFailsDisk(random.Random(6))
    log, _ = open_log(disk, "/e")
    acked: list[tuple[int, int, bytes]] = []
    add(log, acked, "a", 2)
    log.close()
    disk.armed = True
    with pytest.raises(LogFailed):
        open_log(disk, "/e")
    disk.crash()
    log, records = open_log(disk, "/e")
    assert records == acked
    log.close()


def test_a_deleted_note_and_last_segment_are_refused_and_truncate_corrupt_accepts(written: tuple) -> None:  # type: ignore[type-arg]
    disk, acked, _, _ = written
    log, _ = open_log(disk, "/e")
    add(log, acked, "b", 2)
    last = log._segments[-1].path
    log.close()
    disk.remove(last)
    disk.remove("/e/log/newest")
    with pytest.raises(LogCorrupted, match="note of the newest segment is missing"):
        open_log(disk, "/e")
    log, records = open_log(disk, "/e", truncate_corrupt=True)  # the operator accepts the log as it is
    assert records == acked[:25]
    log.close()
    log, records = open_log(disk, "/e")  # and the note is back
    assert records == acked[:25]
    log.close()


def test_a_foreign_segment_is_named_as_the_one_that_does_not_continue_the_log(written: tuple) -> None:  # type: ignore[type-arg]
    disk, _, _, _ = written
    other = SimDisk(random.Random(9))
    log, _ = open_log(other, "/o", rng=random.Random(99))
    add(log, [], "x", 1)
    log.close()
    stray = "/e/log/000000000002.seg"
    fh = disk.open(stray, create=True)
    disk.pwrite(fh, read_whole(other, "/o/log/000000000001.seg"), 0)
    disk.fdatasync(fh)
    disk.close(fh)
    with pytest.raises(LogCorrupted, match="does not continue the log") as info:
        open_log(disk, "/e")
    assert info.value.path == stray


def test_recovery_reads_what_the_disk_holds_after_a_failed_sync_of_an_earlier_life() -> None:
    """After a failed fdatasync the cache may show a batch the disk never got (the pages are marked
    clean): recovery must read the disk, or it builds on a batch a later power cut takes away."""
    for seed in range(12):
        disk = SimDisk(random.Random(seed))
        log, _ = open_log(disk, "/e")
        acked: list[tuple[int, int, bytes]] = []
        add(log, acked, "a", 2)
        log.append(0, b"never acknowledged" * 20)
        disk.fail_next_fdatasync()
        with pytest.raises(LogFailed):
            log.flush()
        disk.crash_process()  # the supervisor restarts the process; the machine stays up
        log.close()
        log, records = open_log(disk, "/e")
        assert records[:len(acked)] == acked and len(records) <= len(acked) + 1
        acked = records  # the failed batch counts only if the disk really holds it
        add(log, acked, "b", 2)
        log.close()
        disk.power_loss()
        log, records = open_log(disk, "/e")
        assert records == acked, f"seed {seed}"
        log.close()


def test_an_open_time_io_error_does_not_speak_of_failed_syncs(tmp_path: Path) -> None:
    from fusee.storage.posix import PosixStorage

    storage, path = PosixStorage(), str(tmp_path / "e")
    log, _ = open_log(storage, path)
    log.close()
    import shutil

    shutil.rmtree(f"{path}/log")
    Path(path, "log").write_bytes(b"a file where the log directory should be")
    with pytest.raises(LogFailed) as info:
        open_log(storage, path)
    text = str(info.value)
    assert "opening" in text and "sync" not in text and "lock is released" in text


def test_recovery_never_holds_a_whole_preallocated_segment() -> None:
    """A 16 MiB segment holding a few KiB of batches costs recovery about one batch, not 16 MiB."""
    import tracemalloc

    seg = 16 << 20
    disk = SimDisk(random.Random(2))
    log, _ = open_log(disk, "/e", segment_bytes=seg)
    acked: list[tuple[int, int, bytes]] = []
    add(log, acked, "a", 6)
    log.close()
    tracemalloc.start()
    try:  # read-only: the simulated disk's own memory for a new segment stays out of the count
        log, records = open_log(disk, "/e", segment_bytes=seg, read_only=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert records == acked
    assert peak < 4 << 20, peak  # chunks of 1 MiB past the batches (the simulated read copies twice)
    log.close()
