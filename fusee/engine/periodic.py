"""Periodic work of an open engine (``checkpoint_interval``), on its loop's own timers.

The loop's clock is the Env's in a simulation (virtual time), so the same
code checkpoints on schedule there and on a real loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable


def check_interval(seconds: object) -> float | None:
    """``seconds`` as a positive float, or None; ValueError for anything else."""
    if seconds is None:
        return None
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ValueError(f"checkpoint_interval must be a positive number of seconds or None, got {seconds!r}")
    return float(seconds)


def every(
    loop: asyncio.AbstractEventLoop,
    interval: float,
    tick: Callable[[], bool | None],
    on_wake: Callable[[Callable[[], None]], None] | None = None,
) -> None:
    """Calls ``tick`` every ``interval`` seconds on ``loop`` until it returns False.

    When ``tick`` returns None it had nothing to do: the ticks pause, and
    ``on_wake`` is given the function that resumes them (an idle engine then
    holds no timer, so virtual time can skip ahead in a simulation).
    """

    def fire() -> None:
        more = tick()
        if more:
            loop.call_later(interval, fire)
        elif more is None and on_wake is not None:
            on_wake(lambda: _later(loop, interval, fire))
        elif more is None:
            loop.call_later(interval, fire)

    loop.call_later(interval, fire)


def _later(loop: asyncio.AbstractEventLoop, delay: float, fn: Callable[[], None]) -> None:
    loop.call_later(delay, fn)
