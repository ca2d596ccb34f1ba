"""What ``Engine.open(tune_gc=...)`` buys: the workloads with the collector tuned and left alone.

    .venv/bin/python bench/gc_thresholds.py [--rounds 3] [--quick]

Each workload of ``workloads_fusee.py`` (fan-outs of 2,000 and 10,000 workflows
× 10 steps, 10,000 sleepers, 10,000 signalled waiters) runs in a fresh process
with ``tune_gc=False`` (the interpreter's thresholds) and ``tune_gc=True`` (the
default), alternating, ``--rounds`` times each. For each it prints the median
over rounds of the throughput, CPU per 1,000 steps (or per workflow), the
latency p50 and p99, the seconds spent in garbage collection, the number of
whole-heap collections, and the longest single collection (a stall of the
event loop), and the median ratio of the pairs (tuned over untuned, each pair
measured back to back).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

HERE = Path(__file__).resolve().parent

#: name, workload arguments, the throughput key and its unit.
WORKLOADS = [
    ("fan-out 2,000 × 10", ["fanout", "--fanout", "2000"], "steps_per_s", "steps/s"),
    ("fan-out 10,000 × 10", ["fanout", "--fanout", "10000"], "steps_per_s", "steps/s"),
    ("10,000 sleepers", ["timers", "--timers", "10000"], None, ""),
    ("10,000 signalled", ["signals", "--signals", "10000"], None, ""),
]
QUICK = [
    ("fan-out 200 × 10", ["fanout", "--fanout", "200"], "steps_per_s", "steps/s"),
    ("500 sleepers", ["timers", "--timers", "500"], None, ""),
]


def run_once(argv: list[str], tune: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "workloads_fusee.py"), *argv, "--engine-opt", f"tune_gc={tune}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    results = common.parse_results(p.stdout)
    if p.returncode != 0 or not results:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return results[-1]


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args(argv)
    env = common.environment()
    print("; ".join(f"{k}: {v}" for k, v in env.items()))
    report: dict[str, Any] = {"environment": env, "rounds": args.rounds, "workloads": []}
    header = (f"{'workload':22} {'tune_gc':7} {'rate':>14} {'CPU ms/1k':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'gc s':>6} {'full':>4} {'max pause ms':>12}")
    print(header)
    for name, wargs, rate_key, unit in QUICK if args.quick else WORKLOADS:
        rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for tune in (False, True):
                rows[tune].append(run_once(wargs, tune))
        for tune in (False, True):
            rs = rows[tune]
            units = [r.get("workflows", 1) * r.get("steps_per_workflow", 1) if rate_key else r["count"]
                     for r in rs]
            cpu_per_k = statistics.median(r["cpu_s"] / u * 1000 for r, u in zip(rs, units, strict=True))
            rate = f"{median(rs, rate_key):,.0f} {unit}" if rate_key else f"{median(rs, 'wall_s'):.2f} s wall"
            print(f"{name:22} {tune!s:7} {rate:>14} {cpu_per_k * 1e3:9.1f} {median(rs, 'p50_us') / 1e3:8.1f} "
                  f"{median(rs, 'p99_us') / 1e3:8.1f} {median(rs, 'gc_s'):6.2f} {median(rs, 'gc_full'):4.0f} "
                  f"{median(rs, 'gc_max_pause_ms'):12.1f}")
        cpu_ratio = statistics.median(b["cpu_s"] / a["cpu_s"] for a, b in zip(rows[False], rows[True], strict=True))
        p99_ratio = statistics.median(b["p99_us"] / a["p99_us"] for a, b in zip(rows[False], rows[True], strict=True))
        print(f"{'':22} tuned/untuned, median of pairs: CPU {cpu_ratio:.2f}×, p99 {p99_ratio:.2f}×")
        report["workloads"].append({"name": name, "args": wargs, "untuned": rows[False], "tuned": rows[True],
                                    "cpu_ratio": cpu_ratio, "p99_ratio": p99_ratio})
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
