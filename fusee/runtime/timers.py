"""The engine's timers: one heap for every run's sleeps, deadlines, wake-ups, parks and expiries.

However many runs wait, the host loop holds one timer: for the earliest
entry. Entries are plain tuples (not tracked by the cycle collector) naming
the run by workflow ID and run ID, so a parked run costs no object here, and
an entry for a run that moved on is simply ignored when it comes due.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable

#: Entries dispatched per turn of the loop at most: a mass wake reaches the code in
#: batches, each batch's records flushing while the next one runs, and the loop
#: stays responsive (acknowledgements, I/O) during it.
BATCH = 256

# What an entry asks for when it comes due.
FIRE, DEADLINE, WAKE, PARK, EXPIRE, CHILD_DEADLINE, RUN_DEADLINE = range(7)

#: (due ms, kind, workflow ID, run ID, position, extra)
Entry = tuple[int, int, str, int, int, int]


class TimerQueue:
    """Due times on the Env's clock, dispatched in order on the host loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        now_ms: Callable[[], int],
        dispatch: Callable[[int, str, int, int, int], None],
    ) -> None:
        self._loop = loop
        self._now_ms = now_ms
        self._dispatch = dispatch
        self._heap: list[Entry] = []
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0
        self._closed = False

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due_ms: int, kind: int, wid: str, run_id: int, seq: int = 0, extra: int = 0) -> None:
        """Schedules an entry. Ties order by kind, workflow ID and position: deterministic."""
        heapq.heappush(self._heap, (due_ms, kind, wid, run_id, seq, extra))
        if self._handle is None or due_ms < self._due:
            self._arm()

    def next_due(self) -> int | None:
        """The earliest entry's due time (Env ms), or None when nothing is scheduled."""
        return self._heap[0][0] if self._heap else None

    def rearm(self) -> None:
        """The Env's clock moved (a test skipped time): look again at what is due."""
        self._arm()

    def close(self) -> None:
        """Nothing more comes due."""
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._heap or self._closed:
            return
        self._due = self._heap[0][0]
        delay = max(0.0, (self._due - self._now_ms()) / 1000)
        self._handle = self._loop.call_later(delay, self._run_due)

    def _run_due(self) -> None:
        self._handle = None
        if self._closed:
            return
        now = self._now_ms()
        heap = self._heap
        budget = BATCH
        while heap and heap[0][0] <= now and budget:
            _, kind, wid, run_id, seq, extra = heapq.heappop(heap)
            self._dispatch(kind, wid, run_id, seq, extra)
            budget -= 1
        if heap and heap[0][0] <= now and not self._closed:
            # More are due: after the loop's next turn (what this batch appended starts its flush first).
            if self._handle is not None:
                self._handle.cancel()
            self._due = heap[0][0]
            self._handle = self._loop.call_later(0, self._run_due)
            return
        self._arm()
