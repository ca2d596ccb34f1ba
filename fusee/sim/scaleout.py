"""Several processes on one simulated engine directory: the lease, takeover, routed calls.

    python -m fusee.sim.scaleout --seeds 0..200 [--verbose]

A seed picks how many processes share the directory, how many owners it has
in turn (each dies: a process crash, or a power loss that drops what was not
synced) and a set of workflow starts the followers route to the owner, each
delayed on the way there and back. When the owner dies, its lock goes with it
(as the kernel releases a ``flock``); a follower takes the lease under the next
epoch and recovers the directory; calls whose answer was lost are sent again
(a start says so: the owner then answers for a run it already has with the
same input). Checkers:

- one owner at a time: while a process holds the lease, nobody else gets it;
- epochs grow: each owner's epoch is larger than every earlier one's
  (sabotage ``epoch_not_durable`` breaks it);
- nothing acknowledged is lost: every start a follower acknowledged is still
  there after every takeover, and every start completes with its result.

The owner side is the real engine and the real routed calls
(:func:`fusee.scale.server.dispatch`); the socket is replaced by delays.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import inspect
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import fusee
from fusee import codec
from fusee.errors import DirectoryLocked, FuseeError, NotFound
from fusee.scale.server import dispatch
from fusee.sim.env import SimEnv
from fusee.sim.loop import SimLoop, run_within
from fusee.storage.directory import bump_epoch, read_epoch
from fusee.storage.simdisk import SimDisk

DATA = "/scaled"
#: The sabotage switches this simulator (not the single-process world) must catch.
SWITCHES = ("epoch_not_durable",)
_HANG_S = 120.0


@fusee.workflow("sim-scale-job")
async def job(ctx: fusee.Ctx, x: int) -> int:
    a = await ctx.step("a", lambda: x + 1)
    return await ctx.step("b", lambda: a * 2)


class SimLease:
    """The local lease (:class:`fusee.scale.lease.Lease`) on a simulated disk: its lock table
    plays the ``flock``, which a process crash releases."""

    def __init__(self, disk: SimDisk, path: str, board: dict[str, str]) -> None:
        self.disk, self.path, self.board = disk, path, board
        self.epoch = 0
        self.handle: Any = None

    def try_acquire(self) -> bool:
        try:
            self.handle = self.disk.lock(self.path)
        except DirectoryLocked:
            return False
        self.epoch = bump_epoch(self.disk, self.path)
        return True

    def wait_acquire(self, stop: Any) -> bool:
        return self.try_acquire()  # no threads in a simulation: the world asks when the owner died

    def still_held(self) -> bool:
        return self.handle is not None and read_epoch(self.disk, self.path) == self.epoch

    def publish(self, address: str) -> None:
        self.board[self.path] = address

    def owner_address(self) -> str | None:
        return self.board.get(self.path)

    def release(self) -> None:
        if self.handle is not None:
            self.disk.unlock(self.handle)
            self.handle = None


class ScaleFailure(AssertionError):
    """A broken promise, with the seed's trace and the command that replays it."""

    #: The simulator's module (``python -m`` replays the seed).
    module = "fusee.sim.scaleout"

    def __init__(self, seed: int, message: str, trace: list[str]) -> None:
        self.seed, self.message, self.trace = seed, message, trace
        super().__init__(f"seed {seed}: {message}\n  replay: python -m {self.module} --seeds {seed} --verbose")


@dataclasses.dataclass
class _Start:
    wid: str
    x: int
    tries: int = 0
    acked_in: int | None = None


@dataclasses.dataclass
class ScaleResult:
    seed: int
    owners: int
    processes: int
    starts: int
    resent: int
    trace: list[str]

    @property
    def trace_hash(self) -> str:
        return trace_hash(self.trace)


def trace_hash(trace: list[str]) -> str:
    """A seed's trace, as a short hash (the same seed prints the same one)."""
    return hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16]


def open_options() -> dict[str, Any]:
    """``Engine.open``'s keyword options at their defaults, those the engine itself takes (a simulated
    process passes them all to ``_open``; it plays the owner-or-follower choice itself)."""
    sig = inspect.signature(fusee.Engine.open)
    own = inspect.signature(fusee.Engine._open).parameters
    return {n: p.default for n, p in sig.parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and n in own}


class ScaleWorld:
    def __init__(self, seed: int, verbose: bool = False) -> None:
        self.seed, self.verbose = seed, verbose
        self.rng = random.Random(f"scale-{seed}")
        self.disk = SimDisk(random.Random(f"scale-disk-{seed}"))
        self.board: dict[str, str] = {}
        self.processes = self.rng.randint(2, 4)
        self.owners = self.rng.randint(2, 5)
        self.starts = [_Start(f"j{i}", i) for i in range(self.rng.randint(4, 24))]
        self.trace: list[str] = []
        self.t = 0.0
        self.dead: list[SimLoop] = []
        self.resent = 0

    def log(self, text: str) -> None:
        line = f"{self.t:9.4f} {text}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    def fail(self, message: str) -> ScaleFailure:
        return ScaleFailure(self.seed, message, self.trace)

    def _drive(self, loop: SimLoop, aw: Awaitable[Any], what: str) -> Any:
        task = run_within(loop, aw, _HANG_S)
        if not task.done():
            raise self.fail(f"{what} did not finish within {_HANG_S:.0f} simulated seconds")
        return task.result()

    def run(self) -> ScaleResult:
        try:
            return self._run()
        except ScaleFailure:
            raise
        except Exception as e:  # a lease, an open or a call the crash left unusable
            raise self.fail(f"{type(e).__name__}: {e}") from e

    def _run(self) -> ScaleResult:
        last_epoch = 0
        self.disk.makedirs(DATA)  # the lease is the directory's own lock: it exists before anyone opens it
        self.disk.fsync_dir("/")
        for life in range(self.owners):
            final = life == self.owners - 1
            loop = SimLoop(start=self.t)
            lease = SimLease(self.disk, DATA, self.board)
            if not lease.try_acquire():
                raise self.fail("no process got the lease: the dead owner's lock was not released")
            if SimLease(self.disk, DATA, self.board).try_acquire():
                raise self.fail("two processes hold the lease of one directory")
            if lease.epoch <= last_epoch:
                raise self.fail(f"owner {life + 1} took epoch {lease.epoch}, not above the last owner's "
                                f"{last_epoch}: epochs went back")
            last_epoch = lease.epoch
            self.log(f"owner {life + 1} of {self.processes} processes takes the lease, epoch {lease.epoch}")
            env = SimEnv(self.disk, random.Random(self.rng.getrandbits(64)), loop,
                         lambda: self.rng.uniform(0.0001, 0.002))
            options = {**open_options(), "workflows": [job], "env": env, "_lock": lease.handle,
                       "_epoch": lease.epoch, "park_after": None, "segment_bytes": 1 << 20}
            engine = self._drive(loop, fusee.Engine._open(DATA, **options), "recovery")
            lease.publish(f"owner-{life + 1}")
            self._check_acknowledged(loop, engine)
            if final:
                self._drive(loop, self._finish(loop, engine, life), "the last owner's work")
                self.t = loop.now
                self._drive(loop, engine.close(), "closing")
                break
            tasks = [loop.create_task(self._route(loop, engine, s, life))
                     for s in self.starts if s.acked_in is None]
            self.t = loop.run_until(loop.now + self.rng.uniform(0.001, 0.05))
            kind = self.rng.choice(["process", "power"])
            self.log(f"owner {life + 1} dies ({kind}); {sum(not t.done() for t in tasks)} routed calls in flight")
            if kind == "process":
                self.disk.crash_process()
            else:
                self.disk.crash()
            self.dead.append(loop)
        return ScaleResult(self.seed, self.owners, self.processes, len(self.starts), self.resent, self.trace)

    async def _route(self, loop: SimLoop, engine: Any, s: _Start, life: int) -> None:
        """A follower's start: to the owner after a delay, the answer back after another."""
        await asyncio.sleep(self.rng.uniform(0.0, 0.01))
        again = s.tries > 0
        s.tries += 1
        self.resent += again
        args = [["sim-scale-job", 1], s.wid, codec.encode(s.x), "fail", "fail", None, again]
        try:
            await dispatch(engine, "start", args)
        except FuseeError as e:
            raise self.fail(f"start of {s.wid} (sent {'again' if again else 'first'}) failed: "
                            f"{type(e).__name__}: {e}") from None
        await asyncio.sleep(self.rng.uniform(0.0, 0.01))
        s.acked_in = life
        self.log(f"{s.wid} acknowledged to its follower")

    def _check_acknowledged(self, loop: SimLoop, engine: Any) -> None:
        for s in self.starts:
            if s.acked_in is None:
                continue
            try:
                engine.describe(s.wid)
            except NotFound:
                raise self.fail(f"{s.wid} was acknowledged (by owner {s.acked_in + 1}) and is lost after "
                                "the takeover") from None

    async def _finish(self, loop: SimLoop, engine: Any, life: int) -> None:
        await asyncio.gather(*(self._route(loop, engine, s, life) for s in self.starts if s.acked_in is None))
        for s in self.starts:
            _wtype, _version, data = await dispatch(engine, "result", [s.wid])
            got = codec.decode(data)
            if got != (s.x + 1) * 2:
                raise self.fail(f"{s.wid} returned {got!r}, not {(s.x + 1) * 2}")
        self.log(f"all {len(self.starts)} starts completed ({self.resent} sent again after a takeover)")


def run_seed(seed: int, *, verbose: bool = False) -> ScaleResult:
    """Runs one seed; raises :class:`ScaleFailure` naming the broken promise."""
    return ScaleWorld(seed, verbose).run()


def seeds_main(argv: list[str] | None, doc: str | None, run: Callable[..., Any],
               failure: type[BaseException], line: Callable[[Any], str]) -> int:
    """A simulator's command line: ``--seeds N`` or ``A..B`` (B excluded), ``--verbose``; stops at
    the first failing seed (printed with how to replay it) and exits 1."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0..100", help="N or A..B (B excluded)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    a, _, b = args.seeds.partition("..")
    seeds = range(int(a), int(b)) if b else range(int(a), int(a) + 1)
    for seed in seeds:
        try:
            r = run(seed, verbose=args.verbose)
        except failure as f:
            print(f, file=sys.stderr)
            return 1
        print(f"seed {seed}: {line(r)}, trace {r.trace_hash}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return seeds_main(argv, __doc__, run_seed, ScaleFailure,
                      lambda r: f"{r.owners} owners, {r.starts} starts, {r.resent} sent again")


if __name__ == "__main__":
    sys.exit(main())
