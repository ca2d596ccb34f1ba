"""Progress of the ``fusee`` command's long operations, on stderr.

Opening a big directory, listing every run of it, exporting and importing a
journal can take seconds. While they run, a ``rich`` progress bar (a spinner
when the total is unknown) is drawn on stderr; at the end one line says what
was done, with its counts and time. Shown on a terminal by default, never
when stderr is piped unless ``--progress`` asks (then rich prints the bar's
final state and the line, with no animation): stdout is left alone either way,
so ``--json`` output stays parseable.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

#: ``--progress`` / ``--no-progress`` (None: when stderr is a terminal), set by the command group.
wanted: bool | None = None


def enabled() -> bool:
    """Whether progress is shown (``--progress``, or stderr is a terminal)."""
    return sys.stderr.isatty() if wanted is None else wanted


def _console() -> Console:
    tty = sys.stderr.isatty()
    # Off a terminal, lines are not folded at 80 columns: a path stays whole on its line.
    return Console(file=sys.stderr, width=None if tty else 200, highlight=False, emoji=False, no_color=not tty,
                   soft_wrap=not tty)


@contextlib.contextmanager
def task(description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """Shows ``description`` with a bar to ``total`` (a spinner if None) while the block runs; yields
    ``advance(n)``. Nothing is shown, and ``advance`` costs nothing, when progress is off."""
    if not enabled():
        yield lambda n: None
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=_console(), transient=sys.stderr.isatty()) as bar:
        tid = bar.add_task(description, total=total)
        yield lambda n: bar.advance(tid, n)
        if total is not None:
            bar.update(tid, completed=max(total, bar.tasks[0].completed))


def done(message: str, began: float) -> None:
    """The line that ends a long operation: what it did and in how long (only when progress is on)."""
    if enabled():
        _console().print(f"{message} in {time.perf_counter() - began:.1f} s")
