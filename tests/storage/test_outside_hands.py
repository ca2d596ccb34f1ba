"""Issue 22: what outside hands do to an engine directory (rename and restore it, put a FIFO
where a segment is, zero the log's last batches) is refused or survived, never silent."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee import errors
from fusee.errors import LogCorrupted
from fusee.storage.log import SharedLog, segment_name
from fusee.storage.posix import PosixStorage

APP = Path(__file__).with_name("hands_app.py")
ROOT = Path(__file__).resolve().parents[2]


class App:
    """hands_app.py in a subprocess, steered by stdin; its JSON lines read on a thread."""

    def __init__(self, directory: Path) -> None:
        #: Every line read so far.
        self.seen: list[dict[str, Any]] = []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.p = subprocess.Popen([sys.executable, str(APP), str(directory)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.opened = self.until("opened")

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.strip():
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def until(self, key: str) -> dict[str, Any]:
        """The next line holding ``key`` (the lines before it are kept in ``seen``)."""
        while True:
            try:
                got = self.lines.get(timeout=120)
            except queue.Empty:
                raise AssertionError(f"no {key!r} line from the app in time") from None
            if got is None:
                raise AssertionError(f"the app exited before a {key!r} line: {self.p.stderr.read()}")  # type: ignore[union-attr]
            self.seen.append(got)
            if key in got:
                return got

    def send(self, command: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()

    def start(self, prefix: str, n: int) -> tuple[list[str], list[dict[str, Any]]]:
        """Starts ``n`` runs; returns the acknowledged IDs and the refusals."""
        before = len(self.seen)
        self.send(f"start {prefix} {n}")
        self.until("started")
        lines = self.seen[before:]
        return [x["acked"] for x in lines if "acked" in x], [x for x in lines if "refused" in x]

    def kill(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(60)


def test_a_renamed_and_restored_directory_keeps_each_writer_in_its_own_directory(tmp_path: Path) -> None:
    """``mv data data.old && cp -a data.old data`` while the owner runs: a second process
    owns the copy; the old owner never writes into it, notices, and acknowledges nothing more."""
    data = tmp_path / "data"
    old = App(data)
    before, _ = old.start("a", 10)
    assert len(before) == 10

    data.rename(tmp_path / "data.old")
    subprocess.run(["cp", "-a", str(tmp_path / "data.old"), str(data)], check=True)

    new = App(data)  # the copy is not locked: this process owns it
    assert new.opened["epoch"] > old.opened["epoch"]
    theirs, refused = new.start("b", 30)
    assert len(theirs) == 30 and not refused

    # The old owner goes on: whatever it does now must not reach the path's directory.
    after, refusals = old.start("post", 30)
    old.send("checkpoint")
    ckpt = old.until("checkpoint")
    old.send("close")
    closed = old.until("closed")
    old.p.wait(60)
    # It noticed that the path names another directory, said so, and acknowledged nothing more.
    assert after == [], f"the old owner acknowledged {after} after its directory was moved"
    assert {r["error"] for r in refusals} == {"EngineClosed"}
    assert closed["failure"] == "DirectoryMoved" and ckpt["checkpoint"] is not None
    assert str(data) in ckpt["message"] and "renamed or deleted" in ckpt["message"]

    new.kill()  # its acknowledged starts are durable; its close would hide a clobbered checkpoint

    async def reopen() -> set[str]:
        async with fusee.Engine.open(data, read_only=True) as engine:
            return {r.workflow_id for r in engine.runs()}

    ids = asyncio.run(reopen())
    assert set(theirs) <= ids, f"lost: {sorted(set(theirs) - ids)}"
    assert set(before) <= ids
    foreign = {i for i in ids if i.startswith("post-")}
    assert not foreign, f"the old owner's runs after the move appear in the copy: {sorted(foreign)}"


def _engine_with_runs(path: Path, n: int) -> None:
    @fusee.workflow("job")
    async def job(ctx: fusee.Ctx, x: int) -> int:
        return x

    async def main() -> None:
        async with fusee.Engine.open(path, workflows=[job]) as engine:
            for i in range(n):
                await engine.start(job, f"r-{i}", i)

    asyncio.run(main())


def test_a_fifo_in_place_of_a_segment_is_refused_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _engine_with_runs(data, 3)
    newest = sorted((data / "log").glob("*.seg"))[-1]
    newest.unlink()
    os.mkfifo(newest)

    async def main() -> None:
        await fusee.Engine.open(data)

    with pytest.raises(errors.NotARegularFile) as caught:
        asyncio.run(main())
    assert caught.value.path == str(newest) and str(newest) in str(caught.value)
    assert "FIFO" in str(caught.value)
    assert newest.is_fifo()  # left as it was

    # Read-only inspection (what `fusee runs DIR` does) refuses the same way, naming it.
    async def read() -> None:
        await fusee.Engine.open(data, read_only=True)

    with pytest.raises(errors.NotARegularFile, match=str(newest)):
        asyncio.run(read())


def test_a_directory_in_place_of_the_checkpoint_is_refused_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _engine_with_runs(data, 2)
    (data / "checkpoint").unlink()
    (data / "checkpoint").mkdir()

    async def main() -> None:
        await fusee.Engine.open(data)

    with pytest.raises(errors.NotARegularFile, match=f"{data / 'checkpoint'} is a directory"):
        asyncio.run(main())


def test_zeroed_last_batches_after_a_kill_are_refused_not_dropped(tmp_path: Path) -> None:
    """The owner is killed (the machine stays up); before any restart, an outside hand zeroes
    the newest segment's last batches. The next open must not lose those acknowledged runs
    silently."""
    data = tmp_path / "data"
    app = App(data)
    acked: list[str] = []
    for k in range(6):  # six batches at least: one start is acknowledged at a time here
        got, _ = app.start(f"k{k}", 1)
        acked += got
    app.kill()

    reader, rec = SharedLog.open(PosixStorage(), str(data), 1, read_only=True)
    reader.close()
    assert rec.batch_starts, "the log holds batches after the checkpoint"
    seg, off = rec.batch_starts[-2][1], rec.batch_starts[-2][2]
    assert seg.endswith(segment_name(max(int(p.stem) for p in (data / "log").glob("*.seg"))))
    with open(seg, "r+b") as f:  # zero from the second-to-last batch on (the segment keeps its size)
        size = os.fstat(f.fileno()).st_size
        f.seek(off)
        f.write(bytes(size - off))

    async def main() -> None:
        await fusee.Engine.open(data, workflows=[])

    with pytest.raises(LogCorrupted) as caught:
        asyncio.run(main())
    assert caught.value.path == seg, caught.value
    assert "acknowledged" in str(caught.value)

    # The operator may accept the loss: the log is cut there, and the next open is clean.
    async def accept() -> set[str]:
        async with fusee.Engine.open(data, truncate_corrupt=True) as engine:
            return {r.workflow_id for r in engine.runs()}

    kept = asyncio.run(accept())
    assert kept < set(acked)

    async def again() -> set[str]:
        async with fusee.Engine.open(data) as engine:
            return {r.workflow_id for r in engine.runs()}

    assert asyncio.run(again()) == kept
