"""The engine over a failing or foreign disk: typed errors, no hangs, nothing held, nothing touched."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.errors import (
    CorruptRecord,
    DirectoryLocked,
    EngineClosed,
    InvalidMeta,
    InvalidWorkflowId,
    LogCorrupted,
    LogFailed,
    NotAnEngineDirectory,
)
from fusee.storage.checkpoint import Checkpoint
from tests.helpers import until

go = fusee.signal("go", int)


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Runs an async test on a fresh loop (pytest here has no asyncio plugin)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


@fusee.workflow("waits")
async def waits(ctx: fusee.Ctx) -> int:
    return await ctx.wait_for(go)


def tree(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with a hash of its bytes."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# --- 5. waiters hear of a close or a failed log ---------------------------------------------


@sync
async def test_result_waiters_get_engine_closed_at_close() -> None:
    engine = await fusee.Engine.open(workflows=[waits])
    h = await engine.start(waits, "w1")
    waiter = asyncio.ensure_future(h.result())
    await until(lambda: bool(engine._rt.wf["w1"].waiters))
    await engine.close()
    with pytest.raises(EngineClosed, match="closed"):
        await asyncio.wait_for(waiter, 5)


@sync
async def test_result_waiters_get_engine_closed_when_the_log_fails() -> None:
    engine = await fusee.Engine.open(workflows=[waits])
    h = await engine.start(waits, "w1")
    waiter = asyncio.ensure_future(h.result())
    await until(lambda: bool(engine._rt.wf["w1"].waiters))
    engine._log.storage.fail_next_fdatasync()  # type: ignore[attr-defined]
    with pytest.raises(EngineClosed):
        await engine.start(waits, "w2")
    with pytest.raises(EngineClosed, match="log failed") as info:
        await asyncio.wait_for(waiter, 5)
    assert isinstance(info.value.__cause__, LogFailed)
    await engine.close()


add = fusee.update("add", int)


@fusee.workflow("adder")
async def adder(ctx: fusee.Ctx) -> int:
    total = 0

    async def handle(n: int) -> int:
        nonlocal total
        total += await ctx.step("s", lambda: n)
        return total

    ctx.on_update(add, handle)
    await ctx.sleep("long", "1h")
    return total


@sync
async def test_update_waiters_get_engine_closed_when_the_log_fails() -> None:
    engine = await fusee.Engine.open(workflows=[adder])
    await engine.start(adder, "a1")
    engine._log.storage.fail_next_fdatasync()  # type: ignore[attr-defined]
    with pytest.raises(EngineClosed, match="log failed"):
        await asyncio.wait_for(engine.update("a1", add, 3), 5)
    await engine.close()


@sync
async def test_update_waiters_get_engine_closed_at_close() -> None:
    gate = asyncio.Event()

    @fusee.workflow("slow_adder")
    async def slow_adder(ctx: fusee.Ctx) -> int:
        async def handle(n: int) -> int:
            return await ctx.step("s", gate.wait)  # type: ignore[no-any-return]

        ctx.on_update(add, handle)
        await ctx.sleep("long", "1h")
        return 0

    engine = await fusee.Engine.open(workflows=[slow_adder])
    await engine.start(slow_adder, "a1")
    pending = asyncio.ensure_future(engine.update("a1", add, 3))
    await until(lambda: bool(engine._rt.wf["a1"].run and engine._rt.wf["a1"].run.update_inflight))
    await engine.close()
    with pytest.raises(EngineClosed, match="closed"):
        await asyncio.wait_for(pending, 5)


@sync
async def test_close_reports_a_failed_checkpoint() -> None:
    engine = await fusee.Engine.open(workflows=[waits])
    await engine.start(waits, "w1")
    engine._log.storage.fail_next_fdatasync()  # type: ignore[attr-defined]
    with pytest.raises(LogFailed):
        await engine.close()


# --- 6. a failed open holds nothing -------------------------------------------------------


@sync
async def test_a_failed_open_releases_the_directory(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[waits]) as engine:
        await engine.start(waits, "w1")
    ckpt = Checkpoint.decode((tmp_path / "checkpoint").read_bytes())
    assert ckpt is not None
    # A valid checksum over content the engine cannot read.
    forged = Checkpoint(ckpt.lsns, ckpt.start_segment, b"\xc1garbage", ckpt.end_seq)
    (tmp_path / "checkpoint").write_bytes(forged.encode())
    for _ in range(2):  # the second open gets the same error, not DirectoryLocked
        with pytest.raises(LogCorrupted, match="content does not decode") as info:
            await fusee.Engine.open(tmp_path, workflows=[waits])
        assert info.value.path.endswith("checkpoint")


# --- 7, 8, 10. meta files and records ----------------------------------------------------


@pytest.mark.parametrize("meta", ['{"format": 3, "shards": 0}', '{"format": 3, "shards": -1}',
                                  '{"format": 3, "shards": 1e400}', '{"format": 3, "shards": 1000000000}',
                                  "[" * 100_000 + "]" * 100_000, '{"format": 3, "shards": true}', "{"])
@sync
async def test_a_bad_meta_file_is_a_typed_error_naming_it(tmp_path: Path, meta: str) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[waits]):
        pass
    (tmp_path / "meta").write_text(meta)
    with pytest.raises(InvalidMeta) as info:
        await fusee.Engine.open(tmp_path, workflows=[waits])
    assert str(tmp_path / "meta") in str(info.value)
    (tmp_path / "meta").write_text('{"format": 3, "shards": 1}')
    async with fusee.Engine.open(tmp_path, workflows=[waits]):  # and the lock was released
        pass


@sync
async def test_a_missing_meta_file_with_a_log_is_refused(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[waits], shards=3) as engine:
        await engine.start(waits, "w1")
    (tmp_path / "meta").unlink()
    before = tree(tmp_path)
    with pytest.raises(NotAnEngineDirectory, match="meta file was lost"):
        await fusee.Engine.open(tmp_path, workflows=[waits])
    assert tree(tmp_path) == before


@sync
async def test_a_crafted_record_is_a_corrupt_record_naming_file_and_offset(tmp_path: Path) -> None:
    from fusee.storage.log import SharedLog
    from fusee.storage.posix import PosixStorage

    async with fusee.Engine.open(tmp_path, workflows=[waits]):
        pass
    log, _ = SharedLog.open(PosixStorage(), str(tmp_path), 1)
    log.append(0, b"\x01not a record")
    log.flush()
    seg = log._segments[-1].path
    log.close()
    with pytest.raises(CorruptRecord) as info:
        await fusee.Engine.open(tmp_path, workflows=[waits])
    assert info.value.path == seg and info.value.offset == 4096


@sync
async def test_a_workflow_id_with_a_lone_surrogate_is_refused() -> None:
    async with fusee.Engine.open(workflows=[waits]) as engine:
        with pytest.raises(InvalidWorkflowId):
            await engine.start(waits, "bad\ud800id")
        await engine.start(waits, "fine")  # the engine lives on


# --- issue 9, finding 3: directories that are not ours ----------------------------------------


@sync
async def test_a_foreign_directory_is_refused_and_left_untouched(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "000000000001.seg").write_bytes(b"my own log")
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "user-1.png").write_bytes(b"\x89PNG")
    (tmp_path / "lock").write_text("mine")
    before = tree(tmp_path)
    with pytest.raises(NotAnEngineDirectory):
        await fusee.Engine.open(tmp_path, workflows=[waits])
    assert tree(tmp_path) == before


@sync
async def test_a_directory_with_other_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(NotAnEngineDirectory, match="not an engine directory"):
        await fusee.Engine.open(tmp_path, workflows=[waits])
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@sync
async def test_a_file_is_refused_clearly(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("data")
    with pytest.raises(NotAnEngineDirectory, match="is a file"):
        await fusee.Engine.open(f, workflows=[waits])
    assert f.read_text() == "data"


@sync
async def test_an_engine_directory_in_use_is_refused_even_without_its_lock_file(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[waits]):
        (tmp_path / "lock").unlink()
        with pytest.raises(DirectoryLocked):
            await fusee.Engine.open(tmp_path, workflows=[waits])


def _cli(*args: str) -> tuple[int, str, str]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fusee.cli", *args], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(Path(fusee.__file__).parents[1])})
    return out.returncode, out.stdout, out.stderr


def test_read_only_cli_commands_never_write(tmp_path: Path) -> None:
    missing = tmp_path / "typo-dir"
    code, _, err = _cli("runs", str(missing))
    assert code != 0 and "does not exist" in err
    assert not missing.exists()

    engine_dir = tmp_path / "e"

    async def setup() -> None:
        async with fusee.Engine.open(engine_dir, workflows=[waits]) as engine:
            await engine.start(waits, "w1")

    asyncio.run(setup())
    before = tree(engine_dir)
    code, out, err = _cli("runs", str(engine_dir), "--json")
    assert code == 0, err
    assert [(r["workflow_id"], r["workflow"]) for r in json.loads(out)["items"]] == [("w1", "waits")]
    code, out, err = _cli("journal", str(engine_dir), "w1")
    assert code == 0, err
    assert json.loads(out)[0]["kind"] == "Start"
    assert tree(engine_dir) == before

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    code, _, err = _cli("runs", str(foreign))
    assert code != 0 and "not an engine directory" in err
    assert tree(foreign) == {"x": hashlib.sha256(b"x").hexdigest()}


@sync
async def test_a_crafted_start_with_an_empty_id_is_refused_at_open(tmp_path: Path) -> None:
    from fusee.core import records as rec
    from fusee.storage.log import SharedLog
    from fusee.storage.posix import PosixStorage

    async with fusee.Engine.open(tmp_path, workflows=[waits]):
        pass
    log, _ = SharedLog.open(PosixStorage(), str(tmp_path), 1)
    log.append(0, rec.encode(rec.Start(1, "", "waits", 1, 0, 0, 0, None, 0, None, b"null")))
    log.flush()
    log.close()
    with pytest.raises(CorruptRecord, match="empty workflow ID"):
        await fusee.Engine.open(tmp_path, workflows=[waits])


@fusee.workflow("big")
async def big(ctx: fusee.Ctx, n: int) -> str:
    return await ctx.step("pad", lambda: "x" * 2000)


@sync
async def test_a_checkpoint_is_written_by_size_too() -> None:
    async with fusee.Engine.open(workflows=[big], checkpoint_every=10**9, checkpoint_bytes=64 << 10) as engine:
        for i in range(40):  # about 80 KiB of step results
            await engine.execute(big, f"b{i}", i)
        await until(lambda: engine.stats["checkpoints"] >= 1)
        assert engine._log.since_checkpoint < 64 << 10


@sync
async def test_a_failed_log_wakes_no_parked_run() -> None:
    # Waking replays and appends; a wake that failed would park the run again and be asked
    # again at once (seed 1225: a parent's replay resent its finished child's start, forever).
    engine = await fusee.Engine.open(workflows=[waits], park_after=0)
    await engine.start(waits, "w1")
    await until(lambda: engine._rt.wf["w1"].packed is not None)
    woken = engine._rt.stats["woken"]
    engine._log.storage.fail_next_fdatasync()  # type: ignore[attr-defined]
    with pytest.raises(EngineClosed):
        await engine.start(waits, "w2")
    with pytest.raises(LogFailed):
        engine._rt.loaded(engine._rt.wf["w1"])
    with pytest.raises(EngineClosed):
        await engine.signal("w1", go, 1)
    assert engine._rt.stats["woken"] == woken
    await engine.close()
