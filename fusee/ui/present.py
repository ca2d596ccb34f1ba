"""How journal values look on a page: payloads, errors, times and durations as short text."""

from __future__ import annotations

import datetime
import json
from typing import Any

import msgspec

from fusee import codec
from fusee.errors import FuseeError

#: Longest payload text shown inline (the full text is in the journal's detail).
SHORT = 160


def value_of(data: bytes) -> Any:
    """The JSON value journaled in ``data`` (the text itself when it is not JSON)."""
    if not data:
        return None
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return data.decode("utf-8", "replace")


def payload_text(data: bytes, limit: int | None = SHORT) -> str:
    """A journaled payload as compact JSON text, cut at ``limit`` characters."""
    if not data:
        return ""
    value = value_of(data)
    text = value if isinstance(value, str) and not data.startswith(b'"') else json.dumps(
        value, ensure_ascii=False, separators=(", ", ": "))
    return clip(text, limit)


def payload_json(data: bytes) -> str:
    """A journaled payload as indented JSON a form can take back (empty for none)."""
    if not data:
        return ""
    return json.dumps(value_of(data), ensure_ascii=False, indent=2)


def error_text(data: bytes, limit: int | None = SHORT) -> str:
    """A journaled error as ``Type: message`` (a payload that is not an error shows as text)."""
    try:
        return clip(codec.decode_error(data).summary, limit)
    except FuseeError:
        return payload_text(data, limit)


def traceback_of(data: bytes) -> str | None:
    """The traceback text a journaled error kept, if any."""
    try:
        return codec.decode_error(data).traceback
    except FuseeError:
        return None


def clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def when(ms: int | None) -> str:
    """UTC milliseconds as ``2026-12-01 04:19:45.123`` (empty for None)."""
    if ms is None:
        return ""
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def when_dt(t: datetime.datetime | None) -> str:
    """A time of a summary as ``when`` shows it."""
    return "" if t is None else when(int(t.timestamp() * 1000))


def duration(ms: float | None) -> str:
    """A duration in the unit that reads best: ``850 ms``, ``12.4 s``, ``3 min 5 s``, ``2 h 10 min``."""
    if ms is None:
        return ""
    if ms < 1:
        return f"{ms * 1000:.0f} µs"
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def attributes_text(attrs: dict[str, Any]) -> str:
    """Search attributes as ``key=value`` pairs."""
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in attrs.items())


def type_name(tp: Any) -> str:
    """A type as a person reads it: ``str``, ``dict[str, int]``, ``Order``."""
    if isinstance(tp, type) and not getattr(tp, "__args__", None):
        return tp.__name__
    return str(tp).replace("typing.", "")
