"""When each step attempt of a run ran, read from its journal.

Every ``Step`` and ``Attempt`` record carries the attempt's start (the
engine's clock, Unix microseconds), how long it ran and how long it waited
for a limit's permit or a pool thread before it began. Records written before
step times were journaled hold zeros there: their attempts are listed with no
times.
"""

from __future__ import annotations

import dataclasses
import datetime

from fusee import codec
from fusee.core import records as rec
from fusee.errors import FuseeError

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def at_us(us: int) -> datetime.datetime:
    """Unix microseconds as a UTC datetime, exactly."""
    return _EPOCH + datetime.timedelta(microseconds=us)


@dataclasses.dataclass(frozen=True)
class StepAttempt:
    """One attempt of a step: when it ran, how long it took and how it ended."""

    #: The step's position in the run (its operation's sequence number).
    position: int
    name: str
    #: The attempt's number, from 1 (counted across resumes, as the journal counts).
    attempt: int
    #: "ok", "failed", "cancelled" or "timed_out" (the step's outcome), "retried" (it failed
    #: and a next attempt followed) or "paused" (it failed and retries ran out).
    status: str
    #: When its function began (UTC), None for an attempt journaled before step times.
    started_at: datetime.datetime | None = None
    #: When its outcome was known (UTC), None as ``started_at``.
    ended_at: datetime.datetime | None = None
    #: How long it waited for a limit's permit or a thread of the step pool before it began.
    queued: datetime.timedelta = datetime.timedelta(0)
    #: Why it failed ("Type: message"), None if it did not.
    error: str | None = None

    @property
    def duration(self) -> datetime.timedelta | None:
        """How long its function ran (None without times)."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


def _error(data: bytes) -> str | None:
    try:
        info = codec.decode_error(data)
    except FuseeError:
        return None
    return f"{info.type}: {info.message}" if info.message else info.type


def _times(began_us: int, took_us: int, queued_us: int) -> dict[str, object]:
    if not began_us:
        return {}
    return {"started_at": at_us(began_us), "ended_at": at_us(began_us + took_us),
            "queued": datetime.timedelta(microseconds=queued_us)}


def step_attempts(journal: list[rec.Record]) -> tuple[StepAttempt, ...]:
    """Every journaled step attempt of a run, in journal order (in-flight ones are not journaled yet)."""
    out: list[StepAttempt] = []
    for r in journal:
        t = type(r)
        if t is rec.Step:
            assert isinstance(r, rec.Step)
            error = None if r.status == rec.Status.OK else _error(r.payload)
            out.append(StepAttempt(r.seq, r.name, r.attempt, r.status.name.lower(), error=error,
                                   **_times(r.began_us, r.took_us, r.queued_us)))  # type: ignore[arg-type]
        elif t is rec.Attempt:
            assert isinstance(r, rec.Attempt)
            status = "paused" if r.retry_at_ms == rec.PAUSED else "retried"
            out.append(StepAttempt(r.seq, r.name, r.attempt, status, error=_error(r.error),
                                   **_times(r.began_us, r.took_us, r.queued_us)))  # type: ignore[arg-type]
    return tuple(out)
