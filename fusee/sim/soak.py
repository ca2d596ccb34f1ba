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

A seed that runs away is a failure, not the end of the soak: each worker's address space is
capped (``--memory-cap``) and each seed has a wall-clock limit (``--seed-timeout``). A
``MemoryError`` retires the worker's pool (a worker's heap can stay near the cap after one
seed, and would fail the next ones for nothing): that seed and the rest of its chunk run again
one at a time in a new pool, and a seed fails on memory only if it reaches the cap there. A worker killed outright (the kernel's OOM killer, a crash of the
interpreter) breaks the pool; the soak starts a new one and runs the seeds that were in flight
again one at a time, alone, so the one that kills its worker again is recorded as the culprit.
``atlas.json`` lists the seeds covered (passed or failed) as ranges; ``--resume`` continues a
stopped soak from it, skipping those seeds.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import os
import resource
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

#: Report counters that are faults the world injected (the rest are code paths).
FAULTS = ("crashes", "crashes_after_io", "power_losses", "kills_in_sync", "lock_deletions",
          "dir_moves", "restarts", "flush_failures", "torn_tails", "closes", "closes_mid_step")
#: Report fields that are neither faults nor paths.
_NOT_PATHS = ("seed", "workflows", "finished", "sim_ms", "clock_jumps")
#: The default canary: a sabotage switch and a seed it makes fail.
CANARY = "early_blobs@3"
#: Seeds per task a worker takes (small: progress shows often, a lost worker loses little).
CHUNK = 20
#: The default cap of a worker's address space, and of a seed's wall-clock time.
MEMORY_CAP = 4 << 30
SEED_TIMEOUT_S = 900.0


class SeedTimeout(KeyboardInterrupt):
    """A seed ran past ``--seed-timeout``.

    A KeyboardInterrupt, since asyncio lets only that and SystemExit out of the tasks and
    callbacks it runs (and the world's handlers take Exceptions only).
    """


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
    #: Every seed run, passed or failed (``covered`` in the JSON, as ranges).
    done: set[int] = dataclasses.field(default_factory=set)

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
        self.done.update(part.get("ran", ()))
        self.done.update(f["seed"] for f in part["failures"])

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Atlas:
        """The atlas ``to_json`` wrote (``--resume``)."""
        atlas = cls(seeds=int(data["seeds"]), canary=data.get("canary"))
        for r in data["rows"]:
            atlas.rows[(r["category"], r["name"])] = [int(r["seeds"]), int(r["total"])]
        atlas.fired.update(data.get("fired", {}))
        atlas.failures = [Failure(**f) for f in data["failures"]]
        for a, b in data.get("covered", ()):
            atlas.done.update(range(a, b))
        return atlas

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
            "covered": ranges(self.done),
        }


def ranges(seeds: Iterable[int]) -> list[list[int]]:
    """``seeds`` as sorted [start, stop) ranges: [[0, 3], [5, 6]] for {0, 1, 2, 5}."""
    out: list[list[int]] = []
    for seed in sorted(seeds):
        if out and out[-1][1] == seed:
            out[-1][1] = seed + 1
        else:
            out.append([seed, seed + 1])
    return out


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


def limit_worker(memory_cap: int | None) -> None:
    """A worker's initializer: caps its address space, so that a runaway seed fails with MemoryError."""
    if memory_cap:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = memory_cap if hard == resource.RLIM_INFINITY else min(memory_cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _timed_out(signum: int, frame: Any) -> None:
    raise SeedTimeout()


def run_chunk(seeds: list[int], switches: dict[str, bool] | None = None,
              seed_timeout: float | None = None) -> dict[str, Any]:
    """Runs ``seeds`` in this process (a worker's task); what the atlas needs of each."""
    from fusee import sabotage
    from fusee.sim import checkers
    from fusee.sim.config import SimConfig
    from fusee.sim.world import SimFailure, run_seed

    out: dict[str, Any] = {"seeds": [], "fired": collections.Counter(), "failures": [], "ran": []}
    timed = seed_timeout is not None and seed_timeout > 0
    if timed:
        signal.signal(signal.SIGALRM, _timed_out)
    with sabotage.sabotaged(**(switches or {})):
        for i, seed in enumerate(seeds):
            checkers.runs.clear()
            checkers.fired.clear()
            cfg = SimConfig.for_seed(seed)
            try:
                began = time.monotonic()
                if timed:
                    # Again every second until it is out: a handler of the seed's may swallow one.
                    signal.setitimer(signal.ITIMER_REAL, seed_timeout, 1.0)  # type: ignore[arg-type]
                try:
                    result = run_seed(seed)
                finally:
                    if timed:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                if timed and time.monotonic() - began > seed_timeout:  # type: ignore[operator]
                    raise SeedTimeout()  # it overran, though its alarm was swallowed on the way
            except SeedTimeout:
                out["failures"].append({"seed": seed, "checker": "(timeout)",
                                        "message": f"the seed ran longer than {seed_timeout:g} s of wall clock"})
                continue
            except MemoryError:
                # The worker's heap may stay near the cap after the seed (what earlier seeds left
                # fragmented counts too): its later seeds would fail for nothing. This worker is
                # retired, and the seeds from this one on run again one at a time in a new pool.
                out["poisoned"] = True
                if len(seeds) > 1:
                    out["unrun"] = seeds[i:]
                else:
                    out["failures"].append({"seed": seed, "checker": "(memory)",
                                            "message": "MemoryError: the seed outgrew a fresh worker's "
                                                       "memory cap, alone"})
                break
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
            out["ran"].append(seed)
            out["fired"].update(checkers.fired)
    out["fired"] = dict(out["fired"])
    return out


def run_canary(spec: str, seed_timeout: float | None = None) -> str:
    """Runs the canary ``SWITCH@SEED``: the first line of its failure, or "" if it passed."""
    switch, seed = parse_canary(spec)
    part = run_chunk([seed], {switch: True}, seed_timeout)
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


def chunks_of(seeds: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(seeds), size):
        yield seeds[i:i + size]


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
         chunk: int = CHUNK, echo: Any = print, memory_cap: int | None = MEMORY_CAP,
         seed_timeout: float | None = SEED_TIMEOUT_S, resume: bool = False) -> Atlas:
    """Runs ``seeds`` over ``jobs`` processes and the canary; returns the atlas (also written to ``out``).

    With ``resume``, the atlas in ``out`` is read first and the seeds it covers are not run again.
    """
    atlas = Atlas()
    path = os.path.join(out, "atlas.json")
    if resume and os.path.exists(path):
        with open(path) as fh:
            atlas = Atlas.from_json(json.load(fh))
        echo(f"resuming: {len(atlas.done)} seeds already covered", flush=True)
    atlas.register(known_rows())
    title = f"Simulator soak: seeds {seeds.start}..{seeds.stop}, {jobs} worker(s)"
    t0 = last = time.monotonic()
    left = [s for s in seeds if s not in atlas.done]
    total = len(left)
    todo = collections.deque(chunks_of(left, chunk))
    # Seeds that were in flight when a worker died: run again one at a time, alone.
    suspects: collections.deque[int] = collections.deque()
    canary_due = bool(canary) and atlas.canary is None
    done_seeds = 0
    # spawn: fresh workers (no copy of this process's state), recycled now and then so that a
    # slow leak in one long-lived worker cannot grow without bound.
    ctx = multiprocessing.get_context("spawn")
    while todo or suspects or canary_due:
        pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, max_tasks_per_child=10,
                                      initializer=limit_worker, initargs=(memory_cap,))
        running: dict[cf.Future[Any], list[int] | None] = {}  # None: the canary
        broken = False
        # A worker hit the memory cap: nothing new is submitted; once what runs is in, a new pool.
        retiring = False
        try:
            if canary_due and canary:
                running[pool.submit(run_canary, canary, seed_timeout)] = None
            while not broken:
                if retiring:
                    pass
                elif suspects:
                    if not any(c is not None for c in running.values()):
                        seed = suspects.popleft()
                        running[pool.submit(run_chunk, [seed], None, seed_timeout)] = [seed]
                else:
                    while len(running) < 2 * jobs and todo:  # a short queue: seeds finish roughly in order
                        batch = todo.popleft()
                        running[pool.submit(run_chunk, batch, None, seed_timeout)] = batch
                if not running:
                    break
                finished, _ = cf.wait(running, timeout=every, return_when=cf.FIRST_COMPLETED)
                for f in finished:
                    c = running.pop(f)
                    try:
                        result = f.result()
                    except cf.process.BrokenProcessPool:
                        broken = True
                        _after_death(c, running, suspects, atlas, echo)
                        break
                    if c is None:
                        atlas.canary, canary_due = result, False
                        echo(f"canary: {atlas._canary_text()}", flush=True)
                        continue
                    unrun = result.get("unrun", [])
                    done_seeds += len(c) - len(unrun)
                    atlas.merge(result)
                    if result.get("poisoned"):
                        retiring = True
                        suspects.extend(unrun)
                        echo(f"a worker reached the memory cap at seed {c[len(c) - len(unrun)] if unrun else c[0]}: "
                             f"{len(unrun)} seed(s) run again alone, in a new pool", flush=True)
                    for fail in result["failures"]:
                        echo(f"FAILED seed {fail['seed']} ({fail['checker']}): {fail['message']}", flush=True)
                now = time.monotonic()
                if now - last >= every or not running:
                    last = now
                    rate = done_seeds / max(now - t0, 1e-9)
                    eta = (total - done_seeds) / rate if rate else float("inf")
                    echo(f"[{time.strftime('%H:%M:%S')}] {done_seeds}/{total} seeds, {rate:.2f} seeds/s, "
                         f"{len(atlas.failures)} failing, ETA {eta / 60:.0f} min", flush=True)
                    _write(out, atlas, title)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    _write(out, atlas, title)
    return atlas


def _after_death(culprit: list[int] | None, running: dict[cf.Future[Any], list[int] | None],
                 suspects: collections.deque[int], atlas: Atlas, echo: Any) -> None:
    """A worker died (the pool is broken): what was in flight runs again, seed by seed.

    A seed that was alone in the pool when it broke killed its worker: it is recorded as failed.
    """
    alone = culprit is not None and len(culprit) == 1 and all(c is None for c in running.values())
    if alone:
        assert culprit is not None
        atlas.failures.append(Failure(culprit[0], "(worker died)",
                                      "the worker process running this seed died (killed by the kernel: "
                                      "see dmesg for the OOM killer; or the interpreter crashed)"))
        atlas.done.add(culprit[0])
        echo(f"FAILED seed {culprit[0]} ((worker died)): its worker process died", flush=True)
    elif culprit is not None:
        suspects.extend(culprit)
    for c in running.values():
        if c is not None:
            suspects.extend(c)
    running.clear()
    echo(f"a worker died; {len(suspects)} seed(s) in flight run again one at a time", flush=True)


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
    p.add_argument("--memory-cap", default=f"{MEMORY_CAP >> 30}GiB",
                   help="address space of each worker (e.g. 4GiB; 0 for none): a seed past it fails")
    p.add_argument("--seed-timeout", type=float, default=SEED_TIMEOUT_S,
                   help="wall-clock seconds a seed may take (0 for none): a seed past it fails")
    p.add_argument("--resume", action="store_true", help="continue the soak in --out, skipping the seeds it covers")
    args = p.parse_args(argv)
    if args.canary:
        parse_canary(args.canary)
    if args.jobs < 1 or args.chunk < 1:
        p.error("--jobs and --chunk must be at least 1")
    from fusee.sizes import to_bytes

    cap = to_bytes(args.memory_cap, "--memory-cap") if args.memory_cap not in ("0", "") else None
    atlas = soak(args.seeds, jobs=args.jobs, out=args.out, canary=args.canary or None,
                 every=args.every, chunk=args.chunk, memory_cap=cap,
                 seed_timeout=args.seed_timeout or None, resume=args.resume)
    print(atlas.markdown(title=f"Simulator soak: seeds {args.seeds.start}..{args.seeds.stop}", limit=args.rows))
    print(f"atlas written to {os.path.join(args.out, 'atlas.md')} (and atlas.json)")
    if args.canary and not atlas.canary:
        print(f"the canary {args.canary} passed: the checkers are not live", file=sys.stderr)
        return 2
    return 1 if atlas.failures else 0


if __name__ == "__main__":
    sys.exit(main())
