"""Smoke check of the flow benchmarks (schedules, enqueue): they run and report sane figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402


def test_flow_workloads_run_small(tmp_path: Path) -> None:
    env = {**os.environ, "FUSEE_BENCH_TMP": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "workloads_flow.py"), "all", "--schedules", "20",
         "--schedule-seconds", "2.5", "--keys", "10", "--events", "100"],
        capture_output=True, text=True, timeout=120, cwd=BENCH.parent, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    schedules, enqueue = common.parse_results(proc.stdout)
    assert schedules["workload"] == "schedules" and schedules["fired"] >= 20
    assert schedules["measured"] > 0 and 0 < schedules["lateness_p50_us"] <= schedules["lateness_p99_us"]
    assert enqueue["workload"] == "enqueue" and enqueue["events"] == 100
    assert enqueue["events_per_s"] > 0 and 1 <= enqueue["windows"] <= 100
    assert list(tmp_path.iterdir()) == []  # the scratch directories were removed
