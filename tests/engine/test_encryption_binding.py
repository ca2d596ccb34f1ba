"""Encrypted payloads are bound to their record: one moved to another run or record is refused.

An attacker who can write the engine's files (but holds no key) swaps two
runs' encrypted inputs and recomputes every checksum with the storage's own
encoders; the engine must refuse the moved payload with a typed error naming
the run and record, and never run one workflow with another's input.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import fusee
from fusee.core import records as rec
from fusee.errors import DecryptionFailed
from fusee.runtime.sealing import BINDING, PLANS, SEALED, Sealer, peek
from fusee.runtime.snapshot import CheckpointEntry
from fusee.storage import batch as fmt
from fusee.storage.checkpoint import Checkpoint
from tests.helpers import crash_in_process, until

K1 = bytes(range(32))
K2 = bytes(range(100, 132))

go = fusee.signal("go", str)
#: (workflow ID, input) of every step that used its run's input: the effects.
USED: list[tuple[str, str]] = []


def use(workflow_id: str, secret: str) -> str:
    USED.append((workflow_id, secret))
    return f"{workflow_id} used {secret}"


@fusee.workflow("holder")
async def holder(ctx: fusee.Ctx, secret: str) -> str:
    await ctx.wait_for(go)
    wid = ctx.workflow_id
    return await ctx.step("use", lambda: use(wid, secret))


def aes(current: str = "k1", **keys: bytes) -> fusee.AesGcmCodec:
    return fusee.AesGcmCodec(keys=keys or {"k1": K1}, current=current)


def reseal(r: rec.Record) -> bytes:
    """A sealed record's bytes after an edit of its (still encrypted) payloads, as the engine lays them out."""
    return bytes([SEALED]) + rec.encode(r)[1:]


def swapped_starts(records: dict[str, rec.Start], a: str, b: str) -> dict[str, rec.Start]:
    """The Start records of ``a`` and ``b`` with their encrypted inputs exchanged."""
    sa, sb = records[a], records[b]
    assert sa.input != sb.input and len(sa.input) == len(sb.input)
    return {a: msgspec.structs.replace(sa, input=sb.input), b: msgspec.structs.replace(sb, input=sa.input)}


def swap_inputs_in_log(d: Path, a: str, b: str) -> dict[str, int]:
    """Swaps the encrypted inputs of runs ``a`` and ``b`` in the log, every crc and chain recomputed.

    Returns each workflow's numeric run ID.
    """
    segments = sorted((d / "log").glob("*.seg"))
    images = {p: bytearray(p.read_bytes()) for p in segments}
    # Find the two Start records (and where they lie) with the log's own decoders.
    found: dict[str, tuple[Path, int, bytes, rec.Start]] = {}
    batches = {path: list(_batches(data)) for path, data in images.items()}
    for path, found_batches in batches.items():
        for off, body, h in found_batches:
            for _shard, _lsn, raw in fmt.parse_body(body, h.sections, h.records):
                assert isinstance(raw, bytes), "a record went to a blob: keep the inputs small"
                if raw[0] != SEALED:
                    continue
                r = peek(raw)
                if isinstance(r, rec.Start) and r.id in (a, b):
                    at = bytes(body).find(raw)
                    assert at > 0
                    found[r.id] = (path, off + at, raw, r)
    assert set(found) == {a, b}, "the Start records are not in the log"
    new = swapped_starts({k: v[3] for k, v in found.items()}, a, b)
    for wid, (path, at, raw, _r) in found.items():
        edited = reseal(new[wid])
        assert len(edited) == len(raw)
        images[path][at:at + len(raw)] = edited
    # Recompute every batch crc, the chain from batch to batch, and from segment to segment.
    prev_crc: int | None = None
    for path, data in images.items():
        head = fmt.SegmentHeader.decode(bytes(data[:fmt.SEG_HEADER.size]))
        assert head is not None
        if prev_crc is not None and head.prev_crc:
            head = dataclasses.replace(head, prev_crc=prev_crc)
            data[:fmt.SEG_HEADER.size] = head.encode()
            head = fmt.SegmentHeader.decode(bytes(data[:fmt.SEG_HEADER.size]))
            assert head is not None
        chain = head.chain_start()
        for off, _body, h in batches[path]:
            buf = data[off:off + h.length]
            chain = fmt.seal(buf, salt=head.salt, sections=h.sections, records=h.records, seq=h.seq,
                             prev_crc=chain, life=h.life)
            data[off:off + h.length] = buf
        prev_crc = chain
        path.write_bytes(bytes(data))
    return {wid: v[3].run for wid, v in found.items()}


def _batches(data: bytearray) -> Any:
    """(offset, bytes, header) of each intact batch of a segment image, in order."""
    head = fmt.SegmentHeader.decode(bytes(data[:fmt.SEG_HEADER.size]))
    assert head is not None
    off = head.align
    while True:
        h = fmt.BatchHeader.decode(memoryview(data), off)
        if h is None or h.life != head.life or off + h.length > len(data):
            return
        body = bytes(data[off:off + h.length])
        if fmt.batch_crc(body, head.salt) != h.crc:
            return
        yield off, body, h
        off += fmt.align_up(h.length, head.align)


def swap_inputs_in_checkpoint(d: Path, a: str, b: str) -> dict[str, int]:
    """Swaps the encrypted inputs of ``a`` and ``b`` in the checkpoint's packed journals (crc recomputed)."""
    path = d / "checkpoint"
    ckpt = Checkpoint.decode(path.read_bytes())
    assert ckpt is not None
    entries = msgspec.msgpack.decode(ckpt.state, type=list[CheckpointEntry])
    journals = {e.id: msgspec.msgpack.decode(e.journal, type=list[tuple[int, bytes]]) for e in entries}
    starts = {wid: peek(journals[wid][0][1]) for wid in (a, b)}
    assert all(isinstance(s, rec.Start) and s.id == wid for wid, s in starts.items())
    new = swapped_starts(starts, a, b)  # type: ignore[arg-type]
    for e in entries:
        if e.id in new:
            items = journals[e.id]
            items[0] = (items[0][0], reseal(new[e.id]))
            e.journal = msgspec.msgpack.encode(items)
    state = msgspec.msgpack.encode(entries)
    path.write_bytes(dataclasses.replace(ckpt, state=state).encode())
    return {wid: s.run for wid, s in starts.items()}


async def start_two(engine: fusee.Engine) -> None:
    await engine.start(holder, "run-a", "input-a")
    await engine.start(holder, "run-b", "input-b")


async def test_inputs_swapped_in_the_log_are_refused_at_open(tmp_path: Path) -> None:
    USED.clear()
    engine = await fusee.Engine.open(tmp_path, workflows=[holder], codec=aes())
    await start_two(engine)
    await crash_in_process(engine)  # no checkpoint at close: the records are only in the log
    runs = swap_inputs_in_log(tmp_path, "run-a", "run-b")
    try:
        engine = await fusee.Engine.open(tmp_path, workflows=[holder], codec=aes())
    except DecryptionFailed as e:
        assert e.run == runs["run-a"] and e.record == "Start.input"
        assert f"run {runs['run-a']}" in str(e) and "'run-a'" in str(e) and "input" in str(e)
        assert e.key_id == "k1"
    else:
        async with engine:
            await engine.signal("run-a", go, "now")
            got = await engine.get("run-a").result()
        pytest.fail(f"the engine opened a log with swapped inputs: {got!r}")
    assert USED == []


async def test_inputs_swapped_in_the_checkpoint_are_refused_when_the_run_wakes(tmp_path: Path) -> None:
    USED.clear()
    async with fusee.Engine.open(tmp_path, workflows=[holder], codec=aes()) as engine:
        await start_two(engine)
    runs = swap_inputs_in_checkpoint(tmp_path, "run-a", "run-b")  # both runs were parked at close
    async with fusee.Engine.open(tmp_path, workflows=[holder], codec=aes()) as engine:
        for wid in ("run-a", "run-b"):
            with pytest.raises(fusee.NotFound, match="does not decrypt"):
                await engine.signal(wid, go, "now")  # waking the run reads its journal: it stops
            with pytest.raises(DecryptionFailed) as failed:
                await engine.get(wid).result()
            assert failed.value.run == runs[wid] and failed.value.record == "Start.input"
            assert f"run {runs[wid]}" in str(failed.value) and f"{wid!r}" in str(failed.value)
            assert "does not decrypt" in engine.stuck()[wid]
    assert USED == []


@fusee.workflow("tagged")
async def tagged(ctx: fusee.Ctx, tag: str) -> None:
    ctx.set_attributes({"tag": tag})
    await ctx.wait_for(go)


async def test_attributes_swapped_in_the_checkpoint_are_refused(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[tagged], codec=aes()) as engine:
        await engine.start(tagged, "t-a", "tag-a")
        await engine.start(tagged, "t-b", "tag-b")
        await until(lambda: all(engine.describe(w).attributes for w in ("t-a", "t-b")))
    path = tmp_path / "checkpoint"
    ckpt = Checkpoint.decode(path.read_bytes())
    assert ckpt is not None
    entries = {e.id: e for e in msgspec.msgpack.decode(ckpt.state, type=list[CheckpointEntry])}
    assert entries["t-a"].sealed and len(entries["t-a"].attributes) == len(entries["t-b"].attributes)
    entries["t-a"].attributes, entries["t-b"].attributes = entries["t-b"].attributes, entries["t-a"].attributes
    path.write_bytes(dataclasses.replace(ckpt, state=msgspec.msgpack.encode(list(entries.values()))).encode())
    with pytest.raises(DecryptionFailed, match="attributes of workflow 't-a'"):
        await fusee.Engine.open(tmp_path, workflows=[tagged], codec=aes())


# --- payloads written before binding -----------------------------------------------


class OldAesGcm:
    """AesGcmCodec as it was before payloads were bound: format 1, only the key header authenticated."""

    def __init__(self, key: bytes, key_id: str = "k1") -> None:
        self.cipher = AESGCM(key)
        self.header = bytes([1, len(key_id)]) + key_id.encode()

    def encode(self, data: bytes) -> bytes:
        nonce = os.urandom(12)
        return self.header + nonce + self.cipher.encrypt(nonce, data, self.header)

    def decode(self, data: bytes) -> bytes:
        n = 2 + data[1]
        return self.cipher.decrypt(data[n:n + 12], data[n + 12:], data[:n])


def test_an_old_format_payload_still_decodes() -> None:
    old = OldAesGcm(K1).encode(b"written before binding")
    assert old[0] == 1
    codec = aes("k2", k1=K1, k2=K2)
    assert codec.decode(old) == b"written before binding"
    assert codec.decode(old, associated_data=b"wherever it is") == b"written before binding"
    new = codec.encode(b"bound", associated_data=b"here")
    assert new[0] == 2 and codec.decode(new, associated_data=b"here") == b"bound"
    with pytest.raises(DecryptionFailed, match="moved there from another record or run"):
        codec.decode(new, associated_data=b"elsewhere")
    with pytest.raises(DecryptionFailed):
        codec.decode(new)
    # The format byte is authenticated: a bound payload relabelled as old does not decode either.
    with pytest.raises(DecryptionFailed):
        codec.decode(bytes([1]) + new[1:])
    unbound = codec.encode(b"as before")
    assert unbound[0] == 1 and OldAesGcm(K2, "k2").decode(unbound) == b"as before"


async def test_a_directory_written_before_binding_opens_and_is_bound_once_rewritten(tmp_path: Path) -> None:
    USED.clear()
    async with fusee.Engine.open(tmp_path, workflows=[holder, tagged], codec=OldAesGcm(K1)) as engine:
        await start_two(engine)
        await engine.start(tagged, "t-old", "tag-old")
        await until(lambda: bool(engine.describe("t-old").attributes))
    assert {_input_format(tmp_path, w) for w in ("run-a", "run-b")} == {1}
    rotated = aes("k2", k1=K1, k2=K2)
    async with fusee.Engine.open(tmp_path, workflows=[holder, tagged], codec=rotated) as engine:
        assert engine.describe("t-old").attributes == {"tag": "tag-old"}
        await engine.signal("run-a", go, "now")
        assert await engine.get("run-a").result() == "run-a used input-a"
    # Run a was woken, so the checkpoint at close rewrote its journal: bound, under the current key.
    assert _input_format(tmp_path, "run-a") == 2 and _input_format(tmp_path, "run-b") == 1
    async with fusee.Engine.open(tmp_path, workflows=[holder, tagged], codec=rotated) as engine:
        await engine.signal("run-b", go, "now")
        assert await engine.get("run-b").result() == "run-b used input-b"
        assert await engine.get("run-a").result() == "run-a used input-a"
    assert USED == [("run-a", "input-a"), ("run-b", "input-b")]


def _input_format(d: Path, wid: str) -> int:
    """The first byte (AesGcmCodec's format) of workflow ``wid``'s encrypted input in the checkpoint."""
    ckpt = Checkpoint.decode((d / "checkpoint").read_bytes())
    assert ckpt is not None
    for e in msgspec.msgpack.decode(ckpt.state, type=list[CheckpointEntry]):
        if e.id == wid:
            start = peek(msgspec.msgpack.decode(e.journal, type=list[tuple[int, bytes]])[0][1])
            assert isinstance(start, rec.Start)
            return start.input[0]
    raise AssertionError(f"no {wid} in the checkpoint")


# --- what copies records elsewhere: each copy is sealed again where it lands -------------


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx, n: int) -> str:
    got = await ctx.wait_for(go)
    total = await ctx.step("add", lambda: n + len(got or ""))
    if n < 2:
        await ctx.continue_as_new(n + 1)
    return f"{got}:{total}"


@pytest.mark.parametrize("blob_threshold", [256 << 10, 64], ids=["in-batches", "as-blobs"])
async def test_bound_payloads_survive_reset_fork_continue_as_new_parking_and_checkpoints(
        tmp_path: Path, blob_threshold: int) -> None:
    opts: dict[str, Any] = {"workflows": [counter], "codec": aes(), "blob_threshold": blob_threshold}
    async with fusee.Engine.open(tmp_path, park_after=0, **opts) as engine:
        await engine.start(counter, "c", 0)
        runs: list[int] = []
        for _ in range(3):  # continue-as-new twice: three runs of one ID, each parked as it waits
            await until(lambda: engine.describe("c").run_id not in runs and engine.stats["parked"] > len(runs))
            runs.append(engine.describe("c").run_id)
            await engine.signal("c", go, "x")
        assert await engine.get("c").result() == "x:3"
        await engine.start(counter, "r", 2)
        await engine.signal("r", go, "first")
        assert await engine.get("r").result() == "first:7"
        await engine.fork("r", "r-fork", before_position=0, reapply_signals=False)
        await engine.reset("r", before_step="add")  # its signal is delivered again
        await engine.checkpoint()
    assert {_input_format(tmp_path, w) for w in ("c", "r", "r-fork")} == {2}
    async with fusee.Engine.open(tmp_path, **opts) as engine:
        assert await engine.get("r").result() == "first:7"
        await engine.signal("r-fork", go, "forked")
        assert await engine.get("r-fork").result() == "forked:8"
        assert await engine.get("c").result() == "x:3"
    async with fusee.Engine.open(tmp_path, codec=aes("k2", k1=K1, k2=K2), workflows=[counter]) as engine:
        assert [await engine.get(w).result() for w in ("c", "r", "r-fork")] == ["x:3", "first:7", "forked:8"]


# --- the binding on its own --------------------------------------------------------


def test_every_record_with_payloads_is_bound_to_readable_fields_of_its_own() -> None:
    for t, plan in PLANS.items():
        if plan:
            assert BINDING[t][0] == "run", t.__name__
            assert set(BINDING[t]) <= set(t.__struct_fields__) - {name for name, _ in plan}, t.__name__
    assert set(BINDING) == {t for t, plan in PLANS.items() if plan}


def test_a_payload_moved_between_records_does_not_open() -> None:
    sealer = Sealer(aes())
    a = rec.Step(run=7, seq=3, name="charge", attempt=1, status=rec.Status.OK, payload=b"a")
    variants = [msgspec.structs.replace(a, **{k: v}) for k, v in
                (("run", 8), ("seq", 4), ("name", "refund"), ("attempt", 2), ("status", rec.Status.FAILED))]
    sealed_a = peek(sealer.encode(a))
    assert sealer.decode(reseal(sealed_a)) == a
    for other in variants:
        moved = msgspec.structs.replace(peek(sealer.encode(other)), payload=sealed_a.payload)  # type: ignore[union-attr]
        with pytest.raises(DecryptionFailed) as failed:
            sealer.decode(reseal(moved))
        assert failed.value.run == other.run and failed.value.record == "Step.payload"
    # Two payload fields of one record are bound apart too.
    s = rec.Start(run=1, id="w", wtype="t", version=1, codec=0, started_ms=0, deadline_ms=0, parent=None,
                  policy=0, update=None, input=b"in", trace=b"tr")
    sealed = peek(sealer.encode(s))
    assert isinstance(sealed, rec.Start)
    with pytest.raises(DecryptionFailed, match=re.escape("the input of a Start record of run 1 (workflow 'w')")):
        sealer.decode(reseal(msgspec.structs.replace(sealed, input=sealed.trace, trace=sealed.input)))


class Tagged:
    """A custom codec that binds: it keeps what it was given as associated data, and checks it."""

    def __init__(self) -> None:
        self.seen: list[bytes | None] = []

    def encode(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        self.seen.append(associated_data)
        return len(associated_data or b"").to_bytes(4, "big") + (associated_data or b"") + data

    def decode(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        n = int.from_bytes(data[:4], "big")
        if data[4:4 + n] != (associated_data or b""):
            raise DecryptionFailed("not where it was written")
        return data[4 + n:]


class Lopsided:
    def encode(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        return data

    def decode(self, data: bytes) -> bytes:
        return data


async def test_a_custom_codec_that_takes_associated_data_gets_it(tmp_path: Path) -> None:
    USED.clear()
    custom = Tagged()
    async with fusee.Engine.open(tmp_path, workflows=[holder], codec=custom) as engine:
        await start_two(engine)
    assert custom.seen and all(ad for ad in custom.seen)
    swap_inputs_in_checkpoint(tmp_path, "run-a", "run-b")
    async with fusee.Engine.open(tmp_path, workflows=[holder], codec=Tagged()) as engine:
        with pytest.raises(fusee.NotFound, match="input of a Start record"):
            await engine.signal("run-a", go, "now")
    assert USED == []
    with pytest.raises(TypeError, match="associated_data= in encode but not in decode"):
        await fusee.Engine.open(tmp_path, workflows=[holder], codec=Lopsided())
