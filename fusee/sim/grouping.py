"""Group commit across runs: a quiet world, then many runs taking turns, then a crash.

    python -m fusee.sim.grouping --seeds 0..200 [--verbose]

The main world (``fusee.sim.world``) is never quiet and rarely in lockstep, so
two promises of group commit do not show there. A seed here picks a flush
mode (inline, background or pipeline), a kind of step function (synchronous
lambdas run on the loop's thread, each costing it 10 to 60 µs, synchronous functions that hold the loop's
thread longer than a flush, async functions that return at once, or async
functions that suspend, so that executions are in flight when a flush could
start), and then runs, on the real engine over a simulated disk and clock:

1. *alone*: one chain of steps with nothing else in the world;
2. *together*: N chains of S steps started at once, taking turns;
3. a crash (process or power) at a seeded moment of a second round of chains,
   and a reopen that finishes them.

Checkers:

- *nothing is left waiting*: whenever the loop goes idle, no appended record
  lacks a flush that takes it (in flight, scheduled or held for producers):
  a record must never wait for something that will not come (sabotage
  ``no_flush_after_direct_step`` breaks it in the quiet phase);
- *one flush per round*: with N chains of steps that do not suspend or hold, the
  together phase takes at most S + 8 flushes, not one per chain and step
  (sabotage ``flush_before_producers`` breaks it: each chain flushes alone; so would
  handing what is pending to the log's thread once a round's cheap functions added up
  past one flush time, sabotage ``hand_off_splits_rounds``: the chains then split into
  groups taking turns);
- *an outcome is not held behind step functions*: with functions that hold
  the loop's thread, a step that ended more than ``_late_bound`` before the
  crash is durable (it does not run again after it): what is pending goes
  to the disk while the next function holds the thread, rather than after
  all of them (sabotage ``inline_step_holds_flush`` breaks it);
- *nothing acknowledged is lost, results never change*: every start
  acknowledged before the crash is there after it, and every chain returns
  its sum.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import fusee
from fusee.errors import NotFound
from fusee.sim.env import SimEnv
from fusee.sim.loop import SimLoop, run_within
from fusee.sim.scaleout import ScaleFailure, seeds_main, trace_hash
from fusee.storage.simdisk import SimDisk

DATA = "/grouped"
#: The sabotage switches this simulator catches (the main world does not see them).
SWITCHES = ("flush_before_producers", "inline_step_holds_flush", "hand_off_splits_rounds")
#: Flushes the together phase may take beyond one per step round (starts, ends, a checkpoint).
SLACK = 8
_HANG_S = 120.0
#: The longest a simulated flush takes.
_MAX_FLUSH_S = 0.0003


#: Called with (workflow ID, step number) by each blocking step function (set by the world that runs).
_executed: Callable[[str, int], None] | None = None


def _work(wid: str, v: int) -> int:
    if _executed is not None:
        _executed(wid, v)
    return v + 1


async def _bump(v: int) -> int:
    return v + 1


async def _nap(v: int) -> int:
    await asyncio.sleep(0.00005 * (v % 3))  # suspends (even sleep(0) does): a task carries it
    return v + 1


@fusee.workflow("sim-group-chain")
async def chain(ctx: fusee.Ctx, job: tuple[int, str]) -> int:
    steps, kind = job
    v = 0
    for _ in range(steps):
        if kind == "sync":
            v = await ctx.step("s", lambda v=v: v + 1)
        elif kind == "blocking":
            v = await ctx.step("b", lambda v=v: _work(ctx.workflow_id, v))
        elif kind == "async":
            v = await ctx.step("a", _bump, v)
        else:
            v = await ctx.step("n", _nap, v)
    # A durable timer right after a step that ran within the run's turn: only a flush
    # request of its own gets it on disk while nothing else happens.
    await ctx.sleep("rest", "1ms")
    return v


class GroupingFailure(ScaleFailure):
    module = "fusee.sim.grouping"


@dataclasses.dataclass
class GroupingResult:
    seed: int
    mode: str
    kind: str
    chains: int
    steps: int
    #: Flushes of the together phase, and the records they carried.
    together_flushes: int
    together_records: int
    crash: str
    trace: list[str]

    @property
    def trace_hash(self) -> str:
        return trace_hash(self.trace)


class GroupingWorld:
    def __init__(self, seed: int, verbose: bool = False) -> None:
        self.seed, self.verbose = seed, verbose
        self.rng = random.Random(f"grouping-{seed}")
        self.disk = SimDisk(random.Random(f"grouping-disk-{seed}"))
        self.mode = self.rng.choice(["inline", "background", "pipeline"])
        self.kind = self.rng.choice(["sync", "blocking", "async", "suspending"])
        # Blocking functions hold the loop's thread 0.4 to 1.5 ms: longer than a flush, short
        # enough to stay inline (syncsteps.DEMOTE_ABOVE_S).
        self.max_hold = 0.0015 if self.kind == "blocking" else 0.0
        self.hold_rng = random.Random(f"grouping-hold-{seed}")
        self.last_hold = 0.0
        # A synchronous lambda costs the loop's thread a little (the engine's own work around
        # a step: 10 to 60 µs, less than a flush), so the chains' turns in one round add up past
        # a flush time, as on a real machine: a flush must still wait for all of them.
        self.cpu_rng = random.Random(f"grouping-cpu-{seed}")
        #: (workflow ID, step number) -> when the step function ended, per life.
        self.executions: list[dict[tuple[str, int], float]] = []
        self.chains = self.rng.randint(3, 10)
        self.steps = self.rng.randint(10, 30)
        self.crash = self.rng.choice(["process", "power"])
        self.trace: list[str] = []
        self.t = 0.0
        #: Crashed lives: their loops and engines, freed by ``bury``.
        self.dead: list[tuple[SimLoop, Any]] = []
        self.idle_violation: str | None = None

    def log(self, text: str) -> None:
        line = f"{self.t:9.4f} {text}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    def fail(self, message: str) -> GroupingFailure:
        return GroupingFailure(self.seed, message, self.trace)

    def run(self) -> GroupingResult:
        try:
            return self._run()
        except GroupingFailure:
            raise
        except Exception as e:
            raise self.fail(f"{type(e).__name__}: {e}") from e
        finally:
            self.bury()

    def bury(self) -> None:
        """Frees the crashed lives (a crashed engine is never closed: its table holds its runs)."""
        for loop, engine in self.dead:
            loop.bury()
            engine._rt.release_table()
        self.dead.clear()

    def _hold(self) -> float:
        hold, self.last_hold = self.last_hold, 0.0
        return hold

    def _cpu(self) -> float:
        return self.cpu_rng.uniform(0.00001, 0.00006)

    def _step_latency(self) -> Callable[[], float] | None:
        """How long each step function holds the loop's thread, per kind (None: no time)."""
        if self.max_hold:
            return self._hold
        return self._cpu if self.kind == "sync" else None

    def _late_bound(self) -> float:
        """How long after its function ended a step's outcome may still not be durable.

        An outcome appended as its function returns waits for producers one flush
        time at most, counting the function about to hold the thread, so at most
        that function; then a flush takes it, possibly behind one in flight.
        """
        return self.max_hold + 3 * _MAX_FLUSH_S

    # --- a life -----------------------------------------------------------------

    def _open(self) -> tuple[SimLoop, Any]:
        loop = SimLoop(start=self.t)
        env = SimEnv(self.disk, random.Random(self.rng.getrandbits(64)), loop,
                     lambda: self.rng.uniform(0.00005, _MAX_FLUSH_S),
                     inline_sync_steps=True, flush_mode=self.mode,
                     step_latency=self._step_latency())
        ran: dict[tuple[str, int], float] = {}
        self.executions.append(ran)

        def executed(wid: str, v: int) -> None:
            # The function's effect happens as it is called; the hold follows (SimEnv.call_inline).
            self.last_hold = self.hold_rng.uniform(0.0004, self.max_hold)
            ran[(wid, v)] = loop.now + self.last_hold

        global _executed
        _executed = executed
        engine = self._drive(loop, fusee.Engine.open(DATA, workflows=[chain], env=env, park_after=None,
                                                       segment_bytes=1 << 20),
                             "recovery")
        loop.idle_hook = lambda: self._check_idle(loop, engine)
        return loop, engine

    def _drive(self, loop: SimLoop, aw: Awaitable[Any], what: str) -> Any:
        task = run_within(loop, aw, _HANG_S)
        if not task.done():
            raise self.fail(f"{what} did not finish within {_HANG_S:.0f} simulated seconds"
                            + (f" ({self.idle_violation})" if self.idle_violation else ""))
        self.t = loop.now
        if self.idle_violation is not None:
            raise self.fail(self.idle_violation)
        return task.result()

    def _check_idle(self, loop: SimLoop, engine: Any) -> None:
        """The loop is idle: every appended record must have a flush taking it."""
        log, committer = engine._rt.log, engine._rt.committer
        if (self.idle_violation is None and log.failed is None and log.has_pending()
                and not log.flushing and not committer.flushing and not committer.holding):
            self.idle_violation = (
                f"at {loop.now:.6f}s the loop went idle with {log.pending_records} appended record(s) "
                "that no flush was taking, asked to take or held for: they wait for something that "
                "will not come")

    def _check_not_held(self, crashed_at: float) -> None:
        """A step that ended long enough before the crash did not run again after it."""
        if len(self.executions) < 2:
            return
        before, after = self.executions[-2], self.executions[-1]
        bound = self._late_bound()
        for key in sorted(set(before) & set(after)):
            ended = before[key]
            if ended < crashed_at - bound:
                raise self.fail(
                    f"step {key[1]} of {key[0]} ended at {ended * 1000:.3f} ms, {(crashed_at - ended) * 1000:.3f} ms "
                    f"before the crash (more than {bound * 1000:.3f} ms), and ran again after it: its outcome "
                    "waited behind other step functions holding the loop's thread instead of going to the disk")

    # --- the phases -------------------------------------------------------------------

    async def _chains(self, engine: Any, prefix: str, n: int) -> list[str]:
        handles = await asyncio.gather(*(engine.start(chain, f"{prefix}{i}", (self.steps, self.kind))
                                         for i in range(n)))
        return [h.workflow_id for h in handles]

    async def _results(self, engine: Any, wids: list[str]) -> None:
        for wid in wids:
            got = await engine.get(wid).result()
            if got != self.steps:
                raise self.fail(f"{wid} returned {got!r}, not {self.steps}")

    def _run(self) -> GroupingResult:
        self.log(f"flush={self.mode} steps={self.kind} chains={self.chains} x {self.steps} steps, "
                 f"then a {self.crash} crash")
        loop, engine = self._open()
        committer = engine._rt.committer

        async def alone() -> None:
            await self._results(engine, await self._chains(engine, "solo", 1))

        self._drive(loop, alone(), "the lone chain")
        self.log(f"alone: {committer.flushes} flushes")

        before_f, before_r = committer.flushes, committer.records_flushed

        async def together() -> None:
            await self._results(engine, await self._chains(engine, "c", self.chains))

        self._drive(loop, together(), "the chains together")
        flushes = committer.flushes - before_f
        records = committer.records_flushed - before_r
        self.log(f"together: {flushes} flushes for {records} records "
                 f"({committer.holds} holds, {committer.holds_expired} ran out)")
        # Functions that hold the thread longer than a flush get a flush each, by design.
        if self.kind != "blocking" and flushes > self.steps + SLACK:
            raise self.fail(f"{self.chains} chains of {self.steps} steps took {flushes} flushes for "
                            f"{records} records: a flush did not wait for the runs about to append "
                            f"(at most {self.steps + SLACK} expected)")

        # A second round, cut by a crash at a seeded moment.
        acked: list[str] = []

        async def started() -> None:
            acked.extend(await self._chains(engine, "k", self.chains))

        self._drive(loop, started(), "the second round's starts")
        # Blocking chains run one function at a time: cut them well into the round.
        span = self.chains * self.steps * self.max_hold / 2 if self.max_hold else 0.003
        self.t = loop.run_until(loop.now + self.rng.uniform(0.0, span))
        crashed_at = self.t
        self.log(f"{self.crash} crash with {len(acked)} acknowledged chains running")
        if self.crash == "process":
            self.disk.crash_process()
        else:
            self.disk.crash()
        self.dead.append((loop, engine))
        loop, engine = self._open()
        for wid in acked:
            try:
                engine.describe(wid)
            except NotFound:
                raise self.fail(f"{wid} was acknowledged before the crash and is lost") from None
        self._drive(loop, self._results(engine, acked), "the chains after the crash")
        self._check_not_held(crashed_at)
        self._drive(loop, engine.close(), "closing")
        self.log("every chain returned its sum")
        return GroupingResult(self.seed, self.mode, self.kind, self.chains, self.steps,
                              flushes, records, self.crash, self.trace)


def run_seed(seed: int, *, verbose: bool = False) -> GroupingResult:
    """Runs one seed; raises :class:`GroupingFailure` naming the broken promise."""
    return GroupingWorld(seed, verbose).run()


def main(argv: list[str] | None = None) -> int:
    return seeds_main(argv, __doc__, run_seed, GroupingFailure,
                      lambda r: (f"{r.mode}/{r.kind} {r.chains}x{r.steps}: {r.together_flushes} flushes "
                                 f"for {r.together_records} records"))


if __name__ == "__main__":
    sys.exit(main())
