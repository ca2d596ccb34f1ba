"""``GroupCommitter``: drives the shared log's flushes from an asyncio loop (group commit).

Appends return at once; ``wait_durable`` suspends until the record's batch is
durable. One flush is in flight at a time and it takes everything appended
before it began; the next one starts as soon as it ends if anything is
pending (no artificial delay). A flush runs off the loop (``run_blocking``,
by default one dedicated thread: ``fdatasync`` releases the GIL) or, when
``inline`` and exactly one waiter waits with nothing else ready to run, on the
loop's thread itself: the lowest latency for one chain of steps.

A flush waits for records that are about to come: the runtime counts its
producers (``expect``/``landed``: steps released and not yet started,
executions in flight), and while any is outstanding no flush starts inline
and a scheduled one is held until they landed, for one flush time at most
(``hold_s``, the median of recent flushes). So N runs taking turns share one
``fdatasync`` per round instead of taking one each.

Waiters share one future per batch instead of owning one each, which keeps
the cost per record to a few microseconds. A waiter's cancellation takes
effect when the batch it waits for completes (a shared future must not be
cancelled on behalf of one waiter).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fusee import sabotage
from fusee.errors import StorageError
from fusee.storage import flush_modes
from fusee.storage.log import FlushJob, SharedLog

logger = logging.getLogger("fusee")

#: A held flush waits this long at most before any flush was timed, and never
#: less or more than the bounds after (the median of recent flushes, clamped).
HOLD_DEFAULT_S = 150e-6
HOLD_MIN_S = 20e-6
HOLD_MAX_S = 2e-3


class _SharedFuture(asyncio.Future[None]):
    """A future many tasks await: one waiter's cancellation must not cancel it for all."""

    def cancel(self, msg: Any = None) -> bool:
        return False


class GroupCommitter:
    """Group commit over a ``SharedLog`` for the code of one asyncio loop."""

    def __init__(self, log: SharedLog, *,
                 run_blocking: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
                 inline: bool = True,
                 mode: str | None = None,
                 wait_job: Callable[[FlushJob], None] | None = None,
                 on_durable: Callable[[list[int]], None] | None = None,
                 early_start: int = 512,
                 hold_timer: Callable[[float, Callable[[], None]], Callable[[], None]] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 run_inline: Callable[[Callable[[], None]], None] | None = None,
                 ) -> None:
        self.log = log
        #: ``flush_modes.INLINE``, ``PIPELINE`` or ``BACKGROUND`` (``inline=False`` means background).
        self.mode = mode if mode is not None else (flush_modes.INLINE if inline else flush_modes.BACKGROUND)
        assert self.mode in flush_modes.MODES, self.mode
        self._inline = self.mode == flush_modes.INLINE
        self._pipeline = self.mode == flush_modes.PIPELINE
        self._wait_job = wait_job if wait_job is not None else flush_modes.wait_for_job
        self._on_durable = on_durable
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._run_blocking = run_blocking if run_blocking is not None else self._in_thread
        # The loop of whoever builds the committer: later calls may come from
        # inside a workflow's own loop, which must never be taken for it.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        # The loop's queue of ready callbacks (asyncio's own deque; looked up once).
        self._ready: Any = None
        self._inflight: FlushJob | None = None
        self._inflight_fut: _SharedFuture | None = None  # waiters of the batch in flight
        self._next_fut: _SharedFuture | None = None  # waiters of the batch forming
        self._waiters = 0
        # Flushes completed here before their runner's callbacks reached the loop:
        # those callbacks, still on their way, change nothing (see _loop_idle).
        self._stale = 0
        self._start_scheduled = False
        self._closed = False
        #: With a start scheduled and this many records pending, a waiter starts the
        #: flush at once instead of after every ready task appended: under load the
        #: disk then syncs one batch while the next one forms (group commit pipelining).
        self.early_start = early_start
        #: Flushes completed (and of them, run on the loop's thread, and waited for by
        #: blocking it: pipeline mode) and records they made durable.
        self.flushes = 0
        self.inline_flushes = 0
        self.blocking_waits = 0
        self.records_flushed = 0
        #: Told of each completed flush: (records, seconds). Telemetry sets it; None: nobody asks.
        self.on_flush: Callable[[int, float], None] | None = None
        #: Producers outstanding: each will append a record soon without waiting for a flush.
        self.producers = 0
        #: The longest a flush is held for outstanding producers (seconds): one flush time.
        self.hold_s = HOLD_DEFAULT_S
        # Schedules a call after a delay and returns its cancel (the loop's timer by default).
        self._hold_timer = hold_timer if hold_timer is not None else self._loop_timer
        self._hold_cancel: Callable[[], None] | None = None
        # When records pending began to wait for producers (a hold, or a hand-off that left
        # them for the producers' records to join), on this committer's clock; None: they do not.
        self._waiting_since: float | None = None
        # How long the last step function lent the loop's thread held it (``lent``).
        self._lent_s = 0.0
        self._clock = clock
        # Runs an inline flush's blocking part on the loop's thread (the simulator passes time there).
        self._run_inline = run_inline
        # How long recent flushes took, from begin to end on this committer's clock: ``hold_s``
        # is their median (a simulated clock keeps a seed's decisions the same).
        self._took: collections.deque[float] = collections.deque(maxlen=64)
        self._launched_at = 0.0
        # A hold ran out with producers still out: they are slow, so do not hold for them
        # again until one lands (a step running for minutes must not cost every flush a hold).
        self._hold_futile = False
        #: Flushes held for producers, and of them those whose hold ran out.
        self.holds = 0
        self.holds_expired = 0
        log.on_flushed = self._flushed_elsewhere

    # --- API ------------------------------------------------------------------

    def expect(self, count: int = 1) -> None:
        """``count`` producers are outstanding: each will append a record soon (see ``landed``)."""
        if not sabotage.active.flush_before_producers:
            self.producers += count

    def landed(self) -> None:
        """A producer is done (it appended its record, or will before the loop's next turn)."""
        if sabotage.active.flush_before_producers:
            return
        self.producers -= 1
        assert self.producers >= 0, "a producer landed that nobody expected"
        self._hold_futile = False
        if self.producers == 0 and self._hold_cancel is not None:
            # Everyone the held flush waited for has come: start it once this callback is done.
            self._end_hold()
            self._schedule_start()

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
                elif self._inline and self._waiters == 0 and not self.producers and self._loop_idle():
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

    def hand_off(self) -> None:
        """Starts a flush of everything pending on the log's thread now, unless one is still in flight.

        Called before the loop's thread is lent to a step function: the disk
        then works on what is pending meanwhile instead of after it. A flush
        whose thread already finished is completed here first (the loop may
        not have heard of it yet, if step functions ran back to back). While
        producers are outstanding, a cheap coming function (shorter than a
        flush, guessed from the last ones, see ``lent``) starts nothing: its
        record and the producers' join what is pending, and one flush takes the
        whole turn's. Before a longer one, what is pending goes now unless it
        has waited less than one flush time, counting that function.
        """
        job = self._inflight
        if job is not None and job.done:
            self._finish_inflight(job)
        if (self._inflight is not None or self._closed or self.log.failed is not None
                or not self.log.has_pending()):
            return
        if self.producers and not self._hold_futile:
            now = self._clock()
            if self._waiting_since is None:
                self._waiting_since = now
            if self._lent_s < self.hold_s and not sabotage.active.hand_off_splits_rounds:
                # A short function: its record, and the other producers' in this turn of the
                # loop, join what is pending, and one flush on the loop's thread takes them all.
                # Launching here would split concurrent runs into groups that take turns
                # flushing through the log's thread, which costs CPython more CPU per step
                # (the GIL changing hands each flush) than the whole turn's wait.
                return
            # No producer lands while the function runs, and no hold's timer fires: leaving
            # the records for the producers costs them the function's whole time.
            if now - self._waiting_since + self._lent_s < self.hold_s:
                return
            self._hold_ran_out_early()
        self._launch()

    def lent(self, seconds: float) -> None:
        """The loop's thread came back from a step function (see ``hand_off``) after ``seconds``."""
        # One short call among long ones says little: the guess decays rather than drops.
        self._lent_s = max(seconds, self._lent_s / 2)

    @property
    def lends_are_long(self) -> bool:
        """Whether step functions lent the loop's thread lately held it longer than one flush time."""
        return self._lent_s >= self.hold_s

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
        self._end_hold()
        self._resolve(self._inflight_fut)
        self._resolve(self._next_fut)
        self._inflight_fut = self._next_fut = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def flush_if_alone(self, shard: int, lsn: int) -> bool:
        """Makes ``lsn`` of ``shard`` durable now, on the calling thread, if nothing else could share the flush.

        That is: no task waits, no other callback is ready to run and the log
        is healthy, and no producer is outstanding. Inline mode then flushes on the loop's thread; pipeline
        mode hands the flush to the log's thread (unless one in flight is on
        its way) and blocks until it is done. The caller (a lone chain of
        steps) skips a turn of the loop. Returns whether ``lsn`` is durable.
        """
        log = self.log
        if self._pipeline:
            job = self._inflight
            if job is not None and job.done:
                self._finish_inflight(job)  # its thread finished: no need to wait for the loop to hear
                if log.durable(shard) >= lsn:
                    return True
        if (
            self._closed
            or self._waiters
            or self.producers
            or log.failed is not None
            or not (self._inline or self._pipeline)
            or not self._loop_idle()
        ):
            return False
        if self._inline:
            if self._inflight is not None or self._start_scheduled or not log.has_pending():
                return False
            self._flush_inline()
            return log.durable(shard) >= lsn
        while log.durable(shard) < lsn and log.failed is None:
            job = self._inflight
            if job is None:
                if not log.has_pending():
                    return False
                self._launch()
                job = self._inflight
                assert job is not None
            self._wait_job(job)
            self.blocking_waits += 1
            self._finish_inflight(job)
        return log.durable(shard) >= lsn

    def after_delivery(self) -> None:
        """A run appended a delivery and its code goes on to its next gate: in pipeline mode, write meanwhile.

        Only when no flush is in flight: the rest of a fan-out joins the next write.
        """
        if (self._pipeline and self._inflight is None and not self.producers and not self._closed
                and self.log.failed is None and self.log.has_pending()):
            self._launch()

    @property
    def flushing(self) -> bool:
        """Whether a flush is in flight (its end starts the next one if anything is pending)."""
        return self._inflight is not None

    @property
    def holding(self) -> bool:
        """Whether a flush is held for producers (its hold's end starts it)."""
        return self._hold_cancel is not None

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
        """Whether no other callback or task is ready to run (so none could join this flush).

        The callbacks of flushes completed early count for nothing: at most one
        of each is ready at a time.
        """
        ready = self._ready
        if ready is None:
            ready = self._ready = getattr(self._get_loop(), "_ready", None)
        return ready is not None and len(ready) <= self._stale

    def _schedule_start(self) -> None:
        self._start_scheduled = True
        self._get_loop().call_soon(self._start)

    def _start(self) -> None:
        # Runs after every task already ready: they all get to append to this batch first.
        if self._hold_cancel is not None:
            return  # held: the hold's end (a landing or its timer) starts it
        self._start_scheduled = False
        if self._closed or self._inflight is not None:
            return
        if self.log.failed is not None or not self.log.has_pending():
            self._resolve(self._next_fut)  # failed, or a checkpoint flushed it already
            self._next_fut = None
            self._waiting_since = None
            return
        if self.producers and not self._hold_futile:
            # Records are about to come (executions in flight): wait for them, one flush time at most.
            self._start_scheduled = True
            self.holds += 1
            now = self._clock()
            if self._waiting_since is None:
                self._waiting_since = now
            # One flush time from when the records began to wait (a hand-off may have left them).
            self._hold_cancel = self._hold_timer(max(0.0, self.hold_s - (now - self._waiting_since)),
                                                 self._hold_ran_out)
            return
        if self._inline and not self.producers and self._loop_idle():
            self._flush_inline()  # nothing else could run meanwhile: the lowest latency
        else:
            self._launch()

    def _hold_ran_out(self) -> None:
        self._hold_cancel = None
        self.holds_expired += 1
        self._hold_futile = True
        self._start()

    def _hold_ran_out_early(self) -> None:
        # As the hold's timer would have: the producers are slow, the flush goes without them.
        if self._hold_cancel is not None:
            self.holds_expired += 1
        self._hold_futile = True

    def _end_hold(self) -> None:
        cancel, self._hold_cancel = self._hold_cancel, None
        if cancel is not None:
            cancel()
            self._start_scheduled = False  # the hold was the scheduled start

    def _loop_timer(self, delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        return self._get_loop().call_later(delay, fn).cancel

    def _flush_inline(self) -> None:
        self._end_hold()
        self._waiting_since = None  # the flush takes everything pending
        job = self.log.begin_flush()
        if job is None:
            return
        began = self._clock()
        if self._run_inline is not None:
            self._run_inline(job.run)
        else:
            job.run()
        self._took.append(self._clock() - began)
        self._complete(job)
        self._resolve(self._next_fut)
        self._next_fut = None
        self.inline_flushes += 1

    def _launch(self) -> None:
        self._end_hold()
        self._waiting_since = None  # the flush takes everything pending
        job = self.log.begin_flush()
        assert job is not None and self._inflight is None
        self._inflight = job
        self._launched_at = self._clock()
        # Everyone waiting for the forming batch now waits for this one.
        self._inflight_fut, self._next_fut = self._next_fut, None
        done = asyncio.ensure_future(self._run_blocking(job.run), loop=self._get_loop())
        done.add_done_callback(functools.partial(self._job_done, job))

    def _job_done(self, job: FlushJob, done: asyncio.Future[None]) -> None:
        if not done.cancelled():
            done.exception()  # job.run never raises; retrieve anything the runner itself raised
        if self._inflight is not job:
            self._stale -= 1  # completed already, without waiting for this callback
            assert self._stale >= 0
            return
        self._finish_inflight(job, early=False)

    def _finish_inflight(self, job: FlushJob, early: bool = True) -> None:
        """Completes the flush in flight: from its runner's callback, or ``early``, as soon as its thread finished."""
        assert self._inflight is job
        if early:
            self._stale += 1
        if not job.done:
            job.wait()  # the runner gave up on it: finish it here rather than lose it
        self._took.append(self._clock() - self._launched_at)
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
        if not self.log.has_pending():
            self._waiting_since = None

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
        if not self.flushes & 63 and self._took:
            took = sorted(self._took)
            self.hold_s = min(max(took[len(took) // 2], HOLD_MIN_S), HOLD_MAX_S)
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
