"""The simulated world: the real engine on a simulated disk and clock, a client, faults.

One process "life" is one :class:`SimLoop` with one engine opened on the
shared :class:`SimDisk`. A crash stops driving that loop forever (it is kept
referenced so that no coroutine of a dead life is finalized at a random
moment), applies the disk's crash model, and opens a new life on the same
disk: recovery. The client's requests in flight at a crash are
unacknowledged; the client sends every unacknowledged request again after
the restart, as a real client would. Checkers run after every recovery and
at the end. Everything is decided by the seed, and the trace proves it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import heapq
import inspect
import logging
import random
from collections.abc import Awaitable
from typing import Any

import fusee
from fusee import errors
from fusee.core import records as rec
from fusee.runtime.table import dedup_key
from fusee.sim import checkers, flowjobs, integrity, workload
from fusee.sim.checkers import Observed, Outcome, RunView, Snapshot
from fusee.sim.config import DATA_DIR, SimConfig
from fusee.sim.env import SimEnv
from fusee.sim.loop import SimDeadlock, SimLoop, run_within
from fusee.sim.plan import (
    FLOW_ACTIONS,
    Action,
    Call,
    Cancel,
    Complete,
    Enqueue,
    ObjectCall,
    Plan,
    ReadStream,
    Reset,
    Signal,
    Start,
    Terminate,
    Update,
)
from fusee.sim.report import Report
from fusee.storage.log import SharedLog
from fusee.storage.simdisk import SimDisk

#: Restarts in a row without progress after which a seed fails as a livelock (see
#: ``World._check_restart_progress``): far more than a fault rate of a few per mille causes.
MAX_STALLED_RESTARTS = 50

#: Longest a recovery or a snapshot may take in virtual seconds before it counts as hung.
_HANG_S = 30.0
#: Client retry delay after a refused or lost request (virtual seconds).
_RETRY_S = 0.010
#: The lines of the trace a failure report shows.
TAIL_LINES = 60


class SimFailure(AssertionError):
    """A checker caught the engine breaking a promise (or the run could not complete)."""

    def __init__(self, seed: int, message: str, trace: list[str], *, scenario: bool = False) -> None:
        self.seed = seed
        self.message = message
        self.trace = trace
        how = f"scenario.run({seed})" if scenario else f"python -m fusee.sim --seed {seed}"
        tail = "\n".join(f"  {line}" for line in trace[-TAIL_LINES:])
        super().__init__(f"seed {seed} failed: {message}\nreproduce: {how}\nlast trace lines:\n{tail}")


@dataclasses.dataclass
class Result:
    """What one seed's run produced."""

    report: Report
    trace: list[str]
    observed: Observed

    @property
    def trace_hash(self) -> str:
        """SHA-256 of the whole trace: equal for two runs of one seed."""
        h = hashlib.sha256()
        for line in self.trace:
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()


# Event kinds, ordered by the heap after (time, sequence).
_CLIENT, _CRASH, _RESTART, _CLOSE, _REOPEN, _MOVE = "client", "crash", "restart", "close", "reopen", "move"
#: Where an outside hand moves the directory before it restores a copy at ``DATA_DIR``.
MOVED_DIR = DATA_DIR + ".old"

# Errors after which a request is retried (the engine was not able to take it now).
_RETRYABLE: tuple[type[BaseException], ...] = (errors.Busy, errors.EngineClosed, errors.StorageError)
# Errors that say there is nothing to deliver to (the run ended or never existed).
_NOTHING_THERE: tuple[type[BaseException], ...] = (errors.NotFound, errors.WorkflowEnded,
                                                   errors.WorkflowFailed,
                                                   errors.Cancelled, errors.QueryFailed)


class _FrozenRecords(logging.Filter):
    """Formats each engine log record at once and drops its arguments.

    An argument such as a storage error holds its traceback, and through it a
    whole simulated world: a handler that keeps records (pytest's capture over
    a seed range) would keep every world alive.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = record.getMessage()
        record.args = None
        record.exc_info = None
        return True


_ENGINE_LOGGERS = ("fusee", "fusee.scale")


class World:
    """One seed's simulated run. ``run()`` returns a :class:`Result` or raises :class:`SimFailure`."""

    def __init__(self, cfg: SimConfig, plan: Plan | None = None, *, scenario: bool = False,
                 verbose: bool = False) -> None:
        self.cfg = cfg
        self.plan = plan if plan is not None else workload.build(cfg)
        self.scenario = scenario
        self.verbose = verbose
        self.rng = random.Random(f"world-{cfg.seed}")
        self.disk = SimDisk(random.Random(f"disk-{cfg.seed}"),
                            fail_flush_rate=cfg.flush_fail_per_mille / 1000.0)
        # Process crashes (page cache kept), kills inside an fdatasync and outside hands
        # draw from their own rng, so the rest of a seed's world stays as it was.
        self.kill_rng = random.Random(f"kills-{cfg.seed}")
        kill_rate = self.kill_rng.choice([0.0, 0.005, 0.02]) if cfg.crash_every_ms else 0.0
        self.disk.arm_kills(random.Random(f"kill-at-{cfg.seed}"), kill_rate)
        #: Outside hands that rename the directory and restore a copy (DESIGN §11, §13).
        self.hands_rng = random.Random(f"hands-{cfg.seed}")
        #: The directory was moved and restored in this life, when these actions were acknowledged.
        self.moved: tuple[int, frozenset[int]] | None = None
        self.report = Report(seed=cfg.seed)
        self.obs = Observed()
        self.obs.children = {k: list(v) for k, v in self.plan.children.items()}
        self.trace: list[str] = []
        self.t = 0.0
        self.faults = True
        self.opening = False
        self.crash_pending = False
        self.restart_pending = False
        self.clock_offset_ms = 0
        self.failure: SimFailure | None = None
        self.life = 0
        self.dead: list[SimLoop] = []
        #: Engines of dead lives, whose tables bury() lets go of.
        self.dead_engines: list[Any] = []
        #: The idle check found a record left behind (reported once per seed).
        self.idle_violation = False
        self.loop: SimLoop = SimLoop()
        self.engine: Any = None
        self._events: list[tuple[float, int, str, int]] = []
        self._seq = 0
        self.actions: list[Action] = []
        self.acked: list[bool] = []
        self.pending: dict[int, int] = {}  # action index -> scheduled or in-flight count
        self.watched: dict[str, int] = {}  # workflow ID -> life its result watcher runs in
        self._torn_before = 0
        self._target = float("inf")
        self._accepted: frozenset[str] | None = None
        self.env: SimEnv | None = None
        #: A graceful close is under way (requests sent now must be refused cleanly).
        self.closing = False
        #: Lives that ended in a crash (or a supervisor restart), not a graceful close.
        self.crashed_lives: set[int] = set()
        #: Restarts after a failed log in a row with no record made durable, and the durable
        #: positions they all stopped at (see ``_check_restart_progress``).
        self.stalled_restarts = 0
        self._stalled_at: list[int] | None = None
        #: Client attempts in flight per action, and actions an attempt of which may have been applied.
        self.inflight: dict[int, int] = {}
        self.maybe_applied: set[int] = set()
        #: Requests refused during the current close: (kind, workflow ID, detail) for ``check_refused``.
        self.refused: list[tuple[str, str, str]] = []
        self.svc: Any = self.plan.service
        #: Resets in flight: (life, workflow ID).
        self.resetting: set[tuple[int, str]] = set()
        #: A scenario's window runs its receipts named: watched for their results like starts.
        self.window_runs: set[str] = set()
        #: The tracer the engine reports spans to, on seeds with telemetry (see ``fusee.sim.tracing``).
        self.tracing: Any = _tracer_for(cfg)
        if self.svc is not None:
            self.svc.clock = lambda: self.loop.time()
            self.svc.life = lambda: self.life

    # --- the trace ------------------------------------------------------------

    def log(self, text: str) -> None:
        line = f"[{self.loop.now * 1000.0:.3f}] {text}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    def fail(self, message: str) -> SimFailure:
        return SimFailure(self.cfg.seed, message, self.trace, scenario=self.scenario)

    def _fail_later(self, message: str) -> None:
        """Reports a failure found inside the loop: the loop stops and the world raises it."""
        if self.failure is None:
            self.log(f"FAILED: {message}")
            self.failure = self.fail(message)
        self.loop.stop()

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    # --- scheduling -------------------------------------------------------------

    def _at(self, t: float, kind: str, arg: int = 0) -> None:
        heapq.heappush(self._events, (t, self._seq, kind, arg))
        self._seq += 1
        if t < self._target:
            # Scheduled from inside the loop, before the time it runs to: stop
            # there so the event is handled on time.
            self._target = t
            self.loop.call_at(t, self.loop.stop)

    def _schedule_action(self, ix: int, t: float) -> None:
        self.pending[ix] = self.pending.get(ix, 0) + 1
        self._at(t, _CLIENT, ix)

    def _io_latency(self) -> float:
        return self.rng.uniform(0.00005, max(0.00005, self.cfg.max_io_ms / 1000.0))

    def _step_latency(self) -> float:
        """Seconds a synchronous step function holds its pool slot."""
        if self.svc is not None:
            return float(self.svc.take_hold())  # the workload's functions say how long they block
        return self.rng.uniform(0.0, self.cfg.max_step_ms / 1000.0)

    def _msg_latency(self) -> float:
        return self.rng.uniform(0.0, self.cfg.max_msg_ms / 1000.0)

    def _after_io(self, error: BaseException | None) -> bool:
        if self.disk.killed:
            # Killed inside an fdatasync: the engine never hears how the I/O went.
            if not self.crash_pending:
                self.crash_pending = True
                self.loop.stop()
                self.report.kills_in_sync += 1
                self.log("the process is killed inside an fdatasync (its write stays in the page cache)")
            return True
        if isinstance(error, OSError) and not self.restart_pending:
            # A supervisor restarts a process whose log failed.
            self.log(f"I/O failed: {error}; the supervisor will restart the process")
            self.restart_pending = True
            self._at(self.loop.now + 0.001, _RESTART)
        if (not self.faults or self.opening or self.crash_pending
                or not self.cfg.crash_after_io_per_mille):
            return False
        if self.rng.randrange(1000) >= self.cfg.crash_after_io_per_mille:
            return False
        self.crash_pending = True
        self.loop.stop()
        withhold = self.rng.random() < 0.5
        self.report.crashes_after_io += 1
        self.log("crash right after an I/O completed" + (", before the engine heard" if withhold else ""))
        return withhold

    # --- lives ------------------------------------------------------------------

    def _drive(self, aw: Awaitable[Any], what: str) -> Any:
        """Runs ``aw`` on the current life to completion (bounded in virtual time)."""
        loop = self.loop
        task = loop.create_task(_await(aw))
        task.add_done_callback(lambda _: loop.stop())
        deadline = loop.now + _HANG_S
        try:
            while not task.done():
                self._raise_failure()
                if loop.now >= deadline:
                    raise self.fail(f"{what} did not finish within {_HANG_S:.0f} simulated seconds")
                loop.run_until(deadline)
        except SimDeadlock as e:
            raise self.fail(f"{what} can never finish: {e}") from None
        self._raise_failure()
        return task.result()

    def _engine_options(self) -> dict[str, Any]:
        if self._accepted is None:
            params = inspect.signature(fusee.Engine.open).parameters
            self._accepted = frozenset(params)
        extra = {k: v for k, v in self.plan.engine_options.items() if k in self._accepted}
        return {**self.cfg.engine_options(self._accepted), **extra}

    def _open(self) -> None:
        """Starts a new life: a fresh loop and an engine recovering from the disk."""
        self._bury_dead()
        for attempt in range(20):
            self.life += 1
            self.report.clock_jumps += self.loop.clock_jumps
            self.loop = SimLoop(start=self.t)
            env = SimEnv(self.disk, random.Random(self.rng.getrandbits(64)), self.loop,
                         self._io_latency, message_latency=self._msg_latency,
                         clock_offset_ms=self.clock_offset_ms, after_io=self._after_io,
                         step_slots=self.cfg.step_slots, step_latency=self._step_latency,
                         inline_sync_steps=self.cfg.inline_sync_steps, flush_mode=self.cfg.flush_mode)
            self.env = env
            self.opening = True
            options = self._engine_options()
            if "telemetry" in (self._accepted or ()):
                # Off unless the seed traces: a global provider of the process changes nothing here.
                options["telemetry"] = False
                if self.tracing is not None:
                    self.tracing.life = self.life
                    options["telemetry"] = fusee.Telemetry(tracer_provider=self.tracing, metrics=False)
            try:
                self.engine = self._drive(
                    fusee.Engine.open(DATA_DIR, workflows=self.plan.workflows, env=env,
                                      limits=self.plan.limits, **options),
                    "recovery")
                for engine_hook in self.plan.on_engine_open:
                    engine_hook(self.engine, self.life)
            except SimFailure:
                raise
            except (errors.StorageError, OSError) as e:
                if isinstance(e, errors.LogCorrupted) or not self.faults:
                    raise self.fail(f"the engine failed to recover: {type(e).__name__}: {e}") from None
                # The disk failed during the open itself: the supervisor tries again.
                self.log(f"open failed ({type(e).__name__}); restarting (attempt {attempt + 1})")
                self.dead.append(self.loop)
                self.disk.crash_process()
                self.t = self.loop.now
                continue
            except Exception as e:
                raise self.fail(f"the engine failed to recover: {type(e).__name__}: {e}") from None
            finally:
                self.opening = False
            self.restart_pending = False
            self.t = self.loop.now
            self.loop.idle_hook = self._check_idle
            # Not in a process killed inside an fdatasync during the open: its crash is pending,
            # and the second opener would run on the dead process's disk handle.
            if self.faults and self.kill_rng.random() < 0.1 and not self.disk.killed:
                self._second_writer()
            if self.faults and self.hands_rng.random() < 0.08:
                self._at(self.loop.now + self.hands_rng.uniform(0.0, 0.05), _MOVE, self.life)
            for hook in self.plan.on_open:
                hook(self)
            return
        raise self.fail("the engine could not be opened in 20 attempts")

    def _check_idle(self) -> None:
        """The loop is idle: no appended record may be left waiting for unrelated activity.

        A quiet world is where such a record shows (a step that ran within its
        run's turn, then a long sleep): with other runs always flushing, a
        missing flush request hides behind theirs.
        """
        engine = self.engine
        if engine is None or self.closing or self.idle_violation or engine.failure is not None:
            return
        log, committer = engine._rt.log, engine._rt.committer
        # A flush in flight (even one a checkpoint completed first) takes what is pending when it ends.
        if (log.failed is None and log.has_pending() and not log.flushing and not committer.flushing
                and not committer.holding):
            self.idle_violation = True
            self.obs.violations.append(
                f"at {self.loop.now:.6f}s the loop went idle with {log.pending_records} appended "
                "record(s) that no flush was taking or asked to take: they wait for unrelated activity")

    def _second_writer(self) -> None:
        """An outside hand deletes the lock file, then a second process opens the directory."""
        lock = f"{DATA_DIR}/lock"
        if self.disk.exists(lock):
            self.disk.remove(lock)
        self.report.lock_deletions += 1
        try:
            log, _ = SharedLog.open(self.disk, DATA_DIR, self.cfg.shards, segment_bytes=self.cfg.segment_bytes)
        except errors.DirectoryLocked:
            self.log("an outside hand deleted the lock file; a second opener was refused")
            return
        log.close()
        raise self.fail("a second process opened the engine directory after its lock file was deleted")

    def _rename_and_restore(self) -> None:
        """An outside hand: ``mv data data.old && cp -a data.old data`` while the engine runs,
        then a second process opens the copy (it holds no lock: it may).

        The engine writes on into the directory it locked (now data.old), never into the copy;
        it must notice and acknowledge nothing more, since a restart on the path reads the copy.
        A crash follows soon, so that the checkers look at the copy: nothing the engine
        acknowledged may be missing from it (``checkers.check_moved``).
        """
        if self.disk.exists(MOVED_DIR):
            self.disk.remove_dir(MOVED_DIR)  # an earlier move's original: its owner is gone
        self.disk.move_dir(DATA_DIR, MOVED_DIR)
        self.disk.copy_dir(MOVED_DIR, DATA_DIR)
        self.report.dir_moves += 1
        self.moved = (self.life, frozenset(ix for ix, a in enumerate(self.acked) if a))
        try:
            log, _ = SharedLog.open(self.disk, DATA_DIR, self.cfg.shards, segment_bytes=self.cfg.segment_bytes,
                                    rng=random.Random(self.hands_rng.getrandbits(64)))
        except errors.LogFailed as e:  # a failing disk (fail_flush_rate): not the copy's fault
            self.log(f"an outside hand renamed the directory and restored a copy; a second process "
                     f"failed to open it ({type(e).__name__})")
        except errors.StorageError as e:
            raise self.fail(f"a copy of the live directory could not be opened: {type(e).__name__}: {e}") from None
        else:
            log.close()
            self.log("an outside hand renamed the directory and restored a copy; a second process "
                     "opened the copy")
        self._at(self.loop.now + self.hands_rng.uniform(0.001, 0.030), _CRASH)

    def _crash(self, kind: str) -> None:
        self.t = self.loop.now
        if kind == _RESTART:
            self.report.restarts += 1
            self.log("restart: the supervisor kills the process after its log failed")
            self._check_restart_progress()
        else:
            self.report.crashes += 1
        due = self._due_at_crash(kind)
        crashed_at = self.t
        self._live_read()
        self._check_integrity(f"at the crash at {self.t * 1000:.3f} ms")
        self.crashed_lives.add(self.life)
        self._end_life()
        if kind == _RESTART or self.disk.killed or self.kill_rng.random() < 0.5:
            # The process dies, the machine stays up: the page cache keeps unsynced writes,
            # which a later power loss (of any later life) may still drop or tear.
            if kind != _RESTART:
                self.log("crash: the process dies; the page cache keeps unsynced writes")
            self.disk.crash_process()
        else:
            self.report.power_losses += 1
            self.log("crash: the power fails; unsynced writes are lost or torn")
            self.disk.crash()
        torn = self.disk.stats.sectors_torn
        if torn > self._torn_before:
            self.report.torn_tails += 1
        self._torn_before = torn
        if self.cfg.clock_jump_ms:
            self.clock_offset_ms += self.rng.randrange(self.cfg.clock_jump_ms + 1)
        self.crash_pending = False
        self._open()
        self.log(f"recovered (life {self.life})")
        self.watched.clear()
        bound = self.cfg.durable_within_ms
        # The crash's own time: the lambda runs after recovery, when self.t has moved on.
        what = f"more than {bound:.1f} ms before the crash at {crashed_at * 1000:.3f} ms"
        self._after_recovery(lambda snap: checkers.check_durable(due, snap, what))

    def _check_restart_progress(self) -> None:
        """Fails the seed when lives keep dying of a failed log without one more durable record.

        A life whose recovery needs more syncs than the disk's fault rate lets through
        makes no progress, and the world would restart it forever (seed 655).
        """
        engine = self.engine
        if engine is None:
            return
        log = engine._log
        at = [log.durable(s) for s in range(log.shards)]
        if at != self._stalled_at:
            self._stalled_at, self.stalled_restarts = at, 0
            return
        self.stalled_restarts += 1
        if self.stalled_restarts >= MAX_STALLED_RESTARTS:
            raise self.fail(
                f"livelock: {self.stalled_restarts} restarts in a row after a failed log made no record "
                f"durable (stuck at {at}); each life's work needs more syncs than the fault rate "
                f"(flush_fail={self.cfg.flush_fail_per_mille}/1000) lets through")

    def _live_read(self) -> None:
        """An operator reads the directory (``fusee runs DIR``) while the engine has it open."""
        engine = self.engine
        if engine is None or self.opening or self.disk.killed:
            return
        log = engine._log
        durable = [log.durable(s) for s in range(log.shards)]
        before = self._disk_state()
        seen: list[int] | None = None
        refused: str | None = None
        try:
            reader, _ = SharedLog.open(self.disk, DATA_DIR, log.shards, segment_bytes=self.cfg.segment_bytes,
                                       read_only=True, rng=random.Random(0))
        except errors.DirectoryLocked as e:
            refused = str(e)
        except errors.LogCorrupted as e:
            # The engine wrote every byte here; a reader that finds damage a crash cannot
            # explain means the log's own checks let something through.
            raise self.fail(f"a read-only inspection of the live directory found it corrupt: {e}") from None
        else:
            seen = [reader.durable(s) for s in range(log.shards)]
            reader.close()
        problems = checkers.check_live_read(durable, seen, refused, self._disk_state() != before)
        if refused is None and not problems:
            problems = checkers.check_view_stuck(self._view_stuck(), engine.stuck())
        if problems:
            raise self.fail(problems[0])
        self.log(f"an operator read the live directory: records up to {seen}")

    def _check_integrity(self, when: str) -> None:
        """The worst power loss now would leave a log that opens, whose batches find their blobs,
        holding every record the engine counts durable (``fusee.sim.integrity``)."""
        engine = self.engine
        if engine is None or self.opening or (self.moved is not None and self.moved[0] == self.life):
            return  # nothing open, or its directory was moved away (check_moved looks at the copy)
        log = engine._log
        durable = None if log.failed is not None else [log.durable(s) for s in range(log.shards)]
        problems = integrity.check_log_integrity(self.disk, DATA_DIR, log.shards, self.cfg.segment_bytes,
                                                 durable, when)
        if problems:
            raise self.fail(problems[0])

    def _view_stuck(self) -> dict[str, str]:
        """``Engine.open(DIR, read_only=True)`` beside the live engine, as ``fusee runs DIR`` opens it
        (on a loop of its own, at the world's time): the runs its view reports stuck."""
        view_loop = SimLoop(start=self.loop.now)
        env = SimEnv(self.disk, random.Random(0), view_loop, lambda: 0.0001,
                     clock_offset_ms=self.clock_offset_ms)
        options = {k: v for k, v in self._engine_options().items() if k != "telemetry"}

        async def look() -> dict[str, str]:
            view = await fusee.Engine.open(DATA_DIR, workflows=self.plan.workflows, env=env,
                                           limits=self.plan.limits, read_only=True, **options)
            try:
                return view.stuck()
            finally:
                await view.close()

        task = run_within(view_loop, look(), 60.0)
        try:
            return task.result() if task.done() else {"(view)": "the read-only open did not finish"}
        finally:
            view_loop.bury()

    def _disk_state(self) -> tuple[Any, ...]:
        """What a reader must leave as it was: the files, their sizes, the writes made."""
        files = []
        for d in (DATA_DIR, f"{DATA_DIR}/log", f"{DATA_DIR}/blobs"):
            if self.disk.exists(d):
                for name in self.disk.listdir(d):
                    path = f"{d}/{name}"
                    if not self.disk.is_dir(path):
                        fh = self.disk.open(path)
                        files.append((path, self.disk.size(fh)))
                        self.disk.close(fh)
        return (tuple(files), self.disk.stats.writes, self.disk.stats.bytes_written)

    def _due_at_crash(self, kind: str) -> list[Any]:
        """Effects of this life whose steps finished long enough before the crash to be durable."""
        if self.svc is None:
            return []
        self.svc.life_ended(self.life, self.t)
        engine = self.engine
        if (kind == _RESTART or self.restart_pending or self.opening
                or (engine is not None and engine.failure is not None)):
            return []  # the log failed: what it had not flushed is lost, as promised
        bound = self.cfg.durable_within_ms / 1000.0
        stalls = self.env.stalls if self.env is not None else []
        # The loop's thread lent to a step function delays the next flush's start
        # (one already in flight still completes): that time does not count.
        return [e for e in self.svc.effects if e.life == self.life and e.ok
                and self.t - e.end - checkers.stalled(stalls, e.end, self.t) >= bound]

    def _end_life(self) -> None:
        """The current life is over: its engine is gone and new code may be deployed."""
        self._check_stalls()
        self.dead.append(self.loop)
        self._add_engine_stats()
        if self.engine is not None:
            self.dead_engines.append(self.engine)
        self.engine = None
        self.closing = False
        for ix, n in self.inflight.items():
            if n:
                self.maybe_applied.add(ix)  # it died in flight: perhaps applied
        self.inflight.clear()
        for hook in self.plan.on_crash:
            hook()

    def _check_stalls(self) -> None:
        if self.env is not None and self.cfg.inline_sync_steps is None:
            problems = checkers.check_inline_stalls(self.env.stalls)
            if problems:
                raise self.fail(problems[0])

    # --- graceful closes ----------------------------------------------------------

    def _begin_close(self) -> None:
        """``engine.close(grace=...)`` with steps in flight; a reopen follows once it returns."""
        engine, life = self.engine, self.life
        self.closing = True
        self.refused = []
        self.report.closes += 1
        now = self.loop.now
        running = 0 if self.svc is None else sum(
            1 for e in self.svc.effects if e.life == life and e.begin <= now < e.end)
        self.report.closes_mid_step += running > 0
        self.log(f"close: graceful, grace {self.cfg.close_grace_ms} ms, {running} step function(s) running")
        task = self.loop.create_task(engine.close(grace=self.cfg.close_grace_ms / 1000.0))

        def done(t: asyncio.Task[Any]) -> None:
            if life != self.life:
                return
            exc = None if t.cancelled() else t.exception()
            if isinstance(exc, errors.StorageError):
                # The log failed during the close (its checkpoint said so): the supervisor
                # restarts the process, as after any failed log.
                self.log(f"close: the log failed ({type(exc).__name__}); restarting")
                if not self.restart_pending:
                    self.restart_pending = True
                    self._at(self.loop.now + 0.001, _RESTART)
                return
            if t.cancelled() or exc is not None:
                err = "cancelled" if t.cancelled() else repr(exc)
                self._fail_later(f"engine.close raised {err}")
                return
            self._at(self.loop.now, _REOPEN, life)

        task.add_done_callback(done)

    def _reopen(self) -> None:
        """The process exits after a graceful close and starts again (no writes lost)."""
        self.t = self.loop.now
        closed_life = self.life
        if self.engine is not None and self.engine.failure is not None:
            # The log failed while closing: the supervisor restarts the process as
            # after any failed log (with the crash model, like every such restart).
            self.log("closed after its log failed")
            self.refused = []
            self.restart_pending = True
            self._crash(_RESTART)
            return
        self.log("closed; the process exits and starts again")
        self._end_life()
        self._open()
        self.log(f"reopened (life {self.life})")
        self.watched.clear()
        due = [] if self.svc is None else [
            e for e in self.svc.effects if e.life == closed_life and e.ok]
        refused, self.refused = self.refused, []

        def check(snap: Snapshot) -> list[str]:
            return (checkers.check_durable(due, snap, "before a graceful close returned")
                    + checkers.check_refused(refused, snap))

        self._after_recovery(check)

    def _after_recovery(self, extra: Any = None) -> None:
        extra = self._with_move_check(extra)
        # Requests in flight died with the process: the client sends them again.
        self.pending = {}
        for _, _, kind, ix in self._events:
            if kind == _CLIENT:
                self.pending[ix] = self.pending.get(ix, 0) + 1
        for ix, acked in enumerate(self.acked):
            if not acked and self.pending.get(ix, 0) == 0:
                self.report.client_retries += 1
                self._schedule_action(ix, self.loop.now + 0.001)
        self._watch_all()
        self._check(final=False, extra=extra)

    def _with_move_check(self, extra: Any) -> Any:
        """``extra`` plus, after the first recovery since a rename and restore, ``check_moved``
        over the starts acknowledged after the move (by the life that was moved)."""
        moved = self.moved
        if moved is None or moved[0] >= self.life:
            return extra
        self.moved = None
        since = [act.id for ix, a in enumerate(self.acked)
                 if a and ix not in moved[1] and isinstance(act := self.actions[ix], Start)]

        def check(snap: Snapshot) -> list[str]:
            return (extra(snap) if extra is not None else []) + checkers.check_moved(since, snap)

        return check

    # --- the client -------------------------------------------------------------

    def _watch_all(self) -> None:
        for wid in [*self.obs.starts, *sorted(self.window_runs)]:
            self._watch(wid)
        for parent in self.obs.starts:
            for kid, _ in self.obs.children.get(parent, ()):
                self._watch(kid)

    def _watch(self, wid: str) -> None:
        if self.watched.get(wid) == self.life:
            return
        self.watched[wid] = self.life
        self.loop.create_task(self._result_watcher(wid, self.life))

    async def _result_watcher(self, wid: str, life: int) -> None:
        engine = self.engine
        while True:
            try:
                value = await engine.get(wid).result()
                outcome = Outcome("ok", value)
            except errors.NotFound:
                # A child not started yet (its start message may be on its way).
                await asyncio.sleep(_RETRY_S)
                continue
            except errors.Cancelled:
                outcome = Outcome("cancelled", None)
            except errors.WorkflowFailed as e:
                outcome = Outcome(str(e.status).lower(), None)
            except errors.StepFailed:
                outcome = Outcome("failed", None)
            except _RETRYABLE as e:
                self._engine_trouble(e)
                return
            except Exception as e:
                self._fail_later(f"result of {wid} raised {type(e).__name__}: {e}")
                return
            break
        if life != self.life:
            return
        first = wid not in self.obs.results
        self.obs.result(wid, outcome)
        if first:
            self.log(f"result {wid} {outcome.status} {outcome.value!r}")

    def _engine_trouble(self, e: BaseException) -> None:
        if self.closing and isinstance(e, errors.EngineClosed):
            return  # closing on purpose: the reopen follows
        if isinstance(e, (errors.EngineClosed, errors.StorageError)) and not self.restart_pending:
            self.log(f"engine unavailable ({type(e).__name__}); the supervisor will restart it")
            self.restart_pending = True
            self._at(self.loop.now + 0.001, _RESTART)

    def _dispatch(self, ix: int) -> None:
        self.pending[ix] = max(0, self.pending.get(ix, 0) - 1)
        if self.acked[ix]:
            return
        action = self.actions[ix]
        if isinstance(action, FLOW_ACTIONS):
            if not flowjobs.ready(self, action):
                self._schedule_action(ix, self.loop.now + 0.005)
                return
        elif not isinstance(action, Start | ObjectCall | Call | ReadStream) and action.id not in self.obs.starts:
            # The client only talks to workflows whose start it saw acknowledged.
            self._schedule_action(ix, self.loop.now + 0.005)
            return
        self.pending[ix] = self.pending.get(ix, 0) + 1
        self.inflight[ix] = self.inflight.get(ix, 0) + 1
        self.loop.create_task(self._client(ix, self.life, self.closing))

    async def _client(self, ix: int, life: int, during_close: bool) -> None:
        engine = self.engine
        action = self.actions[ix]
        try:
            try:
                if self.tracing is not None:
                    with self.tracing.caller(getattr(action, "id", "")):
                        answer = await self._request(engine, action)
                else:
                    answer = await self._request(engine, action)
            finally:
                if life == self.life:
                    self.inflight[ix] = max(0, self.inflight.get(ix, 0) - 1)
        except errors.UpdateRejected:
            answer = ("rejected", None)
        except errors.UpdateFailed:
            answer = ("update_failed", None)
        except errors.ObjectCallFailed as e:
            answer = ("failed", f"{e.type_name}: {e.error_message}")
        except _RETRYABLE as e:
            if life == self.life and during_close and not isinstance(e, errors.EngineClosed):
                self._fail_later(f"{_describe(action)} sent during a close raised {type(e).__name__}: "
                                 f"{e} (expected EngineClosed, nothing applied)")
                return
            if life == self.life:
                if during_close and isinstance(e, errors.EngineClosed):
                    self._refused(ix, action)
                else:
                    self.maybe_applied.add(ix)
                self.pending[ix] = max(0, self.pending.get(ix, 0) - 1)
                self.log(f"{_describe(action)}: {type(e).__name__}; again later")
                self.report.client_retries += 1
                self._engine_trouble(e)
                self._schedule_action(ix, self.loop.now + _RETRY_S)
            return
        except _NOTHING_THERE as e:
            answer = ("nothing", type(e).__name__)
        except errors.HistoryUnavailable as e:
            # Without history an ended run cannot answer a query or be reset: as promised.
            if self.cfg.keep_history:
                self._fail_later(f"{_describe(action)} raised HistoryUnavailable on an engine that "
                                 f"keeps history: {e}")
                return
            answer = ("nothing", type(e).__name__)
            self.report.history_refused += 1
        except errors.AlreadyExists:
            answer = ("exists", None)
        except (errors.SerializationError, errors.UnknownSignal) as e:
            if not (isinstance(action, Signal) and action.refusal == type(e).__name__):
                self._fail_later(f"{_describe(action)} raised {type(e).__name__}: {e}")
                return
            answer = ("refused", type(e).__name__)
        except Exception as e:
            if isinstance(action, Update) and not isinstance(e, errors.FuseeError):
                # The validator's own error: the update was rejected, nothing recorded.
                answer = ("rejected", None)
            else:
                self._fail_later(f"{_describe(action)} raised {type(e).__name__}: {e}")
                return
        if life != self.life:
            return
        if during_close:
            self._fail_later(f"{_describe(action)} sent during a close was answered {answer!r}: "
                             "expected EngineClosed")
            return
        self.pending[ix] = max(0, self.pending.get(ix, 0) - 1)
        self.acked[ix] = True
        self._observe(action, answer)

    def _refused(self, ix: int, action: Action) -> None:
        """A request sent during a close was refused: unless another attempt may have landed, it left no trace."""
        self.report.calls_refused += 1
        if self.inflight.get(ix, 0) or ix in self.maybe_applied:
            return
        if isinstance(action, Start):
            self.refused.append(("start", action.id, ""))
        elif isinstance(action, Signal) and action.key:
            self.refused.append(("signal", action.id, str(dedup_key("client:" + action.key))))
        elif isinstance(action, Cancel):
            self.refused.append(("cancel", action.id, ""))
        elif isinstance(action, Terminate):
            self.refused.append(("terminate", action.id, ""))
        elif isinstance(action, Update):
            for j, other in enumerate(self.actions):
                if (j != ix and isinstance(other, Update) and other.update_id == action.update_id
                        and (self.acked[j] or self.inflight.get(j, 0) or j in self.maybe_applied)):
                    return  # the same update ID sent by another request may have landed
            self.refused.append(("update", action.id, action.update_id))

    def _resolve(self, workflow: Any) -> Any:
        """The plan's definition of ``workflow`` (given as a definition or a name)."""
        name = workflow if isinstance(workflow, str) else workflow.name
        for wf in self.plan.workflows:
            if wf.name == name:
                return wf
        return workflow

    def _resolve_handler(self, handler: Any) -> Any:
        """The handler of the same name of the plan's object of the same name (a scenario
        builds its definitions afresh for every seed)."""
        for obj in self.plan.workflows:
            if isinstance(obj, fusee.ObjectDef) and obj.name == handler.obj.name:
                return obj.handlers.get(handler.name, handler)
        return handler

    async def _request(self, engine: Any, action: Action) -> tuple[str, Any]:
        if isinstance(action, ObjectCall):
            return ("ok", await action.request(engine))
        if isinstance(action, Call):
            handler = self._resolve_handler(action.handler)
            return ("ok", await engine.call(handler, action.key, action.arg, call_id=action.call_id))
        if isinstance(action, ReadStream):
            return await self._read_stream(engine, action)
        if isinstance(action, FLOW_ACTIONS):
            return await flowjobs.request(self, engine, action)
        if isinstance(action, Start):
            wf = self._resolve(action.workflow)
            # A start sent again after a crash attaches to the run it made.
            await engine.start(wf, action.id, action.input, if_running="attach", if_finished="attach")
            return ("ok", None)
        if isinstance(action, Signal):
            # One dedup key per request, so a signal sent again is not received twice.
            await engine.signal(action.id, action.signal, action.value, dedup_key=action.key or None)
            return ("ok", None)
        if isinstance(action, Cancel):
            await engine.cancel(action.id)
            return ("ok", None)
        if isinstance(action, Terminate):
            await engine.terminate(action.id)
            return ("ok", None)
        if isinstance(action, Update):
            return ("ok", await engine.update(action.id, action.update, action.value,
                                              update_id=action.update_id))
        if isinstance(action, Complete):
            return ("ok", await self._complete(engine, action))
        if isinstance(action, Reset):
            return await self._reset(engine, action)
        return ("ok", await engine.query(action.id, action.query))

    async def _read_stream(self, engine: Any, action: ReadStream) -> tuple[str, Any]:
        """Reads a stream to its end from where this client got to (in any earlier life)."""
        key = (action.id, action.name)
        got = self.obs.streams.setdefault(key, [])
        while True:
            try:
                b = await engine.stream_batch(action.id, action.name, len(got), wait=0.050)
            except errors.NotFound:
                await asyncio.sleep(_RETRY_S)  # not started yet (a child, or a window run)
                continue
            if b.offset != len(got) or b.next_offset != len(got) + len(b.chunks):
                self._fail_later(f"stream {action.name} of {action.id} read from offset {len(got)} "
                                 f"answered offset {b.offset} with {len(b.chunks)} chunks and next offset "
                                 f"{b.next_offset}: an offset was skipped")
            got.extend(b.chunks)  # durable when answered: a crash cannot take them back
            if b.ended:
                self.obs.stream_ends[key] = b.end_status
                return ("ok", b.end_status)

    async def _complete(self, engine: Any, action: Complete) -> list[bool]:
        """Completes every token handed out for ``action.id`` so far, once one is current.

        Waits (polling, at most 2 virtual seconds) until some token function
        returned; then the stale tokens go first, then the current one.
        Each answer is recorded as it arrives (a True one is durable).
        """
        answers: list[bool] = []
        svc = self.svc
        for _ in range(400):
            tokens = list(svc.tokens.get(action.id, ()))
            if any(tok in svc.tokens_returned for tok in tokens):
                for tok in tokens:
                    if action.fail:
                        ok = bool(await engine.fail_completion(tok, "declined"))
                    else:
                        ok = bool(await engine.complete(tok, action.value))
                    self.obs.completion_answered(action.id, tok, ok, -1 if action.fail else action.value)
                    self.report.completions += ok
                    self.report.completions_refused += not ok
                    answers.append(ok)
                return answers
            await asyncio.sleep(0.005)
        return answers

    async def _reset(self, engine: Any, action: Reset) -> tuple[str, Any]:
        """Resets a running workflow and checks the new run's journal against the old one's."""
        # One reset of an ID at a time (in this life): another one landing while
        # this one awaits durability would change the run read afterwards.
        busy = (self.life, action.id)
        while busy in self.resetting:
            await asyncio.sleep(0.001)
        if action.id in self.obs.results:
            engine._check_open()  # during a close the engine refuses, as it would the reset itself
            return ("late", None)  # it finished: a reset would run it again
        self.resetting.add(busy)
        try:
            # No suspension between reading the journal and the reset's cut.
            before = list(await engine.journal(action.id))
            try:
                handle = await engine.reset(action.id, before_step=action.before_step,
                                            reapply_signals=True, by="sim")
            except ValueError:
                return ("nothing", "no step to cut before yet")
            after = list(await engine.journal(action.id))
        finally:
            self.resetting.discard(busy)
        self.log(f"reset {action.id}: run {before[0].run if before else None} ({len(before)} records) "
                 f"-> run {handle.run_id} ({len(after)} durable records)")
        self.report.resets += 1
        cut = min((x.seq for x in (*before, *after)
                   if isinstance(x, rec.Step | rec.Attempt) and x.name == action.before_step), default=None)
        if cut is not None:
            # Signals after the prefix: delivered again (or arrived since).
            last = max((i for i, x in enumerate(after) if (p := checkers.position(x)) is not None and p < cut),
                       default=0)
            self.report.signals_reapplied += sum(isinstance(x, rec.Signal) for x in after[last + 1:])
        for problem in checkers.check_reset(action.id, before, after, action.before_step):
            self.obs.violations.append(problem)
        return ("ok", handle.run_id)

    def _observe(self, action: Action, answer: tuple[str, Any]) -> None:
        status, value = answer
        self.log(f"{_describe(action)}: {status} {value!r}")
        if isinstance(action, FLOW_ACTIONS):
            flowjobs.observe(self, action, answer)
            if self.scenario and isinstance(action, Enqueue) and status == "ok":
                # The window run it joined is the scenario's too: it must finish, with a result.
                self.window_runs.add(str(value[0]))
                self._watch(str(value[0]))
            return
        if isinstance(action, Start):
            self.obs.start_acked(action.id, action.kind)
            self._watch(action.id)
            for kid, _ in self.obs.children.get(action.id, ()):
                self._watch(kid)
        elif isinstance(action, Signal) and action.refusal:
            if status == "ok":
                self.obs.violations.append(f"{_describe(action)} was accepted: the engine must refuse it "
                                           f"with {action.refusal} and record nothing")
            elif status == "refused":
                self.report.signals_refused += 1
                self.obs.refused_signals.append(
                    (action.id, action.signal.name, str(dedup_key("client:" + action.key))))
        elif isinstance(action, Signal):
            if status == "ok":
                self.obs.signal_acked(action.id, action.signal.name)
                self.report.signals += 1
        elif isinstance(action, Cancel):
            self.report.cancels += status == "ok"
            if status == "ok":
                self.obs.cancels.setdefault(action.id, self.loop.now)
                self.obs.cancel_effects.setdefault(action.id, len(self.svc.effects) if self.svc is not None else 0)
        elif isinstance(action, Terminate):
            self.report.terminates += status == "ok"
        elif isinstance(action, Update):
            if status in ("ok", "rejected", "update_failed"):
                self.obs.update_answered(action.id, action.update_id, Outcome(status, value))
                self.report.updates += status == "ok"
                self.report.updates_rejected += status == "rejected"
        elif isinstance(action, ObjectCall):
            action.observe(status, value)
        elif isinstance(action, Call):
            self.report.object_calls += 1
            self.obs.call_answered(action.call_id, Outcome(status, value))
        elif isinstance(action, ReadStream):
            self.report.streams_read += status == "ok"
        elif isinstance(action, (Complete, Reset)):
            pass  # each answer was recorded as it came (see _complete, _reset)
        elif status == "ok":
            self.report.queries += 1
            if action.monotonic and isinstance(value, int):
                self.obs.query_answered(action.id, value)

    # --- checks -------------------------------------------------------------------

    async def _snapshot(self) -> Snapshot:
        engine = self.engine
        ids = list(self.obs.starts)
        for parent in self.obs.starts:
            ids.extend(kid for kid, _ in self.obs.children.get(parent, ()))
        snap = Snapshot(results_before=frozenset(self.obs.results))
        for wid in ids:
            try:
                snap.runs[wid] = RunView(wid, list(await engine.journal(wid)))
            except errors.NotFound:
                snap.runs[wid] = RunView(wid, None)
        snap.stuck = dict(engine.stuck())
        if self.plan.flow is not None:
            snap.schedules = await flowjobs.final_states(engine, self.plan.flow)
        return snap

    def _check(self, *, final: bool, extra: Any = None) -> None:
        self.opening = True
        try:
            snap = self._drive(self._snapshot(), "reading the journals")
        except _RETRYABLE as e:
            self.log(f"snapshot skipped: {type(e).__name__}")
            return
        finally:
            self.opening = False
        problems = checkers.check_all(self.obs, snap, self.plan.service_violations(), final=final)
        if self.tracing is not None:
            problems += checkers.tally("traces", self.tracing.check(self.obs, snap))
        if extra is not None:
            problems += extra(snap)
        for check in self.plan.checks:
            problems += checkers.tally(getattr(check, "__name__", "plan").removeprefix("check_"),
                                       check(self, snap, final))
        if self.plan.flow is not None:
            problems += checkers.check_schedule_fires(self.plan.flow, snap.schedules, final=final)
            problems += checkers.check_windows(self.plan.flow, final=final)
            sent = {a.event_id for a in self.actions if isinstance(a, Enqueue)}
            problems += checkers.check_window_starts(self.plan.flow, sent, final=final)
        svc = self.svc
        if svc is not None:
            problems += checkers.check_cancel_gate(svc.effects, self.obs.cancels, svc.cancels_seen,
                                                   self.obs.cancel_effects)
            problems += checkers.check_compensation(svc.effects)
            problems += checkers.check_completions(self.obs, svc.tokens_returned)
            problems += checkers.check_resumes(svc.resumes, svc.progress)
            if final:
                problems += checkers.check_step_outcomes(svc.effects, snap, self.crashed_lives)
        for keyed_check in self.plan.keyed_checks:
            problems += keyed_check()
        if final:
            self._check_stalls()
        if problems:
            raise self.fail(problems[0])

    def _all_done(self) -> bool:
        if not all(self.acked) or self.plan.unfinished() or not flowjobs.settled(self):
            return False
        if any(wid not in self.obs.results for wid in self.window_runs):
            return False
        for wid in self.obs.starts:
            if wid not in self.obs.results:
                return False
            for kid, _ in self.obs.children.get(wid, ()):
                if kid not in self.obs.results:
                    return False
        return True

    def _unfinished(self) -> list[str]:
        out = [f"{_describe(a)} (unacknowledged)" for a, ok in zip(self.actions, self.acked, strict=True)
               if not ok]
        for wid in self.obs.starts:
            for x in [wid, *(k for k, _ in self.obs.children.get(wid, ()))]:
                if x not in self.obs.results:
                    out.append(f"{x} (no result)")
        out += [f"{w} (window run, no result)" for w in sorted(self.window_runs) if w not in self.obs.results]
        return out + self.plan.unfinished()

    # --- the run ------------------------------------------------------------------

    def _handle_due(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            _, _, kind, arg = heapq.heappop(self._events)
            if kind == _CLIENT:
                self._dispatch(arg)
            elif kind == _CRASH:
                if self.faults:
                    self._crash(_CRASH)
            elif kind == _RESTART and self.restart_pending:
                self._crash(_RESTART)
            elif kind == _CLOSE:
                if (self.faults and not self.closing and not self.restart_pending
                        and not self.crash_pending and self.engine is not None):
                    self._begin_close()
            elif kind == _REOPEN and arg == self.life and self.closing:
                self._reopen()
            elif (kind == _MOVE and self.faults and arg == self.life and self.engine is not None
                  and not self.closing and not self.restart_pending and not self.crash_pending
                  and not self.disk.killed):
                self._rename_and_restore()
            if self.crash_pending:
                self._crash(_CRASH)

    def _advance(self, until: float) -> None:
        """Runs the engine up to ``until``, handling faults as they come."""
        self._target = until
        try:
            self.loop.run_until(until)
        except SimDeadlock as e:  # run_until always has its own timer: cannot happen
            raise self.fail(str(e)) from None
        self._target = float("inf")
        self.t = self.loop.now
        engine = self.engine
        if engine is not None and engine.failure is not None and not self.restart_pending:
            # The log failed with nobody asking (a flush in the background): a
            # supervisor watching the engine restarts the process.
            self.log(f"the engine's log failed ({engine.failure}); the supervisor will restart it")
            self.restart_pending = True
            self._at(self.loop.now + 0.001, _RESTART)
        self._raise_failure()
        if self.crash_pending:
            self._crash(_CRASH)

    def run(self) -> Result:
        """Runs the seed to its end; raises :class:`SimFailure` if a check fails."""
        frozen = _FrozenRecords()
        for name in _ENGINE_LOGGERS:
            logging.getLogger(name).addFilter(frozen)
        try:
            return self._run()
        finally:
            for name in _ENGINE_LOGGERS:
                logging.getLogger(name).removeFilter(frozen)

    def _run(self) -> Result:
        cfg = self.cfg
        self.log(cfg.describe())
        for t_ms, action in sorted(self.plan.actions, key=lambda a: a[0]):
            self.actions.append(action)
            self.acked.append(False)
            self._schedule_action(len(self.actions) - 1, t_ms / 1000.0)
        if cfg.crash_every_ms:
            t = 0
            while True:
                t += 1 + self.rng.randrange(cfg.crash_every_ms * 2)
                if t > cfg.duration_ms:
                    break
                self._at(t / 1000.0, _CRASH)
        if cfg.close_every_ms:
            t = 0
            while True:
                t += 1 + self.rng.randrange(cfg.close_every_ms * 2)
                if t > cfg.duration_ms:
                    break
                self._at(t / 1000.0, _CLOSE)
        self._open()
        fault_end = cfg.duration_ms / 1000.0
        while self.loop.now < fault_end:
            nxt = min(self._events[0][0], fault_end) if self._events else fault_end
            self._advance(nxt)
            if self.loop.now >= nxt:
                self._handle_due(self.loop.now)
            self._check_service()
        # Faults stop; every acknowledged workflow must now finish.
        self.faults = False
        self.disk.fail_flush_rate = 0.0
        self.disk.arm_kills(random.Random(0), 0.0)
        self._events = [e for e in self._events if e[2] not in (_CRASH, _CLOSE)]
        heapq.heapify(self._events)
        self.log("faults stop")
        if self.restart_pending:
            self._crash(_RESTART)
        deadline = fault_end + cfg.settle_ms / 1000.0
        while not self._all_done():
            if self.loop.now > deadline:
                pending = self._unfinished()
                raise self.fail(f"{len(pending)} requests or workflows did not finish "
                                f"{cfg.settle_ms} ms after faults stopped: {', '.join(pending[:10])}")
            nxt = self.loop.now + 0.020
            idle_until = self.loop.next_deadline()
            if idle_until is not None and idle_until > nxt:
                # Nothing can happen before the loop's next timer (a sleep of days, say):
                # go straight there instead of looking every 20 ms.
                nxt = min(idle_until, deadline + 0.001)
            if self._events:
                nxt = min(nxt, self._events[0][0])
            self._advance(nxt)
            if self.loop.now >= nxt:
                self._handle_due(self.loop.now)
            self._check_service()
        self.log("all finished")
        self._check_integrity("at the end")
        self._check(final=True)
        self._finish_report()
        self.log("report " + self.report.line())
        return Result(self.report, self.trace, self.obs)

    def _check_service(self) -> None:
        v = checkers.tally("service", self.plan.service_violations())
        if v:
            raise self.fail(v[0])
        if checkers.tally("online", self.obs.violations):
            raise self.fail(self.obs.violations[0])

    def _finish_report(self) -> None:
        r = self.report
        r.workflows = len(self.obs.starts)
        r.finished = len(self.obs.results)
        r.flush_failures = self.disk.stats.failed_fdatasyncs
        r.sim_ms = int(self.loop.now * 1000)
        r.clock_jumps += self.loop.clock_jumps
        r.children = sum(1 for kids in self.obs.children.values() for k, _ in kids
                         if k in self.obs.results)
        if self.svc is not None:
            for wid, t in self.obs.cancels.items():
                r.cancels_mid_step += any(e.owner[0] == wid and e.begin <= t < e.end
                                          for e in self.svc.effects)
        for name, value in self.plan.counters().items():
            if hasattr(r, name):
                setattr(r, name, value)
        self._add_engine_stats()

    def _add_engine_stats(self) -> None:
        """Adds the engine's counters of this life (replays, parks, checkpoints) to the report."""
        if self.env is not None:
            self.report.sync_steps += self.env.steps_run
            self.report.inline_steps += self.env.steps_inline
            self.report.flush_waits += self.env.flush_waits
            self.env = None
        log = getattr(self.engine, "_log", None)
        if log is not None:
            self.report.log_batches += int(getattr(log, "batches_written", 0))
            self.report.offloaded += int(getattr(log, "blobs_written", 0))
        stats = getattr(self.engine, "stats", None)
        if callable(stats):
            stats = stats()
        if isinstance(stats, dict):
            for name in ("replays", "parked", "checkpoints", "signals_dropped", "budget_parks", "recovery_batches"):
                value = stats.get(name, 0)
                if isinstance(value, int):
                    setattr(self.report, name, getattr(self.report, name) + value)

    def bury(self) -> None:
        """Disposes of every life's coroutines, the last one's too (call once the run is over)."""
        self.dead.append(self.loop)
        if self.engine is not None:
            self.dead_engines.append(self.engine)
        self._bury_dead()

    def _bury_dead(self) -> None:
        """Disposes of the dead lives' coroutines and tables, between two lives (a seed of a
        thousand crashes would otherwise keep a thousand engines' memory)."""
        for loop in self.dead:
            loop.bury()
        self.dead.clear()
        # A crashed life's engine was never closed: its table still holds its runs.
        for engine in self.dead_engines:
            rt = getattr(engine, "_rt", None)
            if rt is not None:
                rt.release_table()
        self.dead_engines.clear()


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def _tracer_for(cfg: SimConfig) -> Any:
    """The simulator's tracer on a seed with telemetry, if OpenTelemetry's API is installed."""
    if not cfg.telemetry:
        return None
    try:
        from fusee.sim.tracing import SimTracerProvider
    except ImportError:
        return None
    return SimTracerProvider()


def _describe(action: Action) -> str:
    if isinstance(action, ObjectCall):
        return action.describe()
    if isinstance(action, Call):
        return f"call {action.handler.name} {action.key} ({action.call_id})"
    if isinstance(action, ReadStream):
        return f"read stream {action.name} of {action.id}"
    if isinstance(action, Start):
        return f"start {action.id} ({action.kind})"
    if isinstance(action, Signal):
        return f"signal {action.signal.name}={action.value!r} to {action.id}"
    if isinstance(action, Cancel):
        return f"cancel {action.id}"
    if isinstance(action, Terminate):
        return f"terminate {action.id}"
    if isinstance(action, Update):
        return f"update {action.update_id} add={action.value!r}"
    if isinstance(action, Complete):
        return f"{'fail' if action.fail else 'complete'} {action.id} with {action.value!r}"
    if isinstance(action, Reset):
        return f"reset {action.id} before {action.before_step!r}"
    if isinstance(action, FLOW_ACTIONS):
        return repr(action)
    return f"query {action.query.name} of {action.id}"




def run_seed(seed: int, *, verbose: bool = False, config: SimConfig | None = None) -> Result:
    """Runs one seed of the built-in workload; raises :class:`SimFailure` if a check fails."""
    world = World(config if config is not None else SimConfig.for_seed(seed), verbose=verbose)
    try:
        return world.run()
    finally:
        world.bury()
