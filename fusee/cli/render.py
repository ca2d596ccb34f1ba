"""How the ``fusee`` command shows runs: rich tables on a terminal, plain text elsewhere.

Colours and styles are written only to a terminal (rich's own detection, which
also honours ``NO_COLOR``). Piped output is plain, and as wide as its longest
line: nothing is cut or folded, so an error stays whole on its line for grep.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

_STATUS_STYLE = {
    "running": "cyan", "ok": "green", "failed": "red", "stuck": "bold red", "cancelled": "yellow",
    "terminated": "magenta", "timed_out": "red", "retrying": "yellow", "paused": "bold yellow",
    "waiting": "cyan", "fired": "green", "signal": "green", "received": "green",
}


#: The width of piped output: tables are only as wide as their content, up to this.
PIPED_WIDTH = 1 << 20


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    # Off a terminal: no colour, no markup codes, and no width to fold long lines at.
    return Console(file=stream, width=None if tty else PIPED_WIDTH, no_color=not tty, highlight=False,
                   emoji=False, soft_wrap=not tty)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _status(status: str | None) -> Text:
    status = status or ""
    return Text(status, style=_STATUS_STYLE.get(status, ""))


def _short(value: Any, width: int = 60) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _time(iso: str | None) -> str:
    """``2026-12-01T04:25:04.755Z`` as ``2026-12-01 04:25:04``."""
    if not iso:
        return ""
    return iso.replace("T", " ")[:19]


def runs_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("WORKFLOW ID", "TYPE", "STATUS", "STARTED", "ENDED", "ATTRIBUTES"):
        # IDs and attributes fold on a narrow terminal; statuses and times stay whole.
        table.add_column(col, overflow="fold", no_wrap=col in ("STATUS", "STARTED", "ENDED"))
    for s in items:
        attrs = " ".join(f"{k}={_short(v, 30)}" for k, v in s.get("attributes", {}).items())
        table.add_row(s["workflow_id"], s["workflow"], _status(s["status"]), _time(s.get("started_at")),
                      _time(s.get("ended_at")), attrs)
    return table


def summary_table(s: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, Any]] = [
        ("workflow id", s["workflow_id"]), ("type", s["workflow"]), ("status", _status(s["status"])),
        ("run", str(s["run_id"])), ("shard", str(s["shard"])),
        ("started", _time(s.get("started_at"))), ("ended", _time(s.get("ended_at")) or "-"),
    ]
    if s.get("attributes"):
        rows.append(("attributes", " ".join(f"{k}={_short(v, 40)}" for k, v in s["attributes"].items())))
    if s.get("stuck_reason"):
        rows.append(("stuck", s["stuck_reason"]))
    if s.get("attempt"):
        rows.append(("attempt", str(s["attempt"])))
    if s.get("last_error"):
        rows.append(("last error", s["last_error"]))
    if s.get("next_retry"):
        rows.append(("next retry", _time(s["next_retry"])))
    if s.get("paused_steps"):
        rows.append(("paused steps", ", ".join(s["paused_steps"])))
    for a in s.get("audit", []):
        rows.append(("asked", f"{a['action']} by {a['by']}" + (f" ({a['detail']})" if a.get("detail") else "")))
    for k, v in rows:
        grid.add_row(k, v)
    return grid


def _detail(e: dict[str, Any]) -> str:
    parts = []
    for key in ("error", "reason", "result", "value", "input", "workflow_id", "update_id"):
        if e.get(key) not in (None, ""):
            # Errors and reasons are messages, shown whole; payloads are cut (--json has them).
            text = e[key] if key in ("error", "reason") and isinstance(e[key], str) else _short(e[key])
            parts.append(f"{key}: {text}")
    if e.get("retry_at"):
        parts.append(f"retry at {_time(e['retry_at'])}")
    if e.get("by"):
        parts.append(f"by {e['by']}")
    return "; ".join(parts)


def _duration(ms: float | None) -> str:
    if ms is None:
        return ""
    if ms < 1:
        return f"{ms * 1000:.0f} µs"
    if ms < 1000:
        return f"{ms:.3g} ms"
    s = ms / 1000
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def timeline_table(timeline: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("#", "AT", "KIND", "NAME", "STATUS", "ATTEMPTS", "TOOK", "QUEUED", "DETAIL"):
        table.add_column(col, overflow="fold", no_wrap=col in ("#", "AT", "KIND", "STATUS", "TOOK", "QUEUED"))
    for i, e in enumerate(timeline):
        # AT: when it began (a step's first attempt, a sleep) or the one time journaled for it.
        table.add_row(str(i), _time(e.get("began_at") or e.get("at")), e["kind"], e.get("name", ""),
                      _status(e.get("status")), str(e["attempts"]) if e.get("attempts") else "",
                      _duration(e.get("duration_ms")), _duration(e.get("queued_ms")) if e.get("queued_ms") else "",
                      _detail(e))
        tries = e.get("attempt_times") or []
        if len(tries) > 1:
            # One row per attempt, as the waterfall draws one bar per attempt.
            for a in tries:
                table.add_row("", _time(a["began_at"]), "  attempt", str(a["attempt"]), _status(a["status"]), "",
                              _duration(a["duration_ms"]), _duration(a["queued_ms"]) if a["queued_ms"] else "",
                              f"error: {a['error']}" if a.get("error") else "")
    return table


def metrics_table(m: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for shard in m["shards"]:
        runs = " ".join(f"{k}={v}" for k, v in shard["runs"].items()) or "-"
        grid.add_row(f"shard {shard['shard']}", f"{runs}  (loaded {_figure(shard['loaded'])}, parked "
                                                 f"{_figure(shard['parked'])}, durable lsn {shard['durable_lsn']})")
    for key in ("steps_run", "steps_executing", "steps_gated", "timers_pending", "flushes", "records_flushed",
                "records_pending", "flush_p50_ms", "flush_p99_ms", "indexed"):
        grid.add_row(key.replace("_", " "), _figure(m[key]))
    if any(m.get(key, 0) is None for key in ("steps_run", "flushes")):
        grid.add_row("", "n/a: read offline; the running engine counts these (ask it with --url)")
    return grid


def _figure(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _every(s: dict[str, Any]) -> str:
    if s.get("cron"):
        return f"cron {s['cron']} ({s.get('timezone') or 'UTC'})"
    if s.get("every") is None:
        return ""
    return f"every {_duration(int(s['every'] * 1000))}"


def _count(value: Any) -> str:
    return "?" if value is None else str(value)


def schedules_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("SCHEDULE", "WORKFLOW", "SPEC", "OVERLAP", "PAUSED", "NEXT", "FIRED", "SKIPPED", "LAST RUN"):
        table.add_column(col, overflow="fold", no_wrap=col in ("PAUSED", "NEXT", "FIRED"))
    for s in items:
        paused = "?" if s.get("paused") is None else ("yes" if s["paused"] else "no")
        skips = [s.get(k) for k in ("skipped_overlap", "skipped_catchup", "skipped_paused")]
        skipped = "?" if None in skips else str(sum(int(k) for k in skips if k is not None))
        table.add_row(s["schedule_id"], s.get("workflow") or "", _every(s), s.get("overlap") or "",
                      Text(paused, style="bold yellow" if s.get("paused") else ""), _time(s.get("next_time")),
                      _count(s.get("fired")), skipped, s.get("last_run") or "")
    return table


def limits_table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("LIMIT", "CONCURRENCY", "PER SECOND", "IN USE", "WAITING"):
        table.add_column(col, overflow="fold", no_wrap=col != "LIMIT")
    for lim in items:
        table.add_row(lim["name"], "-" if lim["concurrency"] is None else str(lim["concurrency"]),
                      "-" if lim["per_second"] is None else f"{lim['per_second']:g}", str(lim["in_use"]),
                      str(lim["waiting"]))
    return table
