"""The ``fusee`` command (``pip install 'fusee[cli]'``): list, inspect and act on runs.

``main`` is the console script. The commands live in :mod:`fusee.cli.commands`;
this module imports them only when run, so a missing extra is one clear line.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Runs the ``fusee`` command with ``argv`` (default: the process's arguments) and returns
    its exit code: 0, 1 for an error (one line on stderr, never a traceback), 2 for a usage
    mistake."""
    try:
        from fusee.cli.commands import main as run
    except ImportError as e:
        print(f"fusee: the command needs the cli extra ({e.name} is missing): "
              "pip install 'fusee[cli]'", file=sys.stderr)
        return 1
    return run(argv)


__all__ = ["main"]
