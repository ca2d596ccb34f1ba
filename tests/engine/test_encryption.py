"""Payload encryption at rest: nothing a user passed is readable in the engine's files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.core import records as rec
from fusee.errors import CodecError, DecryptionFailed, MissingKey
from fusee.runtime.sealing import PLANS, SEALED, Sealer

K1 = bytes(range(32))
K2 = bytes(range(100, 132))
MARK = b"S3CRET"

hold = fusee.signal("hold", str)
bump = fusee.update("bump", str, result_type=str)
note = fusee.signal("note", str)
TOKENS: list[str] = []


@fusee.workflow("child-vault")
async def child_vault(ctx: fusee.Ctx, secret: str) -> str:
    return secret + "-child-result"


@fusee.workflow("sink")
async def sink(ctx: fusee.Ctx) -> str:
    got = await ctx.wait_for(note)
    return f"sink got {got}"


def flaky(info: fusee.StepInfo) -> str:
    info.heartbeat("S3CRET-heartbeat")
    info.stream("tokens").write("S3CRET-step-chunk")  # a retry repeats it: recorded once
    if info.attempt == 1:
        raise RuntimeError("S3CRET-step-error")
    return "S3CRET-flaky-result"


@fusee.workflow("vault")
async def vault(ctx: fusee.Ctx, secret: str) -> str:
    ctx.set_attributes({"owner": "S3CRET-attribute"})
    ctx.on_update(bump, lambda v: v + "-S3CRET-update-result")
    progress = ctx.stream("progress")
    await progress.write("S3CRET-workflow-chunk")
    await progress.close()
    plain = await ctx.step("plain", lambda: "S3CRET-step-result")
    again = await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=2, initial="1ms"))
    child = await ctx.child(child_vault, f"{ctx.workflow_id}-child", "S3CRET-child-input")
    await ctx.signal_workflow("sink-1", note, "S3CRET-sent-signal")
    signalled = await ctx.wait_for(hold)
    completed = await ctx.await_completion("approve", lambda info: TOKENS.append(info.token))
    ctx.now(), ctx.random(), ctx.uuid4()
    return f"{secret}|{plain}|{again}|{child}|{signalled}|{completed}|S3CRET-result"


@fusee.workflow("doomed")
async def doomed(ctx: fusee.Ctx) -> None:
    raise ValueError("S3CRET-workflow-error")


@fusee.workflow("waiter")
async def waiter(ctx: fusee.Ctx) -> None:
    await ctx.wait_for(hold)


WORKFLOWS = [vault, child_vault, sink, doomed, waiter]


def codec(current: str = "k1", **keys: bytes) -> fusee.AesGcmCodec:
    return fusee.AesGcmCodec(keys=keys or {"k1": K1}, current=current)


async def until(cond: Any) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), 30)


async def run_everything(engine: fusee.Engine) -> str:
    """Every kind of payload the engine stores, each holding MARK."""
    TOKENS.clear()
    await engine.start(sink, "sink-1")
    h = await engine.start(vault, "vault-1", "S3CRET-input")
    assert await engine.update("vault-1", bump, "S3CRET-update-arg") == "S3CRET-update-arg-S3CRET-update-result"
    await until(lambda: any(r.workflow_id == "vault-1-child" and r.status == "ok" for r in engine.runs()))
    await h.signal(hold, "S3CRET-signal")
    await until(lambda: TOKENS)
    assert await engine.complete(TOKENS[0], "S3CRET-completion", by="S3CRET-by-completion")
    result = await h.result()
    with pytest.raises(fusee.WorkflowFailed):
        await engine.execute(doomed, "doomed-1")
    await engine.start(waiter, "waiter-1")
    await engine.cancel("waiter-1", "S3CRET-cancel-reason", by="S3CRET-by-cancel")
    await engine.start(waiter, "waiter-2")
    await engine.terminate("waiter-2", "S3CRET-terminate-reason", by="S3CRET-by-terminate")
    await engine.start(waiter, "waiter-3")
    await engine.signal("waiter-3", hold, "S3CRET-signal-by", by="S3CRET-by-signal")
    assert await engine.get("sink-1").result() == "sink got S3CRET-sent-signal"
    return result


EXPECTED = ("S3CRET-input|S3CRET-step-result|S3CRET-flaky-result|S3CRET-child-input-child-result|"
            "S3CRET-signal|S3CRET-completion|S3CRET-result")


def files_holding(d: Path, needle: bytes) -> list[str]:
    found = []
    for root, _dirs, names in os.walk(d):
        for name in names:
            path = Path(root, name)
            if needle in path.read_bytes():
                found.append(str(path.relative_to(d)))
    return found


async def check_readable(engine: fusee.Engine) -> None:
    """What users read back is the plain value, whatever is on disk."""
    assert await engine.get("vault-1").result() == EXPECTED
    assert [c async for c in engine.read_stream("vault-1", "progress")] == ["S3CRET-workflow-chunk"]
    assert [c async for c in engine.read_stream("vault-1", "tokens")] == ["S3CRET-step-chunk"]
    assert engine.describe("vault-1").attributes == {"owner": "S3CRET-attribute"}
    with pytest.raises(fusee.WorkflowFailed, match="S3CRET-workflow-error"):
        await engine.get("doomed-1").result()
    kinds = {type(r).__name__ for r in await engine.journal("vault-1")}
    assert {"Start", "Step", "Attempt", "Heartbeat", "Chunk", "Attributes", "Child", "ChildDone", "Send",
            "Signal", "Update", "UpdateDone", "Completed", "Value", "Done"} <= kinds


@pytest.mark.parametrize("blob_threshold", [256 << 10, 64], ids=["in-batches", "as-blobs"])
async def test_no_payload_is_readable_in_the_files(tmp_path: Path, blob_threshold: int) -> None:
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec(),
                                 blob_threshold=blob_threshold) as engine:
        assert await run_everything(engine) == EXPECTED
        assert not files_holding(tmp_path, MARK), "a payload reached the log in plaintext"
        await engine.checkpoint()  # packed journals and attributes in the checkpoint
        await check_readable(engine)
    assert not files_holding(tmp_path, MARK), files_holding(tmp_path, MARK)
    # IDs and names stay readable for operators.
    assert files_holding(tmp_path, b"vault-1") and files_holding(tmp_path, b"flaky")
    if blob_threshold == 64:
        assert any("blob" in f for f in files_holding(tmp_path, b"vault-1")), "no record went to a blob"
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec()) as engine:
        await check_readable(engine)


async def test_without_a_codec_the_same_files_hold_the_payloads(tmp_path: Path) -> None:
    """The control: the scan above does find plaintext payloads when there is no codec."""
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS) as engine:
        assert await run_everything(engine) == EXPECTED
    assert files_holding(tmp_path, b"S3CRET-heartbeat") and files_holding(tmp_path, b"S3CRET-step-chunk")


async def test_rotation_keeps_old_records_readable_and_a_missing_key_is_named(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec()) as engine:
        await run_everything(engine)
    rotated = codec("k2", k1=K1, k2=K2)
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=rotated) as engine:
        await check_readable(engine)
        assert await engine.execute(child_vault, "after-rotation", "S3CRET-new") == "S3CRET-new-child-result"
    # New writes use k2: a codec with only k2 reads them but not the old records.
    with pytest.raises(MissingKey) as missing:
        await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec("k2", k2=K2))
    assert missing.value.key_id == "k1" and "'k1'" in str(missing.value)
    # The failed open left the directory as it was: the full key set still opens it.
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=rotated) as engine:
        assert await engine.get("after-rotation").result() == "S3CRET-new-child-result"
        await engine.checkpoint()
    with pytest.raises(MissingKey) as missing:
        await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec("k1", k1=K1))
    assert missing.value.key_id == "k2"


async def test_a_wrong_key_or_no_codec_is_a_typed_error(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec()) as engine:
        await engine.execute(child_vault, "c", "S3CRET-x")
    with pytest.raises(DecryptionFailed, match="'k1'") as failed:
        await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec(k1=K2))
    assert failed.value.key_id == "k1"
    with pytest.raises(MissingKey, match="without a codec"):
        await fusee.Engine.open(tmp_path, workflows=WORKFLOWS)


async def test_a_plain_directory_opens_with_a_codec(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS) as engine:
        await engine.execute(child_vault, "old", "S3CRET-old")
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec()) as engine:
        assert await engine.get("old").result() == "S3CRET-old-child-result"
        await engine.execute(child_vault, "new", "FRESH-new")
    assert not files_holding(tmp_path, b"FRESH")
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec()) as engine:
        assert await engine.get("new").result() == "FRESH-new-child-result"


class Reverse(fusee.Codec):
    """A custom codec (a stand-in for a KMS): tags its output, counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, data: bytes) -> bytes:
        self.calls += 1
        return b"REV1" + data[::-1]

    def decode(self, data: bytes) -> bytes:
        if not data.startswith(b"REV1"):
            raise DecryptionFailed("not a REV1 payload")
        return data[4:][::-1]


async def test_a_custom_codec_is_used_for_every_payload(tmp_path: Path) -> None:
    custom = Reverse()
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=custom) as engine:
        assert await run_everything(engine) == EXPECTED
    assert custom.calls > 20
    assert not files_holding(tmp_path, MARK)
    assert files_holding(tmp_path, MARK[::-1])
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=Reverse()) as engine:
        await check_readable(engine)


class Broken:
    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes) -> bytes:
        raise KeyError("the KMS is down")


async def test_a_codec_that_fails_is_a_codec_error(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=Broken()) as engine:
        await engine.execute(child_vault, "c", "x")
    with pytest.raises(CodecError, match="the KMS is down"):
        await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=Broken())
    with pytest.raises(TypeError, match="encode"):
        await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=object())  # type: ignore[arg-type]


async def test_the_test_engine_takes_a_codec() -> None:
    from fusee.testing import TestEngine

    async with TestEngine(workflows=WORKFLOWS, codec=codec()) as env:
        assert await env.execute(child_vault, "c", "x") == "x-child-result"


# --- the codec and the sealer on their own -----------------------------------------


def test_aes_gcm_round_trip_nonces_and_tampering() -> None:
    c = codec("k2", k1=K1, k2=K2)
    a, b = c.encode(b"hello"), c.encode(b"hello")
    assert a != b, "every payload gets a fresh nonce"
    assert c.decode(a) == b"hello" and b"hello" not in a and b"k2" in a
    assert codec("k1", k1=K1, k2=K2).decode(a) == b"hello"  # rotation: any held key decodes
    for i in range(len(a)):
        bad = bytearray(a)
        bad[i] ^= 1
        with pytest.raises(CodecError):
            c.decode(bytes(bad))
    with pytest.raises(DecryptionFailed, match="cut short"):
        c.decode(a[:-20])
    with pytest.raises(MissingKey, match="'k2'"):
        codec(k1=K1).decode(a)
    assert c.decode(c.encode(b"")) == b""
    assert "k1" in repr(c) and str(K1) not in repr(c)
    assert len(fusee.AesGcmCodec.generate_key()) == 32


@pytest.mark.parametrize(
    ("keys", "current", "error"),
    [({}, "k", "at least one key"), ({"k": b"short"}, "k", "32 bytes"), ({"k": K1}, "other", "current="),
     ({"": K1}, "", "non-empty"), ({"k": "a string"}, "k", "32 bytes")],
)
def test_aes_gcm_refuses_bad_keys(keys: Any, current: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        fusee.AesGcmCodec(keys=keys, current=current)


def test_every_bytes_field_of_every_record_is_sealed() -> None:
    """The sealer finds payload fields from the record types: a new field cannot be missed."""
    assert PLANS[rec.Step] == (("payload", None),)
    assert ("input", None) in PLANS[rec.Start] and ("update", (("payload", None),)) in PLANS[rec.Start]
    assert PLANS[rec.Timer] == () and PLANS[rec.Fired] == ()
    sealer = Sealer(Reverse())
    r = rec.Start(run=1, id="w", wtype="t", version=1, codec=0, started_ms=5, deadline_ms=0, parent=None,
                  policy=0, update=rec.UpdateWithStart("u", "u1", b"upd"), input=b"inp", trace=None, by=b"")
    data = sealer.encode(r)
    assert data[0] == SEALED and b"inp" not in data and b"upd" not in data and b"w" in data
    assert sealer.decode(data) == r
    assert Sealer().decode(rec.encode(r)) == r


async def test_a_parked_run_under_a_missing_key_is_stopped_not_garbage(tmp_path: Path) -> None:
    """A run parked in the checkpoint is decrypted only when it wakes: then a missing key stops it."""
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec(), park_after=0) as engine:
        await engine.start(waiter, "parked")
        await until(lambda: engine.stats["parked"] >= 1)
    only_k2 = codec("k2", k2=K2)
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=only_k2) as engine:
        with pytest.raises(fusee.NotFound, match="'k1'"):
            await engine.signal("parked", hold, "wake up")
        assert "'k1'" in engine.stuck()["parked"]
    async with fusee.Engine.open(tmp_path, workflows=WORKFLOWS, codec=codec("k2", k1=K1, k2=K2)) as engine:
        await engine.signal("parked", hold, "wake up")
        assert await engine.get("parked").result() is None


@fusee.workflow("tagged-waiter")
async def tagged_waiter(ctx: fusee.Ctx) -> None:
    ctx.set_attributes({"team": "S3CRET-team"})
    await ctx.wait_for(hold)


async def test_encrypted_attributes_of_a_parked_run_need_the_codec(tmp_path: Path) -> None:
    """Only a parked run in the checkpoint: its encrypted attributes still refuse an open without a codec."""
    async with fusee.Engine.open(tmp_path, workflows=[tagged_waiter], codec=codec(), park_after=0) as engine:
        await engine.start(tagged_waiter, "parked")
        await until(lambda: engine.stats["parked"] >= 1)
    assert not files_holding(tmp_path, MARK)
    with pytest.raises(MissingKey, match="without a codec"):
        await fusee.Engine.open(tmp_path, workflows=[tagged_waiter])
    async with fusee.Engine.open(tmp_path, workflows=[tagged_waiter], codec=codec()) as engine:
        assert engine.describe("parked").attributes == {"team": "S3CRET-team"}
