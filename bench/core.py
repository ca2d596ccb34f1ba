"""The journal machine's own cost per step (issue 2 §5).

Run from the repository: ``.venv/bin/python bench/core.py [--steps N] [--reps R]``.

- live: a 10,000-step sequential run; per step ``begin_step``, ``complete``,
  ``next`` and encoding the ``Step`` record the delivery carries.
- live fast path: the same with ``take_live_step`` instead of ``complete`` +
  ``next`` (what the runtime does when the step's result is the only delivery).
- replay: building the machine from that run's (decoded) journal, then per step
  ``begin_step`` and ``next``. Decoding the records is the storage layer's
  cost and is printed separately.

Figures are the median and p99 of the per-repetition µs/step (each repetition
runs the whole journal), so one noisy repetition on a shared machine does not
decide the result.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

from fusee.core import records as r
from fusee.core.journal import IDLE, Deliver, RunMachine, StepDone

LIVE_TARGET_US = 5.0
REPLAY_TARGET_US = 3.0

START = r.Start(1, "bench", "bench", 1, 0, 0, 0, None, 0, None, b"{}")


def live(steps: int) -> list[r.Record]:
    """Runs ``steps`` sequential live steps; returns the journal they wrote."""
    journal: list[r.Record] = [START]
    m = RunMachine.fresh(START, 1)
    encode = r.encode
    ok = r.Status.OK
    payload = b'{"ok":true}'
    for _ in range(steps):
        seq, _start = m.begin_step("charge")
        m.complete(seq, StepDone(ok, payload))
        d = m.next()
        assert type(d) is Deliver and d.record is not None
        encode(d.record)
        journal.append(d.record)
    assert m.next() is IDLE
    return journal


def live_fast(steps: int) -> None:
    """``steps`` sequential live steps through ``take_live_step``."""
    m = RunMachine.fresh(START, 1)
    encode = r.encode
    ok = r.Status.OK
    payload = b'{"ok":true}'
    for _ in range(steps):
        seq, _start = m.begin_step("charge")
        record = m.take_live_step(seq, ok, payload)
        assert record is not None
        encode(record)


def replay(journal: list[r.Record]) -> None:
    """Replays ``journal`` (a sequential run of steps) to its end."""
    m = RunMachine.from_journal(journal, len(journal))
    for _ in range(len(journal) - 1):
        seq, _start = m.begin_step("charge")
        d = m.next()
        assert type(d) is Deliver and d.seq == seq
    assert not m.is_replaying()


def per_step_us(fn: Callable[[], object], steps: int, reps: int) -> list[float]:
    """µs per step of ``fn`` (one whole run per call), one figure per repetition."""
    fn()  # warm up
    out = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) / steps * 1e6)
    return out


def report(label: str, figures: list[float], target: float | None) -> None:
    median = common.percentile(figures, 0.5)
    p99 = common.percentile(figures, 0.99)
    ratio = f"  ({median / target:.2f}× the {target:g} µs target)" if target else ""
    print(f"{label:<22} {median:6.2f} µs/step median, {p99:6.2f} p99 of {len(figures)} reps{ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    steps, reps = args.steps, args.reps
    journal = live(steps)
    blobs = [r.encode(x) for x in journal]
    decode = r.decode

    live_us = per_step_us(lambda: live(steps), steps, reps)
    fast_us = per_step_us(lambda: live_fast(steps), steps, reps)
    replay_us = per_step_us(lambda: replay(journal), steps, reps)
    decode_us = per_step_us(lambda: [decode(b) for b in blobs], steps, reps)

    env = common.environment()
    print(f"journal machine, {steps:,} sequential steps; {env['cpu']}, {env['python']}")
    report("live", live_us, LIVE_TARGET_US)
    report("live (fast path)", fast_us, LIVE_TARGET_US)
    report("replay", replay_us, REPLAY_TARGET_US)
    report("decode (storage)", decode_us, None)
    ok = common.percentile(live_us, 0.5) <= LIVE_TARGET_US and (
        common.percentile(replay_us, 0.5) <= REPLAY_TARGET_US
    )
    common.emit_result(
        {
            "system": "fusee",
            "workload": "core",
            "steps": steps,
            "reps": reps,
            **{
                f"{name}_{stat}_us": common.percentile(figures, q)
                for name, figures in (
                    ("live", live_us),
                    ("live_fast", fast_us),
                    ("replay", replay_us),
                    ("decode", decode_us),
                )
                for stat, q in (("p50", 0.5), ("p99", 0.99))
            },
            "within_target": ok,
        }
    )
    print("within target" if ok else "OVER TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
