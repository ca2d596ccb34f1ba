"""Step limits: permits for steps that share a scarce resource (an API, a pool of GPUs).

``Engine.open(..., limits=[fusee.Limit("payments", concurrency=5, per_second=20)])``
declares a limit; ``ctx.step(..., limit="payments", priority=0, fairness_key="tenant-a")``
makes each *execution* (attempt) of that step take a permit before its function
runs and give it back when the attempt's outcome is known.

Why permits live in memory and are not journaled: a permit guards an execution
of a step function, and executions live in the engine's process. A crash ends
every one of them, so after recovery no permit is held; the recovered runs
replay, their unfinished steps ask for permits again, and they ask first (while
the engine opens, before any caller can start new work). Every execution begins
only through :meth:`Limiter.acquire`, so the count of permits out is the count of
executions running, across any number of crashes. What is durable is the step
itself: it stays pending in its run's journal while it waits, so the wait
survives a crash as well as the step does.

Order: the highest ``priority`` waiting goes first; among waiters of one
priority, fairness keys take turns by weighted round robin (a key of weight
``w`` gets up to ``w`` permits in a row, then the next key's turn comes); one
key's waiters go in arrival order. The bound: from the moment a key has a
waiter until it gets a permit, and between two permits of a key that keeps
waiting, the other keys of that priority get at most the sum of their weights
(each at most one turn). ``per_second`` spaces grants with a token bucket of
``per_second`` tokens (a burst of at most that many, and room for at least one,
so a rate below one per second still grants).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fusee import sabotage
from fusee.errors import UnknownLimit

#: The fairness key of steps that give none.
DEFAULT_KEY = ""


@dataclasses.dataclass(frozen=True)
class Limit:
    """A named limit on the executions of the steps that name it.

    ``concurrency`` bounds the executions running at once, ``per_second``
    the executions begun per second (``None``: no bound of that kind).
    ``weights`` gives fairness keys their share (default 1 each).
    """

    name: str
    concurrency: int | None = None
    per_second: float | None = None
    weights: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a limit's name must be a non-empty string, got {self.name!r}")
        c = self.concurrency
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 1):
            raise ValueError(f"limit {self.name!r}: concurrency must be a positive int or None, got {c!r}")
        p = self.per_second
        if p is not None and (
            not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p) or p <= 0
        ):
            raise ValueError(f"limit {self.name!r}: per_second must be a positive number or None, got {p!r}")
        if not isinstance(self.weights, Mapping):
            raise TypeError(f"limit {self.name!r}: weights must be a dict of fairness key to int")
        for k, w in self.weights.items():
            if not isinstance(k, str) or not isinstance(w, int) or isinstance(w, bool) or w < 1:
                raise ValueError(
                    f"limit {self.name!r}: weights must map fairness keys (str) to positive ints, "
                    f"got {k!r}: {w!r}"
                )
        object.__setattr__(self, "weights", dict(self.weights))

    def weight(self, key: str) -> int:
        """The share of ``key`` (1 unless ``weights`` says otherwise)."""
        return self.weights.get(key, 1)


@dataclasses.dataclass(frozen=True)
class LimitStatus:
    """What :meth:`fusee.Engine.limits` reports for one limit."""

    name: str
    concurrency: int | None
    per_second: float | None
    #: Permits out: executions of its steps running now.
    in_use: int
    #: Step executions waiting for a permit.
    waiting: int


class LimitRequest:
    """A step's claim on a limit, fixed when the workflow code calls ``ctx.step``."""

    __slots__ = ("fairness_key", "name", "priority", "recovered")

    def __init__(self, name: str, priority: int, fairness_key: str, recovered: bool) -> None:
        self.name = name
        self.priority = priority
        self.fairness_key = fairness_key
        #: Issued while the engine was recovering (a step that may have run before the crash).
        self.recovered = recovered


#: Identifies a step across parking: (workflow ID, run ID, position).
Ident = tuple[str, int, int]


class _Waiter:
    __slots__ = ("alive", "fut", "holder", "ident", "key", "priority", "uncounted", "wake")

    def __init__(self, holder: object, ident: Ident, req: LimitRequest, fut: asyncio.Future[bool] | None,
                 alive: Callable[[], bool]) -> None:
        self.holder = holder
        self.ident = ident
        self.key = req.fairness_key
        self.priority = req.priority
        #: None while its run is parked: a grant then wakes the run (``wake``).
        self.fut = fut
        self.alive = alive
        self.wake: Callable[[Ident], None] | None = None
        self.uncounted = req.recovered and sabotage.active.limit_uncounted_after_recovery


class _Level:
    """The waiters of one priority: a ring of fairness keys, each with its queue."""

    __slots__ = ("credit", "ring", "size")

    def __init__(self) -> None:
        self.ring: OrderedDict[str, deque[_Waiter]] = OrderedDict()
        #: Permits the key at the head of the ring may still take in its turn.
        self.credit = 0
        self.size = 0

    def push(self, w: _Waiter, limit: Limit) -> None:
        q = self.ring.get(w.key)
        if q is None:
            q = self.ring[w.key] = deque()
            if len(self.ring) == 1:
                self.credit = limit.weight(w.key)
        q.append(w)
        self.size += 1

    def head(self) -> _Waiter:
        """The waiter the next permit of this priority goes to."""
        assert self.size > 0
        return next(iter(self.ring.values()))[0]

    def pop(self, limit: Limit, *, granted: bool = True) -> _Waiter:
        """Takes the head waiter; ``granted=False`` drops one that stopped waiting, which
        costs its key nothing (a cancelled waiter must not use up its key's turn)."""
        assert self.size > 0
        key, q = next(iter(self.ring.items()))
        w = q.popleft()
        self.size -= 1
        if granted:
            self.credit -= 1
        if not q:
            del self.ring[key]
            self._new_turn(limit)
        elif not granted:
            pass
        elif self.credit <= 0 or sabotage.active.limit_unfair:
            if not sabotage.active.limit_unfair:
                self.ring.move_to_end(key)
            self._new_turn(limit)
        return w

    def _new_turn(self, limit: Limit) -> None:
        self.credit = limit.weight(next(iter(self.ring))) if self.ring else 0


#: How far below a whole token a refill may land and still count as one (float rounding).
_TOKEN_EPSILON = 1e-9


class _Pool:
    """One limit's permits and waiters."""

    def __init__(self, limit: Limit, now: float) -> None:
        self.limit = limit
        self.in_use = 0
        self.holders: dict[object, bool] = {}
        self.levels: dict[int, _Level] = {}
        self.waiting = 0
        self.tokens = float(limit.per_second) if limit.per_second is not None else 0.0
        self.refilled = now
        self.timer: asyncio.TimerHandle | None = None


#: One grant, as a test or the simulator sees it: (limit, priority, fairness key,
#: {key: waiters} at that priority just before, the highest priority waiting).
Grant = tuple[str, int, str, dict[str, int], int]


class Limiter:
    """Every limit of one engine: hands out permits, takes them back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, now_s: Callable[[], float]) -> None:
        self._loop = loop
        self._now = now_s
        self._pools: dict[str, _Pool] = {}
        #: Steps issued now are recovered ones (set while the engine opens).
        self.recovering = False
        #: Every grant, when a test or the simulator asks (None: not kept).
        self.grants: list[Grant] | None = None
        #: Waiters by holder (a loaded run's step) and by ident (a parked run's step).
        self._waiting: dict[object, _Waiter] = {}
        self._parked: dict[Ident, _Waiter] = {}
        #: Permits granted to parked runs' steps, kept until the woken step claims them.
        self._reserved: dict[Ident, _Pool] = {}

    def configure(self, limits: Iterable[Limit]) -> None:
        """Declares the limits (at open)."""
        for lim in limits:
            if not isinstance(lim, Limit):
                raise TypeError(f"limits=[...] takes fusee.Limit values, got {lim!r}")
            if lim.name in self._pools:
                raise ValueError(f"two limits are named {lim.name!r}")
            self._pools[lim.name] = _Pool(lim, self._now())

    def request(self, name: object, priority: object, fairness_key: object) -> LimitRequest:
        """Checks a step's limit options (at ``ctx.step`` time) and makes its claim."""
        if not isinstance(name, str) or name not in self._pools:
            known = ", ".join(repr(n) for n in self._pools) or "none"
            raise UnknownLimit(
                f"ctx.step names the limit {name!r}, which this engine does not have (declared: {known}); "
                "declare it with Engine.open(..., limits=[fusee.Limit(name, ...)])",
                name=str(name),
            )
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"a step's priority must be an int, got {priority!r}")
        if fairness_key is None:
            fairness_key = DEFAULT_KEY
        if not isinstance(fairness_key, str):
            raise TypeError(f"a step's fairness_key must be a string or None, got {fairness_key!r}")
        return LimitRequest(name, priority, fairness_key, self.recovering)

    async def acquire(self, holder: object, ident: Ident, req: LimitRequest, alive: Callable[[], bool],
                      on_wait: Callable[[], None] | None = None) -> bool:
        """Waits for a permit of ``req``'s limit for ``holder``; False if it stopped being wanted
        (``alive()`` turned false: the run was cancelled or ended meanwhile).

        ``ident`` names the step across parking: a permit granted while its run was
        parked is claimed at once, and a wait begun before the run parked goes on
        from its place in the queue.
        """
        pool = self._pools[req.name]
        fut: asyncio.Future[bool] = self._loop.create_future()
        reserved = self._reserved.pop(ident, None)
        if reserved is not None:
            # Granted while its run was parked (the grant woke it): the permit is its own.
            reserved.holders[holder] = reserved.holders.pop(("parked", *ident))
            return True
        w = self._parked.pop(ident, None)
        if w is not None:
            # Its run was parked while it waited, and woke for another reason: same place in line.
            w.holder, w.fut, w.alive, w.wake = holder, fut, alive, None
            self._waiting[holder] = w
        else:
            w = _Waiter(holder, ident, req, fut, alive)
            self._waiting[holder] = w
            pool.levels.setdefault(req.priority, _Level()).push(w, pool.limit)
            pool.waiting += 1
            self._pump(pool)
        if on_wait is not None and not fut.done():
            on_wait()  # it waits: its run may now be parked
        try:
            return await fut
        except asyncio.CancelledError:
            # The engine closes: a permit granted meanwhile goes back.
            if fut.done() and not fut.cancelled() and fut.result():
                self.release(holder)
            raise

    def release(self, holder: object) -> None:
        """``holder``'s execution is over: its permit (if it has one) goes to the next waiter."""
        for pool in self._pools.values():
            if pool.holders.pop(holder, None) is not None:
                pool.in_use -= 1
                assert pool.in_use >= 0
                self._pump(pool)
                return

    def holds(self, holder: object) -> bool:
        return any(holder in p.holders for p in self._pools.values())

    def waits(self, holder: object) -> bool:
        """Whether ``holder`` waits for a permit (and holds nothing else meanwhile)."""
        w = self._waiting.get(holder)
        return w is not None and w.fut is not None and not w.fut.done()

    def park(self, holder: object, wake: Callable[[Ident], None]) -> None:
        """``holder``'s run is parked: its wait goes on without it; a grant calls ``wake(ident)``,
        and the permit waits for the woken step (:meth:`acquire` with the same ident)."""
        w = self._waiting.pop(holder)
        assert w.fut is not None
        fut, w.fut = w.fut, None
        w.holder, w.wake = ("parked", *w.ident), wake
        w.alive = _always
        self._parked[w.ident] = w
        fut.set_result(False)  # the loaded run's task waiting for it ends

    def drop_reservation(self, ident: Ident) -> None:
        """A permit granted to a parked run's step that no woken step claimed goes back."""
        pool = self._reserved.pop(ident, None)
        if pool is not None and pool.holders.pop(("parked", *ident), None) is not None:
            pool.in_use -= 1
            self._pump(pool)

    def _pump(self, pool: _Pool) -> None:
        lim = pool.limit
        while pool.waiting:
            if lim.concurrency is not None and pool.in_use >= lim.concurrency:
                return
            if lim.per_second is not None:
                now = self._now()
                # The bucket holds at least one token, or a rate below one per second never grants.
                room = max(1.0, float(lim.per_second))
                pool.tokens = min(room, pool.tokens + (now - pool.refilled) * lim.per_second)
                pool.refilled = now
                # A refill timer lands on the instant the token is due, where the float sum can
                # fall short of 1 by an ulp; waiting for that ulp would re-arm the timer forever.
                if pool.tokens < 1.0 - _TOKEN_EPSILON:
                    if pool.timer is None:
                        delay = (1.0 - pool.tokens) / lim.per_second
                        pool.timer = self._loop.call_later(delay, self._tick, pool)
                    return
            top = max(p for p, lv in pool.levels.items() if lv.size)
            level = pool.levels[top]
            snapshot = {k: len(q) for k, q in level.ring.items()} if self.grants is not None else {}
            head = level.head()
            gone = head.fut is not None and (head.fut.done() or not head.alive())
            w = level.pop(lim, granted=not gone)
            pool.waiting -= 1
            if not level.size:
                del pool.levels[top]
            if self._waiting.get(w.holder) is w:
                del self._waiting[w.holder]
            if w.fut is None:
                self._parked.pop(w.ident, None)
            elif gone:
                if not w.fut.done():
                    w.fut.set_result(False)
                continue
            if lim.per_second is not None:
                pool.tokens -= 1.0
            if not w.uncounted:
                pool.in_use += 1
                pool.holders[w.holder] = True
            if self.grants is not None:
                self.grants.append((lim.name, w.priority, w.key, snapshot, top))
            if w.fut is None:
                # A parked run's step: the permit is kept for it and its run is woken.
                assert w.wake is not None
                if not w.uncounted:
                    self._reserved[w.ident] = pool
                self._loop.call_soon(w.wake, w.ident)
            else:
                w.fut.set_result(True)

    def _tick(self, pool: _Pool) -> None:
        pool.timer = None
        self._pump(pool)

    def set_limit(self, name: str, concurrency: Any, per_second: Any, weights: Any) -> Limit:
        """Replaces a limit's bounds (what is not given stays); waiters get permits it now allows."""
        pool = self._pools.get(name)
        if pool is None:
            raise UnknownLimit(f"set_limit: no limit named {name!r}; declare it with Engine.open(..., "
                               "limits=[fusee.Limit(name, ...)])", name=name)
        old = pool.limit
        new = Limit(
            name,
            old.concurrency if concurrency is KEEP else concurrency,
            old.per_second if per_second is KEEP else per_second,
            old.weights if weights is KEEP else weights,
        )
        now = self._now()
        if old.per_second is not None:
            # Tokens earned at the old rate up to now are kept (up to the new bucket's room).
            pool.tokens += (now - pool.refilled) * old.per_second
            if new.per_second is not None:
                pool.tokens = min(max(1.0, float(new.per_second)), pool.tokens)
        pool.limit = new
        if new.per_second is None:
            pool.tokens = 0.0
        elif old.per_second is None:
            pool.tokens = float(new.per_second)
        pool.refilled = now
        if pool.timer is not None:
            pool.timer.cancel()
            pool.timer = None
        self._pump(pool)
        return new

    def status(self) -> dict[str, LimitStatus]:
        """Each limit's bounds, permits out and waiters."""
        return {
            n: LimitStatus(n, p.limit.concurrency, p.limit.per_second, p.in_use, p.waiting)
            for n, p in self._pools.items()
        }

    def close(self) -> None:
        for pool in self._pools.values():
            if pool.timer is not None:
                pool.timer.cancel()
                pool.timer = None


def _always() -> bool:
    return True


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


#: ``set_limit``'s default: leave that bound as it is.
KEEP: Any = _Keep()
