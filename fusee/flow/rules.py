"""Window rules users attach to a workflow, and the receipt an enqueued event gets."""

from __future__ import annotations

import dataclasses

from fusee.durations import Duration, to_ms

#: Events a window coordinator run takes before it continues as new (bounds its journal).
DEFAULT_CONTINUE_EVERY = 100
#: Event IDs a coordinator remembers (the most recent ones) to answer a repeated ``event_id``.
DEFAULT_DEDUP_MEMORY = 1_000


@dataclasses.dataclass(frozen=True)
class Debounce:
    """Runs the workflow once a key's events pause for ``period``, or ``max_wait`` after
    the window's first event at the latest (None: no cap)."""

    period: Duration
    max_wait: Duration | None = None
    #: Events one coordinator run takes before it continues as new (its journal stays bounded).
    continue_every: int = DEFAULT_CONTINUE_EVERY
    #: How many of the most recent event IDs per key are remembered for deduplication.
    dedup_memory: int = DEFAULT_DEDUP_MEMORY

    def __post_init__(self) -> None:
        if to_ms(self.period) <= 0:
            raise ValueError(f"Debounce(period=...) must be positive, got {self.period!r}")
        if self.max_wait is not None and to_ms(self.max_wait) < to_ms(self.period):
            raise ValueError(f"Debounce(max_wait=...) must be at least the period, got {self.max_wait!r}")
        _check_counts(self.continue_every, self.dedup_memory)


@dataclasses.dataclass(frozen=True)
class Batch:
    """Runs the workflow with up to ``max_size`` events of a key, at most ``max_delay``
    after the batch's first event."""

    max_size: int
    max_delay: Duration
    continue_every: int = DEFAULT_CONTINUE_EVERY
    dedup_memory: int = DEFAULT_DEDUP_MEMORY

    def __post_init__(self) -> None:
        if not isinstance(self.max_size, int) or isinstance(self.max_size, bool) or self.max_size < 1:
            raise ValueError(f"Batch(max_size=...) must be a positive int, got {self.max_size!r}")
        if to_ms(self.max_delay) < 0:
            raise ValueError(f"Batch(max_delay=...) must not be negative, got {self.max_delay!r}")
        _check_counts(self.continue_every, self.dedup_memory)


def _check_counts(continue_every: object, dedup_memory: object) -> None:
    for name, v in (("continue_every", continue_every), ("dedup_memory", dedup_memory)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


@dataclasses.dataclass(frozen=True)
class Receipt:
    """Where an acknowledged event went: the window run's workflow ID and the event's
    index in that run's input list."""

    window_id: str
    position: int
