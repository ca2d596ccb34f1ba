"""``python -m fusee.sim.soak`` (``make soak``): the simulator over a long seed range, sharded
across processes, with a canary and a coverage atlas.

    python -m fusee.sim.soak --seeds 0..20000 --jobs 2 --out bench/results/soak

Seeds go to ``--jobs`` worker processes in chunks. A **canary** runs beside them: a seed
with a deliberate engine bug switched on (``--canary early_blobs@3``) that must fail;
if it passes, the checkers are not live and the soak says so (exit status 2). Every
failing seed is recorded with the checker that caught it and the first line of what
broke (exit status 1); the soak goes on past failures.

The **coverage atlas** counts, over the seeds run, how often each fault kind, job kind,
engine knob, checker and code path (the report's counters) fired: per row, the seeds
where it happened at least once and its total. It is printed least-covered first and
written, with the failures, to ``OUT/atlas.md`` and ``OUT/atlas.json``; both are
rewritten every ``--every`` seconds while the soak runs, so a soak stopped early still
leaves its partial atlas.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

#: Report counters that are faults the world injected (the rest are code paths).
FAULTS = ("crashes", "crashes_after_io", "power_losses", "kills_in_sync", "lock_deletions",
          "dir_moves", "restarts", "flush_failures", "torn_tails", "closes", "closes_mid_step")
#: Report fields that are neither faults nor paths.
_NOT_PATHS = ("seed", "workflows", "finished", "sim_ms")
#: The default canary: a sabotage switch and a seed it makes fail.
CANARY = "early_blobs@3"
#: Seeds per task a worker takes (small: progress shows often, a lost worker loses little).
CHUNK = 20


@dataclasses.dataclass
class Failure:
    """A seed that failed: which checker caught it and the first line of what broke."""

    seed: int
    checker: str
    message: str


@dataclasses.dataclass
class Atlas:
    """Coverage over the seeds run: (category, name) -> seeds where it fired, and its total."""

    seeds: int = 0
    rows: dict[tuple[str, str], list[int]] = dataclasses.field(default_factory=dict)
    #: Checker name -> runs that found a violation (only failing seeds and the canary have any).
    fired: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failures: list[Failure] = dataclasses.field(default_factory=list)
    #: The canary's outcome: None (not run yet), or the failure it must produce ("" if it passed).
    canary: str | None = None

    def register(self, rows: Iterable[tuple[str, str]]) -> None:
        """Rows to show even if nothing fires them."""
        for key in rows:
            self.rows.setdefault(key, [0, 0])

    def add_seed(self, counts: dict[tuple[str, str], int]) -> None:
        self.seeds += 1
        for key, n in counts.items():
            row = self.rows.setdefault(key, [0, 0])
            row[0] += n > 0
            row[1] += n

    def merge(self, part: dict[str, Any]) -> None:
        """Adds a worker's chunk result (``run_chunk``)."""
        for counts in part["seeds"]:
            self.add_seed({(c, n): v for c, n, v in counts})
        self.fired.update(part["fired"])
        self.failures.extend(Failure(**f) for f in part["failures"])

    def sorted_rows(self) -> list[tuple[str, str, int, int]]:
        """(category, name, seeds, total), least covered first (fewest seeds, then smallest total)."""
        out = [(c, n, s, t) for (c, n), (s, t) in self.rows.items()]
        return sorted(out, key=lambda r: (r[2], r[3], r[0], r[1]))

    def markdown(self, *, title: str, limit: int | None = None) -> str:
        rows = self.sorted_rows()
        lines = [f"# {title}", "",
                 f"{self.seeds + len(self.failures)} seeds run: {self.seeds} passed (the rows count these), "
                 f"{len(self.failures)} failed; canary: {self._canary_text()}", ""]
        if self.failures:
            lines += ["## Failures", "", "| seed | checker | what broke |", "|---:|---|---|"]
            lines += [f"| {f.seed} | {f.checker} | {f.message.replace('|', '/')} |" for f in self.failures]
            lines.append("")
        lines += ["## Coverage, least covered first", "",
                  "| category | name | seeds | % of seeds | total | fired |", "|---|---|---:|---:|---:|---:|"]
        for c, n, s, t in rows[:limit]:
            pct = 100.0 * s / self.seeds if self.seeds else 0.0
            fired = self.fired.get(n, 0) if c == "checker" else ""
            lines.append(f"| {c} | {n} | {s} | {pct:.1f} | {t} | {fired} |")
        return "\n".join(lines) + "\n"

    def _canary_text(self) -> str:
        if self.canary is None:
            return "not run yet"
        return f"failed as it must ({self.canary})" if self.canary else "PASSED: the checkers are not live"

    def to_json(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "canary": self.canary,
            "failures": [dataclasses.asdict(f) for f in self.failures],
            "rows": [{"category": c, "name": n, "seeds": s, "total": t} for c, n, s, t in self.sorted_rows()],
            "fired": dict(self.fired),
        }


#: Checkers the world tallies by name rather than through ``checkers.tallied``.
WORLD_CHECKERS = ("traces", "streams", "resettables", "plaintext", "service", "online")
#: Every value a knob of ``SimConfig.for_seed`` takes (so that a value no seed drew shows as 0).
KNOB_VALUES: dict[str, tuple[Any, ...]] = {
    "flush": ("inline", "background", "pipeline"),
    "keep_history": (True, False),
    "inline_sync_steps": (None, False, True),
    "shards": (1, 2, 3, 4),
    "park_after_ms": (0, 5, 50, None),
    "blob_threshold": (256 << 10, 64, 512),
    "telemetry": (True, False),
    "codec": (True, False),
    "memory_pressure": (True, False),
}


def known_rows() -> Iterator[tuple[str, str]]:
    """Rows the atlas shows even at zero: every counter, knob value, job kind and checker."""
    from fusee.sim import checkers, integrity
    from fusee.sim.config import JOB_KINDS
    from fusee.sim.report import Report

    del integrity  # imported for the checker it registers
    for f in dataclasses.fields(Report):
        if f.name not in _NOT_PATHS:
            yield ("fault" if f.name in FAULTS else "path", f.name)
    for kind in JOB_KINDS:
        yield ("job", kind)
    for name in (*sorted(checkers.known), *WORLD_CHECKERS):
        yield ("checker", name)
    for knob, values in KNOB_VALUES.items():
        for v in values:
            yield ("knob", f"{knob}={v}")


def seed_counts(cfg: Any, report: Any, observed: Any, runs: dict[str, int]) -> Iterator[tuple[str, str, int]]:
    """The atlas rows one seed adds: (category, name, count)."""
    for f in dataclasses.fields(report):
        if f.name in _NOT_PATHS:
            continue
        yield ("fault" if f.name in FAULTS else "path", f.name, int(getattr(report, f.name)))
    kinds = collections.Counter(observed.starts.values()) if observed is not None else collections.Counter()
    for kind, n in sorted(kinds.items()):
        yield ("job", kind or "(none)", n)
    for name, n in sorted(runs.items()):
        yield ("checker", name, n)
    yield from knob_counts(cfg)


def knob_counts(cfg: Any) -> Iterator[tuple[str, str, int]]:
    """The engine knobs a seed ran with, as atlas rows (each value counts once per seed)."""
    yield ("knob", f"flush={cfg.flush_mode}", 1)
    yield ("knob", f"keep_history={cfg.keep_history}", 1)
    yield ("knob", f"inline_sync_steps={cfg.inline_sync_steps}", 1)
    yield ("knob", f"shards={cfg.shards}", 1)
    yield ("knob", f"park_after_ms={cfg.park_after_ms}", 1)
    yield ("knob", f"blob_threshold={cfg.blob_threshold}", 1)
    yield ("knob", f"telemetry={cfg.telemetry}", 1)
    yield ("knob", f"codec={cfg.seed % 3 == 1}", 1)
    if hasattr(cfg, "memory_budget"):
        yield ("knob", f"memory_pressure={cfg.memory_budget is not None or cfg.max_loaded is not None}", 1)


def run_chunk(seeds: list[int], switches: dict[str, bool] | None = None) -> dict[str, Any]:
    """Runs ``seeds`` in this process (a worker's task); what the atlas needs of each."""
    from fusee import sabotage
    from fusee.sim import checkers
    from fusee.sim.config import SimConfig
    from fusee.sim.world import SimFailure, run_seed

    out: dict[str, Any] = {"seeds": [], "fired": collections.Counter(), "failures": []}
    with sabotage.sabotaged(**(switches or {})):
        for seed in seeds:
            checkers.runs.clear()
            checkers.fired.clear()
            cfg = SimConfig.for_seed(seed)
            try:
                result = run_seed(seed)
            except SimFailure as f:
                caught = sorted(checkers.fired) or ["world"]
                out["failures"].append({"seed": seed, "checker": ",".join(caught),
                                        "message": f.message.splitlines()[0][:400]})
                out["fired"].update(checkers.fired)
                continue
            except Exception as e:  # the simulator itself broke: as much a failure as a checker's
                out["failures"].append({"seed": seed, "checker": "(simulator)",
                                        "message": f"{type(e).__name__}: {e}"[:400]})
                continue
            out["seeds"].append(list(seed_counts(cfg, result.report, result.observed, dict(checkers.runs))))
            out["fired"].update(checkers.fired)
    out["fired"] = dict(out["fired"])
    return out


def run_canary(spec: str) -> str:
    """Runs the canary ``SWITCH@SEED``: the first line of its failure, or "" if it passed."""
    switch, seed = parse_canary(spec)
    part = run_chunk([seed], {switch: True})
    if not part["failures"]:
        return ""
    f = part["failures"][0]
    return f"seed {seed} with {switch}, caught by {f['checker']}"


def parse_canary(spec: str) -> tuple[str, int]:
    from fusee import sabotage

    switch, sep, seed = spec.partition("@")
    names = {f.name for f in dataclasses.fields(sabotage.Sabotage)}
    if not sep or not seed.isdigit() or switch not in names:
        raise argparse.ArgumentTypeError(f"expected SWITCH@SEED with a sabotage switch of fusee.sabotage, got {spec!r}")
    return switch, int(seed)


def chunks(seeds: range, size: int) -> Iterator[list[int]]:
    for i in range(seeds.start, seeds.stop, size):
        yield list(range(i, min(i + size, seeds.stop)))


def _range(text: str) -> range:
    a, sep, b = text.partition("..")
    if not sep or not a.isdigit() or not b.isdigit() or int(b) <= int(a):
        raise argparse.ArgumentTypeError(f"expected A..B with A < B (B excluded), got {text!r}")
    return range(int(a), int(b))


def _write(out: str, atlas: Atlas, title: str) -> None:
    """Writes the atlas files (each replaced whole, so a reader never sees half of one)."""
    os.makedirs(out, exist_ok=True)
    for name, text in (("atlas.md", atlas.markdown(title=title)),
                       ("atlas.json", json.dumps(atlas.to_json(), indent=1) + "\n")):
        tmp = os.path.join(out, f".{name}.tmp")
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(out, name))


def soak(seeds: range, *, jobs: int, out: str, canary: str | None, every: float = 30.0,
         chunk: int = CHUNK, echo: Any = print) -> Atlas:
    """Runs ``seeds`` over ``jobs`` processes and the canary; returns the atlas (also written to ``out``)."""
    atlas = Atlas()
    atlas.register(known_rows())
    title = f"Simulator soak: seeds {seeds.start}..{seeds.stop}, {jobs} worker(s)"
    t0 = last = time.monotonic()
    total = len(seeds)
    # spawn: fresh workers (no copy of this process's state), recycled now and then so that a
    # slow leak in one long-lived worker cannot grow without bound.
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, max_tasks_per_child=50) as pool:
        canary_f = pool.submit(run_canary, canary) if canary else None
        todo: Iterable[list[int]] = chunks(seeds, chunk)
        running: set[cf.Future[Any]] = set()
        pending = iter(todo)
        done_seeds = 0
        while True:
            while len(running) < 2 * jobs:  # a short queue: seeds finish roughly in order
                nxt = next(pending, None)
                if nxt is None:
                    break
                running.add(pool.submit(run_chunk, nxt))
            if not running and (canary_f is None or canary_f.done()):
                break
            waiting = running | ({canary_f} if canary_f is not None and not canary_f.done() else set())
            finished, _ = cf.wait(waiting, timeout=every, return_when=cf.FIRST_COMPLETED)
            for f in finished:
                if f is canary_f:
                    atlas.canary = f.result()
                    echo(f"canary: {atlas._canary_text()}", flush=True)
                    continue
                running.discard(f)
                part = f.result()
                n = len(part["seeds"]) + len(part["failures"])
                done_seeds += n
                atlas.merge(part)
                for fail in part["failures"]:
                    echo(f"FAILED seed {fail['seed']} ({fail['checker']}): {fail['message']}", flush=True)
            now = time.monotonic()
            if now - last >= every or not running:
                last = now
                rate = done_seeds / max(now - t0, 1e-9)
                eta = (total - done_seeds) / rate if rate else float("inf")
                echo(f"[{time.strftime('%H:%M:%S')}] {done_seeds}/{total} seeds, {rate:.2f} seeds/s, "
                     f"{len(atlas.failures)} failing, ETA {eta / 60:.0f} min", flush=True)
                _write(out, atlas, title)
    _write(out, atlas, title)
    return atlas


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusee.sim.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=_range, default=range(0, 20_000), help="seeds A..B (B excluded)")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="worker processes")
    p.add_argument("--out", default="bench/results/soak", help="directory for atlas.md and atlas.json")
    p.add_argument("--canary", default=CANARY, help="SWITCH@SEED that must fail ('' for none)")
    p.add_argument("--every", type=float, default=30.0, help="seconds between progress lines and atlas writes")
    p.add_argument("--chunk", type=int, default=CHUNK, help="seeds per worker task")
    p.add_argument("--rows", type=int, default=40, help="atlas rows to print (least covered first)")
    args = p.parse_args(argv)
    if args.canary:
        parse_canary(args.canary)
    if args.jobs < 1 or args.chunk < 1:
        p.error("--jobs and --chunk must be at least 1")
    atlas = soak(args.seeds, jobs=args.jobs, out=args.out, canary=args.canary or None,
                 every=args.every, chunk=args.chunk)
    print(atlas.markdown(title=f"Simulator soak: seeds {args.seeds.start}..{args.seeds.stop}", limit=args.rows))
    print(f"atlas written to {os.path.join(args.out, 'atlas.md')} (and atlas.json)")
    if args.canary and not atlas.canary:
        print(f"the canary {args.canary} passed: the checkers are not live", file=sys.stderr)
        return 2
    return 1 if atlas.failures else 0


if __name__ == "__main__":
    sys.exit(main())
