"""The perf guard's verdict logic (``make perf``). Nothing here times anything.

The guard itself measures CPU per step and is run by a person on a quiet
machine (``make perf``); CI machines are loaded, so ``make test`` never
passes or fails on a time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import perf_smoke  # noqa: E402


def test_the_guard_flags_only_ratios_past_the_tolerance() -> None:
    baseline = {"fanout_ratio": 2.0, "chain_ratio": 2.0}
    assert perf_smoke.regressions({"fanout_ratio": 2.3, "chain_ratio": 2.0}, baseline) == []
    found = perf_smoke.regressions({"fanout_ratio": 2.5, "chain_ratio": 2.6}, baseline)
    assert len(found) == 2 and "fanout_ratio" in found[0] and "chain_ratio" in found[1]


def test_the_guard_keeps_the_lowest_of_its_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    baseline = {"fanout_ratio": 2.0, "chain_ratio": 2.0}
    remeasured = iter([{"fanout_ratio": 2.1, "chain_ratio": 3.0}, {"fanout_ratio": 3.0, "chain_ratio": 2.2}])
    monkeypatch.setattr(perf_smoke, "measure", lambda: next(remeasured))
    measured, problems = perf_smoke.confirmed({"fanout_ratio": 2.9, "chain_ratio": 2.9}, baseline)
    assert measured == {"fanout_ratio": 2.1, "chain_ratio": 2.2} and problems == []
