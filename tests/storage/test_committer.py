"""GroupCommitter: inline and threaded flushes, batching under load, failure and cancellation."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fusee.errors import LogFailed
from fusee.storage.committer import GroupCommitter
from fusee.storage.log import SharedLog
from fusee.storage.posix import PosixStorage
from fusee.storage.seam import Storage
from fusee.storage.simdisk import SimDisk


def open_log(storage: Storage, path: str, shards: int = 4) -> SharedLog:
    log, _ = SharedLog.open(storage, path, shards, segment_bytes=1 << 20, rng=random.Random(1))
    return log


def loop_runner(delay: float = 0.0) -> Callable[[Callable[[], None]], asyncio.Future[None]]:
    """A run_blocking like the simulator's: runs the job on the loop, later, no thread."""
    def run(fn: Callable[[], None]) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def go() -> None:
            fn()
            fut.set_result(None)

        loop.call_later(delay, go)
        return fut
    return run


async def settle() -> None:
    """Lets every task and callback that is ready run (no timers, no waiting on time)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_one_chain_flushes_inline(disk: tuple[Storage, str]) -> None:
    storage, path = disk
    log = open_log(storage, path)

    async def main() -> GroupCommitter:
        c = GroupCommitter(log)
        for i in range(50):
            lsn = c.append(i % 4, b"step %d" % i)
            await c.wait_durable(i % 4, lsn)
            assert c.durable(i % 4) == lsn
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.flushes == 50 and c.inline_flushes == 50
    log.close()


def test_threaded_flushes_when_inline_is_off(disk: tuple[Storage, str]) -> None:
    storage, path = disk
    log = open_log(storage, path)

    async def main() -> GroupCommitter:
        c = GroupCommitter(log, inline=False)
        for i in range(20):
            lsn = c.append(0, b"r%d" % i)
            await c.wait_durable(0, lsn)
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.flushes == 20 and c.inline_flushes == 0
    log.close()


@pytest.mark.parametrize("inline", [True, False])
def test_a_thousand_concurrent_appenders(inline: bool, tmp_path: Path) -> None:
    log = open_log(PosixStorage(), str(tmp_path / "e"))
    durable_reports: list[list[int]] = []

    async def appender(c: GroupCommitter, k: int) -> list[int]:
        got = []
        for i in range(5):
            lsn = c.append(k % 4, b"%d:%d" % (k, i))
            await c.wait_durable(k % 4, lsn)
            assert c.durable(k % 4) >= lsn
            got.append(lsn)
        return got

    async def main() -> GroupCommitter:
        c = GroupCommitter(log, inline=inline, on_durable=durable_reports.append)
        results = await asyncio.gather(*(appender(c, k) for k in range(1000)))
        assert sum(len(r) for r in results) == 5000
        for shard in range(4):
            lsns = sorted(lsn for k, r in enumerate(results) if k % 4 == shard for lsn in r)
            assert lsns == list(range(1, 1251))
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.records_flushed == 5000
    assert c.flushes <= 100, f"{c.flushes} flushes for 5000 records: no group commit"
    assert durable_reports[-1] == [1250] * 4
    log.close()
    log2, rec = SharedLog.open(PosixStorage(), str(tmp_path / "e"), 4)
    assert len(rec.records) == 5000
    log2.close()


def test_simulated_runner_and_no_delay_between_flushes() -> None:
    disk = SimDisk(random.Random(1))
    log = open_log(disk, "/e")

    async def main() -> GroupCommitter:
        c = GroupCommitter(log, run_blocking=loop_runner(0.001), inline=False)
        first = c.append(0, b"a")
        t = asyncio.ensure_future(c.wait_durable(0, first))
        await settle()  # the flush of "a" is in flight now
        assert log.flushing
        second = c.append(1, b"b")  # joins the next batch, which starts when the first ends
        await c.wait_durable(1, second)
        assert t.done()
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.flushes == 2


def test_failure_reaches_every_waiter() -> None:
    disk = SimDisk(random.Random(1))
    log = open_log(disk, "/e")

    async def waiter(c: GroupCommitter, k: int) -> BaseException | None:
        lsn = c.append(k % 4, b"x")
        try:
            await c.wait_durable(k % 4, lsn)
        except LogFailed as e:
            return e
        return None

    async def main() -> None:
        c = GroupCommitter(log, run_blocking=loop_runner())
        disk.fail_next_fdatasync()
        errors = await asyncio.gather(*(waiter(c, k) for k in range(100)))
        assert all(isinstance(e, LogFailed) for e in errors)
        with pytest.raises(LogFailed):
            c.append(0, b"later")
        await c.close()

    asyncio.run(main())
    assert log.failed is not None
    log.close()


def test_a_cancelled_waiter_does_not_cancel_the_others() -> None:
    disk = SimDisk(random.Random(1))
    log = open_log(disk, "/e")

    async def main() -> None:
        c = GroupCommitter(log, run_blocking=loop_runner(0.001), inline=False)
        lsns = [c.append(0, b"%d" % i) for i in range(3)]
        tasks = [asyncio.ensure_future(c.wait_durable(0, lsn)) for lsn in lsns]
        await settle()
        tasks[0].cancel()
        await asyncio.gather(tasks[1], tasks[2])
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]
        assert c.durable(0) == 3
        await c.close()

    asyncio.run(main())
    log.close()


def test_checkpoint_through_the_log_wakes_waiters() -> None:
    disk = SimDisk(random.Random(1))
    log = open_log(disk, "/e")

    async def main() -> None:
        c = GroupCommitter(log, run_blocking=loop_runner(0.01), inline=False)
        a = c.append(0, b"a")
        ta = asyncio.ensure_future(c.wait_durable(0, a))
        await settle()  # "a" in flight (its runner has not run yet)
        assert log.flushing
        b = c.append(0, b"b")
        tb = asyncio.ensure_future(c.wait_durable(0, b))
        await asyncio.sleep(0)
        log.checkpoint(b"state")  # runs the job in flight, flushes "b", checkpoints
        assert log.durable(0) == b
        await asyncio.wait_for(asyncio.gather(ta, tb), 1.0)
        await c.close()

    asyncio.run(main())
    log.close()
    log2, rec = SharedLog.open(disk, "/e", 4)
    assert rec.checkpoint == b"state" and rec.records == []
    log2.close()


def test_close_flushes_what_is_pending(disk: tuple[Storage, str]) -> None:
    storage, path = disk
    log = open_log(storage, path)

    async def main() -> None:
        c = GroupCommitter(log)
        for i in range(10):
            c.append(1, b"%d" % i)
        c.request_flush()
        c.append(2, b"late")
        await c.close()
        assert log.durable_lsns() == [0, 10, 1, 0]

    asyncio.run(main())
    log.close()


# --- flush modes (``Engine.open(flush=...)``) ------------------------------------------


def test_pipeline_writes_on_the_log_thread_and_a_lone_gate_blocks_for_it(disk: tuple[Storage, str]) -> None:
    """Pipeline: a delivery hands its record to the log's thread at once; a lone chain's
    gate then waits for that flush by blocking, never flushing on the loop's thread."""
    storage, path = disk
    log = open_log(storage, path)

    async def main() -> GroupCommitter:
        c = GroupCommitter(log, mode="pipeline")
        for i in range(30):
            lsn = c.append(0, b"result %d" % i)
            c.after_delivery()  # the code goes on to its next gate meanwhile
            assert c.durable(0) < lsn or c.flushes > i  # handed over, not written here
            assert c.flush_if_alone(0, lsn)
            assert c.durable(0) >= lsn
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.inline_flushes == 0
    assert c.flushes == 30 and c.blocking_waits <= 30  # none when the thread was done first


def test_pipeline_gate_behind_a_later_record_takes_two_flushes(disk: tuple[Storage, str]) -> None:
    """A record appended after the handed-over flush began follows in the next one."""
    storage, path = disk
    log = open_log(storage, path)

    async def main() -> GroupCommitter:
        c = GroupCommitter(log, mode="pipeline")
        c.append(1, b"delivery")
        c.after_delivery()
        later = c.append(1, b"now() value")
        assert c.flush_if_alone(1, later)
        assert c.durable(1) == later
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.flushes == 2


def test_background_never_flushes_or_blocks_on_the_loop(disk: tuple[Storage, str]) -> None:
    storage, path = disk
    log = open_log(storage, path)

    async def main() -> GroupCommitter:
        c = GroupCommitter(log, mode="background")
        for i in range(10):
            lsn = c.append(2, b"x%d" % i)
            assert not c.flush_if_alone(2, lsn)
            await c.wait_durable(2, lsn)
        await c.close()
        return c

    c = asyncio.run(main())
    assert c.inline_flushes == 0 and c.blocking_waits == 0 and c.flushes == 10


def test_hand_off_starts_what_is_pending_and_reaps_a_finished_flush(disk: tuple[Storage, str]) -> None:
    """Before the loop's thread is lent to a step function, what is pending goes to the disk;
    a flush whose thread already finished is completed first, so the next one can start."""
    storage, path = disk
    log = open_log(storage, path)

    async def main() -> None:
        c = GroupCommitter(log, mode="background")
        a = c.append(0, b"a")
        c.hand_off()
        job = c._inflight
        assert job is not None
        job.wait()  # its thread finished; the loop has not heard yet
        b = c.append(0, b"b")
        c.hand_off()  # reaps the finished flush and starts the next
        assert c.durable(0) >= a
        assert c._inflight is not None and c._inflight is not job
        await c.wait_durable(0, b)
        await c.close()

    asyncio.run(main())


def test_hand_off_leaves_records_for_the_producers_of_cheap_functions(disk: tuple[Storage, str]) -> None:
    """Step functions lent the loop's thread back to back while the steps a flush released are
    still producers: while each function is cheap, what is pending waits for their records,
    however long the turn of the loop (one flush then carries every run's record, instead of
    runs splitting into groups that take turns through the log's thread); once the last
    producer landed, the next hand-off sends everything."""
    storage, path = disk
    log = open_log(storage, path)
    now = [0.0]

    async def main() -> None:
        # The hold's timer never fires: the loop's thread is busy with step functions.
        c = GroupCommitter(log, mode="background", clock=lambda: now[0],
                           hold_timer=lambda delay, fn: lambda: None)
        c.expect(4)
        lsn = c.append(0, b"outcome")
        for _ in range(4):  # cheap functions: the records wait for the producers' to join them
            c.hand_off()
            assert not c.flushing
            now[0] += c.hold_s  # the turn's other work: well past one flush time in all
            c.lent(c.hold_s / 10)
            c.landed()
            c.append(0, b"next gate")
        c.hand_off()  # no producer left: nothing more is coming
        assert c.flushing
        job = c._inflight
        assert job is not None and job.records == 5, "one flush carries every producer's record"
        await c.wait_durable(0, lsn)
        await c.close()

    asyncio.run(main())


def test_hand_off_does_not_leave_records_behind_a_function_as_long_as_the_last(
        disk: tuple[Storage, str]) -> None:
    """Once a step function held the loop's thread longer than a flush, the next hand-off with
    producers out sends what is pending at once: the coming function would hold it as long."""
    storage, path = disk
    log = open_log(storage, path)
    now = [0.0]

    async def main() -> None:
        c = GroupCommitter(log, mode="background", clock=lambda: now[0],
                           hold_timer=lambda delay, fn: lambda: None)
        c.expect(3)
        c.hand_off()  # nothing pending: nothing to start
        now[0] += 0.040
        c.lent(0.040)  # a function blocked the loop for 40 ms
        c.landed()
        lsn = c.append(0, b"outcome of the first")
        c.hand_off()
        assert c.flushing, "the outcome would have waited 40 ms more for the producers"
        c.landed()
        c.landed()
        await c.wait_durable(0, lsn)
        await c.close()

    asyncio.run(main())


def test_flush_mode_from_the_environment_overrides_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusee.storage import flush_modes

    monkeypatch.delenv("FUSEE_FLUSH", raising=False)
    assert flush_modes.resolve(None) == flush_modes.DEFAULT
    assert flush_modes.resolve("pipeline") == "pipeline"
    with pytest.raises(ValueError, match="flush must be one of"):
        flush_modes.resolve("fast")
    monkeypatch.setenv("FUSEE_FLUSH", "Background")
    assert flush_modes.resolve("inline") == "background"
    monkeypatch.setenv("FUSEE_FLUSH", "sometimes")
    with pytest.raises(ValueError, match="FUSEE_FLUSH='sometimes'"):
        flush_modes.resolve(None)


async def test_the_real_envs_hold_timer_fires_once_and_a_cancelled_one_never(tmp_path: Path) -> None:
    # A held flush's bound: below a millisecond the log's thread times it (asyncio's timers
    # wake an idle loop only to the millisecond). Counted, not timed.
    from fusee.runtime.env import RealEnv

    env = RealEnv(PosixStorage())
    fired: list[str] = []
    try:
        cancel = env.hold_timer(200e-6, lambda: fired.append("cancelled"))
        cancel()
        env.hold_timer(100e-6, lambda: fired.append("short"))
        env.hold_timer(2e-3, lambda: fired.append("long"))
        for _ in range(10_000):
            if len(fired) >= 2:
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)  # anything still on its way lands meanwhile
    finally:
        env.close()
    assert sorted(fired) == ["long", "short"]


def test_a_flush_job_waited_for_from_another_thread_returns_once_it_is_done(tmp_path: Path) -> None:
    """``FlushJob.wait`` on a job another thread is running returns only after its sync did;
    on a job nobody started it runs the job itself; on a finished one it returns at once."""
    log = open_log(PosixStorage(), str(tmp_path / "log"))
    storage: Any = log.storage  # what the log writes through (rooted at its directory)
    entered, release = threading.Event(), threading.Event()
    real = storage.fdatasync

    def held_fdatasync(fh: Any) -> None:
        entered.set()
        assert release.wait(30)
        real(fh)

    log.append(0, b"a")
    job = log.begin_flush()
    assert job is not None
    storage.fdatasync = held_fdatasync
    runner = threading.Thread(target=job.run)
    runner.start()
    assert entered.wait(30)
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (job.wait(), returned.set()))
    waiter.start()
    assert not returned.wait(0.05) and not job.done  # still in its fdatasync: the waiter waits
    release.set()
    waiter.join(30)
    runner.join(30)
    assert returned.is_set() and job.done and job.error is None
    job.wait()  # done already: returns at once
    assert log.finish_flush(job)[0] == 1
    del storage.fdatasync
    log.append(0, b"b")
    second = log.begin_flush()
    assert second is not None
    second.wait()  # nobody started it: runs here
    assert second.done and log.finish_flush(second)[0] == 2
    log.close()
