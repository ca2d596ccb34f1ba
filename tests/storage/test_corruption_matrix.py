"""The corruption matrix: damage every bit, cut at every point, vary each file; refuse or recover, never lose silently.

Each case builds the directory afresh on a SimDisk from a snapshot of an
intact one, damages it, and opens it. The outcome must be a typed refusal
(a ``FuseeError``), or a recovery that holds every acknowledged record; the
one documented tolerance is the last batch, whose damage looks exactly like
the write a crash interrupted.
"""

from __future__ import annotations

import json
import random

import pytest

from fusee.errors import FuseeError
from fusee.storage.checkpoint import Checkpoint
from fusee.storage.log import SharedLog
from fusee.storage.seam import read_whole
from fusee.storage.simdisk import SimDisk

ROOT = "/e"
SHARDS = 2
SEG = 8 << 10

Record = tuple[int, int, bytes]


def _open(disk: SimDisk) -> tuple[SharedLog, list[Record], bytes | None]:
    log, rec = SharedLog.open(disk, ROOT, SHARDS, segment_bytes=SEG, align=512, rng=random.Random(1))
    return log, list(rec.records), rec.checkpoint


def _add(log: SharedLog, acked: list[Record], tag: str, batches: int) -> list[tuple[int, int]]:
    extents = []
    for b in range(batches):
        for i in range(3):
            data = f"{tag}{b}.{i}".encode()
            acked.append((i % 2, log.append(i % 2, data), data))
        start = log._offset
        log.flush()
        extents.append((start, start + int.from_bytes(_peek(log, start)[4:8], "little")))
    return extents


def _peek(log: SharedLog, at: int) -> bytes:
    fh = log.storage.open(log._segments[-1].path)
    try:
        return log.storage.pread(fh, 8, at)
    finally:
        log.storage.close(fh)


class Base:
    """An intact directory: two lives, a checkpoint in the second, its last segment holding batches."""

    def __init__(self) -> None:
        disk = SimDisk(random.Random(3))
        acked: list[Record] = []
        log, _, _ = _open(disk)
        _add(log, acked, "a", 3)
        log.close()
        log, _, _ = _open(disk)
        _add(log, acked, "b", 2)
        covers = log.appended_lsns()
        log.checkpoint(b"STATE", covers)
        self.covered = len(acked)
        self.extents = _add(log, acked, "c", 4)
        self.last_segment = log._segments[-1].path
        log.close()
        self.acked = acked
        self.files = {}
        for sub in ("", "/log", "/blobs"):
            for name in disk.listdir(ROOT + sub):
                path = f"{ROOT}{sub}/{name}"
                if name not in ("log", "blobs"):
                    self.files[path] = read_whole(disk, path)

    def open_with(self, files: dict[str, bytes]) -> str | list[Record]:
        """'refused: <error>' or every record the state and log hold (checkpoint's included)."""
        disk = SimDisk(random.Random(0))
        for sub in ("/log", "/blobs"):
            disk.makedirs(ROOT + sub)
        for path, data in files.items():
            fh = disk.open(path, create=True)
            disk.pwrite(fh, data, 0)
            disk.fdatasync(fh)
            disk.close(fh)
        for sub in ("", "/log", "/blobs"):
            disk.fsync_dir(ROOT + sub)
        try:
            log, records, state = _open(disk)
        except FuseeError as e:
            return f"refused: {type(e).__name__}"
        log.close()
        if state is not None:
            assert state == b"STATE", "a checkpoint was accepted with other content"
            return [*self.acked[:self.covered], *records]
        return records

    def check(self, outcome: str | list[Record], *, may_lose_last_batch: bool, what: str) -> None:
        if isinstance(outcome, str):
            return
        keep = len(self.acked) - (3 if may_lose_last_batch else 0)
        assert outcome[:keep] == self.acked[:keep], f"{what}: acknowledged records lost silently"


@pytest.fixture(scope="module")
def base() -> Base:
    return Base()


def test_every_bit_of_the_last_two_batches(base: Base) -> None:
    seg = base.last_segment
    data = base.files[seg]
    (s1, e1), (s2, e2) = base.extents[-2:]
    refused = 0
    for offset in [*range(s1, e1), *range(s2, e2)]:
        for bit in range(8):
            damaged = bytearray(data)
            damaged[offset] ^= 1 << bit
            outcome = base.open_with({**base.files, seg: bytes(damaged)})
            base.check(outcome, may_lose_last_batch=offset >= s2, what=f"bit {bit} of byte {offset}")
            refused += isinstance(outcome, str)
    assert refused >= 8 * (e1 - s1), "every flip in the second-last batch is refused"


def test_every_truncation_point_of_the_last_segment(base: Base) -> None:
    seg = base.last_segment
    data = base.files[seg]
    end = base.extents[-1][1]
    points = sorted({*range(0, end + 1), *range(end, len(data), 97)})
    for at in points:
        outcome = base.open_with({**base.files, seg: data[:at]})
        assert isinstance(outcome, str), f"a segment cut at byte {at} was accepted"


def test_whole_batches_zeroed_from_a_boundary_are_refused_while_log_durable_remembers_them(base: Base) -> None:
    """Zeroing whole batches from the end of the last life: ``log/durable`` (written after each
    flush, never synced) still names the last durable batch, so the open refuses. Without it
    (a power loss may take it) the documented limit remains: it looks like a log that ended
    there, unless a later segment or a checkpoint pins the end."""
    seg = base.last_segment
    data = base.files[seg]
    start = base.extents[-1][0]
    zeroed = {**base.files, seg: data[:start] + bytes(len(data) - start)}
    assert base.open_with(zeroed) == "refused: LogCorrupted"
    note = f"{ROOT}/log/durable"
    assert note in zeroed
    without = {p: d for p, d in zeroed.items() if p != note}
    assert base.open_with(without) == base.acked[:-3]
    torn = {**zeroed, note: bytes(len(zeroed[note]))}  # a torn note is ignored, never trusted
    assert base.open_with(torn) == base.acked[:-3]


def test_each_checkpoint_variant(base: Base) -> None:
    ckpt = f"{ROOT}/checkpoint"
    good = base.files[ckpt]
    parsed = Checkpoint.decode(good)
    assert parsed is not None
    variants: dict[str, dict[str, bytes]] = {}
    for i in range(len(good)):
        for bit in (0, 7):
            damaged = bytearray(good)
            damaged[i] ^= 1 << bit
            variants[f"bit {bit} of byte {i}"] = {**base.files, ckpt: bytes(damaged)}
    for cut in range(len(good)):
        variants[f"cut at {cut}"] = {**base.files, ckpt: good[:cut]}
    without = dict(base.files)
    del without[ckpt]
    variants["missing"] = without
    variants["lsns past the log"] = {**base.files, ckpt: Checkpoint(
        tuple(n + 5 for n in parsed.lsns), parsed.start_segment, parsed.state, parsed.end_seq).encode()}
    variants["end past the log"] = {**base.files, ckpt: Checkpoint(
        parsed.lsns, parsed.start_segment, parsed.state, parsed.end_seq + 10).encode()}
    variants["start past the log"] = {**base.files, ckpt: Checkpoint(
        parsed.lsns, parsed.start_segment + 5, parsed.state, parsed.end_seq).encode()}
    variants["other shard count"] = {**base.files, ckpt: Checkpoint(
        (*parsed.lsns, 0), parsed.start_segment, parsed.state, parsed.end_seq).encode()}
    variants["a leftover temp file"] = {**base.files, f"{ckpt}.tmp": b"half a checkpoint"}
    for what, files in variants.items():
        outcome = base.open_with(files)
        if what == "a leftover temp file":
            assert outcome == base.acked, what
        elif what.startswith(("bit", "cut")) or what != "missing":
            assert isinstance(outcome, str), f"checkpoint {what} was accepted"
        base.check(outcome, may_lose_last_batch=False, what=f"checkpoint {what}")


def test_each_meta_and_note_variant(base: Base) -> None:
    meta, newest = f"{ROOT}/meta", f"{ROOT}/log/newest"
    good_meta, good_note = base.files[meta], base.files[newest]
    variants: dict[str, dict[str, bytes]] = {}
    for i in range(len(good_meta)):
        damaged = bytearray(good_meta)
        damaged[i] ^= 0x01
        variants[f"meta byte {i}"] = {**base.files, meta: bytes(damaged)}
    for i in range(len(good_note)):
        damaged = bytearray(good_note)
        damaged[i] ^= 0x01
        variants[f"note byte {i}"] = {**base.files, newest: bytes(damaged)}
    for name in (meta, newest):
        without = dict(base.files)
        del without[name]
        variants[f"no {name}"] = without
    for shards in (0, -1, 1, 3, 10**9, 1e400, "2", None, True):
        variants[f"shards={shards!r}"] = {**base.files, meta: json.dumps({"format": 3, "shards": shards}).encode()}
    variants["meta nested"] = {**base.files, meta: b"[" * 50_000 + b"]" * 50_000}
    variants["meta huge"] = {**base.files, meta: b" " * (1 << 20)}
    for what, files in variants.items():
        outcome = base.open_with(files)
        base.check(outcome, may_lose_last_batch=False, what=what)
        if what == f"no {newest}":
            assert isinstance(outcome, str), "batches of this version without the note: it was deleted"
        elif what not in ("shards=2",):
            # A meta byte flip may leave valid JSON with the same values (a space in it).
            assert isinstance(outcome, str) or outcome == base.acked, what
