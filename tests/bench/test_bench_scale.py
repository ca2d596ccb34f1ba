"""Smoke check of the scale-out benchmark: it runs and its section renders sane figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import run_all  # noqa: E402


def test_scale_workloads_quick(tmp_path: Path) -> None:
    env = {**os.environ, "FUSEE_BENCH_TMP": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "workloads_scale.py"), "all", "--quick", "--trials", "2"],
                          capture_output=True, text=True, timeout=300, cwd=BENCH.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failover, routing, fanout = common.parse_results(proc.stdout)
    assert failover["workload"] == "failover" and failover["n"] == 2 and failover["p50_us"] > 0
    assert routing["query_follower_p50_us"] > 0 and routing["follower_p50_us"] > 0
    assert all(fanout[f"steps_per_s_{n}"] > 0 for n in (1, 2, 4))
    assert list(tmp_path.iterdir()) == []  # data directories removed
    section = "\n".join(run_all.render_scale({"fusee": {"failover": failover, "routing": routing,
                                                         "scale_fanout": fanout}}))
    assert "## Scale-out (one directory)" in section and "4 processes" in section


def test_parts_benchmark_quick_renders_its_rows(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "parts_scale.py"), "--json", "--runs", "200",
                           "--trials", "1", "--procs", "1,2"],
                          capture_output=True, text=True, timeout=300, cwd=BENCH.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (fanout,) = common.parse_results(proc.stdout)
    assert fanout["workload"] == "parts_fanout" and fanout["ratio_1"] == 1.0
    assert all(fanout[f"steps_per_s_{n}"] > 0 for n in (1, 2))
    assert list(tmp_path.iterdir()) == []  # data directories removed
    section = "\n".join(run_all.render_parts({"fusee": {"parts_fanout": fanout}}))
    assert "## Parts (one directory, 4 parts)" in section and "| 2 |" in section
