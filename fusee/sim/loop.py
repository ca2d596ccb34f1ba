"""A virtual-time asyncio event loop: the simulator's clock and scheduler.

The whole real engine runs unchanged on this loop. Its ``time()`` is virtual:
when nothing is ready, the loop jumps straight to the next timer instead of
sleeping, so a day-long ``asyncio.sleep`` costs nothing. It does no real I/O
and refuses threads. Callbacks run in a deterministic order: ready callbacks
first-in first-out, timers by due time and then by the order they were set.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from asyncio import events
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import Context
from typing import Any, TypeVar

T = TypeVar("T")


class SimDeadlock(RuntimeError):
    """The loop was asked to wait for something, but nothing is scheduled that could bring it."""


class ThreadsForbidden(RuntimeError):
    """Something tried to use a thread (an executor) inside a simulated run.

    Threads make a run depend on the OS scheduler, so a seed would no longer
    reproduce. Route blocking work through the Env's ``run_io`` instead.
    """


class _SeqTimerHandle(events.TimerHandle):
    """A timer that breaks ties between equal due times by creation order (FIFO)."""

    __slots__ = ("_seq",)

    def __init__(self, seq: int, when: float, callback: Callable[..., object], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop, context: Context | None) -> None:
        super().__init__(when, callback, args, loop, context=context)
        self._seq = seq

    def _key(self) -> tuple[float, int]:
        return (self.when(), self._seq)

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _SeqTimerHandle):
            return self._key() < other._key()
        return NotImplemented

    def __le__(self, other: object) -> bool:
        if isinstance(other, _SeqTimerHandle):
            return self._key() <= other._key()
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        if isinstance(other, _SeqTimerHandle):
            return self._key() > other._key()
        return NotImplemented

    def __ge__(self, other: object) -> bool:
        if isinstance(other, _SeqTimerHandle):
            return self._key() >= other._key()
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _SeqTimerHandle):
            return self._key() == other._key() and self._cancelled == other._cancelled
        return NotImplemented


class _VirtualSelector:
    """Stands in for the I/O selector: "waiting" advances the virtual clock."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        loop = self._loop
        if timeout != 0 and loop.idle_hook is not None:
            # Nothing is ready: whatever the engine promised to do "soon" must already be
            # under way (a timer or a storage call), or it would wait for unrelated activity.
            loop.idle_hook()
        if timeout is None:
            # Nothing ready and no timer: in a real loop this would block
            # forever waiting for I/O, which the simulation never delivers.
            raise SimDeadlock(
                f"at virtual time {loop.now:.6f}s nothing is ready and no timer is set: "
                "the awaited result can never arrive"
            )
        if timeout > 0:
            target = loop.now + timeout
            scheduled = loop._scheduled  # type: ignore[attr-defined]
            if scheduled and scheduled[0]._when <= target:
                # Land exactly on the timer's due time (no float drift).
                target = max(loop.now, scheduled[0]._when)
            if target > loop.now:
                loop.clock_jumps += 1
            loop._advance_to(target)
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """An asyncio loop on virtual time, single-threaded, without real I/O.

    ``start`` is the virtual time (seconds) the loop's clock starts at; a
    simulator gives every process life a fresh loop starting where the last
    one stopped.
    """

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._now = float(start)
        self._selector = _VirtualSelector(self)
        self._timer_seq = itertools.count()
        # Virtual time: the loop never sleeps, so "slow callback" warnings
        # and the monotonic clock's resolution are meaningless here.
        self._clock_resolution = 1e-9
        #: Called each time nothing is ready and the loop is about to wait (advance the clock).
        self.idle_hook: Callable[[], None] | None = None
        #: Times nothing was ready and the clock jumped ahead to the next timer (never a real wait).
        self.clock_jumps = 0
        #: Exception contexts reported by callbacks and tasks, in order.
        self.errors: list[dict[str, Any]] = []
        self.set_exception_handler(self._record_error)

    # --- the clock -------------------------------------------------------

    @property
    def now(self) -> float:
        """The virtual time in seconds."""
        return self._now

    def time(self) -> float:
        return self._now

    def _advance_to(self, t: float) -> None:
        assert t >= self._now, f"virtual time cannot go back from {self._now} to {t}"
        self._now = t

    def resume_at(self, t: float) -> None:
        """A stopped process resumes at ``t``: its clock jumps there (a monotonic clock goes on
        while a process is stopped), so what fell due meanwhile runs at once, late."""
        self._advance_to(max(t, self._now))

    # --- scheduling ------------------------------------------------------

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                context: Context | None = None) -> events.TimerHandle:
        self._check_closed()  # type: ignore[attr-defined]
        timer = _SeqTimerHandle(next(self._timer_seq), when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def next_deadline(self) -> float | None:
        """The due time of the earliest live timer (None when none is set)."""
        live = [h.when() for h in self._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        return min(live) if live else None

    def has_ready(self) -> bool:
        """Whether callbacks are ready to run at the current virtual time."""
        return bool(self._ready)  # type: ignore[attr-defined]

    def run_until(self, t: float) -> float:
        """Runs callbacks until virtual time ``t`` or until ``stop()`` is called.

        Callbacks due at ``t`` and scheduled before this call run; the clock
        is left at ``t`` (or where ``stop()`` was called). Returns the
        virtual time reached.
        """
        if t < self._now:
            t = self._now
        stopper = self.call_at(t, self.stop)
        try:
            self.run_forever()
        finally:
            stopper.cancel()
        return self._now

    def run_until_complete(self, future: Any) -> Any:
        """Runs until ``future`` (a coroutine or future) is done, in virtual time.

        Raises :class:`SimDeadlock` if the loop runs out of work first.
        """
        return super().run_until_complete(future)

    def run_briefly(self) -> None:
        """Runs what is ready now without advancing the clock."""
        self.run_until(self._now)

    # --- what the simulation refuses -------------------------------------

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:  # type: ignore[override]
        raise ThreadsForbidden(
            f"run_in_executor({func!r}) in a simulated run: threads make seeds irreproducible; "
            "use the Env's run_io instead"
        )

    def set_default_executor(self, executor: Any) -> None:
        raise ThreadsForbidden("a simulated loop has no executor")

    def _write_to_self(self) -> None:
        # call_soon_threadsafe wakes the selector; the virtual one never sleeps.
        pass

    def _process_events(self, event_list: list[Any]) -> None:
        assert not event_list

    # --- errors ------------------------------------------------------------

    def _record_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def bury(self) -> None:
        """Disposes of a dead life's coroutines now, instead of at a random GC moment.

        A crashed life's loop is never driven again. Its suspended coroutines
        must not be finalized at an arbitrary later time (their ``finally``
        blocks would run in the middle of another seed), so the simulator
        keeps dead loops referenced and buries them at a quiet point: every
        pending task's coroutine is closed in task-creation order and its
        "destroyed but pending" warning is silenced.
        """
        tasks = [t for t in asyncio.all_tasks(self) if not t.done()]
        tasks.sort(key=_task_order)
        for task in tasks:
            task._log_destroy_pending = False  # type: ignore[attr-defined]
            coro = task.get_coro()
            if isinstance(coro, Coroutine):
                try:
                    coro.close()
                except KeyboardInterrupt:
                    raise  # the soak's time limit (or a user's ^C) arrived meanwhile: not the coroutine's
                except BaseException:
                    # A coroutine that refuses to close belongs to a dead life.
                    pass
        self._ready.clear()  # type: ignore[attr-defined]
        self._scheduled.clear()  # type: ignore[attr-defined]


def _task_order(task: asyncio.Task[Any]) -> tuple[int, str]:
    name = task.get_name()
    prefix, _, number = name.rpartition("-")
    if prefix == "Task" and number.isdigit():
        return (int(number), name)
    return (-1, name)


def run_within(loop: SimLoop, aw: Awaitable[Any], seconds: float) -> asyncio.Task[Any]:
    """Runs ``aw`` on ``loop`` until it is done or ``seconds`` of virtual time passed; its task."""
    async def run() -> Any:
        return await aw

    task = loop.create_task(run())
    task.add_done_callback(lambda _: loop.stop())
    deadline = loop.now + seconds
    while not task.done() and loop.now < deadline:
        loop.run_until(deadline)
    return task
