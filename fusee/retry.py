"""Retry policy of a step: how many attempts, how long between them, which errors are final.

The policy is pure data and arithmetic: the caller supplies the random draw
for the jitter (from its Env's rng), so the same draws give the same delays
in a real run and in the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fusee.durations import Duration, format_ms, to_ms
from fusee.errors import Cancelled


@dataclass(frozen=True)
class Retry:
    """How a failing step is retried.

    - ``attempts``: attempts in total, the first included (None: unlimited).
    - ``initial``: delay after the first failure; each later delay is
      ``backoff`` times the previous one, capped at ``max_interval``.
    - ``jitter``: each delay is scaled by a factor drawn in ``[1 - jitter, 1 + jitter)``.
    - ``non_retryable``: exception types that fail the step at once.
    - ``pause_when_exhausted``: when attempts run out, pause the run until it
      is resumed (with a fresh budget) instead of failing the workflow.

    Only ``Exception`` subclasses are ever retried: ``fusee.Cancelled``,
    ``asyncio.CancelledError``, ``KeyboardInterrupt`` and the like never are.
    """

    attempts: int | None = 3
    initial: Duration = "100ms"
    backoff: float = 2.0
    max_interval: Duration = "1m"
    jitter: float = 0.1
    non_retryable: tuple[type[BaseException], ...] = ()
    pause_when_exhausted: bool = False
    #: ``initial`` and ``max_interval`` in milliseconds (derived).
    initial_ms: int = field(init=False, repr=False, compare=False)
    max_interval_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        attempts = self.attempts
        if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1):
            raise ValueError(
                f"Retry(attempts={attempts!r}): attempts counts every try, the first included, "
                "so it must be an int >= 1 (1 = no retry), or None for unlimited"
            )
        initial_ms = to_ms(self.initial)
        max_ms = to_ms(self.max_interval)
        if max_ms < initial_ms:
            raise ValueError(
                f"Retry(initial={self.initial!r}, max_interval={self.max_interval!r}): max_interval "
                f"({format_ms(max_ms)}) must not be shorter than initial ({format_ms(initial_ms)})"
            )
        backoff = self.backoff
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not (1.0 <= backoff < math.inf):
            raise ValueError(
                f"Retry(backoff={backoff!r}): backoff multiplies each delay, so it must be a finite "
                "number >= 1 (1 = constant delay)"
            )
        jitter = self.jitter
        if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not (0.0 <= jitter <= 1.0):
            raise ValueError(
                f"Retry(jitter={jitter!r}): jitter is the fraction (0 to 1) by which a delay may "
                "randomly grow or shrink, e.g. 0.1 for ±10%"
            )
        types: Any = self.non_retryable
        if isinstance(types, type):
            types = (types,)
        types = tuple(types) if isinstance(types, list | tuple | set | frozenset) else types
        if not isinstance(types, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in types
        ):
            raise ValueError(
                f"Retry(non_retryable={self.non_retryable!r}): give a tuple of exception classes, "
                "e.g. (ValueError, PermissionError)"
            )
        if not isinstance(self.pause_when_exhausted, bool):
            raise ValueError(f"Retry(pause_when_exhausted={self.pause_when_exhausted!r}): give True or False")
        # Frozen: derived and normalised fields are set once, here.
        object.__setattr__(self, "non_retryable", types)
        object.__setattr__(self, "initial_ms", initial_ms)
        object.__setattr__(self, "max_interval_ms", max_ms)

    @classmethod
    def none(cls) -> Retry:
        """A single attempt: the first failure is final."""
        return cls(attempts=1)

    def delay_ms(self, attempt: int, rand: float) -> int:
        """Milliseconds to wait after failed attempt number ``attempt`` (1-based).

        ``initial * backoff**(attempt-1)``, capped at ``max_interval``, then scaled
        by ``1 + jitter * (2*rand - 1)``: never negative, never above
        ``max_interval * (1 + jitter)``, and a pure function of its arguments.
        ``rand`` is a draw in [0, 1) from the caller's deterministic rng.
        """
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"delay_ms(attempt={attempt!r}): attempts are numbered from 1")
        if not (0.0 <= rand < 1.0):
            raise ValueError(f"delay_ms(rand={rand!r}): rand must be drawn from [0, 1)")
        cap = self.max_interval_ms
        if self.initial_ms == 0:
            base = 0.0
        else:
            try:
                base = min(self.initial_ms * self.backoff ** (attempt - 1), cap)
            except OverflowError:  # backoff**n past the float range: long since capped
                base = cap
        scaled = base * (1.0 + self.jitter * (2.0 * rand - 1.0))
        return max(0, math.floor(scaled + 0.5))

    def should_retry(self, attempt: int, error: BaseException) -> bool:
        """True when failed attempt number ``attempt`` (1-based, counted from
        the step's last resume) may be followed by another.

        False for errors that are not ``Exception`` subclasses, for cancellation,
        for ``non_retryable`` types and once ``attempts`` are used up.
        """
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"should_retry(attempt={attempt!r}): attempts are numbered from 1")
        if not isinstance(error, Exception) or isinstance(error, Cancelled):
            return False
        if self.non_retryable and isinstance(error, self.non_retryable):
            return False
        return self.attempts is None or attempt < self.attempts

    def exhausted(self, attempt: int) -> bool:
        """True when ``attempt`` failed attempts use up the budget (whatever the error)."""
        return self.attempts is not None and attempt >= self.attempts


#: The policy of a step that names none.
DEFAULT = Retry()
