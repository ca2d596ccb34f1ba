"""Workload 1, the floor: pwrite ~100 B + fdatasync on a preallocated file.

Run from the repository: ``.venv/bin/python bench/floor.py [--quick] [--dir DIR]``.
The measuring itself lives in ``fusee.diskcheck`` (also ``python -m
fusee.diskcheck``), so users measure their own disk the same way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

from fusee.diskcheck import measure_floor


def run(directory: Path, count: int) -> dict[str, Any]:
    """Measures the floor in ``directory`` and returns the workload's result."""
    result = measure_floor(directory, count=count)
    return {
        "system": "floor",
        "workload": "floor",
        "count": result.count,
        "record_size": result.record_size,
        **common.latency_summary(result.latencies),
        "ops_per_s": result.ops_per_second,
        "samples_us": [x * 1e6 for x in result.latencies],
    }


def main(argv: list[str] | None = None) -> int:
    """Prints the floor's p50, p99 and ops/s (and the marked JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="200 writes instead of 2,000")
    parser.add_argument("--count", type=int, default=None, help="measured writes")
    parser.add_argument("--dir", type=Path, default=common.TMP_DIR,
                        help="directory on the disk to measure (default bench/results/tmp)")
    parser.add_argument("--json", action="store_true", help="emit the marked JSON result")
    args = parser.parse_args(argv)
    count = args.count or (200 if args.quick else 2000)
    args.dir.mkdir(parents=True, exist_ok=True)
    result = run(args.dir, count)
    print(
        f"floor: p50 {common.format_us(result['p50_us'])}, "
        f"p99 {common.format_us(result['p99_us'])}, "
        f"{result['ops_per_s']:,.0f} ops/s ({count} writes in {args.dir})"
    )
    if args.json:
        common.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
