"""Speed of the shared log against the disk's own floor (issue 3).

Prints, from one run on the same directory:
  * the raw floor: pwrite of 100 bytes + fdatasync on a preallocated file;
  * one writer appending and awaiting one record at a time through GroupCommitter
    (target: p50 within 1.10x the floor's p50);
  * 1,000 concurrent asyncio appenders: durable records/s and records per flush
    (target: at least 200,000 records/s).

Usage: python bench/log.py [--quick] [--dir DIR]. By default it works in a temp
directory inside the repository, i.e. on the repository's disk (not a tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusee.storage.committer import GroupCommitter
from fusee.storage.log import SharedLog
from fusee.storage.posix import PosixStorage

RECORD = b"r" * 100


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))]


def raw_floor(directory: str, n: int) -> list[float]:
    storage = PosixStorage()
    path = os.path.join(directory, "floor.dat")
    fh = storage.open(path, create=True)
    storage.preallocate(fh, (n + 1) * 4096)
    storage.fdatasync(fh)
    out = []
    for i in range(n):
        t = time.perf_counter()
        os.pwrite(fh, RECORD, i * 4096)
        os.fdatasync(fh)
        out.append(time.perf_counter() - t)
    storage.close(fh)
    os.remove(path)
    return out


async def one_writer(directory: str, n: int) -> tuple[list[float], GroupCommitter]:
    log, _ = SharedLog.open(PosixStorage(), os.path.join(directory, "chain"), 1)
    c = GroupCommitter(log)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        lsn = c.append(0, RECORD)
        await c.wait_durable(0, lsn)
        out.append(time.perf_counter() - t)
    await c.close()
    log.close()
    return out, c


async def many_writers(directory: str, writers: int, each: int, shards: int
                       ) -> tuple[float, GroupCommitter, list[float]]:
    log, _ = SharedLog.open(PosixStorage(), os.path.join(directory, "many"), shards)
    c = GroupCommitter(log)
    lat: list[float] = []

    async def writer(k: int) -> None:
        shard = k % shards
        for _ in range(each):
            t = time.perf_counter()
            lsn = c.append(shard, RECORD)
            await c.wait_durable(shard, lsn)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(k) for k in range(writers)))
    elapsed = time.perf_counter() - t0
    await c.close()
    log.close()
    return elapsed, c, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few hundred samples (CI smoke test)")
    ap.add_argument("--dir", help="where to write (default: a temp dir inside the repository)")
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    samples = 300 if args.quick else 5000
    each = 5 if args.quick else 100
    repo = Path(__file__).resolve().parent.parent
    directory = tempfile.mkdtemp(prefix=".bench-log-", dir=args.dir or str(repo))
    try:
        floor = raw_floor(directory, samples)
        chain, cc = asyncio.run(one_writer(directory, samples))
        elapsed, mc, lat = asyncio.run(many_writers(directory, 1000, each, args.shards))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    us = 1e6
    f50, f99 = pct(floor, 0.5) * us, pct(floor, 0.99) * us
    c50, c99 = pct(chain, 0.5) * us, pct(chain, 0.99) * us
    total = 1000 * each
    rate = total / elapsed
    print(f"shared log on {directory} ({samples} samples{', quick' if args.quick else ''})")
    print(f"{'':44}{'p50 µs':>10}{'p99 µs':>10}{'x floor':>10}")
    print(f"{'raw floor: pwrite 100 B + fdatasync':44}{f50:10.1f}{f99:10.1f}{1.0:10.2f}")
    print(f"{'one writer: append + wait_durable':44}{c50:10.1f}{c99:10.1f}{c50 / f50:10.2f}"
          f"   (target <= 1.10; {cc.inline_flushes}/{cc.flushes} flushes inline)")
    print(f"{'1,000 appenders: append + wait_durable':44}{pct(lat, 0.5) * us:10.1f}{pct(lat, 0.99) * us:10.1f}")
    print(f"1,000 concurrent appenders, {args.shards} shards: {total} records in {elapsed:.3f} s = "
          f"{rate:,.0f} durable records/s (target >= 200,000), "
          f"{mc.records_flushed / max(1, mc.flushes):.0f} records per flush over {mc.flushes} flushes")


if __name__ == "__main__":
    main()
