"""The Env: everything the runtime needs from outside the process's logic.

The real engine and the simulator differ only here. Engine code never reads a
clock, draws randomness, starts a thread or touches a file except through the
Env it was opened with, so a simulated Env makes a run reproducible from a seed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Env(Protocol):
    """What a runtime asks of the world."""

    #: Where the engine's directory lives (a ``fusee.storage.seam.Storage``).
    storage: Any
    #: Source of run IDs, random values, UUIDs, retry jitter and log salts.
    rng: random.Random
    #: Run a flush on the event loop's thread when exactly one run waits for it.
    inline_flush: bool
    #: Run synchronous step functions on the event loop's thread (cheap, pure
    #: functions) instead of the thread pool.
    inline_sync_steps: bool
    #: Journal the traceback of a failed step or workflow (optional; default True).

    def now_ms(self) -> int:
        """Wall-clock Unix milliseconds (what ``ctx.now()`` records)."""
        ...

    def run_blocking(self, fn: Callable[[], T]) -> Awaitable[T]:
        """Runs ``fn`` off the event loop's thread and returns its result."""
        ...

    def message_delay(self) -> float:
        """Seconds a message between shards takes (0 in a real process)."""
        ...


class RealEnv:
    """The Env of a real process: wall clock, OS randomness, worker threads."""

    def __init__(self, storage: Any, *, inline_flush: bool = True, inline_sync_steps: bool = False,
                 step_threads: int = 8) -> None:
        self.storage = storage
        self.rng = random.Random(os.urandom(16))
        self.inline_flush = inline_flush
        self.inline_sync_steps = inline_sync_steps
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=step_threads, thread_name_prefix="fusee-step"
        )
        # The host's loop, taken now: later calls may come from inside a
        # workflow's own loop, which runs no threads.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def run_blocking(self, fn: Callable[[], T]) -> Awaitable[T]:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.run_in_executor(self._pool, fn)

    def message_delay(self) -> float:
        return 0.0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=False)
