"""SyncEngine from plain threads: blocking calls, many threads at once, the same errors, fork."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import fusee
from fusee.errors import DirectoryLocked

go = fusee.signal("go", int)
count = fusee.query("count", int)
add = fusee.update("add", int)


def double(x: int) -> int:
    return x * 2


@fusee.workflow("adder")
async def adder(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    ctx.on_query(count, lambda: total)
    for _ in range(n):
        total += await ctx.wait_for(go)
    return await ctx.step("double", double, total)


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx) -> int:
    value = 0

    def _add(v: int) -> int:
        nonlocal value
        value += v
        return value

    ctx.on_update(add, _add)
    await ctx.wait_for(go)
    return value


@fusee.workflow("talker")
async def talker(ctx: fusee.Ctx, n: int) -> str:
    s = ctx.stream("out")
    for i in range(n):
        await s.write(i)
    await s.close()
    await ctx.wait_for(go)
    return "done"


@fusee.workflow("boom")
async def boom(ctx: fusee.Ctx) -> None:
    raise ValueError("no")


WORKFLOWS = [adder, counter, talker, boom]


def test_many_threads_start_signal_query_and_wait(tmp_path: Path) -> None:
    threads = 16
    barrier = threading.Barrier(threads)
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as engine:

        def one(i: int) -> int:
            barrier.wait()  # every thread calls at once
            h = engine.start(adder, f"a-{i}", 3)
            for v in (1, 2, i):
                engine.signal(f"a-{i}", go, v)
            assert engine.query(f"a-{i}", count) in range(0, 4 + i)
            return h.result(timeout=60)

        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(one, range(threads)))
        assert results == [2 * (3 + i) for i in range(threads)]
        assert {s.workflow_id for s in engine.list(limit=1000).items} >= {f"a-{i}" for i in range(threads)}
        assert engine.describe("a-3").status == "ok"
    # Reopened: every run and its result is durable.
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as engine:
        assert engine.get("a-5").result(timeout=60) == 16
        assert engine.stats["steps"] == 0  # nothing ran again


def test_updates_from_threads_each_counted_once(tmp_path: Path) -> None:
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as engine:
        h = engine.start(counter, "c")
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: h.update(add, 1, update_id=f"u{i % 4}"), range(8)))
        assert sorted(set(answers)) == [1, 2, 3, 4]  # a repeated update ID answers as before
        assert engine.update_with_start(counter, "c", None, add, 10) == 14
        h.signal(go, 0)
        assert h.result(timeout=60) == 14


def test_same_errors_as_the_async_engine(tmp_path: Path) -> None:
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as engine:
        engine.start(adder, "a", 1)
        with pytest.raises(fusee.AlreadyExists):
            engine.start(adder, "a", 1)
        with pytest.raises(fusee.NotFound):
            engine.describe("missing")
        with pytest.raises(fusee.NotFound):
            engine.signal("missing", go, 1)
        with pytest.raises(fusee.WorkflowFailed):
            engine.execute(boom, "b")
        with pytest.raises(TimeoutError):
            engine.get("a").result(timeout=0.05)
        engine.cancel("a", "enough")
        with pytest.raises(fusee.WorkflowCancelled):
            engine.get("a").result(timeout=60)
        engine.start(adder, "t", 1)
        engine.terminate("t")
        with pytest.raises(fusee.WorkflowTerminated):
            engine.get("t").result(timeout=60)
    with pytest.raises(fusee.EngineClosed):
        engine.start(adder, "late", 1)
    engine.close()  # a second close does nothing


def test_directory_locked_is_raised_by_open_and_stops_the_thread(tmp_path: Path) -> None:
    def loop_threads() -> int:
        return sum(t.name == "fusee-sync-engine" for t in threading.enumerate())

    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS):
        with pytest.raises(DirectoryLocked):
            fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS)
        assert loop_threads() == 1
    assert loop_threads() == 0


def test_read_stream_is_an_iterator_and_export_writes_the_journal(tmp_path: Path) -> None:
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as engine:
        h = engine.start(talker, "s", 5)
        with ThreadPoolExecutor(3) as pool:
            readers = [pool.submit(lambda o=o: list(engine.read_stream("s", "out", o))) for o in (0, 2, 4)]
            assert [r.result() for r in readers] == [[0, 1, 2, 3, 4], [2, 3, 4], [4]]
        h.signal(go, 1)
        assert h.result(timeout=60) == "done"
        b = engine.stream_batch("s", "out", 3)
        assert (b.run_id, b.chunks, b.next_offset, b.end_status) == (h.run_id, [3, 4], 5, "ok")
        assert list(engine.read_stream("s", "out", 4, run_id=h.run_id)) == [4]
        n = engine.export("s", tmp_path / "s.fjnl")
        assert n == len(engine.journal("s")) > 0
        imported = engine.import_journal(tmp_path / "s.fjnl", "s3")
        assert imported.workflow_id == "s3" and imported.result(timeout=60) == "done"
        forked = engine.fork("s", "s2", before_position=0)
        assert forked.workflow_id == "s2"
        assert list(engine.read_stream("s2", "out")) == [0, 1, 2, 3, 4]


def test_a_forked_child_gets_a_typed_error_at_once(tmp_path: Path) -> None:
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as engine:
        engine.start(adder, "a", 1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: every call fails at once, none waits on the parent's thread
            code = 0
            for call in (lambda: engine.start(adder, "b", 1), lambda: engine.describe("a"), engine.close):
                try:
                    call()
                    code = 1
                except fusee.EngineForked as e:
                    code = code if "after the fork" in str(e) else 2
                except BaseException:
                    code = 3
            try:  # the child opens the directory anew: a follower of the parent, which runs its call
                with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as own:
                    code = code or (0 if not own.is_owner else 4)
                    own.start(adder, "from-child", 1)
            except BaseException:
                code = code or 5
            os.write(w, bytes([code]))
            os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        assert got == b"\x00"
        engine.signal("a", go, 4)  # the parent's engine is untouched
        assert engine.get("a").result(timeout=60) == 8
        engine.signal("from-child", go, 2)  # the child's start is the parent's run
        assert engine.get("from-child").result(timeout=60) == 4


def test_a_call_from_the_loop_thread_is_refused(tmp_path: Path) -> None:
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS, inline_sync_steps=True) as engine:
        import asyncio

        async def inside() -> None:
            engine.describe("x")

        async def close_inside() -> None:
            engine.close()

        with pytest.raises(fusee.WrongEventLoop):
            asyncio.run_coroutine_threadsafe(inside(), engine.loop).result()
        with pytest.raises(fusee.WrongEventLoop):
            asyncio.run_coroutine_threadsafe(close_inside(), engine.loop).result(timeout=30)
        engine.start(adder, "still-open", 1)


def test_a_caller_waiting_when_the_engine_closes_gets_engine_closed(tmp_path: Path) -> None:
    engine = fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS)
    h = engine.start(adder, "a", 1)
    started = threading.Event()

    def wait() -> int:
        started.set()
        return h.result()

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(wait)
        started.wait()
        engine.close()
        with pytest.raises(fusee.EngineClosed):
            waiting.result(timeout=30)  # bounded only so a hang fails instead of stalling the suite


def test_a_failure_of_the_loop_thread_is_raised_not_lost(tmp_path: Path) -> None:
    engine = fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS)
    h = engine.start(adder, "a", 1)
    started = threading.Event()

    def wait() -> int:
        started.set()
        return h.result()

    def die() -> None:
        raise KeyboardInterrupt("the loop thread was interrupted")

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(wait)
        started.wait()
        engine.loop.call_soon_threadsafe(die)
        with pytest.raises(fusee.EngineClosed):
            waiting.result(timeout=30)  # bounded only so a hang fails instead of stalling the suite
    with pytest.raises(fusee.EngineClosed, match="interrupted"):
        engine.describe("a")
    with pytest.raises(fusee.EngineClosed, match="interrupted") as got:
        engine.close()
    assert isinstance(got.value.__cause__, KeyboardInterrupt)


def test_a_forked_child_does_not_keep_the_directory_lock(tmp_path: Path) -> None:
    # A fork copies the lock's descriptor: a long-lived child (a gunicorn --preload worker, a
    # Celery prefork process) must not hold the directory once the parent closed or died.
    engine = fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS)
    engine.start(adder, "a", 1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child lives on until the parent has reopened the directory
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        engine.close()
        with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS, exclusive=True) as again:
            assert again.is_owner
            again.signal("a", go, 5)
            assert again.get("a").result(timeout=60) == 10
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)
