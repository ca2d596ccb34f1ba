"""The Env: everything the runtime needs from outside the process's logic.

The real engine and the simulator differ only here. Engine code never reads a
clock, draws randomness, starts a thread or touches a file except through the
Env it was opened with, so a simulated Env makes a run reproducible from a seed.

Step work and storage work have separate seams: a user's blocking step
functions may fill their pool for minutes, and the log's flush must never
queue behind them (finished work would wait for the disk, and be lost by a
crash meanwhile).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from fusee.storage import flush_modes

T = TypeVar("T")

#: Threads that run synchronous step functions when ``Engine.open`` is not told otherwise.
DEFAULT_STEP_THREADS = 16


class Env(Protocol):
    """What a runtime asks of the world."""

    #: Where the engine's directory lives (a ``fusee.storage.seam.Storage``).
    storage: Any
    #: Source of run IDs, random values, UUIDs, retry jitter and log salts.
    rng: random.Random
    #: Run a flush on the event loop's thread when exactly one run waits for it.
    inline_flush: bool
    #: Where flushes run (``fusee.storage.flush_modes``): inline, pipeline or background.
    flush_mode: str
    #: Synchronous step functions on the event loop's thread: True (all), False
    #: (none: the step pool), None (each once measured cheap: ``syncsteps``).
    inline_sync_steps: bool | None

    def now_ms(self) -> int:
        """Wall-clock Unix milliseconds (what ``ctx.now()`` records)."""
        ...

    def now_us(self) -> int:
        """Wall-clock Unix microseconds, on the clock of ``now_ms`` (times step attempts)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (times step functions)."""
        ...

    def call_inline(self, fn: Callable[..., T], *args: Any) -> T:
        """Calls a synchronous step function on the event loop's thread (it blocks the loop meanwhile)."""
        ...

    def run_io(self, fn: Callable[[], T]) -> Awaitable[T]:
        """Runs storage work (a flush) off the event loop's thread; never behind step work."""
        ...

    def wait_flush(self, job: Any) -> None:
        """Blocks the event loop's thread until a flush handed to ``run_io`` is done (pipeline mode)."""
        ...

    def run_step(self, fn: Callable[[], T]) -> Awaitable[T]:
        """Runs a synchronous step function in the bounded step pool and returns its result."""
        ...

    def message_delay(self) -> float:
        """Seconds a message between shards takes (0 in a real process)."""
        ...


class RealEnv:
    """The Env of a real process: wall clock, OS randomness, a log thread and a step pool."""

    def __init__(self, storage: Any, *, inline_flush: bool = True, inline_sync_steps: bool | None = None,
                 step_threads: int = DEFAULT_STEP_THREADS, flush: str | None = None) -> None:
        if not isinstance(step_threads, int) or isinstance(step_threads, bool) or step_threads < 1:
            raise ValueError(f"step_threads must be a positive int, got {step_threads!r}")
        self.storage = storage
        self.rng = random.Random(os.urandom(16))
        self.flush_mode = flush_modes.resolve(flush) if inline_flush else flush_modes.BACKGROUND
        self.inline_flush = self.flush_mode == flush_modes.INLINE
        self.inline_sync_steps = inline_sync_steps
        self.step_threads = step_threads
        self._steps = concurrent.futures.ThreadPoolExecutor(
            max_workers=step_threads, thread_name_prefix="fusee-step"
        )
        # One thread of its own: one flush is in flight at a time anyway.
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fusee-log")
        # The host's loop, taken now: later calls may come from inside a
        # workflow's own loop, which runs no threads.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def now_us(self) -> int:
        return time.time_ns() // 1_000

    monotonic = staticmethod(time.perf_counter)

    @staticmethod
    def call_inline(fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def _host_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def run_io(self, fn: Callable[[], T]) -> Awaitable[T]:
        return self._host_loop().run_in_executor(self._io, fn)

    def run_step(self, fn: Callable[[], T]) -> Awaitable[T]:
        return self._host_loop().run_in_executor(self._steps, fn)

    wait_flush = staticmethod(flush_modes.wait_for_job)

    def hold_timer(self, delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        """Calls ``fn`` on the host loop after ``delay`` seconds; returns what cancels it.

        A held flush waits about one ``fdatasync`` (100 µs here), but asyncio's
        timers wake an idle loop to the millisecond (epoll's resolution): below
        that, the log's thread waits instead (it is idle while a flush is held),
        to the tens of microseconds.
        """
        loop = self._host_loop()
        if delay >= 1e-3:
            return loop.call_later(delay, fn).cancel
        cancelled = threading.Event()

        def fire() -> None:
            if not cancelled.is_set():
                fn()

        def wait() -> None:
            if not cancelled.wait(delay):
                loop.call_soon_threadsafe(fire)

        self._io.submit(wait)
        return cancelled.set

    def message_delay(self) -> float:
        return 0.0

    def close(self) -> None:
        self._steps.shutdown(wait=False, cancel_futures=True)
        self._io.shutdown(wait=True)
