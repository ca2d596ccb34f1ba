"""Retry policy: validation, backoff arithmetic, budgets and non-retryable errors."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusee.errors import Cancelled, InvalidDuration
from fusee.retry import DEFAULT, Retry


def test_defaults_and_derived_milliseconds() -> None:
    policy = Retry()
    assert policy == DEFAULT
    assert policy.attempts == 3 and policy.initial_ms == 100 and policy.max_interval_ms == 60_000
    assert Retry(initial=timedelta(seconds=2), max_interval=5).initial_ms == 2_000
    assert Retry.none().attempts == 1
    assert hash(Retry()) == hash(Retry())


def test_exponential_backoff_without_jitter() -> None:
    policy = Retry(initial="1s", backoff=3.0, max_interval="30s", jitter=0.0, attempts=None)
    assert [policy.delay_ms(n, 0.5) for n in range(1, 6)] == [1_000, 3_000, 9_000, 27_000, 30_000]
    assert policy.delay_ms(10_000, 0.0) == 30_000  # no overflow far past the cap


def test_jitter_spans_plus_minus_the_fraction() -> None:
    policy = Retry(initial="1s", jitter=0.2)
    assert policy.delay_ms(1, 0.0) == 800
    assert policy.delay_ms(1, 0.5) == 1_000
    assert 1_199 <= policy.delay_ms(1, 0.999_999) <= 1_200


def test_budget_and_error_kinds() -> None:
    policy = Retry(attempts=3, non_retryable=(PermissionError,))
    error = ValueError("flaky")
    assert policy.should_retry(1, error) and policy.should_retry(2, error)
    assert not policy.should_retry(3, error)
    assert policy.exhausted(3) and not policy.exhausted(2)
    assert not policy.should_retry(1, PermissionError("denied"))
    assert not policy.should_retry(1, Cancelled("cancelled"))
    assert not policy.should_retry(1, asyncio.CancelledError())
    assert not policy.should_retry(1, KeyboardInterrupt())
    assert not Retry.none().should_retry(1, error)
    unlimited = Retry(attempts=None)
    assert unlimited.should_retry(10**9, error) and not unlimited.exhausted(10**9)


def test_non_retryable_accepts_a_single_class_or_a_list() -> None:
    assert Retry(non_retryable=KeyError).non_retryable == (KeyError,)  # type: ignore[arg-type]
    assert Retry(non_retryable=[KeyError, OSError]).non_retryable == (KeyError, OSError)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"backoff": 0.5}, "backoff"),
        ({"backoff": float("inf")}, "backoff"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.5}, "jitter"),
        ({"initial": "2m", "max_interval": "1m"}, "must not be shorter"),
        ({"non_retryable": (ValueError, "oops")}, "exception classes"),
        ({"non_retryable": (int,)}, "exception classes"),
        ({"pause_when_exhausted": "yes"}, "True or False"),
    ],
)
def test_invalid_policies_are_refused_with_a_reason(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Retry(**kwargs)  # type: ignore[arg-type]


def test_invalid_durations_are_refused() -> None:
    with pytest.raises(InvalidDuration):
        Retry(initial="soon")


def test_delay_arguments_are_checked() -> None:
    policy = Retry()
    for attempt, rand in ((0, 0.5), (1, 1.0), (1, -0.1)):
        with pytest.raises(ValueError):
            policy.delay_ms(attempt, rand)
    with pytest.raises(ValueError):
        policy.should_retry(0, ValueError())


policies = st.builds(
    Retry,
    attempts=st.one_of(st.none(), st.integers(1, 50)),
    initial=st.integers(0, 10_000).map(lambda ms: f"{ms}ms"),
    backoff=st.floats(1.0, 10.0),
    max_interval=st.integers(10_000, 10**9).map(lambda ms: f"{ms}ms"),
    jitter=st.floats(0.0, 1.0),
)
rands = st.floats(0.0, 1.0, exclude_max=True)


@given(policies, st.integers(1, 10_000), rands)
def test_delay_is_bounded(policy: Retry, attempt: int, rand: float) -> None:
    delay = policy.delay_ms(attempt, rand)
    assert 0 <= delay <= policy.max_interval_ms * (1 + policy.jitter) + 1
    assert delay == policy.delay_ms(attempt, rand)  # a pure function of its arguments


@given(policies, st.integers(1, 200), rands)
def test_delay_without_jitter_is_monotone_until_the_cap(policy: Retry, attempt: int, rand: float) -> None:
    steady = Retry(initial=policy.initial, backoff=policy.backoff, max_interval=policy.max_interval, jitter=0.0)
    now, later = steady.delay_ms(attempt, rand), steady.delay_ms(attempt + 1, rand)
    assert now <= later <= steady.max_interval_ms
    if attempt == 1:
        assert now == steady.initial_ms


@given(policies, st.integers(1, 100))
def test_non_retryable_is_never_retried_and_budget_is_respected(policy: Retry, attempt: int) -> None:
    strict = Retry(attempts=policy.attempts, non_retryable=(LookupError,))
    assert not strict.should_retry(attempt, KeyError("k"))
    expected = policy.attempts is None or attempt < policy.attempts
    assert strict.should_retry(attempt, RuntimeError("r")) == expected
