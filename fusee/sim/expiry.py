"""Several engines on one namespace whose lease expires: owners paused past the TTL, takeovers, fencing.

    python -m fusee.sim.expiry --seeds 0..200 [--verbose]

The PostgreSQL backend's model on a simulated disk and clock: one lease row
(:mod:`fusee.scale.expiring`, the rules the backend's SQL applies), several
processes each with its own event loop, the real engine and the real routed
calls, delayed both ways. The owner renews every third of the TTL from its own loop; standbys try
to take the lease at jittered intervals. A seed pauses owners (as ``SIGSTOP``,
a GC pause or a partition would: their loop stops while the clock goes on) for
less or more than the TTL, and kills some. A paused owner's flush already on its
way to the server is committed on time (the server does not pause), and the owner
hears of it when it wakes, its clock jumped: the steps that flush released are
due then, as are flushes, checkpoints and renewals, after a takeover perhaps.
The fence must refuse the writes, and the owner must begin no step. Starts are
routed to whoever holds the lease and sent again when their answer was lost.
Checkers:

- one owner per epoch, and epochs grow;
- stale epochs refused: no write (flush, checkpoint) is accepted from a writer
  that did not hold the lease at that moment (sabotage
  ``append_skips_epoch_check`` breaks it);
- a lapsed lease is never revived: a renewal succeeds only before expiry
  (sabotage ``renewal_ignores_expiry`` breaks it);
- no step acts without the lease: a step's function begins only in the process
  that holds the lease at that moment, so no step runs again once a later owner
  recorded it (sabotage ``step_ignores_lease_deadline`` breaks it);
- nothing acknowledged is lost: every acknowledged start is in every later
  owner's recovery, and every start completes with its result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
from collections.abc import Awaitable
from typing import Any

import fusee
from fusee import codec
from fusee.errors import FuseeError, LeaseLost, NotFound
from fusee.scale import expiring
from fusee.scale.server import dispatch
from fusee.sim.env import SimEnv
from fusee.sim.loop import SimLoop
from fusee.sim.scaleout import ScaleFailure, open_options, seeds_main, trace_hash
from fusee.storage.holding import Holding
from fusee.storage.simdisk import SimDisk

DATA = "/namespace"
#: The sabotage switches this simulator catches.
SWITCHES = ("append_skips_epoch_check", "renewal_ignores_expiry", "step_ignores_lease_deadline")
TTL = 1.0
#: The world's clock advances in steps this long; each running process's loop catches up at each.
_STEP = 0.002
_SETTLE_S = 120.0


class ExpiryFailure(ScaleFailure):
    module = "fusee.sim.expiry"


#: The world whose seed is running: the job's steps tell it of their effects.
_WORLD: ExpiryWorld | None = None


def _effect(wid: str, step: str, value: int) -> int:
    if _WORLD is not None:
        _WORLD.effect(wid, step)
    return value


@fusee.workflow("sim-expiry-job")
async def job(ctx: fusee.Ctx, x: int) -> int:
    a = await ctx.step("a", lambda: _effect(ctx.workflow_id, "a", x + 1))
    return await ctx.step("b", lambda: _effect(ctx.workflow_id, "b", a * 2))


@dataclasses.dataclass
class _Start:
    wid: str
    x: int
    at: float
    tries: int = 0
    acked_by: int | None = None  # the epoch of the owner that acknowledged it
    #: The process it was last sent to, while its answer has not come (a dead or replaced owner's
    #: answer never comes: then it is sent again).
    via: Any = None


@dataclasses.dataclass
class _Proc:
    name: str
    loop: SimLoop
    env: SimEnv
    engine: Any = None
    epoch: int = 0
    opening: asyncio.Task[Any] | None = None
    #: Its engine's deadline for acting under its lease, on its own clock.
    holding: Holding | None = None
    paused_until: float = 0.0
    #: Paused, and not yet woken (its clock jumps when it wakes).
    stopped: bool = False
    dead: bool = False
    next_try: float = 0.0


@dataclasses.dataclass
class ExpiryResult:
    seed: int
    processes: int
    takeovers: int
    pauses: int
    fenced: int
    starts: int
    #: Step effects, and writes a paused owner's server committed while it was stopped.
    effects: int
    committed_while_paused: int
    trace: list[str]

    @property
    def trace_hash(self) -> str:
        return trace_hash(self.trace)


class ExpiryWorld:
    def __init__(self, seed: int, verbose: bool = False) -> None:
        self.seed, self.verbose = seed, verbose
        self.rng = random.Random(f"expiry-{seed}")
        self.disk = SimDisk(random.Random(f"expiry-disk-{seed}"))
        self.row = expiring.LeaseRow()
        self.now = 0.0
        self.duration = self.rng.uniform(6.0, 14.0)
        self.trace: list[str] = []
        self.owners: dict[int, str] = {}
        self.takeovers = self.pauses = self.fenced = 0
        self.effects = self.committed_while_paused = 0
        #: The process whose loop runs now (a step's effect happens in it).
        self._acting: _Proc | None = None
        #: Processes that died or were restarted (their loops are buried at the end).
        self.gone: list[_Proc] = []
        #: Broken promises seen inside engine calls (raised by the world at its next step).
        self.violations: list[str] = []
        self.procs = [self._proc(f"p{i}") for i in range(self.rng.randint(2, 4))]
        self.starts = [_Start(f"j{i}", i, self.rng.uniform(0.0, self.duration))
                       for i in range(self.rng.randint(8, 30))]
        self.pause_at = sorted(self.rng.uniform(0.5, self.duration) for _ in range(self.rng.randint(1, 4)))
        #: Per pause: whether it waits (a TTL at most) for the owner to have a write on its way to
        #: the server, as a stop under load usually lands: then that write commits while it is stopped.
        self.pause_mid_write = [self.rng.random() < 0.5 for _ in self.pause_at]
        self.kill_at = sorted(self.rng.uniform(0.5, self.duration) for _ in range(self.rng.randint(0, 2)))

    def _proc(self, name: str) -> _Proc:
        loop = SimLoop(start=self.now)
        env = SimEnv(self.disk, random.Random(self.rng.getrandbits(64)), loop,
                     lambda: self.rng.uniform(0.0001, 0.003))
        return _Proc(name, loop, env, next_try=self.now + self.rng.uniform(0.0, TTL / 3))

    def log(self, text: str) -> None:
        line = f"{self.now:9.4f} {text}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    def fail(self, message: str) -> ExpiryFailure:
        return ExpiryFailure(self.seed, message, self.trace)

    # --- the lease, as the server applies it (with the checkers watching) ---------------

    def _take(self, p: _Proc) -> int | None:
        was_live = self.row.live(self.now)
        epoch = expiring.take(self.row, p.name, self.now, TTL)
        if epoch is None:
            return None
        if was_live:
            raise self.fail(f"{p.name} took a live lease (epoch {epoch})")
        if epoch in self.owners or any(e > epoch for e in self.owners):
            raise self.fail(f"{p.name} took epoch {epoch}, which is not above every earlier one")
        self.owners[epoch] = p.name
        return epoch

    def _renew(self, p: _Proc) -> bool:
        held = self.row.held_by(p.name, p.epoch, self.now)
        ok = expiring.renew(self.row, p.name, p.epoch, self.now, TTL)
        if ok and not held:
            self.violations.append(f"{p.name} renewed its lease (epoch {p.epoch}) after it had lapsed: a "
                                   "lapsed lease must be taken again under a new epoch")
        return ok

    def _fence_for(self, p: _Proc, epoch: int) -> Any:
        def fence() -> None:
            held = self.row.held_by(p.name, epoch, self.now)
            try:
                expiring.check_fence(self.row, p.name, epoch, self.now, DATA)
            except LeaseLost:
                self.fenced += 1
                self.log(f"{p.name} (epoch {epoch}) is fenced: its write is refused")
                raise
            if not held:
                # Raised here, it would only fail that engine's log: the world raises it at its next step.
                self.violations.append(
                    f"a write of {p.name} under epoch {epoch} was accepted while the lease was "
                    f"{self.row.owner}'s with epoch {self.row.epoch} (expiring at "
                    f"{self.row.expires_at:.3f}): a stale epoch wrote")
        return fence

    def effect(self, wid: str, step: str) -> None:
        """A step's function began: only the process holding the lease may act, at that moment."""
        p = self._acting
        assert p is not None, "a step ran outside every process's loop"
        self.effects += 1
        t = p.loop.time()
        if not self.row.held_by(p.name, p.epoch, t):
            self.violations.append(
                f"{p.name} (epoch {p.epoch}) began step {step!r} of {wid} at {t:.4f} while the lease "
                f"was {self.row.owner}'s with epoch {self.row.epoch} (expiring at "
                f"{self.row.expires_at:.3f}): a process that no longer held the lease acted, and the "
                "owner that took over runs the same step")

    # --- processes ----------------------------------------------------------------------

    def _running(self, p: _Proc) -> bool:
        return not p.dead and p.paused_until <= self.now

    def _step(self) -> None:
        if self.violations:
            raise self.fail(self.violations[0])
        self.now += _STEP
        for p in self.procs:
            if not p.dead and not self._running(p):
                # Stopped, its server is not: what it sent before the pause commits on time.
                done = p.env.io_done
                p.env.complete_io_until(self.now)
                self.committed_while_paused += p.env.io_done - done
            if self._running(p):
                if p.stopped:
                    p.stopped = False
                    p.loop.resume_at(p.paused_until)
                    self.log(f"{p.name} wakes")
                self._acting = p
                try:
                    p.loop.run_until(self.now)
                finally:
                    self._acting = None
                if p.loop.errors:
                    raise self.fail(f"{p.name}: {p.loop.errors[0].get('message')}: "
                                    f"{p.loop.errors[0].get('exception')!r}")
        for i, p in enumerate(self.procs):
            if self._running(p) and p.engine is not None and p.engine._log.failed is not None:
                # Its engine lost the lease: the app's supervisor restarts the process, which
                # opens the namespace again (as a standby while another engine holds it).
                self.log(f"{p.name} restarts after its engine failed ({type(p.engine._log.failed).__name__})")
                p.dead = True
                self.gone.append(p)
                self.procs[i] = self._proc(f"{p.name}'")
        for p in self.procs:
            if self._running(p):
                self._standby(p)

    def _standby(self, p: _Proc) -> None:
        if p.engine is not None or p.opening is not None or self.now < p.next_try:
            if p.opening is not None and p.opening.done():
                self._opened(p)
            return
        p.next_try = self.now + self.rng.uniform(TTL / 3, TTL)
        epoch = self._take(p)
        if epoch is None:
            return
        self.takeovers += 1
        p.epoch = epoch
        p.holding = Holding(TTL, p.env.monotonic)
        p.holding.held(p.loop.time())
        self.log(f"{p.name} takes the lease, epoch {epoch}")
        # The lease row is the lock here: the disk's lock is only shared, so that every process
        # may hold it (it names the directory the engine then writes through).
        lock = self.disk.lock(DATA, shared=True)
        options = {**open_options(), "workflows": [job], "env": p.env, "_lock": lock, "_epoch": epoch,
                   "park_after": None, "segment_bytes": 1 << 20, "_fence": self._fence_for(p, epoch),
                   "_holding": p.holding}
        p.opening = p.loop.create_task(_run(fusee.Engine._open(DATA, **options)))

    def _opened(self, p: _Proc) -> None:
        task, p.opening = p.opening, None
        assert task is not None
        err = task.exception()
        if err is not None:
            if isinstance(err, LeaseLost) or (isinstance(err, FuseeError) and "lease" in str(err)):
                self.log(f"{p.name} lost the lease while it recovered")
                return
            raise self.fail(f"{p.name} could not open as owner: {type(err).__name__}: {err}")
        p.engine = task.result()
        self.log(f"{p.name} recovered and serves (epoch {p.epoch})")
        for s in self.starts:
            if s.acked_by is not None:
                try:
                    p.engine.describe(s.wid)
                except NotFound:
                    raise self.fail(f"{s.wid} was acknowledged (epoch {s.acked_by}) and is lost for "
                                    f"{p.name} (epoch {p.epoch})") from None
        assert p.holding is not None
        p.loop.create_task(self._renewals(p, p.engine, p.epoch, p.holding))

    async def _renewals(self, p: _Proc, engine: Any, epoch: int, holding: Holding) -> None:
        while True:
            await asyncio.sleep(TTL / 3)
            if engine._closed or p.epoch != epoch:
                return
            sent = p.loop.time()
            # A statement's round trip: the server judges it when it arrives, and the engine's
            # loop goes on meanwhile (a woken owner runs what fell due before it hears back).
            await asyncio.sleep(self.rng.uniform(0.0002, 0.004))
            renewed = self._renew(p)
            await asyncio.sleep(self.rng.uniform(0.0002, 0.004))
            if engine._closed or p.epoch != epoch:
                return
            if renewed:
                holding.held(sent)
                continue
            holding.drop()
            self.log(f"{p.name} finds its lease (epoch {epoch}) gone and stops serving")
            if engine._log.failed is None:
                engine._log._fail(LeaseLost(f"the lease of {DATA} (epoch {epoch}) was lost"))
            return

    def _owner(self) -> _Proc | None:
        for p in self.procs:
            if p.engine is not None and p.name == self.row.owner and p.epoch == self.row.epoch:
                return p
        return None

    def _route(self, s: _Start) -> None:
        p = self._owner()
        if p is None or s.via is p or s.acked_by is not None:
            return
        s.via = p
        s.tries += 1
        p.loop.create_task(self._send(p, s))

    async def _send(self, p: _Proc, s: _Start) -> None:
        """A follower's start: delayed on its way to the owner and back (an answer lost with its
        owner means the start is sent again)."""
        args = [[job.name, job.version], s.wid, codec.encode(s.x), "fail", "fail", None, s.tries > 1]
        epoch = p.epoch
        try:
            await asyncio.sleep(self.rng.uniform(0.0, 0.01))
            await dispatch(p.engine, "start", args)
            await asyncio.sleep(self.rng.uniform(0.0, 0.01))
        except FuseeError as e:
            self.log(f"start of {s.wid} through {p.name} failed ({type(e).__name__}): sent again later")
            return
        finally:
            if s.via is p:
                s.via = None
        if s.acked_by is None:
            s.acked_by = epoch
            self.log(f"{s.wid} acknowledged by {p.name} (epoch {epoch})")

    # --- faults -------------------------------------------------------------------------

    def _pause_owner(self) -> None:
        p = self._owner()
        if p is None or not self._running(p):
            return
        span = self.rng.choice([0.2, 0.5, 1.2, 1.6, 2.5]) * TTL
        p.paused_until = self.now + span
        p.stopped = True
        self.pauses += 1
        self.log(f"{p.name} (epoch {p.epoch}) is paused for {span:.2f} s")

    def _kill_owner(self) -> None:
        p = self._owner()
        if p is None:
            return
        self.log(f"{p.name} (epoch {p.epoch}) dies")
        p.dead = True
        self.gone.append(p)
        self.disk.crash_process()
        i = self.procs.index(p)
        self.procs[i] = self._proc(f"{p.name}'")  # the supervisor starts a new process

    # --- the run --------------------------------------------------------------------------

    def run(self) -> ExpiryResult:
        global _WORLD
        _WORLD = self
        try:
            return self._run()
        except ExpiryFailure:
            raise
        except Exception as e:
            raise self.fail(f"{type(e).__name__}: {e}") from e
        finally:
            _WORLD = None
            self._bury()

    def _bury(self) -> None:
        """Disposes of every process's coroutines and lets go of its engine's table (no engine
        here is closed: its table would keep its runs, loop and world alive)."""
        for p in self.gone + self.procs:
            p.loop.bury()
            engine = p.engine if p.engine is not None else None
            if engine is not None:
                engine._rt.release_table()
        self.gone.clear()

    def _run(self) -> ExpiryResult:
        self.disk.makedirs(DATA)
        self.disk.fsync_dir("/")
        self.log(f"{len(self.procs)} processes, {len(self.starts)} starts, {self.duration:.1f} s, TTL {TTL} s")
        pauses, kills = list(zip(self.pause_at, self.pause_mid_write, strict=True)), list(self.kill_at)
        while self.now < self.duration:
            self._step()
            if pauses and self.now >= pauses[0][0]:
                at, mid_write = pauses[0]
                owner = self._owner()
                if not mid_write or owner is None or owner.env.io_in_flight or self.now - at > TTL:
                    pauses.pop(0)
                    self._pause_owner()
            if kills and self.now >= kills[0]:
                kills.pop(0)
                self._kill_owner()
            for s in self.starts:
                if s.at <= self.now:
                    self._route(s)
        # Faults end: paused processes resume, every start is sent until acknowledged.
        deadline = self.now + _SETTLE_S
        while any(s.acked_by is None for s in self.starts):
            if self.now > deadline:
                raise self.fail("starts were never acknowledged after the faults ended")
            self._step()
            for s in self.starts:
                self._route(s)
        self._finish(deadline)
        return ExpiryResult(self.seed, len(self.procs), self.takeovers, self.pauses, self.fenced,
                            len(self.starts), self.effects, self.committed_while_paused, self.trace)

    def _finish(self, deadline: float) -> None:
        results: dict[str, Any] = {}

        async def collect(engine: Any) -> None:
            for s in self.starts:
                _wtype, _version, data = await dispatch(engine, "result", [s.wid])
                results[s.wid] = codec.decode(data)

        while True:
            p = self._owner()
            if p is not None and self._running(p):
                task = p.loop.create_task(collect(p.engine))
                while not task.done() and self._owner() is p and self._running(p):
                    if self.now > deadline:
                        raise self.fail("the results never came")
                    self._step()
                if task.done() and task.exception() is None:
                    break
                if task.done():
                    self.log(f"results through {p.name}: {type(task.exception()).__name__}; asked again")
            if self.now > deadline:
                raise self.fail("no process serves after the faults ended")
            self._step()
        for s in self.starts:
            if results[s.wid] != (s.x + 1) * 2:
                raise self.fail(f"{s.wid} returned {results[s.wid]!r}, not {(s.x + 1) * 2}")
        self.log(f"all {len(self.starts)} starts completed ({self.takeovers} owners, {self.fenced} writes fenced)")


async def _run(aw: Awaitable[Any]) -> Any:
    return await aw


def run_seed(seed: int, *, verbose: bool = False) -> ExpiryResult:
    """Runs one seed; raises :class:`ExpiryFailure` naming the broken promise."""
    return ExpiryWorld(seed, verbose).run()


def main(argv: list[str] | None = None) -> int:
    return seeds_main(argv, __doc__, run_seed, ExpiryFailure,
                      lambda r: f"{r.processes} processes, {r.takeovers} owners, {r.pauses} pauses, "
                                f"{r.fenced} writes fenced, {r.committed_while_paused} committed while paused")

if __name__ == "__main__":
    sys.exit(main())
