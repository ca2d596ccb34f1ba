"""Streams: chunks written by workflow code and by steps, read while the run goes on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.core import records as rec
from fusee.errors import StreamError

go = fusee.signal("go", int)
ATTEMPTS: list[int] = []


def tokens(info: fusee.StepInfo) -> str:
    ATTEMPTS.append(info.attempt)
    out = info.stream("tokens")  # a sync function in the step pool: writes from its thread
    for word in ["durable", "streams", "work"]:
        out.write(word)
    if info.attempt == 1:
        raise ConnectionError("the model dropped the connection")
    out.write("!")
    return "done"


@fusee.workflow("talker")
async def talker(ctx: fusee.Ctx) -> str:
    progress = ctx.stream("progress")
    await progress.write({"phase": "start"})
    answer = await ctx.step("generate", tokens, retry=fusee.Retry(attempts=2, initial="1ms"))
    await progress.write({"phase": "waiting"})
    await ctx.wait_for(go)
    await progress.close()
    return str(answer)


async def collect(engine: fusee.Engine, wid: str, name: str, offset: int = 0) -> list[Any]:
    return [c async for c in engine.read_stream(wid, name, offset)]


async def test_readers_follow_workflow_and_step_streams(tmp_path: Path) -> None:
    ATTEMPTS.clear()
    async with fusee.Engine.open(tmp_path, workflows=[talker]) as engine:
        h = await engine.start(talker, "t-1")
        progress = asyncio.ensure_future(collect(engine, "t-1", "progress"))
        # The retried step continued after the chunks its first attempt recorded.
        assert await asyncio.wait_for(collect(engine, "t-1", "tokens"), 10) == [
            "durable", "streams", "work", "!"]
        assert ATTEMPTS == [1, 2]
        chunks, _next, ended = await engine.read_stream_batch("t-1", "progress", 0, wait="5s")
        assert chunks[0] == {"phase": "start"} and not ended
        await h.signal(go, 1)
        assert await asyncio.wait_for(progress, 10) == [{"phase": "start"}, {"phase": "waiting"}]
        assert await h.result() == "done"
        # Reconnect anywhere: the same chunks, never changed.
        assert await engine.read_stream_batch("t-1", "tokens", 2) == (["work", "!"], 4, True)
        chunks_recorded = [r for r in await engine.journal("t-1") if isinstance(r, rec.Chunk)]
        assert [c.offset for c in chunks_recorded if c.stream == "tokens"] == [0, 1, 2, 3]
    async with fusee.Engine.open(tmp_path, workflows=[talker]) as engine:
        assert await collect(engine, "t-1", "progress") == [{"phase": "start"}, {"phase": "waiting"}]
        assert await collect(engine, "t-1", "tokens", 3) == ["!"]


async def test_writes_after_close_fail_clearly() -> None:
    @fusee.workflow("closer")
    async def closer(ctx: fusee.Ctx) -> str:
        w = ctx.stream("s")
        await w.write(1)
        await w.close()
        try:
            await w.write(2)
        except StreamError as e:
            return str(e)
        return "accepted"

    async with fusee.Engine.open(workflows=[closer]) as engine:
        assert "closed" in await engine.execute(closer, "c-1")
        assert await engine.read_stream_batch("c-1", "s") == ([1], 1, True)


async def test_a_rerun_that_writes_other_chunks_is_refused() -> None:
    first = threading.Event()

    def fickle(info: fusee.StepInfo) -> int:
        s = info.stream("s")
        s.write(info.attempt)  # differs between attempts
        if not first.is_set():
            first.set()
            raise ConnectionError("retry me")
        return 1

    @fusee.workflow("fickle_wf")
    async def fickle_wf(ctx: fusee.Ctx) -> str:
        try:
            await ctx.step("f", fickle, retry=fusee.Retry(attempts=2, initial="1ms"))
        except fusee.StepFailed as e:
            return str(e)
        return "ok"

    async with fusee.Engine.open(workflows=[fickle_wf]) as engine:
        assert "earlier attempt recorded" in await engine.execute(fickle_wf, "f-1")


async def test_stream_names_are_checked() -> None:
    @fusee.workflow("bad_name")
    async def bad_name(ctx: fusee.Ctx) -> None:
        ctx.stream("")

    async with fusee.Engine.open(workflows=[bad_name]) as engine:
        with pytest.raises(fusee.WorkflowFailed, match="stream name"):
            await engine.execute(bad_name, "b-1")


@fusee.workflow("quiet_stream")
async def quiet_stream(ctx: fusee.Ctx) -> None:
    ctx.stream("news")  # open, and nothing written: readers wait
    await ctx.wait_for(go)


@pytest.mark.parametrize("how", ["log fails", "close"])
async def test_a_waiting_stream_reader_hears_engine_closed_when_the_log_fails_or_closes(how: str) -> None:
    engine = await fusee.Engine.open(workflows=[quiet_stream])
    try:
        await engine.start(quiet_stream, "q-1")
        reader = asyncio.ensure_future(engine.read_stream_batch("q-1", "news", 0, wait=3600))
        while not engine._rt.stream_readers:  # the reader waits for more of the log to be durable
            await asyncio.sleep(0)
        if how == "close":
            await engine.close()
        else:
            engine._log.storage.fail_next_fdatasync()  # type: ignore[attr-defined]
            with pytest.raises(fusee.EngineClosed):
                await engine.start(quiet_stream, "q-2")
        # Woken at once, not after its hour: the bound only keeps a regression from hanging.
        with pytest.raises(fusee.EngineClosed, match="closed" if how == "close" else "log failed"):
            await asyncio.wait_for(reader, 30)
    finally:
        await engine.close()


SAMPLED: list[tuple[int, int, list[Any]]] = []


def sampled(info: fusee.StepInfo) -> list[str]:
    """A model call sampled anew on each attempt: it cannot rewrite the chunks an earlier
    attempt recorded, so it continues after them."""
    out = info.stream("tokens")
    start = out.recorded
    prefix = out.recorded_chunks
    SAMPLED.append((info.attempt, start, prefix))
    words = [f"a{info.attempt}-{i}" for i in range(start, 4)]
    for i, word in enumerate(words):
        out.write(word)
        if info.attempt == 1 and i == 1:
            raise ConnectionError("the model dropped the connection")
    return [str(w) for w in prefix] + words


@fusee.workflow("sampler")
async def sampler(ctx: fusee.Ctx) -> list[str]:
    return list(await ctx.step("sample", sampled, retry=fusee.Retry(attempts=2, initial="1ms")))


async def test_a_retried_step_continues_after_the_recorded_prefix(tmp_path: Path) -> None:
    SAMPLED.clear()
    async with fusee.Engine.open(tmp_path, workflows=[sampler]) as engine:
        result = await asyncio.wait_for(engine.execute(sampler, "s-1"), 30)
        # The second attempt learned that two chunks were recorded and wrote only the rest.
        assert [(a, n) for a, n, _ in SAMPLED] == [(1, 0), (2, 2)]
        assert SAMPLED[1][2] == ["a1-0", "a1-1"]
        assert result == ["a1-0", "a1-1", "a2-2", "a2-3"]
        assert await collect(engine, "s-1", "tokens") == result
        chunks = [r for r in await engine.journal("s-1") if isinstance(r, rec.Chunk)]
        assert [(c.offset, c.attempt) for c in chunks] == [(0, 1), (1, 1), (2, 2), (3, 2)]


next_run = fusee.signal("next_run", bool)


@fusee.workflow("chain")
async def chain(ctx: fusee.Ctx, n: int) -> str:
    s = ctx.stream("s")
    for word in (["a", "b"] if n == 1 else ["x", "y", "z"]):
        await s.write(f"{word}{n}")
    if n == 1:
        await ctx.wait_for(next_run)
        await ctx.continue_as_new(2)
    return "done"


async def test_a_pinned_reader_does_not_read_the_next_runs_chunks_after_continue_as_new() -> None:
    async with fusee.Engine.open(workflows=[chain]) as engine:
        await engine.start(chain, "c-1", 1)
        first = await engine.stream_batch("c-1", "s", 0, wait="5s")
        while first.next_offset < 2:
            first = await engine.stream_batch("c-1", "s", 0, wait="5s")
        assert first.chunks == ["a1", "b1"] and first.end_status is None
        assert first.workflow_id == "c-1" and first.run_id == engine.describe("c-1").run_id
        # A follower of run 1 waits at offset 2; run 1 hands over to run 2, which writes 3 chunks.
        follower = asyncio.ensure_future(collect_pinned(engine, "c-1", 2))
        while not engine._rt.stream_readers:  # the follower read run 1 and waits for more
            await asyncio.sleep(0)
        await engine.signal("c-1", next_run, True)
        assert await asyncio.wait_for(engine.get("c-1").result(), 10) == "done"
        with pytest.raises(fusee.RunNotCurrent) as info:
            await asyncio.wait_for(follower, 10)
        assert info.value.run_id == first.run_id and info.value.current_run_id not in (0, first.run_id)
        with pytest.raises(fusee.RunNotCurrent, match="offset 0"):
            await engine.stream_batch("c-1", "s", 2, run_id=first.run_id)
        # Unpinned, a read names the run it read.
        now = await engine.stream_batch("c-1", "s", 0)
        assert now.run_id == info.value.current_run_id
        assert (now.chunks, now.next_offset, now.end_status) == (["x2", "y2", "z2"], 3, "ok")
        assert await engine.read_stream_batch("c-1", "s", 0, run_id=now.run_id) == (["x2", "y2", "z2"], 3, True)
        with pytest.raises(ValueError, match="run_id"):
            await engine.stream_batch("c-1", "s", 0, run_id=0)


async def collect_pinned(engine: fusee.Engine, wid: str, offset: int) -> list[Any]:
    return [c async for c in engine.read_stream(wid, "s", offset)]


def breaks(info: fusee.StepInfo) -> None:
    info.stream("out").write("half")
    raise ValueError("the model broke")


@fusee.workflow("ends")
async def ends(ctx: fusee.Ctx, fail_run: bool) -> str:
    log = ctx.stream("log")
    await log.write("start")
    try:
        await ctx.step("breaks", breaks)
    except fusee.StepFailed:
        pass
    if fail_run:
        raise RuntimeError("the run gives up")
    await log.close()
    return "ok"


async def test_a_stream_ended_by_a_failure_reports_its_status() -> None:
    async with fusee.Engine.open(workflows=[ends]) as engine:
        assert await engine.execute(ends, "e-1", False) == "ok"
        b = await engine.stream_batch("e-1", "out")
        assert (b.chunks, b.end_status, b.ended) == (["half"], "failed", True)
        assert (await engine.stream_batch("e-1", "log")).end_status == "ok"
        with pytest.raises(fusee.WorkflowFailed):
            await engine.execute(ends, "e-2", True)
        b = await engine.stream_batch("e-2", "log", 1)
        assert (b.chunks, b.offset, b.next_offset, b.end_status) == ([], 1, 1, "failed")


@fusee.workflow("narrator")
async def narrator(ctx: fusee.Ctx, n: int) -> int:
    out = ctx.stream("words")
    for i in range(n):
        await out.write(i)
    await out.close()
    return n


@pytest.mark.parametrize("keep_history", [True, False])
async def test_a_stream_of_an_ended_run_without_history_is_refused_not_cut_short(
        tmp_path: Path, keep_history: bool) -> None:
    # Without history an ended run's chunks are dropped: a reader arriving then must be told so,
    # not answered "ended" at its offset (it would take a stream of 3 chunks for one of 1).
    async with fusee.Engine.open(tmp_path, workflows=[narrator], keep_history=keep_history) as engine:
        assert await engine.execute(narrator, "n-1", 3) == 3
        if keep_history:
            assert await engine.read_stream_batch("n-1", "words", 1) == ([1, 2], 3, True)
            assert await collect(engine, "n-1", "words") == [0, 1, 2]
        else:
            with pytest.raises(fusee.HistoryUnavailable, match="reading stream 'words'"):
                await engine.read_stream_batch("n-1", "words", 1)
            with pytest.raises(fusee.HistoryUnavailable):
                await collect(engine, "n-1", "words")
