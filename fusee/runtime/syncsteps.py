"""Where a synchronous step function runs: on the loop's thread or in the step pool.

A thread-pool round trip costs 60-90 µs in CPython (a queue handoff, a thread
wake, the GIL twice and a wake of the loop's selector), more than a cheap
function itself and most of the time a chain of steps spends beside its
``fdatasync``. A blocking function on the loop's thread, though, stops every
run and every acknowledgement of the process while it blocks. So the engine
measures: each function (one per code object, so a lambda written in a loop
counts once) runs in the pool for its first probes, timed in its thread; one
whose probes all finished within ``PROMOTE_BELOW_S`` runs on the loop's
thread from then on, timed there too. An inline execution that takes longer
than ``DEMOTE_ABOVE_S`` is a strike: one strike is not proof, since a busy
machine deschedules the thread mid-call (more processes than cores do that
every few thousand calls) and a garbage collection may run inside the call,
so the function's next execution is probed in the pool, and it goes back
inline if that was quick. A second strike within ``STRIKE_MEMORY`` inline
executions, or a slow probe, sends it back to the pool. A blocking function
therefore stalls the loop at most twice, and a cheap one pays no thread hop
even on an oversubscribed machine. The pool is not forever either: a function a
slow probe kept there is probed again after ``REPROBE_AFTER`` pooled
executions, one demoted after ``REPROBE_AFTER`` times 2, 4, 8 or 16 (each
demotion doubles its wait, up to ``MAX_DOUBLINGS``), and probes run in the
pool, where blocking harms nobody.

``Engine.open(inline_sync_steps=True)`` runs every synchronous function on
the loop's thread (the caller vouches they are cheap); ``False`` runs every
one in the pool; ``None``, the default, measures as above. A function
declared ``@fusee.step(blocking=True)`` always runs in the pool, one declared
``blocking=False`` always inline (unless the engine says ``False``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from fusee import sabotage

logger = logging.getLogger("fusee")

#: Inline executions after a strike (a slow one) during which a second strike demotes at once.
STRIKE_MEMORY = 4096
#: Executions in the pool before a function may run inline.
PROBES = 3
#: A function whose probes each took less than this may run on the loop's thread.
PROMOTE_BELOW_S = 250e-6
#: An inline execution that took longer than this sends its function back to the pool for good.
DEMOTE_ABOVE_S = 2e-3
#: Pooled executions of a function that failed its probes before it is probed again.
REPROBE_AFTER = 256
#: A demotion doubles the pooled spell that follows, this many times at most: a cheap
#: function that a loaded machine made look slow (descheduled mid-call) comes back.
MAX_DOUBLINGS = 4
#: Functions remembered at most (a program that compiles code at run time must not grow this forever).
MAX_FUNCTIONS = 8192
#: A function's demotion is logged at INFO at most once per this many seconds (else at DEBUG).
LOG_EVERY_S = 600

# A function's state: probes left (> 0), INLINE (0), or pooled with executions
# left before it is probed again (< 0).
_INLINE = 0

#: Functions their authors declared (``@fusee.step(blocking=...)``): key -> blocking.
_declared: dict[Any, bool] = {}


def declare(fn: Callable[..., Any], blocking: bool) -> None:
    """Records that ``fn`` blocks (always pooled) or is cheap (always inline), skipping the trial."""
    try:
        _declared[function_key(fn)] = blocking
    except TypeError:
        pass


def function_key(fn: Callable[..., Any]) -> Any:
    """What identifies "the same function" across closures and partials made anew per step."""
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__  # a decorator's wrapper: every function it wraps shares its code
        else:
            break
    code = getattr(fn, "__code__", None)
    if code is not None:
        return code
    inner = getattr(fn, "__func__", None)  # a bound method
    if inner is not None:
        return getattr(inner, "__code__", inner)
    if hasattr(fn, "__name__"):
        return fn  # a builtin: lives as long as the program
    return type(fn)  # a callable object: its class decides what it does


class SyncStepPolicy:
    """Decides per function whether a synchronous step runs inline, and learns from how long it took.

    ``clock`` is the Env's monotonic clock in seconds (virtual in the simulator).
    """

    def __init__(self, mode: bool | None, clock: Callable[[], float]) -> None:
        self.mode = mode
        self.clock = clock
        self._state: dict[Any, int] = {}
        #: Demotions per function (each doubles the pooled spell that follows).
        self._demotions: dict[Any, int] = {}
        #: When a demotion of each function name was last logged at INFO (``clock`` seconds).
        self._logged: dict[str, float] = {}
        #: Functions with a strike: key -> inline executions left before it is forgotten.
        self._struck: dict[Any, int] = {}
        #: Functions whose next pooled execution decides a strike: key -> the slow inline seconds.
        self._confirming: dict[Any, float] = {}
        #: Functions sent back to the pool after blocking the loop (for stats and tests).
        self.demoted = 0
        #: Strikes a quick pooled probe then cleared (the machine, not the function, was slow).
        self.cleared = 0
        #: Executions run inline and in the pool.
        self.inline_runs = 0
        self.pool_runs = 0

    def runs_inline(self, fn: Callable[..., Any]) -> bool:
        """Whether this execution of ``fn`` runs on the loop's thread."""
        if self.mode is False:
            return False
        try:
            key = function_key(fn)
            declared = _declared.get(key) if _declared else None
            if declared is not None:
                return not declared
            if self.mode is True:
                return True
            return self._state.get(key, PROBES) == _INLINE
        except TypeError:  # an unhashable callable: never learned, always pooled
            return self.mode is True

    def needs_thread(self, fn: Callable[..., Any]) -> None:
        """``fn`` waited for the event loop from its thread (``engine.run_threadsafe``): pooled for good."""
        try:
            self._set(function_key(fn), -(1 << 62))
        except TypeError:
            pass
        self.demoted += 1

    def observe(self, fn: Callable[..., Any], seconds: float, inline: bool) -> None:
        """One execution of ``fn`` took ``seconds`` (inline: on the loop's thread)."""
        if self.mode is not None:
            return
        try:
            key = function_key(fn)
            state = self._state.get(key, PROBES)
        except TypeError:
            return
        if inline:
            self.inline_runs += 1
            struck = self._struck
            if seconds > DEMOTE_ABOVE_S and not sabotage.active.inline_never_demoted:
                if key in struck:
                    del struck[key]
                    self._demote(fn, key, seconds)
                    return
                if len(struck) >= MAX_FUNCTIONS or len(self._confirming) >= MAX_FUNCTIONS:
                    struck.clear()
                    self._confirming.clear()
                struck[key] = STRIKE_MEMORY
                self._confirming[key] = seconds
                self._set(key, 1)  # one probe in the pool decides
            elif struck:
                left = struck.get(key)
                if left is not None:
                    if left > 1:
                        struck[key] = left - 1
                    else:
                        del struck[key]
            return
        self.pool_runs += 1
        if self._confirming:
            blocked = self._confirming.pop(key, None)
            if blocked is not None:
                if seconds < PROMOTE_BELOW_S:
                    self.cleared += 1
                    self._set(key, _INLINE)
                else:
                    self._struck.pop(key, None)
                    self._demote(fn, key, blocked)
                return
        if state == _INLINE:
            return  # a pooled run of an inline function (one with a timeout, say)
        if state < 0:
            self._set(key, state + 1 if state < -1 else PROBES)  # time to probe it again
            return
        # Counting down to _INLINE (0) through fast probes; one slow probe keeps it pooled a while.
        self._set(key, state - 1 if seconds < PROMOTE_BELOW_S else -REPROBE_AFTER)

    def _demote(self, fn: Callable[..., Any], key: Any, seconds: float) -> None:
        """Sends ``fn`` back to the pool after it blocked the loop's thread for ``seconds``."""
        n = self._demotions.get(key, 0) + 1
        if len(self._demotions) < MAX_FUNCTIONS:
            self._demotions[key] = n
        self._set(key, -(REPROBE_AFTER << min(n, MAX_DOUBLINGS)))
        self.demoted += 1
        name = str(getattr(fn, "__qualname__", fn))
        now = self.clock()
        last = self._logged.get(name)
        # Once per function name per interval: a closure made anew by every run (a lambda)
        # is demoted again and again, and one line says it.
        quiet = last is not None and now - last < LOG_EVERY_S
        if not quiet:
            if len(self._logged) >= MAX_FUNCTIONS:
                self._logged.clear()
            self._logged[name] = now
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "step function %s blocked the event loop for %.1f ms: it runs in the step "
            "pool from now on (declare it @fusee.step(blocking=True) to skip the trials; "
            "said once per %d s per function)",
            name, seconds * 1000.0, LOG_EVERY_S)

    def _set(self, key: Any, state: int) -> None:
        if key not in self._state and len(self._state) >= MAX_FUNCTIONS:
            self._state.clear()  # forget and measure again rather than grow
        self._state[key] = state
