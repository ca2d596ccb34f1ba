"""Durations as users write them, converted to whole milliseconds.

A duration is seconds as an ``int`` or ``float``, a ``datetime.timedelta``, or
a string of ``<number><unit>`` parts ("250ms", "5s", "1.5m", "2h", "1d",
"1h30m"). Everything in the engine counts milliseconds as ``int``.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from fractions import Fraction

from fusee.errors import InvalidDuration

#: What a duration may be written as.
Duration = float | int | timedelta | str

#: Milliseconds per unit, largest first (the order parts must follow).
UNITS: dict[str, int] = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}

#: The largest duration accepted (fits a signed 64-bit millisecond count).
MAX_MS = 2**63 - 1

_PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|d|h|m|s)", re.ASCII)
_FORMS = (
    'seconds as an int or float (2.5), a datetime.timedelta, or a string of number+unit parts '
    'with units d, h, m, s, ms from largest to smallest ("250ms", "5s", "1.5m", "2h", "1d", "1h30m")'
)


def _invalid(value: object, why: str) -> InvalidDuration:
    return InvalidDuration(f"invalid duration {value!r}: {why}; accepted: {_FORMS}")


def _round_ms(ms: Fraction | float, original: object) -> int:
    """Rounds half up to whole milliseconds, refusing values past MAX_MS."""
    if ms > MAX_MS:
        raise _invalid(original, "too long")
    return math.floor(ms + Fraction(1, 2)) if isinstance(ms, Fraction) else math.floor(ms + 0.5)


def parse(text: str) -> int:
    """Milliseconds in a duration string such as "1h30m" (rounded half up).

    Units run from largest to smallest, each at most once; spaces between
    parts are allowed; a number alone (no unit) is refused as ambiguous.
    """
    body = text.strip().lower()
    if not body:
        raise _invalid(text, "empty string")
    total = Fraction(0)
    position = 0
    last_rank = -1
    ranks = list(UNITS)
    while position < len(body):
        match = _PART.match(body, position)
        if match is None:
            rest = body[position:]
            why = "a number needs a unit" if re.fullmatch(r"[\d.\s]+", rest) else f"cannot read {rest!r}"
            raise _invalid(text, why)
        number, unit = match.groups()
        rank = ranks.index(unit)
        if rank <= last_rank:
            raise _invalid(text, f"unit {unit!r} repeated or out of order (largest first, each once)")
        last_rank = rank
        total += Fraction(number) * UNITS[unit]
        position = match.end()
    return _round_ms(total, text)


def to_ms(d: Duration) -> int:
    """Whole milliseconds (>= 0) in ``d``: seconds, a timedelta or a duration string.

    Rounds half up to the millisecond. Raises :class:`fusee.errors.InvalidDuration`
    (a ValueError) for negative, NaN, infinite, too long or malformed values,
    and for types that are not durations (bools included), with a message
    listing the accepted forms.
    """
    if isinstance(d, bool):
        raise _invalid(d, "a bool is not a duration")
    if isinstance(d, int):
        if d < 0:
            raise _invalid(d, "negative")
        return _round_ms(d * 1000, d)
    if isinstance(d, float):
        if math.isnan(d) or math.isinf(d):
            raise _invalid(d, "not a finite number")
        if d < 0:
            raise _invalid(d, "negative")
        return _round_ms(d * 1000, d)
    if isinstance(d, timedelta):
        if d < timedelta(0):
            raise _invalid(d, "negative")
        micros = (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
        return _round_ms(Fraction(micros, 1000), d)
    if isinstance(d, str):
        ms = _parsed.get(d)
        if ms is None:
            ms = parse(d)
            if len(_parsed) < 1024:
                _parsed[d] = ms
        return ms
    raise _invalid(d, f"a {type(d).__name__} is not a duration")


#: Duration strings seen so far: workflow code names the same few again and again.
_parsed: dict[str, int] = {}


def format_ms(ms: int) -> str:
    """The canonical string for a millisecond count: largest units first ("1h30m", "250ms", "0s").

    ``to_ms(format_ms(n)) == n`` for every valid ``n``.
    """
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
        raise _invalid(ms, "format_ms takes a non-negative int of milliseconds")
    if ms == 0:
        return "0s"
    parts = []
    rest = ms
    for unit, size in UNITS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
