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


def every(loop: asyncio.AbstractEventLoop, interval: float, tick: Callable[[], bool]) -> None:
    """Calls ``tick`` every ``interval`` seconds on ``loop`` until it returns False."""

    def fire() -> None:
        if tick():
            loop.call_later(interval, fire)

    loop.call_later(interval, fire)
