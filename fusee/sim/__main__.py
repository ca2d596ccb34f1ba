"""``python -m fusee.sim``: run one seed with its trace, or a range of seeds.

    python -m fusee.sim --seed 42            # one seed, its whole trace
    python -m fusee.sim --seeds 0..300       # a range (end excluded), seeds per second
    python -m fusee.sim --seeds 0..100000    # a long soak

Exits non-zero on the first failing seed, printing the seed, what broke and
the last lines of its trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from fusee import sabotage
from fusee.sim.report import Totals
from fusee.sim.world import SimFailure, run_seed


def _range(text: str) -> range:
    a, sep, b = text.partition("..")
    if not sep or not a.isdigit() or not b.isdigit() or int(b) <= int(a):
        raise argparse.ArgumentTypeError(f"expected A..B with A < B (B excluded), got {text!r}")
    return range(int(a), int(b))


def main(argv: list[str] | None = None) -> int:
    switches = [f.name for f in dataclasses.fields(sabotage.Sabotage)]
    p = argparse.ArgumentParser(prog="python -m fusee.sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--seed", type=int, help="run one seed and print its trace")
    g.add_argument("--seeds", type=_range, help="run seeds A..B (B excluded)")
    p.add_argument("--sabotage", choices=switches, action="append", default=[],
                   help="turn on a deliberate engine bug (to see the checkers catch it)")
    p.add_argument("--quiet", action="store_true", help="with --seed: print only the report and hash")
    args = p.parse_args(argv)
    with sabotage.sabotaged(**dict.fromkeys(args.sabotage, True)):
        if args.seed is not None:
            return _one(args.seed, quiet=args.quiet)
        return _many(args.seeds)


def _one(seed: int, *, quiet: bool) -> int:
    try:
        result = run_seed(seed, verbose=not quiet)
    except SimFailure as f:
        print(str(f) if quiet else f"seed {seed} failed: {f.message}", file=sys.stderr)
        return 1
    print(result.report.line())
    print(f"trace sha256 {result.trace_hash}")
    return 0


def _many(seeds: range) -> int:
    totals = Totals()
    t0 = time.perf_counter()
    last = t0
    for seed in seeds:
        try:
            result = run_seed(seed)
        except SimFailure as f:
            print(str(f), file=sys.stderr)
            return 1
        totals.add(result.report)
        now = time.perf_counter()
        if now - last >= 10.0:
            last = now
            print(f"... {totals.seeds} seeds, {totals.seeds / (now - t0):.1f} seeds/s", flush=True)
    elapsed = time.perf_counter() - t0
    print(f"{totals.seeds} seeds passed in {elapsed:.1f}s ({totals.seeds / elapsed:.1f} seeds/s)")
    print(totals.line())
    missing = totals.missing()
    if missing:
        print(f"never exercised: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
