"""Smoke check of the keyed objects and step limits benchmark: it runs and reports sane figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import run_all  # noqa: E402


def test_keyed_workloads_quick(tmp_path: Path) -> None:
    env = {**os.environ, "FUSEE_BENCH_TMP": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "workloads_keyed.py"), "all", "--quick",
                           "--calls", "100", "--waiting", "200"],
                          capture_output=True, text=True, timeout=120, cwd=BENCH.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    objects, limits = common.parse_results(proc.stdout)
    assert objects["workload"] == "objects" and objects["calls"] == 100
    assert objects["exclusive_calls_per_s"] > 0 and objects["shared_calls_per_s"] > 0
    assert objects["exclusive_p50_us"] <= objects["exclusive_p99_us"]
    assert limits["workload"] == "limits" and limits["waiting"] == 200
    assert limits["permits_per_s"] > 0 and limits["bytes_per_waiting_step"] >= 0
    assert list(tmp_path.iterdir()) == []  # data directories removed
    rows = {(w, k) for w, k, *_ in run_all.ROWS}
    assert ("objects", "exclusive_calls_per_s") in rows and ("limits", "permits_per_s") in rows
    assert run_all.KEYED_WORKLOADS == ["objects", "limits"]
