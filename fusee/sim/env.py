"""The simulator's Env: the engine's window on a simulated world.

Everything the runtime asks of the outside (clock, randomness, blocking I/O,
message latency) is answered from the seed and the virtual-time loop, so a
seed reproduces a run exactly.
"""

from __future__ import annotations

import asyncio
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

    ``io_latency()`` gives the seconds each blocking call takes;
    ``run_blocking(fn)`` waits that long in virtual time and then calls
    ``fn`` inline, so a flush's pwrite and fdatasync happen at its completion
    time. ``after_io`` (optional) is told after each call ran, with the error
    it raised (or None); if it returns True the caller never learns the
    outcome (the process is about to die right after the I/O completed).
    """

    inline_flush = False
    inline_sync_steps = True

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

    def now_ms(self) -> int:
        """Wall-clock milliseconds: the fixed epoch plus virtual time (plus any clock jump)."""
        return EPOCH_MS + self._clock_offset_ms + int(self.loop.time() * 1000.0)

    def run_blocking(self, fn: Callable[[], T]) -> Awaitable[T]:
        """Runs ``fn`` after a seeded I/O latency, inline on the loop; returns a future of its result.

        Like a worker thread, ``fn`` runs even if the caller stops waiting.
        """
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
