"""Logging for a process that serves an engine: ``fusee serve --log-level``.

Fusee logs under the ``fusee`` logger and configures nothing by itself (a
library leaves that to the application). ``configure(level)`` is what ``fusee
serve`` does: one handler on stderr whose lines end with the record's
structured fields (``workflow_id=... workflow=... run_id=... step=...``, see
``fusee.runtime.telemetry.LOG_FIELDS``) when it has them.
"""

from __future__ import annotations

import logging
import sys

from fusee.runtime.telemetry import LOG_FIELDS

#: The levels ``fusee serve --log-level`` takes.
LEVELS = ("critical", "error", "warning", "info", "debug")


class Formatter(logging.Formatter):
    """``time LEVEL logger: message key=value ...``, the keys being the record's run fields."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={getattr(record, k)!r}" if isinstance(getattr(record, k), str) else f"{k}={getattr(record, k)}"
                  for k in LOG_FIELDS if hasattr(record, k)]
        return f"{line} {' '.join(fields)}" if fields else line


def configure(level: str = "info") -> logging.Handler:
    """Sends the ``fusee`` logger's records at ``level`` and above to stderr with their fields;
    returns the handler (a second call replaces the first one's). ValueError for another level."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    logger = logging.getLogger("fusee")
    for h in list(logger.handlers):
        if getattr(h, "_fusee_configured", False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Formatter())
    handler._fusee_configured = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    return handler
