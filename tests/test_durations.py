"""Durations: every accepted form converts to milliseconds; everything else is refused clearly."""

from __future__ import annotations

import math
from datetime import timedelta
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusee.durations import MAX_MS, UNITS, format_ms, to_ms
from fusee.errors import FuseeError, InvalidDuration


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (0, 0),
        (5, 5_000),
        (2.5, 2_500),
        (0.1, 100),
        (0.0015, 2),  # half up
        (0.0004, 0),
        (timedelta(minutes=1, milliseconds=5), 60_005),
        (timedelta(microseconds=1500), 2),
        ("250ms", 250),
        ("5s", 5_000),
        ("1.5m", 90_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("90s", 90_000),
        ("0.3s", 300),
        (".5s", 500),
        ("1h 30m 15s", 5_415_000),
        (" 2H ", 7_200_000),
        ("1d2h3m4s5ms", 93_784_005),
        ("0.5ms", 1),
    ],
)
def test_accepted_forms(value: object, ms: int) -> None:
    assert to_ms(value) == ms  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (-1, "negative"),
        (-0.5, "negative"),
        (timedelta(seconds=-1), "negative"),
        (math.nan, "finite"),
        (math.inf, "finite"),
        (True, "bool"),
        ("", "empty"),
        ("   ", "empty"),
        ("5", "needs a unit"),
        ("1.5", "needs a unit"),
        ("5x", "cannot read"),
        ("-5s", "cannot read"),
        ("5 s 3", "needs a unit"),
        ("30m1h", "out of order"),
        ("5s5s", "repeated"),
        ("1.s", "cannot read"),
        (None, "NoneType"),
        ([1], "list"),
        (10**30, "too long"),
        (f"{10**20}d", "too long"),
    ],
)
def test_refused_forms_explain_what_is_accepted(value: object, why: str) -> None:
    with pytest.raises(InvalidDuration) as caught:
        to_ms(value)  # type: ignore[arg-type]
    message = str(caught.value)
    assert why in message
    assert '"1h30m"' in message and "timedelta" in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, FuseeError)


_units = list(UNITS.items())


@st.composite
def composed(draw: st.DrawFn) -> tuple[str, Fraction]:
    """A duration string of 1..5 parts in unit order, and its exact length in ms."""
    chosen = draw(st.lists(st.sampled_from(range(len(_units))), min_size=1, max_size=5, unique=True))
    text, total = [], Fraction(0)
    for index in sorted(chosen):
        unit, size = _units[index]
        whole = draw(st.integers(0, 10_000))
        decimals = draw(st.one_of(st.just(""), st.from_regex(r"\A[0-9]{1,3}\Z")))
        number = f"{whole}.{decimals}" if decimals else str(whole)
        spaces = draw(st.sampled_from(["", " "]))
        text.append(f"{spaces}{number}{unit}")
        total += Fraction(number) * size
    return "".join(text), total


@given(composed())
def test_composed_strings_sum_their_parts(case: tuple[str, Fraction]) -> None:
    text, exact = case
    ms = to_ms(text)
    assert abs(ms - exact) <= Fraction(1, 2)
    assert ms == math.floor(exact + Fraction(1, 2))


@given(st.integers(0, MAX_MS))
def test_format_round_trips(ms: int) -> None:
    text = format_ms(ms)
    assert to_ms(text) == ms
    if ms <= timedelta.max // timedelta(milliseconds=1):
        assert to_ms(timedelta(milliseconds=ms)) == ms


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_float_seconds_round_to_nearest_ms(seconds: float) -> None:
    assert abs(to_ms(seconds) - seconds * 1000) <= 0.5 + 1e-6


def test_format_refuses_non_durations() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidDuration):
            format_ms(bad)  # type: ignore[arg-type]
