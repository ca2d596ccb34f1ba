"""What the holder of an expiring lease knows of it on its own clock: whether it may still act.

The store judges each write by its own clock in the same act as the write
(the fence: see ``fusee.storage.postgres.log``). A step's function acts
outside the store, where nothing fences it: the holder must judge for itself,
before the function begins, that no other engine can hold the lease. A take
or renewal that succeeded proves the lease held until the server's ``now()``
at that statement plus the TTL, and that ``now()`` is no earlier than the
moment the statement was sent; so, on the holder's clock, the lease is its
own until ``sent + ttl`` (less a margin for the clocks' rates).

A holder stopped past that point (``SIGSTOP``, a long GC pause, a starved
thread) begins nothing more, even when a flush it sent before the pause comes
back committed: the commit proves the lease was held when the server ran it,
not now, and the engine that took over recovered that flush and runs the same
steps.
"""

from __future__ import annotations

from collections.abc import Callable

#: The share of the TTL given up for the holder's clock running slower than the server's
#: (NTP slews a clock by 500 ppm at most: this is twice that).
RATE_MARGIN = 1e-3


class Holding:
    """The holder's own deadline for acting under one lease (nothing held until ``held``).

    ``clock`` is monotonic seconds (``time.monotonic``; a simulated process's
    loop time). ``held`` may be called from one thread (the renewals) while
    ``holds`` is asked on others: each reads or writes one float.
    """

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self.ttl = float(ttl)
        self.clock = clock
        self._until = float("-inf")

    def held(self, sent_at: float) -> None:
        """A take or renewal sent at ``sent_at`` (``clock()`` just before sending it) succeeded."""
        self._until = max(self._until, sent_at + self.ttl * (1.0 - RATE_MARGIN))

    def drop(self) -> None:
        """The lease is lost or given back: nothing more may begin under it."""
        self._until = float("-inf")

    def holds(self) -> bool:
        """Whether no other engine can hold the lease now, by this holder's clock."""
        return self.clock() < self._until

    @property
    def remaining(self) -> float:
        """Seconds left before the holder must stop acting (negative: it lapsed that long ago)."""
        return self._until - self.clock()
