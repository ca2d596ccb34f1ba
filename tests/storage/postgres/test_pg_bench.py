"""Smoke check of bench/workloads_pg.py on the test cluster: it runs and reports sane figures (never timed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import run_all  # noqa: E402


def test_workloads_pg_quick(pg_dsn: str) -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "workloads_pg.py"), "--url", pg_dsn,
                           "--quick", "--chain", "20", "--fanout", "20", "--fanout-steps", "3"],
                          capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    by_name = {r["workload"]: r for r in common.parse_results(proc.stdout)}
    assert set(by_name) == {"chain", "fanout"}
    chain, fanout = by_name["chain"], by_name["fanout"]
    assert chain["system"] == "fusee-postgres" and chain["steps"] == 20 and chain["n"] == 19
    assert fanout["workflows"] == 20 and fanout["steps_per_s"] > 0
    assert 0 < fanout["transactions"] <= 20 * 3 + 20  # group commit: at most one per record
    assert "synchronous_commit=on" in chain["durability"]
    report = run_all.render({"fusee-postgres": by_name}, {"cpu": "test"}, "quick",
                            {"fusee-postgres": chain["durability"]}, None)
    assert "Fusee (PostgreSQL)" in report and "synchronous_commit=on" in report


def test_scale_workloads_on_postgres_quick(pg_dsn: str) -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "workloads_scale.py"), "all", "--quick", "--trials", "1",
                           "--url", pg_dsn], capture_output=True, text=True, timeout=300, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failover, routing, fanout = common.parse_results(proc.stdout)
    assert {failover["system"], routing["system"], fanout["system"]} == {"fusee-postgres"}
    # A standby serves again only once the killed owner's lease (1 s) expired.
    assert failover["n"] == 1 and failover["p50_us"] > 0.5e6
    assert routing["query_follower_p50_us"] > 0 and all(fanout[f"chain_us_{n}"] > 0 for n in (1, 2, 4))
    section = "\n".join(run_all.render_scale({"fusee-postgres": {
        "failover": failover, "routing": routing, "scale_fanout": fanout}}))
    assert "## Scale-out (one PostgreSQL namespace)" in section and "lease_ttl=1.0 s" in section
