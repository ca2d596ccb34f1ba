"""The disk's floor: how fast can one small record become durable on this disk?

Every durable step ends in an ``fdatasync`` of the shared log, so no engine on
this disk can make a sequential step durable faster than one small ``pwrite``
plus ``fdatasync`` of an already allocated file. This module measures that
floor so users can check the claim "at the speed of the disk" on their own
machine (``python -m fusee.diskcheck [DIR]``, later ``fusee disk-check``).

Standard library only: it must run before anything else of Fusee is trusted.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

#: Bytes in one measured write: about one small journal record.
DEFAULT_RECORD_SIZE = 100
#: Measured writes (plus ``DEFAULT_WARMUP`` discarded ones).
DEFAULT_COUNT = 2000
DEFAULT_WARMUP = 50


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The value at ``fraction`` (0..1) of ``sorted_values``, linearly interpolated.

    ``sorted_values`` must be sorted ascending and non-empty.
    """
    assert sorted_values, "percentile of no samples"
    assert 0.0 <= fraction <= 1.0, fraction
    position = fraction * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    weight = position - low
    return sorted_values[low] * (1.0 - weight) + sorted_values[high] * weight


@dataclass(frozen=True)
class FloorResult:
    """What one floor measurement found. Latencies are in seconds."""

    directory: str
    record_size: int
    latencies: list[float] = field(repr=False)
    elapsed: float

    @property
    def count(self) -> int:
        """Number of measured writes."""
        return len(self.latencies)

    @property
    def p50(self) -> float:
        """Median latency of one pwrite + fdatasync, in seconds."""
        return percentile(sorted(self.latencies), 0.50)

    @property
    def p99(self) -> float:
        """99th percentile latency of one pwrite + fdatasync, in seconds."""
        return percentile(sorted(self.latencies), 0.99)

    @property
    def ops_per_second(self) -> float:
        """Sequential durable writes per second over the whole measurement."""
        return self.count / self.elapsed if self.elapsed > 0 else float("inf")

    def summary(self) -> str:
        """One human-readable line: p50, p99 and ops/s."""
        return (
            f"pwrite {self.record_size} B + fdatasync in {self.directory}: "
            f"p50 {self.p50 * 1e6:.0f} µs, p99 {self.p99 * 1e6:.0f} µs, "
            f"{self.ops_per_second:,.0f} ops/s ({self.count} writes)"
        )


def measure_floor(
    directory: str | os.PathLike[str],
    *,
    count: int = DEFAULT_COUNT,
    record_size: int = DEFAULT_RECORD_SIZE,
    warmup: int = DEFAULT_WARMUP,
) -> FloorResult:
    """Times ``count`` sequential ``pwrite(record_size) + fdatasync`` in ``directory``.

    The file is created in ``directory`` (so on the disk that directory lives
    on), filled with zeros and synced before timing starts, so the timed writes
    overwrite allocated blocks and ``fdatasync`` flushes data only: the best
    case a preallocated log segment gets. Writes advance through the file like
    appends to a log. The file is removed afterwards, whatever happens.
    """
    assert count > 0 and record_size > 0 and warmup >= 0
    total = count + warmup
    size = total * record_size
    payload = os.urandom(record_size)
    fd, path = tempfile.mkstemp(prefix=".fusee-diskcheck-", dir=os.fspath(directory))
    try:
        chunk = b"\0" * (1 << 20)
        written = 0
        while written < size:
            written += os.write(fd, chunk[: min(len(chunk), size - written)])
        os.fsync(fd)
        latencies: list[float] = []
        clock = time.perf_counter
        started = clock()
        for i in range(total):
            if i == warmup:
                started = clock()
            before = clock()
            os.pwrite(fd, payload, i * record_size)
            os.fdatasync(fd)
            after = clock()
            if i >= warmup:
                latencies.append(after - before)
        elapsed = clock() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return FloorResult(os.fspath(directory), record_size, latencies, elapsed)


def main(argv: list[str] | None = None) -> int:
    """``python -m fusee.diskcheck [DIR]``: prints the floor of DIR's disk."""
    parser = argparse.ArgumentParser(
        prog="python -m fusee.diskcheck",
        description="Measure the disk's floor: small pwrite + fdatasync latency.",
    )
    parser.add_argument("directory", nargs="?", default=".",
                        help="a directory on the disk to measure (default: .)")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT,
                        help=f"measured writes (default {DEFAULT_COUNT})")
    parser.add_argument("--size", type=int, default=DEFAULT_RECORD_SIZE,
                        help=f"bytes per write (default {DEFAULT_RECORD_SIZE})")
    args = parser.parse_args(argv)
    if args.count <= 0 or args.size <= 0:
        parser.error("--count and --size must be positive")
    if not os.path.isdir(args.directory):
        parser.error(f"{args.directory!r} is not a directory")
    result = measure_floor(args.directory, count=args.count, record_size=args.size)
    print(result.summary())
    print("A durable sequential step cannot be faster than this p50 on this disk.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
