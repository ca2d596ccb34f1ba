"""What every benchmark script shares: percentiles, clocks, memory, the machine.

Standard library only: this module is imported both by the Fusee workloads
(the project's venv) and by the DBOS workloads (``bench/.venv-dbos``, where
Fusee is not installed).
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import resource
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
#: Scratch space for data directories, on the same disk as the repository
#: (``run_all.py`` points its children at a directory of its own).
TMP_DIR = Path(os.environ.get("FUSEE_BENCH_TMP") or RESULTS_DIR / "tmp")

#: A line starting with this marker carries a workload's JSON result on stdout,
#: so log lines printed by the system under test never get in the way.
RESULT_MARKER = "BENCH-RESULT "


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value at ``fraction`` (0..1) of ``values``, linearly interpolated.

    ``values`` need not be sorted; it must not be empty.
    """
    assert values, "percentile of no samples"
    assert 0.0 <= fraction <= 1.0, fraction
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    weight = position - low
    return ordered[low] * (1.0 - weight) + ordered[high] * weight


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99, mean and max of latencies given in seconds, reported in µs."""
    if not seconds:
        return {"n": 0}
    return {
        "n": len(seconds),
        "p50_us": percentile(seconds, 0.50) * 1e6,
        "p99_us": percentile(seconds, 0.99) * 1e6,
        "mean_us": sum(seconds) / len(seconds) * 1e6,
        "max_us": max(seconds) * 1e6,
    }


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, every thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def measured() -> Iterator[dict[str, float]]:
    """Measures the wall and CPU seconds of the ``with`` body, and its garbage collections.

    The yielded dict gets ``wall_s`` and ``cpu_s`` when the body ends, and what
    CPython's cyclic collector took meanwhile: ``gc_s`` (seconds in all
    collections), ``gc_full`` (whole-heap collections), ``gc_full_s`` and
    ``gc_max_pause_ms`` (the longest single collection: a stall of the loop).
    """
    out: dict[str, float] = {}
    started = [0.0]
    totals = {"gc_s": 0.0, "gc_full": 0, "gc_full_s": 0.0, "gc_max_pause_ms": 0.0}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took = time.perf_counter() - started[0]
        totals["gc_s"] += took
        totals["gc_max_pause_ms"] = max(totals["gc_max_pause_ms"], took * 1e3)
        if info["generation"] == 2:
            totals["gc_full"] += 1
            totals["gc_full_s"] += took

    gc.callbacks.append(on_gc)
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    try:
        yield out
    finally:
        out["wall_s"] = time.perf_counter() - wall0
        out["cpu_s"] = cpu_seconds() - cpu0
        gc.callbacks.remove(on_gc)
        out.update(totals)


#: The keys :func:`measured` adds about garbage collection (a workload passes them on with
#: ``**common.gc_figures(m)``).
GC_KEYS = ("gc_s", "gc_full", "gc_full_s", "gc_max_pause_ms")


def gc_figures(m: dict[str, float]) -> dict[str, float]:
    """The garbage-collection figures of a :func:`measured` body."""
    return {k: m[k] for k in GC_KEYS}


def rss_bytes() -> int:
    """Resident set size of this process now (VmRSS), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS line in /proc/self/status")


def scratch_dir(name: str) -> Path:
    """A fresh, empty directory ``<TMP_DIR>/<name>-<pid>-<n>`` on the bench disk."""
    path = TMP_DIR / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir(parents=True, exist_ok=False)
    return path


@contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A fresh directory from ``scratch_dir``, removed with its contents afterwards."""
    path = scratch_dir(name)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def emit_result(result: dict[str, Any]) -> None:
    """Prints a workload's result as one marked JSON line on stdout."""
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()


def parse_results(stdout: str) -> list[dict[str, Any]]:
    """Every result ``emit_result`` printed in ``stdout``, in order."""
    return [
        json.loads(line[len(RESULT_MARKER):])
        for line in stdout.splitlines()
        if line.startswith(RESULT_MARKER)
    ]


# --- the machine -----------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mount_of(path: Path) -> dict[str, str]:
    """Device, mount point and filesystem type of the mount holding ``path``."""
    best: dict[str, str] = {"device": "unknown", "mount": "/", "fstype": "unknown",
                            "options": ""}
    target = str(path.resolve())
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
            for line in mountinfo:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                mount = fields[4].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best["mount"]) and len(rest) >= 2:
                    best = {"device": rest[1], "mount": mount, "fstype": rest[0],
                            "options": fields[5]}
    except OSError:
        pass
    return best


def _block_device_info(device: str) -> str:
    """Model and kind (SSD/rotational) of a /dev block device, when sysfs tells."""
    name = os.path.basename(device)
    base = Path("/sys/class/block") / name
    if not base.exists():
        return ""
    disk = base.resolve()
    if (disk / "partition").exists():
        disk = disk.parent
    parts = []
    for attr in ("device/model", "device/vendor"):
        try:
            text = (disk / attr).read_text().strip()
        except OSError:
            continue
        if text and not text.startswith("0x"):  # a bare PCI vendor id tells nothing
            parts.append(text)
    try:
        rotational = (disk / "queue/rotational").read_text().strip()
        parts.append("rotational" if rotational == "1" else "non-rotational")
    except OSError:
        pass
    if disk.name.startswith("vd"):
        parts.append("virtio")
    return ", ".join(parts)


def environment(bench_dir: Path = TMP_DIR) -> dict[str, str]:
    """What a reader needs to judge the figures: CPU, Python, kernel, disk."""
    bench_dir.mkdir(parents=True, exist_ok=True)
    mount = _mount_of(bench_dir)
    return {
        "cpu": f"{_cpu_model()} ({os.cpu_count()} logical CPUs)",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kernel": f"{platform.system()} {platform.release()}",
        "disk": (
            f"{mount['device']} ({_block_device_info(mount['device']) or 'model unknown'}), "
            f"{mount['fstype']} mounted at {mount['mount']} ({mount['options']})"
        ),
        "bench_dir": str(bench_dir),
    }


def format_us(value: float | None) -> str:
    """Microseconds as a short human string (µs below 10 ms, else ms)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value >= 10_000:
        return f"{value / 1000:,.1f} ms"
    return f"{value:,.0f} µs"
