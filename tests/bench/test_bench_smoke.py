"""Smoke checks of the benchmark scripts: they run and report sane figures.

Never timed tests: only the shape and internal consistency of results are
checked. The DBOS and Restate sides need network and their own environments,
so they are not run here (``make bench`` runs them); the report is checked with
their results made up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fusee import diskcheck

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import run_all  # noqa: E402


def _run(*args: str, scratch: Path, timeout: float = 120) -> list[dict[str, Any]]:
    env = {**os.environ, "FUSEE_BENCH_TMP": str(scratch)}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=BENCH.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return common.parse_results(proc.stdout)


def test_percentile_interpolates_between_samples() -> None:
    for percentile in (common.percentile,
                       lambda v, f: diskcheck.percentile(sorted(v), f)):
        assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
        assert percentile([1.0, 2.0, 3.0, 4.0], 0.0) == 1.0
        assert percentile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0
        assert percentile([7.0], 0.99) == 7.0
        assert percentile(list(range(101)), 0.99) == pytest.approx(99.0)


def test_measure_floor_times_each_write_and_cleans_up(tmp_path: Path) -> None:
    result = diskcheck.measure_floor(tmp_path, count=30, record_size=64, warmup=2)
    assert result.count == 30 and result.record_size == 64
    assert all(x > 0 for x in result.latencies)
    assert 0 < result.p50 <= result.p99 <= max(result.latencies)
    # The sequential rate cannot exceed what the summed latencies allow.
    assert result.ops_per_second <= result.count / sum(result.latencies) * 1.0001
    assert list(tmp_path.iterdir()) == []
    assert "p50" in result.summary() and "ops/s" in result.summary()


def test_diskcheck_module_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "fusee.diskcheck", str(tmp_path),
                           "--count", "20"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "fdatasync" in proc.stdout and "p99" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "fusee.diskcheck", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "not a directory" in bad.stderr


def test_floor_script_quick(tmp_path: Path) -> None:
    (result,) = _run(str(BENCH / "floor.py"), "--quick", "--json", "--count", "40",
                     scratch=tmp_path)
    assert result["workload"] == "floor" and result["count"] == 40
    assert list(tmp_path.iterdir()) == []  # measured in the scratch dir, then removed
    samples = result["samples_us"]
    assert isinstance(samples, list) and len(samples) == 40
    assert result["p50_us"] == pytest.approx(common.percentile(samples, 0.5))
    assert result["p99_us"] == pytest.approx(common.percentile(samples, 0.99))


def _fake_results(fusee_steps_per_s: float) -> dict[str, dict[str, dict[str, object]]]:
    return {
        "floor": {"floor": {"p50_us": 100.0, "p99_us": 150.0, "ops_per_s": 10_000.0}},
        "fusee": {
            "chain": {"us_per_step": 120.0, "p50_us": 110.0, "p99_us": 300.0},
            "fanout": {"steps_per_s": fusee_steps_per_s},
            "start": {"p50_us": 250.0, "count": 500},
            "scale": {"rss_bytes_per_run": 900.0, "reopen_s": 3.0, "count": 1000},
            "recovery": {"error": "exit 1: boom"},
        },
        "dbos-sqlite": {"chain": {"us_per_step": 2400.0}, "fanout": {"steps_per_s": 250.0},
                        "start": {"p50_us": 5000.0, "count": 50}},
    }


def test_report_ratios_and_targets_read_the_right_way() -> None:
    report = run_all.render(_fake_results(30_000.0), {"cpu": "test"}, "quick",
                            {"dbos-sqlite": "synchronous=FULL"}, None)
    # Latency: 120 µs vs 2,400 µs is a ratio of 0.05, i.e. 20 times better.
    assert "| chain: time per step | 120 µs | 2,400 µs | 0.05 (20× better) |" in report
    assert "| fan-out: durable steps/s | 30,000 | 250 | 120 (120× better) |" in report
    assert run_all._ratio(400.0, 100.0, higher_is_better=False) == "4 (4× worse)"
    assert "| chain: time per step ÷ floor p50 | 1.20 | 24.0 |" in report
    # Different sizes on the two sides are flagged, never silently compared.
    assert "| start latency p50 | 250 µs | 5,000 µs | 0.05 (20× better) † |" in report
    assert "† the two systems ran this workload at different sizes" in report
    verdicts = {what: ok for what, _, ok in run_all.targets(_fake_results(30_000.0))}
    assert verdicts["chain: µs/step ≤ 1.3 × floor p50"] is True
    assert verdicts["chain: p99 ≤ 2 × p50"] is False
    assert verdicts["fan-out: ≥ 20,000 durable steps/s"] is True
    assert verdicts["fan-out: ≥ 10 × DBOS on SQLite"] is True
    assert verdicts["start latency p50 ≤ 3 × floor p50"] is True
    assert verdicts["parked run ≤ 1 KiB RSS"] is True
    # Too few runs to judge the 1,000,000-run reopen target.
    assert verdicts["reopen after clean close of 1,000,000 runs ≤ 5 s"] is None
    assert "fusee / recovery: exit 1: boom" in report
    slow = {what: ok for what, _, ok in run_all.targets(_fake_results(2_000.0))}
    assert slow["fan-out: ≥ 10 × DBOS on SQLite"] is False


def test_report_shows_restate_beside_dbos_with_each_ratio_to_the_floor() -> None:
    results = _fake_results(30_000.0)
    results["restate"] = {
        "chain": {"us_per_step": 130.0, "p50_us": 125.0, "p99_us": 400.0},
        "fanout": {"steps_per_s": 1_500.0, "cpu_s_per_1000_steps": 0.4,
                   "server_cpu_s_per_1000_steps": 0.5},
        "start": {"p50_us": 1_000.0, "count": 500},
    }
    report = run_all.render(results, {"cpu": "test"}, "quick",
                            {"dbos-sqlite": "synchronous=FULL",
                             "restate": "log-server WAL fdatasynced"}, None)
    assert ("| measure | fusee | DBOS (SQLite) | Restate | fusee / DBOS (SQLite) "
            "| fusee / Restate |") in report
    assert "- **Restate durability**: log-server WAL fdatasynced" in report
    # 120 µs vs 130 µs: 0.923, i.e. 1.08 times better.
    assert ("| chain: time per step | 120 µs | 2,400 µs | 130 µs | 0.05 (20× better) "
            "| 0.923 (1.08× better) |") in report
    # Each system's own ratio to the same run's floor (p50 100 µs).
    assert "| chain: time per step ÷ floor p50 | 1.20 | 24.0 | 1.30 |" in report
    assert "| start latency p50 ÷ floor p50 | 2.50 | 50.0 | 10.0 |" in report
    assert ("| fan-out: durable steps/s | 30,000 | 250 | 1,500 | 120 (120× better) "
            "| 20 (20× better) |") in report
    # Restate's engine runs in its server: that CPU has a row of its own, with no
    # counterpart in the other columns.
    assert ("| fan-out: server process CPU s per 1,000 steps | – | – | 0.500 s | – | – |"
            in report)
    # Fusee ran the start workload at 500 like Restate, DBOS at 50: only DBOS's ratio
    # is marked as taken between different sizes.
    assert "| 0.05 (20× better) † | 0.25 (4× better) |" in report
    without = run_all.render(_fake_results(30_000.0), {"cpu": "test"}, "quick", {}, None)
    assert "Restate" not in without and "server process CPU" not in without


def test_restate_is_skipped_with_a_message_when_npm_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run_all, "RESTATE_DIR", tmp_path / "restate")
    monkeypatch.setattr(run_all.shutil, "which", lambda name: None)
    assert run_all.ensure_restate() is False
    assert "npm not found; skipping Restate" in capsys.readouterr().err
    assert not (tmp_path / "restate").exists()  # nothing installed, nothing half-made


def test_environment_names_the_disk_and_python(tmp_path: Path) -> None:
    env = common.environment(tmp_path)
    assert env["python"].endswith(".".join(map(str, sys.version_info[:3])))
    assert "mounted at" in env["disk"] and env["cpu"]


def _engine_available() -> bool:
    import fusee

    return all(hasattr(fusee, name) for name in ("Engine", "workflow", "signal", "Ctx"))


@pytest.mark.skipif(not _engine_available(), reason="the engine's public API is not there yet")
def test_fusee_workloads_quick(tmp_path: Path) -> None:
    results = _run(str(BENCH / "workloads_fusee.py"), "all", "--quick", "--chain", "30",
                   "--fanout", "20", "--starts", "10", "--signals", "10", "--timers", "5",
                   "--due", "10", "--scale", "200", "--recovery-runs", "30", "--park-wait", "0",
                   "--list-runs", "10100", "--list-repeats", "5", "--chunks", "200",
                       "--wakes", "20", "--soak-s", "1",
                   scratch=tmp_path, timeout=240)
    by_name = {r["workload"]: r for r in results}
    assert set(by_name) == {"chain", "fanout", "start", "signals", "timers", "due", "scale",
                            "recovery", "list", "stream", "users", "wakes", "soak", "codec"}
    assert by_name["due"]["count"] == 10 and by_name["due"]["all_started_before_due"] is True
    assert by_name["wakes"]["count"] == 20 and by_name["wakes"]["parked_before"] == 20
    assert by_name["soak"]["rounds"] >= 1
    users = by_name["users"]
    assert users["steps"] == 30 and users["n"] == 29 and users["fanout_workflows"] == 20
    assert users["sync_inline"] + users["sync_pooled"] == 30 + 20 * 10
    assert by_name["stream"]["count"] == 200 and by_name["stream"]["n"] == 200
    assert by_name["codec"]["steps"] == 30 and by_name["codec"]["us_per_step_aesgcm"] > 0
    assert by_name["chain"]["steps"] == 30 and by_name["chain"]["n"] == 29
    assert by_name["fanout"]["workflows"] == 20
    assert by_name["start"]["n"] == 10 and by_name["signals"]["n"] == 10
    assert by_name["timers"]["n"] == 5
    assert by_name["scale"]["count"] == 200
    # One customer in 10,000: c-42 is run 42 and 10,042.
    assert by_name["list"]["count"] == 10100 and by_name["list"]["matched"] == 2
    assert by_name["list"]["list_n"] == 5 and by_name["list"]["list_p99_us"] > 0
    assert by_name["recovery"]["records"] >= 30 * 4  # a start and four steps each, at least
    for key in ("no_checkpoint_reopen_s", "with_checkpoint_reopen_s"):
        assert isinstance(by_name["recovery"][key], float)
    # Every workload removed its data directories.
    assert list(tmp_path.iterdir()) == []


def test_telemetry_cost_script_quick(tmp_path: Path) -> None:
    (result,) = _run(str(BENCH / "telemetry_cost.py"), "--quick", "--rounds", "1", "--json", scratch=tmp_path)
    assert result["workload"] == "telemetry" and result["steps"] == 2000
    for mode in ("off", "on"):
        assert result[f"{mode}_cpu_us_per_step"] > 0
    assert result["on_vs_off"] == pytest.approx(result["on_cpu_us_per_step"] / result["off_cpu_us_per_step"])
    if "baseline_cpu_us_per_step" in result:  # a checkout with git history
        assert result["off_vs_baseline"] == pytest.approx(
            result["off_cpu_us_per_step"] / result["baseline_cpu_us_per_step"])
    assert list(tmp_path.iterdir()) == []
    verdicts = {what: ok for what, _, ok in run_all.targets({"fusee": {"telemetry": {"off_vs_baseline": 1.01}}})}
    assert verdicts["telemetry off: CPU per step ≤ 1.02 × the code before its hooks"] is True


def test_concurrent_chains_script_quick(tmp_path: Path) -> None:
    (result,) = _run(str(BENCH / "concurrent_chains.py"), "--steps", "20", "--chains", "1,4",
                     "--rounds", "1", scratch=tmp_path)
    assert result["workload"] == "concurrent_chains" and result["floor_p50_us"] > 0
    assert [r["chains"] for r in result["rows"]] == [1, 4]
    for r in result["rows"]:
        assert 0 < r["step_p50_us"] <= r["step_p99_us"] and r["steps_per_s"] > 0
        assert r["flushes"] > 0 and r["records_per_flush"] > 0
    assert list(tmp_path.iterdir()) == []  # the data directories were removed
    section = "\n".join(run_all.render_concurrent_chains({"fusee": {"concurrent_chains": result}}))
    assert "## N concurrent chains in one engine" in section and "| 4 |" in section


def test_sync_hosts_script_quick(tmp_path: Path) -> None:
    (result,) = _run(str(BENCH / "sync_hosts.py"), "--quick", "--threads", "1,4", scratch=tmp_path)
    assert result["workload"] == "sync_hosts"
    assert [r["callers"] for r in result["rows"]] == [1, 4]
    for r in result["rows"]:
        assert 0 < r["async_p50_us"] <= r["async_p99_us"] and 0 < r["sync_p50_us"] <= r["sync_p99_us"]
        assert r["p50_ratio"] == r["sync_p50_us"] / r["async_p50_us"]
    assert list(tmp_path.iterdir()) == []  # the data directories were removed
    section = "\n".join(run_all.render_sync_hosts({"fusee": {"sync_hosts": result}}))
    assert "## Start + result from a synchronous thread" in section and "| 4 |" in section
