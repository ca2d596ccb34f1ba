"""Where a durable step's time goes: the disk, CPython itself, and Fusee.

    .venv/bin/python bench/cpython_share.py [--quick] [--rounds N] [--json]

Three programs do the same work in one process, on the same disk, interleaved
over several rounds (medians reported):

* **floor**: ``pwrite`` of a ~100 B record + ``fdatasync``, nothing else;
* **bare asyncio**: the least any asyncio engine written in Python must do for
  a durable step: call the step function, encode a record with msgspec,
  append it, make it durable (one ``fdatasync`` per batch: on the loop's
  thread for a lone chain, on one writer thread for a fan-out, as Fusee's
  inline mode does), resolve a future and resume the waiting task;
* **fusee**: the same workloads through the public API with the default
  options (a chain of synchronous lambdas, a fan-out of async steps).

For the chain it prints µs per step of each and splits Fusee's time into
the floor, what bare asyncio adds to the floor (CPython: the event loop, a
future, a task switch, encoding) and what Fusee adds to bare asyncio (the
journal, the run's replayable loop, indexes). For the fan-out it prints CPU µs
per step of each the same way, and a profile of Fusee's fan-out (cProfile
``tottime`` per package: which share is the interpreter's own machinery,
asyncio, msgspec, and which is Fusee's code).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from perf_smoke import chain as _share_chain  # a chain of lambdas, as users write it
from perf_smoke import fan as _share_fan  # async steps

import fusee
from fusee.diskcheck import measure_floor


class _Record(msgspec.Struct, array_like=True):
    """Roughly what a step result record holds: run, sequence, name, payload."""

    run: int
    seq: int
    name: str
    payload: bytes


_ENCODE = msgspec.msgpack.Encoder().encode


def _cpu() -> float:
    """CPU seconds of every thread of this process (the writer thread's too)."""
    return common.cpu_seconds()


class _File:
    """A preallocated file the bare programs append to (so only data is flushed, as the floor)."""

    def __init__(self, directory: Path, size: int = 64 << 20) -> None:
        self.path = directory / "bare.log"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.posix_fallocate(self.fd, 0, size)
        os.fsync(self.fd)
        self.size = size
        self.offset = 0

    def write(self, data: bytes | bytearray) -> None:
        if self.offset + len(data) > self.size:
            self.offset = 0
        os.pwrite(self.fd, data, self.offset)
        self.offset += len(data)
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink()


# -- chain ------------------------------------------------------------------------------------

async def _bare_chain(f: _File, steps: int) -> float:
    """µs per step of a bare asyncio chain: step, encode, write + fdatasync inline, wake the task."""
    loop = asyncio.get_running_loop()
    value = 0
    t0 = time.perf_counter()
    for seq in range(steps):
        fn = (lambda v: v + 1)  # noqa: E731 - a fresh lambda per step, as users write them
        result = fn(value)
        f.write(_ENCODE(_Record(1, seq, "step", _ENCODE(result))))
        fut: asyncio.Future[int] = loop.create_future()
        loop.call_soon(fut.set_result, result)
        value = await fut
    assert value == steps
    return (time.perf_counter() - t0) / steps * 1e6


async def _fusee_chain(directory: Path, steps: int) -> float:
    """µs per step of a chain of synchronous lambdas, default options."""
    async with await fusee.Engine.open(str(directory), workflows=[_share_chain]) as engine:
        # One short run first: the engine measures a new step function before it runs it inline.
        await engine.execute(_share_chain, "warm", 20)
        t0 = time.perf_counter()
        result = await engine.execute(_share_chain, "chain", steps)
        elapsed = time.perf_counter() - t0
    assert result == steps
    return elapsed / steps * 1e6


# -- fan-out ----------------------------------------------------------------------------------

async def _bare_fanout(f: _File, runs: int, steps: int) -> float:
    """CPU µs per step of a bare asyncio group commit: tasks append, one writer thread syncs batches."""
    loop = asyncio.get_running_loop()
    batch = bytearray()
    batch_fut: asyncio.Future[None] = loop.create_future()
    writing = scheduled = False

    def flushed(fut: asyncio.Future[None], _: Any) -> None:
        nonlocal writing
        writing = False
        fut.set_result(None)
        if batch:
            start_flush()

    def start_flush() -> None:
        nonlocal batch, batch_fut, writing
        data, fut = batch, batch_fut
        batch, batch_fut, writing = bytearray(), loop.create_future(), True
        done = loop.run_in_executor(None, f.write, data)
        done.add_done_callback(functools.partial(flushed, fut))

    def kick() -> None:
        nonlocal scheduled
        scheduled = False
        if not writing and batch:
            start_flush()

    async def bump(v: int) -> int:
        return v + 1

    async def run(run_id: int) -> int:
        nonlocal scheduled
        value = 0
        for seq in range(steps):
            value = await bump(value)
            batch.extend(_ENCODE(_Record(run_id, seq, "bump", _ENCODE(value))))
            fut = batch_fut
            if not writing and not scheduled:
                # After every ready task appended: one batch, one fdatasync.
                scheduled = True
                loop.call_soon(kick)
            await fut
        return value

    t0 = _cpu()
    results = await asyncio.gather(*(run(i) for i in range(runs)))
    cpu = _cpu() - t0
    assert results == [steps] * runs
    return cpu / (runs * steps) * 1e6


async def _fusee_fanout(directory: Path, runs: int, steps: int,
                        profile: cProfile.Profile | None = None) -> float:
    """CPU µs per step of ``runs`` workflows of ``steps`` async steps, all started at once."""
    async with await fusee.Engine.open(str(directory), workflows=[_share_fan]) as engine:
        t0 = _cpu()
        if profile is not None:
            profile.enable()
        handles = await asyncio.gather(*(engine.start(_share_fan, f"f{i}", steps)
                                         for i in range(runs)))
        results = await asyncio.gather(*(h.result() for h in handles))
        if profile is not None:
            profile.disable()
        cpu = _cpu() - t0
    assert results == [steps] * runs
    return cpu / (runs * steps) * 1e6


# -- profile by package -----------------------------------------------------------------------

_GROUPS = (
    ("fusee/core", "Fusee: journal machine (fusee/core)"),
    ("fusee/runtime", "Fusee: runtime (fusee/runtime)"),
    ("fusee/storage", "Fusee: log and committer (fusee/storage)"),
    ("fusee/engine", "Fusee: engine API (fusee/engine)"),
    ("fusee/", "Fusee: other"),
    ("asyncio", "CPython: asyncio (event loop, futures, tasks)"),
    ("threading", "CPython: threads (writer handoff)"),
    ("concurrent", "CPython: threads (writer handoff)"),
    ("msgspec", "msgspec (encoding)"),
)


def _group(filename: str, name: str) -> str:
    if filename == "~":
        if "msgspec" in name:
            return "msgspec (encoding)"
        if "fdatasync" in name or "pwrite" in name or "posix" in name:
            return "system calls (write, fdatasync)"
        return "CPython: built-ins (objects, dicts, lists)"
    path = filename.replace("\\", "/")
    for needle, label in _GROUPS:
        if f"/{needle}" in path:
            return label
    return "CPython: other stdlib"


def profile_shares(profile: cProfile.Profile) -> list[tuple[str, float]]:
    """Share of ``tottime`` per group, largest first."""
    stats = pstats.Stats(profile)
    totals: dict[str, float] = {}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        label = _group(filename, name)
        totals[label] = totals.get(label, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    return sorted(((k, v / whole) for k, v in totals.items()), key=lambda kv: -kv[1])


# -- main -------------------------------------------------------------------------------------

async def measure(directory: Path, rounds: int, steps: int, runs: int) -> dict[str, Any]:
    """Interleaves the programs over ``rounds`` and returns medians and the profile."""
    chain: dict[str, list[float]] = {"floor": [], "bare": [], "fusee": []}
    fan: dict[str, list[float]] = {"bare": [], "fusee": []}
    for r in range(rounds):
        floor = measure_floor(directory, count=steps)
        chain["floor"].append(statistics.fmean(floor.latencies) * 1e6)
        f = _File(directory)
        try:
            chain["bare"].append(await _bare_chain(f, steps))
            fan["bare"].append(await _bare_fanout(f, runs, 10))
        finally:
            f.close()
        with tempfile.TemporaryDirectory(dir=directory) as d:
            chain["fusee"].append(await _fusee_chain(Path(d) / "chain", steps))
            fan["fusee"].append(await _fusee_fanout(Path(d) / "fan", runs, 10))
        print(f"round {r + 1}/{rounds}: chain floor {chain['floor'][-1]:.0f}, bare {chain['bare'][-1]:.0f}, "
              f"fusee {chain['fusee'][-1]:.0f} µs/step; fan-out CPU bare {fan['bare'][-1]:.1f}, "
              f"fusee {fan['fusee'][-1]:.1f} µs/step", file=sys.stderr)
    profile = cProfile.Profile()
    with tempfile.TemporaryDirectory(dir=directory) as d:
        await _fusee_fanout(Path(d) / "fan", runs, 10, profile)
    med = {f"chain_{k}_us": statistics.median(v) for k, v in chain.items()}
    med.update({f"fanout_cpu_{k}_us": statistics.median(v) for k, v in fan.items()})
    return {
        "system": "fusee",
        "workload": "cpython_share",
        "rounds": rounds,
        "chain_steps": steps,
        "fanout_runs": runs,
        **med,
        "chain_samples": chain,
        "fanout_samples": fan,
        "profile_shares": profile_shares(profile),
    }


def report(result: dict[str, Any]) -> str:
    """The figures as markdown."""
    floor, bare, fus = (result[f"chain_{k}_us"] for k in ("floor", "bare", "fusee"))
    fb, ff = result["fanout_cpu_bare_us"], result["fanout_cpu_fusee_us"]
    lines = [
        f"Chain of {result['chain_steps']:,} steps, µs per step (median of {result['rounds']} rounds):",
        "",
        "| part | µs/step | share of Fusee's step |",
        "|---|---:|---:|",
        f"| the disk (pwrite + fdatasync, the floor) | {floor:.1f} | {floor / fus:.0%} |",
        f"| CPython: bare asyncio over the floor | {bare - floor:.1f} | {(bare - floor) / fus:.0%} |",
        f"| Fusee over bare asyncio | {fus - bare:.1f} | {(fus - bare) / fus:.0%} |",
        f"| **Fusee step** | **{fus:.1f}** ({fus / floor:.2f} x floor; bare asyncio {bare / floor:.2f} x) | |",
        "",
        f"Fan-out {result['fanout_runs']:,} x 10 async steps, CPU µs per step: bare asyncio group commit "
        f"{fb:.1f}, Fusee {ff:.1f} ({ff / fb:.1f} x).",
        "",
        "Profile of Fusee's fan-out (cProfile, share of own time; cProfile inflates small calls):",
        "",
        "| where | share |",
        "|---|---:|",
    ]
    lines += [f"| {label} | {share:.0%} |" for label, share in result["profile_shares"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the comparison and prints the report (and the marked JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=common.TMP_DIR)
    parser.add_argument("--json", action="store_true", help="emit the marked JSON result")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    steps, runs = (200, 100) if args.quick else (2000, 2000)
    args.dir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(measure(args.dir, rounds, steps, runs))
    print(report(result))
    if args.json:
        common.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
