"""Where the log's flushes run, and how the event loop waits for one (``Engine.open(flush=...)``).

- ``inline``: a flush that nothing else could share (one chain of steps, an
  idle loop) runs on the loop's thread; others run on the log's thread. The
  fewest thread handoffs: best for a lone chain on a machine with few cores.
- ``pipeline``: every flush runs on the log's thread, handed over as soon as a
  run's delivery is appended, so the disk writes while the code runs on to
  its next gate; a lone chain that reaches its gate first waits for the flush
  by blocking the loop's thread briefly (spinning only while a core is spare).
- ``background``: every flush runs on the log's thread and the loop never
  blocks for one: best when many runs keep the loop busy.

The environment variable ``FUSEE_FLUSH`` overrides the argument, so an
operator can change the mode without touching code.
"""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusee.storage.log import FlushJob

INLINE = "inline"
PIPELINE = "pipeline"
BACKGROUND = "background"
MODES = (INLINE, PIPELINE, BACKGROUND)
#: The mode when neither the argument nor the environment says (chosen by ``bench/``: see docs/operations.md).
DEFAULT = INLINE
ENV_VAR = "FUSEE_FLUSH"

#: The longest the loop's thread spins for a flush before it sleeps on it (seconds).
SPIN_CAP_S = 60e-6


def resolve(requested: str | None) -> str:
    """The flush mode in force: ``FUSEE_FLUSH`` if set, else ``requested``, else ``DEFAULT``."""
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        mode = from_env.strip().lower()
        if mode not in MODES:
            raise ValueError(
                f"the environment variable {ENV_VAR}={from_env!r} names no flush mode: "
                f"use one of {', '.join(MODES)} (or unset it)"
            )
        return mode
    if requested is None:
        return DEFAULT
    if requested not in MODES:
        raise ValueError(f"flush must be one of {', '.join(repr(m) for m in MODES)}, got {requested!r}")
    return requested


@functools.cache
def spare_core() -> bool:
    """Whether this process may use more than one core (spinning on the only one starves the flush)."""
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) > 1


def wait_for_job(job: FlushJob, budget_s: float = SPIN_CAP_S) -> None:
    """Blocks the calling thread until ``job`` is done: spins briefly (GIL released) on a spare core, then sleeps on it."""
    if spare_core() and budget_s > 0:
        deadline = time.perf_counter() + budget_s
        while not job.done and time.perf_counter() < deadline:
            time.sleep(0)  # releases the GIL: the log's thread needs it to finish
    job.wait()
