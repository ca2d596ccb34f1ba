"""The CPU-per-step guard: fails when the hot path got more than 20% slower than the committed baseline.

Measured as ratios to a calibration loop run beside the workload (see
``bench/perf_smoke.py``); a failing measurement is taken again, twice at most,
keeping the lowest ratios, since a burst of load on a shared machine can slow
one measurement but rarely three.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import perf_smoke  # noqa: E402


def test_cpu_per_step_has_not_regressed() -> None:
    baseline = json.loads(perf_smoke.BASELINE.read_text())
    measured = perf_smoke.measure()
    problems = perf_smoke.regressions(measured, baseline)
    for _ in range(2):
        if not problems:
            break
        again = perf_smoke.measure()
        measured = {k: min(v, again[k]) for k, v in measured.items()}
        problems = perf_smoke.regressions(measured, baseline)
    assert not problems, f"{problems} (measured {measured}; baseline {baseline})"


def test_the_guard_catches_a_slower_hot_path() -> None:
    baseline = {"fanout_ratio": 2.0, "chain_ratio": 2.0}
    assert perf_smoke.regressions({"fanout_ratio": 2.3, "chain_ratio": 2.0}, baseline) == []
    assert len(perf_smoke.regressions({"fanout_ratio": 2.5, "chain_ratio": 2.6}, baseline)) == 2
