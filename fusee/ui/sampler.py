"""The recent history of the engine's metrics, for the metrics page's charts.

``Engine.metrics`` is a snapshot; the charts need a few minutes of them. A
sample is taken when a page asks for one (the metrics page and the runs
page's live counts refresh every few seconds) and at most once a second, so
nothing runs when nobody looks.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from fusee.engine.visibility import Metrics

#: Samples kept (at one a second at most: ten minutes or more).
KEEP = 600


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    steps_run: int
    records_flushed: int
    flushes: int
    flush_p50_ms: float
    flush_p99_ms: float
    by_status: dict[str, int]


class Sampler:
    """Keeps the latest :data:`KEEP` metrics samples, taken at most once per ``every`` seconds."""

    def __init__(self, every: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.samples: collections.deque[Sample] = collections.deque(maxlen=KEEP)

    def add(self, m: Metrics) -> None:
        now = self.clock()
        if self.samples and now - self.samples[-1].at < self.every:
            return
        by: dict[str, int] = {}
        for s in m.shards:
            for status, n in s.runs.items():
                by[status] = by.get(status, 0) + n
        self.samples.append(Sample(now, m.steps_run, m.records_flushed, m.flushes,
                                   m.flush_p50_ms, m.flush_p99_ms, by))

    def rates(self, field: str) -> list[tuple[float, float]]:
        """Per-second increase of a counter between consecutive samples, as (seconds ago, rate)."""
        now = self.clock()
        out: list[tuple[float, float]] = []
        prev: Sample | None = None
        for s in self.samples:
            if prev is not None and s.at > prev.at:
                # A counter restarts with the engine: never draw a negative rate.
                delta = max(0, getattr(s, field) - getattr(prev, field))
                out.append((s.at - now, delta / (s.at - prev.at)))
            prev = s
        return out

    def values(self, field: str) -> list[tuple[float, float]]:
        """A gauge over time, as (seconds ago, value)."""
        now = self.clock()
        return [(s.at - now, float(getattr(s, field))) for s in self.samples]

    def statuses(self, status: str) -> list[tuple[float, float]]:
        """How many runs had ``status`` over time."""
        now = self.clock()
        return [(s.at - now, float(s.by_status.get(status, 0))) for s in self.samples]
