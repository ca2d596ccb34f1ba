"""``GroupCommitter``: drives the shared log's flushes from an asyncio loop (group commit).

Appends return at once; ``wait_durable`` suspends until the record's batch is
durable. One flush is in flight at a time and it takes everything appended
before it began; the next one starts as soon as it ends if anything is
pending (no artificial delay). A flush runs off the loop (``run_blocking``,
by default one dedicated thread: ``fdatasync`` releases the GIL) or, when
``inline`` and exactly one waiter waits with nothing else ready to run, on the
loop's thread itself: the lowest latency for one chain of steps.

Waiters share one future per batch instead of owning one each, which keeps
the cost per record to a few microseconds. A waiter's cancellation takes
effect when the batch it waits for completes (a shared future must not be
cancelled on behalf of one waiter).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fusee.errors import StorageError
from fusee.storage.log import FlushJob, SharedLog

logger = logging.getLogger("fusee")


class _SharedFuture(asyncio.Future[None]):
    """A future many tasks await: one waiter's cancellation must not cancel it for all."""

    def cancel(self, msg: Any = None) -> bool:
        return False


class GroupCommitter:
    """Group commit over a ``SharedLog`` for the code of one asyncio loop."""

    def __init__(self, log: SharedLog, *,
                 run_blocking: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
                 inline: bool = True,
                 on_durable: Callable[[list[int]], None] | None = None,
                 early_start: int = 512) -> None:
        self.log = log
        self._inline = inline
        self._on_durable = on_durable
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._run_blocking = run_blocking if run_blocking is not None else self._in_thread
        # The loop of whoever builds the committer: later calls may come from
        # inside a workflow's own loop, which must never be taken for it.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._inflight: FlushJob | None = None
        self._inflight_fut: _SharedFuture | None = None  # waiters of the batch in flight
        self._next_fut: _SharedFuture | None = None  # waiters of the batch forming
        self._waiters = 0
        self._start_scheduled = False
        self._closed = False
        #: With a start scheduled and this many records pending, a waiter starts the
        #: flush at once instead of after every ready task appended: under load the
        #: disk then syncs one batch while the next one forms (group commit pipelining).
        self.early_start = early_start
        #: Flushes completed (and of them, run on the loop's thread) and records they made durable.
        self.flushes = 0
        self.inline_flushes = 0
        self.records_flushed = 0
        #: Told of each completed flush: (records, seconds). Telemetry sets it; None: nobody asks.
        self.on_flush: Callable[[int, float], None] | None = None
        log.on_flushed = self._flushed_elsewhere

    # --- API ------------------------------------------------------------------

    def append(self, shard: int, data: bytes | bytearray | memoryview) -> int:
        """Appends a record (no I/O) and returns its LSN; call ``wait_durable`` or ``request_flush`` to get it on disk."""
        return self.log.append(shard, data)

    def durable(self, shard: int) -> int:
        """The shard's last durable LSN."""
        return self.log.durable(shard)

    def appended(self, shard: int) -> int:
        """The shard's last appended LSN."""
        return self.log.appended(shard)

    async def wait_durable(self, shard: int, lsn: int) -> None:
        """Returns once ``durable(shard) >= lsn``; raises ``LogFailed``/``DiskFull`` if the log failed first."""
        log = self.log
        while log.durable(shard) < lsn:
            if log.failed is not None:
                raise log.failure()
            if self._closed:
                raise StorageError("the group committer is closed: nothing more becomes durable")
            assert lsn <= log.appended(shard), f"shard {shard} never appended position {lsn}"
            if self._inflight is None:
                if self._start_scheduled:
                    if log.pending_records >= self.early_start:
                        self._launch()  # enough for a batch: let the disk work while the rest append
                elif self._inline and self._waiters == 0 and self._loop_idle():
                    self._flush_inline()
                    continue
                else:
                    self._schedule_start()
            inflight = self._inflight
            if inflight is not None and inflight.covers[shard] >= lsn:
                fut = self._inflight_fut
                if fut is None:
                    fut = self._inflight_fut = self._new_future()
            else:
                fut = self._next_fut
                if fut is None:
                    fut = self._next_fut = self._new_future()
            self._waiters += 1
            try:
                await fut
            finally:
                self._waiters -= 1

    def request_flush(self) -> None:
        """Starts a flush of everything pending as soon as the loop gets to it, unless one is in flight (it follows then)."""
        if self._inflight is None and not self._start_scheduled and self.log.has_pending():
            self._schedule_start()

    def checkpoint(self, state: bytes, covers: Sequence[int] | None = None) -> None:
        """``SharedLog.checkpoint`` (blocking); waiters it made durable wake up.

        Calling ``log.checkpoint`` directly is equivalent: the log tells the
        committer whenever it flushed on its own.
        """
        self.log.checkpoint(state, covers)

    async def close(self) -> None:
        """Makes everything appended so far durable (unless the log failed), wakes every waiter and stops the flush thread.

        The log itself stays open: close it separately.
        """
        while self.log.failed is None and not self._closed:
            if self._inflight is not None:
                if self._inflight_fut is None:
                    self._inflight_fut = self._new_future()
                await self._inflight_fut
            elif self.log.has_pending():
                self._launch()
            else:
                break
        self._closed = True
        self._resolve(self._inflight_fut)
        self._resolve(self._next_fut)
        self._inflight_fut = self._next_fut = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def flush_if_alone(self) -> bool:
        """Flushes on the calling thread, now, if nothing else could share the flush.

        That is: inline flushing is on, no flush is in flight or scheduled, no
        task waits and no other callback is ready to run. The caller (a lone
        chain of steps) then skips a turn of the loop. Returns whether it flushed.
        """
        if (
            not self._inline
            or self._closed
            or self._inflight is not None
            or self._start_scheduled
            or self._waiters
            or self.log.failed is not None
            or not self.log.has_pending()
            or not self._loop_idle()
        ):
            return False
        self._flush_inline()
        return True

    @property
    def waiters(self) -> int:
        """Tasks waiting in ``wait_durable`` right now."""
        return self._waiters

    # --- internals ------------------------------------------------------------

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _new_future(self) -> _SharedFuture:
        return _SharedFuture(loop=self._get_loop())

    def _loop_idle(self) -> bool:
        """Whether no other callback or task is ready to run (so none could join this flush)."""
        ready = getattr(self._get_loop(), "_ready", None)
        return ready is not None and len(ready) == 0

    def _schedule_start(self) -> None:
        self._start_scheduled = True
        self._get_loop().call_soon(self._start)

    def _start(self) -> None:
        # Runs after every task already ready: they all get to append to this batch first.
        self._start_scheduled = False
        if self._closed or self._inflight is not None:
            return
        if self.log.failed is not None or not self.log.has_pending():
            self._resolve(self._next_fut)  # failed, or a checkpoint flushed it already
            self._next_fut = None
            return
        if self._inline and self._waiters == 1:
            self._flush_inline()
        else:
            self._launch()

    def _flush_inline(self) -> None:
        job = self.log.begin_flush()
        if job is None:
            return
        job.run()
        self._complete(job)
        self._resolve(self._next_fut)
        self._next_fut = None
        self.inline_flushes += 1

    def _launch(self) -> None:
        job = self.log.begin_flush()
        assert job is not None and self._inflight is None
        self._inflight = job
        # Everyone waiting for the forming batch now waits for this one.
        self._inflight_fut, self._next_fut = self._next_fut, None
        done = asyncio.ensure_future(self._run_blocking(job.run), loop=self._get_loop())
        done.add_done_callback(self._job_done)

    def _job_done(self, done: asyncio.Future[None]) -> None:
        job = self._inflight
        assert job is not None
        if not done.cancelled():
            done.exception()  # job.run never raises; retrieve anything the runner itself raised
        if not job.done:
            job.wait()  # the runner gave up on it: finish it here rather than lose it
        self._inflight = None
        fut, self._inflight_fut = self._inflight_fut, None
        self._complete(job)
        self._resolve(fut)
        if self._closed:
            return
        if self.log.failed is None and self.log.has_pending():
            self._launch()
        else:
            self._resolve(self._next_fut)
            self._next_fut = None

    def _flushed_elsewhere(self) -> None:
        # A checkpoint (or a direct flush) made everything pending durable; the
        # batch in flight, if any, still wakes its own waiters when its runner returns.
        if self._inflight is None:
            self._resolve(self._next_fut)
            self._next_fut = None

    def _complete(self, job: FlushJob) -> None:
        try:
            durable = self.log.finish_flush(job)
        except StorageError as e:
            logger.error("the log failed; nothing more is acknowledged until the directory is "
                         "opened again: %s", e)
            # The log failed: every waiter wakes and raises the failure.
            self._resolve(self._next_fut)
            self._next_fut = None
            return
        self.flushes += 1
        self.records_flushed += job.records
        if self.on_flush is not None:
            samples = self.log.flush_seconds
            self.on_flush(job.records, samples[-1] if samples else 0.0)
        if self._on_durable is not None:
            self._on_durable(durable)

    @staticmethod
    def _resolve(fut: asyncio.Future[None] | None) -> None:
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _in_thread(self, fn: Callable[[], None]) -> Awaitable[None]:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="fusee-log")
        return self._get_loop().run_in_executor(self._executor, fn)
