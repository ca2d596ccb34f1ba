"""How often CPython's cyclic garbage collector traverses the whole heap while engines are open.

An engine holds every loaded run's state (its journal machine, coroutine, context and
pending operations: about fifty container objects a run) for as long as the run lives,
and a run that ends is freed by reference counting alone: it leaves no cycles behind.
The interpreter's default ``gc`` thresholds ``(700, 10, 10)`` nevertheless traverse
every live object each time the long-lived heap has grown by a quarter and ten
middle-generation collections went by, which with 10,000 runs in flight is a 175 ms
stall of the event loop each time, a third of the engine's CPU on a fan-out. The young
generations, where short-lived cycles die, are left as they are; only the full
collection waits for 100 middle-generation collections instead of 10.

The thresholds are changed only while they are the interpreter's defaults, so an
application that chose its own keeps them; they are set back when the last engine
that changed them closes, unless the application changed them meanwhile.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from collections.abc import Callable

#: The interpreter's own threshold for full collections (CPython 3.11 to 3.13).
DEFAULT_FULL = 10
#: What an open engine makes it: one full traversal per 100 middle-generation collections.
TUNED_FULL = 100

_lock = threading.Lock()  # sync hosts open and close engines from their own threads
_holders = 0
_tuned: tuple[int, int, int] | None = None  # the thresholds this module set, while it holds them


def applies() -> bool:
    """Whether this interpreter's collector has the stall this module tames: CPython's
    generational collector before 3.14 (whose incremental collector has no full stalls)."""
    return sys.implementation.name == "cpython" and sys.version_info < (3, 14)


def hold(owner: object) -> Callable[[], None]:
    """Counts ``owner`` as one more open engine; the first raises the full-collection
    threshold if the application left it at the default. Returns the release: calling
    it (once or more) counts the owner out, and it runs by itself if the owner is
    garbage-collected without being closed, so a dropped engine does not keep the
    thresholds changed for the life of the process."""
    _hold()
    return weakref.finalize(owner, release)


def _hold() -> None:
    global _holders, _tuned
    with _lock:
        _holders += 1
        if _holders == 1 and applies():
            young, middle, full = gc.get_threshold()
            if full == DEFAULT_FULL:
                _tuned = (young, middle, TUNED_FULL)
                gc.set_threshold(*_tuned)


def release() -> None:
    """Counts one engine fewer; the last one sets back what :func:`hold` changed, if the
    thresholds are still what it set. Called through the release :func:`hold` returned."""
    global _holders, _tuned
    with _lock:
        assert _holders > 0, "collector.release() without a hold()"
        _holders -= 1
        if _holders == 0 and _tuned is not None:
            if gc.get_threshold() == _tuned:
                gc.set_threshold(_tuned[0], _tuned[1], DEFAULT_FULL)
            _tuned = None


def holders() -> int:
    """How many engines hold the collector's thresholds now (for tests and diagnostics)."""
    with _lock:
        return _holders
