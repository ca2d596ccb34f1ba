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
    inline_sync_steps = False

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
    ) -> None:
        self.storage = disk
        self.rng = rng
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

        loop.call_at(loop.time() + delay, complete)
        return fut

    def _withhold(self, error: BaseException | None) -> bool:
        if self._after_io is not None and self._after_io(error):
            self.io_withheld += 1
            return True
        return False

    def message_delay(self) -> float:
        """Seconds a message between shards takes (seeded)."""
        return self._message_latency() if self._message_latency is not None else 0.0
