"""Smoke check of bench/http_api.py: it runs and reports sane figures (never timed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402


def test_http_bench_quick(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "http_api.py"), "--quick"], capture_output=True,
                          text=True, timeout=300, cwd=BENCH.parent,
                          env={**os.environ, "FUSEE_BENCH_TMP": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = common.parse_results(proc.stdout)
    assert [r["workload"] for r in results] == ["http_list_page", "http_describe", "http_journal",
                                                "http_signal"]
    for r in results:
        assert r["requests"] == 50 and r["requests_per_s"] > 0
        assert 0 < r["p50_us"] <= r["p99_us"]
    assert list(tmp_path.iterdir()) == []  # the scratch directory was removed
