"""Issue 28: ``Engine.open(backup=...)`` in process: what it refuses, encryption at rest in the
target, and a target that fails without holding the engine back."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

import fusee
import fusee.backup as fb
from fusee.errors import BackupUnavailable, MissingKey
from tests.helpers import until

KEY = bytes(range(32))
SECRET = "the-plaintext-payload-" * 4


@fusee.workflow("echo")
async def echo(ctx: fusee.Ctx, text: str) -> str:
    return await ctx.step("copy", lambda: text.upper())  # type: ignore[no-any-return]


async def test_backup_needs_a_directory_opened_to_write(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="in memory"):
        await fusee.Engine.open(None, backup=fusee.Backup(tmp_path / "t"))
    async with fusee.Engine.open(tmp_path / "d"):
        pass
    with pytest.raises(ValueError, match="read-only"):
        await fusee.Engine.open(tmp_path / "d", read_only=True, backup=fusee.Backup(tmp_path / "t"))
    with pytest.raises(TypeError, match=r"fusee\.Backup"):
        await fusee.Engine.open(tmp_path / "d", backup=str(tmp_path / "t"))  # type: ignore[arg-type]
    with pytest.raises(BackupUnavailable, match="only local directories and s3://"):
        fusee.Backup("ftp://host/x")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BackupUnavailable, match="is a file"):
        fusee.Backup(tmp_path / "file")
    with pytest.raises(ValueError, match="interval"):
        fusee.Backup(tmp_path / "t", interval=0)


async def test_uploads_stay_encrypted_and_a_restore_needs_the_keys(tmp_path: Path) -> None:
    codec = fusee.AesGcmCodec({"k1": KEY}, current="k1")
    target = tmp_path / "target"
    async with fusee.Engine.open(tmp_path / "data", workflows=[echo], codec=codec,
                                 backup=fusee.Backup(target, interval=0.05)) as engine:
        assert await (await engine.start(echo, "e1", SECRET)).result() == SECRET.upper()
    stored = b"".join(p.read_bytes() for p in target.rglob("*") if p.is_file())
    assert b"e1" in stored  # IDs stay readable, as on disk
    assert SECRET.encode() not in stored and SECRET.upper().encode() not in stored

    fb.restore(target, tmp_path / "restored")
    async with fusee.Engine.open(tmp_path / "restored", workflows=[echo], codec=codec) as engine:
        assert await engine.get("e1").result() == SECRET.upper()
    with pytest.raises(MissingKey):
        async with fusee.Engine.open(tmp_path / "restored", workflows=[echo]) as engine:
            await engine.get("e1").result()


class Refusing:
    """A target whose uploads all fail (a store that is down)."""

    name = "refusing"

    def __init__(self) -> None:
        self.calls = 0

    def put(self, key: str, data: bytes) -> None:
        self.calls += 1
        raise OSError("the store is down")

    def get(self, key: str) -> bytes:
        raise FileNotFoundError(key)

    def exists(self, key: str) -> bool:
        return False

    def list(self, prefix: str) -> list[str]:
        return []


async def test_a_failing_target_is_reported_and_never_holds_the_engine_back(tmp_path: Path) -> None:
    target = Refusing()
    async with fusee.Engine.open(tmp_path / "data", workflows=[echo],
                                 backup=fusee.Backup(target, interval=0.01, retry_max=0.02,
                                                     close_timeout=5)) as engine:
        for i in range(20):
            assert await (await engine.start(echo, f"e{i}", "x")).result() == "X"
        await until(lambda: (s := engine.metrics().backup) is not None and s.failures >= 3)
        status = engine.metrics().backup
        assert status is not None and status.position == 0 and status.points == 0
        assert status.last_error == "OSError: the store is down" and status.lag_s > 0
    assert target.calls >= 3
    assert os.listdir(tmp_path / "data")


OWNER = """
import asyncio, sys
import fusee

async def main():
    async with fusee.Engine.open(sys.argv[1]):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


async def test_a_follower_opened_with_backup_reads_through_its_view(tmp_path: Path) -> None:
    """The process that follows another one's directory keeps ``backup=`` for when it takes
    over; its read-only view of the directory must open without it."""
    import subprocess
    import sys

    from tests.backup.crash import ROOT

    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "data")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        async with fusee.Engine.open(tmp_path / "data", workflows=[echo],
                                     backup=fusee.Backup(tmp_path / "target")) as follower:
            assert not follower.is_owner
            assert follower.runs() == []
            assert owner.stdin is not None
            owner.stdin.close()  # the owner closes: the follower takes the directory over
            assert owner.wait(60) == 0
            await (await follower.start(echo, "after", "x")).result()
        # It backed the directory up once it owned it.
        fb.restore(tmp_path / "target", tmp_path / "restored")
        async with fusee.Engine.open(tmp_path / "restored", read_only=True) as view:
            assert [r.workflow_id for r in view.runs()] == ["after"]
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(60)


class Stalling(Refusing):
    """A target whose first upload hangs until released (a store that stopped answering)."""

    name = "stalling"

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def put(self, key: str, data: bytes) -> None:
        self.entered.set()
        self.release.wait(60)
        raise OSError("the store stopped answering")


async def test_a_stalled_target_holds_neither_steps_nor_close(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    target = Stalling()
    try:
        engine = await fusee.Engine.open(tmp_path / "data", workflows=[echo],
                                         backup=fusee.Backup(target, interval=0.01, close_timeout=0.2))
        await asyncio.get_running_loop().run_in_executor(None, target.entered.wait, 30)
        for i in range(20):  # the upload hangs; acknowledgements do not wait for it
            assert await (await engine.start(echo, f"e{i}", "x")).result() == "X"
        await engine.close()  # gives the last upload close_timeout, then lets go
        assert "an upload still runs" in caplog.text
    finally:
        target.release.set()
        # The directory is free although the stalled upload still runs: the backup's reads hold
        # a descriptor of the directory of their own, which the lock is not on.
        async with fusee.Engine.open(tmp_path / "data", workflows=[echo], exclusive=True) as again:
            assert len(again.runs()) == 20
