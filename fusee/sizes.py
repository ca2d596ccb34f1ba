"""Sizes in bytes as users write them: an int of bytes, or a string such as "256MiB".

The rule is small on purpose: one number (an integer or a decimal) and one
unit, B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of
1024), spaces between them allowed, units case-sensitive ("mb" would be
millibits to some readers: refusing it is kinder than guessing).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from fusee.errors import InvalidSize

#: What a size may be written as.
Size = int | str

#: Bytes per unit.
UNITS: dict[str, int] = {
    "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]+)\s*", re.ASCII)
_FORMS = ('a positive int of bytes, or a number and a unit: B, KB, MB, GB, TB (powers of 1000) '
          'or KiB, MiB, GiB, TiB (powers of 1024), such as "256MiB" or "1.5GB"')


def _invalid(value: object, why: str, what: str) -> InvalidSize:
    return InvalidSize(f"invalid {what} {value!r}: {why}; accepted: {_FORMS}")


def to_bytes(size: object, what: str = "size") -> int:
    """Whole bytes (>= 1) in ``size``: an int, or a string of a number and a unit.

    A fractional byte count is rounded down ("1.5KiB" is 1536, "0.0001KB" is
    refused as under one byte). Raises :class:`fusee.errors.InvalidSize` (a
    ValueError) for zero, negative, malformed or unknown-unit values, and for
    types that are not sizes (bools and floats included: a float of bytes is
    almost always a unit mistake), with a message naming ``what`` and the
    accepted forms.
    """
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise _invalid(size, f"a {type(size).__name__} is not a size", what)
    if isinstance(size, int):
        if size < 1:
            raise _invalid(size, "it must be at least 1 byte", what)
        return size
    match = _SIZE.fullmatch(size)
    if match is None:
        raise _invalid(size, "write one number followed by one unit", what)
    number, unit = match.groups()
    scale = UNITS.get(unit)
    if scale is None:
        raise _invalid(size, f"unknown unit {unit!r} (units are case-sensitive)", what)
    n = math.floor(Fraction(number) * scale)
    if n < 1:
        raise _invalid(size, "it must be at least 1 byte", what)
    return n
