"""The simulator's Env: the engine's window on a simulated world.

Everything the runtime asks of the outside (clock, randomness, blocking I/O,
message latency) is answered from the seed and the virtual-time loop, so a
seed reproduces a run exactly.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fusee.runtime.syncsteps import function_key
from fusee.sim.loop import SimLoop

T = TypeVar("T")

#: Wall-clock milliseconds at virtual time 0 (2024-01-01T00:00:00Z): a fixed
#: epoch keeps recorded ``ctx.now()`` values identical across runs of a seed.
EPOCH_MS = 1_704_067_200_000


class SimEnv:
    """An Env on a simulated disk, clock and network.

    ``io_latency()`` gives the seconds each storage call takes;
    ``run_io(fn)`` waits that long in virtual time and then calls
    ``fn`` inline, so a flush's pwrite and fdatasync happen at its completion
    time. Synchronous step functions go to a separate, bounded step pool
    (``run_step``) whose functions take simulated time: storage work never
    waits for it, as in a real process. ``after_io`` (optional) is told after each call ran, with the error
    it raised (or None); if it returns True the caller never learns the
    outcome (the process is about to die right after the I/O completed).
    """

    inline_flush = False

    def __init__(
        self,
        disk: Any,
        rng: random.Random,
        loop: SimLoop,
        io_latency: Callable[[], float],
        *,
        message_latency: Callable[[], float] | None = None,
        clock_offset_ms: int = 0,
        after_io: Callable[[BaseException | None], bool] | None = None,
        step_slots: int = 4,
        step_latency: Callable[[], float] | None = None,
        io_shares_step_pool: bool = False,
        inline_sync_steps: bool | None = False,
        flush_mode: str = "background",
    ) -> None:
        self.storage = disk
        self.rng = rng
        self.inline_sync_steps = inline_sync_steps
        assert flush_mode in ("inline", "background", "pipeline"), f"the simulator models no {flush_mode} flushes"
        self.flush_mode = flush_mode
        self.inline_flush = flush_mode == "inline"
        #: Flushes the loop's thread ran itself (inline mode).
        self.inline_flushes = 0
        # Storage calls in flight: (due, timer, complete), so a stalled loop can let them finish on time.
        self._io_inflight: list[tuple[float, Any, Callable[[], None]]] = []
        #: Step functions called on the loop's thread, and (begin, seconds, function, storage
        #: busy) of each that stalled it; busy: a storage call was in flight as it began.
        self.steps_inline = 0
        #: Times the loop's thread blocked for a flush (pipeline mode).
        self.flush_waits = 0
        self.stalls: list[tuple[float, float, Any, bool]] = []
        # Tracebacks hold file paths: a seed must replay the same from any checkout.
        self.record_tracebacks = False
        self.loop = loop
        self._io_latency = io_latency
        self._message_latency = message_latency
        self._clock_offset_ms = clock_offset_ms
        self._after_io = after_io
        #: Blocking calls completed, and those whose result was withheld.
        self.io_done = 0
        self.io_withheld = 0
        # The step pool: ``step_slots`` functions at a time, the rest queue.
        self._step_slots = step_slots
        self._step_busy = 0
        self._step_queue: collections.deque[Callable[[], None]] = collections.deque()
        self._step_latency = step_latency
        # Sabotage of the seam: storage work queues in the step pool.
        self._io_shares_step_pool = io_shares_step_pool
        #: Step functions run in the pool, and the longest any waited for a slot (s).
        self.steps_run = 0
        self.step_queue_max = 0

    def now_ms(self) -> int:
        """Wall-clock milliseconds: the fixed epoch plus virtual time (plus any clock jump)."""
        return EPOCH_MS + self._clock_offset_ms + int(self.loop.time() * 1000.0)

    def now_us(self) -> int:
        """Wall-clock microseconds, on the clock of :meth:`now_ms`."""
        return (EPOCH_MS + self._clock_offset_ms) * 1000 + int(self.loop.time() * 1_000_000.0)

    def monotonic(self) -> float:
        """The loop's virtual time in seconds."""
        return self.loop.time()

    def call_inline(self, fn: Callable[..., T], *args: Any) -> T:
        """Calls a synchronous step function on the loop's thread, which it then holds.

        The function's effect happens now; then the loop stays busy for the
        time it blocks (``step_latency``): virtual time passes, no callback
        runs, while storage calls in flight complete at their own times, as a
        log thread does beside a busy loop. The engine hears of them after.
        """
        self.steps_inline += 1
        try:
            return fn(*args)
        finally:
            hold = self._step_latency() if self._step_latency is not None else 0.0
            if hold > 0.0:
                self._stall(hold, fn)

    def _stall(self, seconds: float, fn: Any) -> None:
        self.stalls.append((self.loop.time(), seconds, function_key(fn), bool(self._io_inflight)))
        self._hold_loop(seconds)

    def _hold_loop(self, seconds: float) -> None:
        """The loop's thread is busy for ``seconds``: storage calls in flight complete meanwhile."""
        loop = self.loop
        end = loop.time() + seconds
        for entry in sorted((e for e in self._io_inflight if e[0] <= end), key=lambda e: e[0]):
            self._complete_io_now(entry)
        loop._advance_to(end)

    def _complete_io_now(self, entry: tuple[float, Any, Callable[[], None]]) -> None:
        """A storage call finishes on "its thread" while the loop's thread is busy: the disk's part now."""
        when, timer, complete = entry
        self._io_inflight.remove(entry)
        timer.cancel()
        self.loop._advance_to(max(when, self.loop.time()))
        complete()  # its future's callbacks wait for the loop

    @property
    def io_in_flight(self) -> int:
        """Storage calls on their way (handed to ``run_io``, not yet complete)."""
        return len(self._io_inflight)

    def complete_io_until(self, t: float) -> None:
        """Storage calls in flight due by ``t`` complete now, while the loop does not run.

        A stopped process (``SIGSTOP``) whose store is a server: the statement it
        sent is executed and committed on time; the process hears of it when it
        resumes (the future's callbacks wait for the loop).
        """
        for entry in sorted((e for e in self._io_inflight if e[0] <= t), key=lambda e: e[0]):
            self._complete_io_now(entry)

    def wait_flush(self, job: Any) -> None:
        """The loop's thread blocks until a flush in flight is done (pipeline mode): virtual time passes."""
        self.flush_waits += 1
        while not job.done and self._io_inflight:
            self._complete_io_now(min(self._io_inflight, key=lambda e: e[0]))
        if not job.done:
            job.wait()  # never handed over (cannot happen): it runs here rather than hang

    def flush_inline(self, run: Callable[[], None]) -> None:
        """An inline flush: the loop's thread writes and syncs, holding the loop meanwhile.

        Virtual time passes for the I/O's seeded latency (storage calls in flight
        complete at their own times meanwhile, as in ``call_inline``), then the
        disk's part happens. A crash armed right after it (``after_io``) takes
        effect once the engine's code returns to the loop: the engine may go on
        with what became durable, as a real process would before it dies.
        """
        delay = self._io_latency()
        assert delay >= 0.0, f"I/O latency {delay} must not be negative"
        self._hold_loop(delay)
        disk = self.storage
        armed = hasattr(disk, "kill_armed")
        if armed:
            disk.kill_armed = True
        try:
            run()
        finally:
            if armed:
                disk.kill_armed = False
        self.io_done += 1
        self.inline_flushes += 1
        if self._after_io is not None:
            self._after_io(None)

    def run_io(self, fn: Callable[[], T]) -> Awaitable[T]:
        """Runs ``fn`` after a seeded I/O latency, inline on the loop; returns a future of its result.

        Like a worker thread, ``fn`` runs even if the caller stops waiting.
        """
        if self._io_shares_step_pool:
            return self._pooled(lambda: self._io_now(fn))
        return self._io_now(fn)

    def run_step(self, fn: Callable[[], T]) -> Awaitable[T]:
        """Runs a synchronous step function in the bounded step pool.

        The function is called when it gets a slot (its effects happen then)
        and holds the slot for a seeded time before its result is returned,
        like a blocking call in a worker thread.
        """
        return self._pooled(lambda: self._step_now(fn))

    def _pooled(self, begin: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        loop = self.loop
        fut: asyncio.Future[T] = loop.create_future()

        def start() -> None:
            self._step_busy += 1
            inner = asyncio.ensure_future(begin(), loop=loop)

            def done(f: asyncio.Future[T]) -> None:
                self._step_busy -= 1
                if self._step_queue:
                    self._step_queue.popleft()()
                if fut.done():
                    return
                if f.cancelled():
                    fut.cancel()
                elif f.exception() is not None:
                    fut.set_exception(f.exception())  # type: ignore[arg-type]
                else:
                    fut.set_result(f.result())

            inner.add_done_callback(done)

        if self._step_busy < self._step_slots:
            start()
        else:
            self._step_queue.append(start)
            self.step_queue_max = max(self.step_queue_max, len(self._step_queue))
        return fut

    async def _step_now(self, fn: Callable[[], T]) -> T:
        self.steps_run += 1
        try:
            value = fn()
        finally:
            delay = self._step_latency() if self._step_latency is not None else 0.0
            assert delay >= 0.0, f"step latency {delay} must not be negative"
            await asyncio.sleep(delay)
        return value

    def _io_now(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        loop = self.loop
        fut: asyncio.Future[T] = loop.create_future()
        delay = self._io_latency()
        assert delay >= 0.0, f"I/O latency {delay} must not be negative"

        def complete() -> None:
            # Storage work here (a flush) may be killed inside an fdatasync (SimDisk.arm_kills).
            disk = self.storage
            armed = hasattr(disk, "kill_armed")
            if armed:
                disk.kill_armed = True
            try:
                value = fn()
            except BaseException as e:  # the caller sees exactly what fn raised
                self.io_done += 1
                if self._withhold(e):
                    return
                if not fut.done():
                    fut.set_exception(e)
                return
            finally:
                if armed:
                    disk.kill_armed = False
            self.io_done += 1
            if self._withhold(None):
                return
            if not fut.done():
                fut.set_result(value)

        when = loop.time() + delay
        entry: list[Any] = []

        def due() -> None:
            self._io_inflight.remove(entry[0])
            complete()

        timer = loop.call_at(when, due)
        entry.append((when, timer, complete))
        self._io_inflight.append(entry[0])
        return fut

    def _withhold(self, error: BaseException | None) -> bool:
        if self._after_io is not None and self._after_io(error):
            self.io_withheld += 1
            return True
        return False

    def message_delay(self) -> float:
        """Seconds a message between shards takes (seeded)."""
        return self._message_latency() if self._message_latency is not None else 0.0
