"""A testing kit: an in-memory engine whose clock skips idle time.

``TestEngine`` opens an engine on memory in about a millisecond. Whenever
nothing in it can make progress but a timer (every run sleeps, waits with a
timeout, or waits for a retry) and the test only waits (no task of its own
sleeps on the real clock), its clock jumps to the next timer, so a workflow
that sleeps for 30 days finishes in milliseconds. Step functions still run
for real, on the real clock.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import random
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from fusee import journal_file
from fusee import telemetry as telemetry_config
from fusee.core import journal as jm
from fusee.core import records as rec
from fusee.definitions import WorkflowDef
from fusee.durations import to_ms
from fusee.encryption import Codec
from fusee.engine.engine import Engine
from fusee.errors import DeterminismError, FuseeError
from fusee.limits import Limit
from fusee.objects import ObjectDef
from fusee.retry import Retry
from fusee.runtime.context import Duration
from fusee.runtime.env import RealEnv
from fusee.runtime.table import WorkflowState
from fusee.sizes import Size
from fusee.storage.simdisk import SimDisk

__all__ = [
    "CrashCheckFailed",
    "EngineOptions",
    "TestEngine",
    "crash_everywhere",
    "journal_json",
    "load_journal",
    "replay",
    "replay_dir",
]


class EngineOptions(TypedDict, total=False):
    """The options of :meth:`fusee.Engine.open` that an engine on memory takes (same meaning).

    :class:`TestEngine`, :func:`replay`, :func:`replay_dir` and
    :func:`crash_everywhere` take them as keyword arguments: open the engine
    under test as the application opens its own (its ``limits``, its
    ``codec``...), or the code meets an engine it was not written for.
    """

    shards: int | None
    retry: Retry | None
    inline_sync_steps: bool | None
    flush: str | None
    step_threads: int
    segment_bytes: int | None
    blob_threshold: int
    checkpoint_every: int
    checkpoint_interval: float | None
    checkpoint_bytes: int | None
    park_after: float | None
    max_loaded: int | None
    memory_budget: Size | None
    recovery_batch: int
    retention: float | None
    keep_history: bool
    codec: Codec | None
    limits: Iterable[Limit]
    telemetry: bool | telemetry_config.Telemetry | None
    tune_gc: bool


#: What ``workflows=[...]`` takes: workflows and keyed objects.
Definitions = Iterable[WorkflowDef[Any, Any] | ObjectDef[Any]]


class _SkippingEnv(RealEnv):
    """The real Env with a clock that can be moved forward (and, frozen, moves no other way)."""

    def __init__(self, frozen: bool = False, **options: Any) -> None:
        super().__init__(SimDisk(random.Random(0)), **options)
        self.offset_ms = 0
        # A frozen clock starts at the real time, to the second: what it reads stays round.
        self._frozen_us = (super().now_ms() // 1000) * 1_000_000 if frozen else None

    def now_ms(self) -> int:
        return self.now_us() // 1000

    def now_us(self) -> int:
        base = super().now_us() if self._frozen_us is None else self._frozen_us
        return base + self.offset_ms * 1000


if TYPE_CHECKING:
    # Type checkers see every engine method on a TestEngine, typed as on the engine (at run
    # time they are the engine's own, reached through __getattr__).
    _EngineMethods = Engine
else:
    _EngineMethods = object


class TestEngine(_EngineMethods):
    """An in-memory :class:`fusee.Engine` for tests, with a clock that skips idle time.

    ``async with TestEngine(workflows=[...]) as env:`` gives an object with
    every method of the engine (``await env.execute(...)``, ``env.describe``)
    plus :meth:`skip`, :meth:`until` and :meth:`now`. Options are those of
    :meth:`fusee.Engine.open` (:class:`EngineOptions`; runs are not parked
    unless ``park_after`` is given). The clock skips idle time only while no
    task of the test sleeps on the real clock (a test polling with
    ``asyncio.sleep`` is busy: poll with :meth:`until` to let it skip). With
    ``skip_time=False`` only :meth:`skip` moves the clock ahead of real time.
    With ``frozen_clock=True`` real time does not move it either (it starts at
    the current second): only :meth:`skip` and the skipping of idle time do,
    so every time the engine records (``ctx.now()``, when a step attempt began
    and how long it took) is exact.
    """

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(
        self, workflows: Definitions = (), *, skip_time: bool = True, frozen_clock: bool = False,
        **options: Unpack[EngineOptions],
    ) -> None:
        self._workflows = list(workflows)
        self._options: dict[str, Any] = {"park_after": None, **options}
        self._skip_time = skip_time
        self._frozen = frozen_clock
        self._clock: _SkippingEnv | None = None
        self._engine: Engine | None = None
        self._skipper: asyncio.Task[None] | None = None

    @property
    def engine(self) -> Engine:
        """The engine under test."""
        if self._engine is None:
            raise RuntimeError("the TestEngine is not open: use 'async with TestEngine(...) as env'")
        return self._engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def __aenter__(self) -> TestEngine:
        # Options of the Env itself: where steps and flushes run.
        env_keys = ("inline_sync_steps", "flush", "step_threads")
        self._clock = _SkippingEnv(self._frozen, **{k: v for k, v in self._options.items() if k in env_keys})
        options = {k: v for k, v in self._options.items() if k not in env_keys}
        self._engine = await Engine.open(None, workflows=self._workflows, env=self._clock, **options)
        if self._skip_time:
            self._skipper = asyncio.get_running_loop().create_task(self._skip_idle())
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._skipper is not None:
            self._skipper.cancel()
            try:
                await self._skipper
            except asyncio.CancelledError:
                pass
        try:
            if self._engine is not None:
                await self._engine.close()
        finally:
            if self._clock is not None:
                self._clock.close()

    def now(self) -> datetime.datetime:
        """The engine's current time (UTC): what ``ctx.now()`` would record."""
        assert self._clock is not None
        return datetime.datetime.fromtimestamp(self._clock.now_ms() / 1000, tz=datetime.UTC)

    async def skip(self, duration: Duration) -> None:
        """Moves the engine's clock forward by ``duration``; what came due runs before this returns."""
        assert self._clock is not None
        self._clock.offset_ms += to_ms(duration)
        self.engine._rt.timers.rearm()
        for _ in range(3):
            await asyncio.sleep(0)

    async def until(self, cond: Callable[[], object], *, timeout: float = 10.0) -> None:
        """Waits until ``cond()`` is true, the clock skipping idle time meanwhile.

        A test that polls with its own ``asyncio.sleep`` is busy on the real
        clock, so the clock holds still; polling through this call says the
        test only waits. Raises :class:`TimeoutError` after ``timeout`` real
        seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not cond():
            if loop.time() > deadline:
                raise TimeoutError(f"the condition did not hold within {timeout} s")
            await asyncio.sleep(0.001)

    def _idle(self) -> bool:
        """Nothing but a timer can move the engine on, and the test only waits (see :meth:`_test_waits`)."""
        rt = self.engine._rt
        committer = self.engine._committer
        return (
            rt.steps.executing == 0
            and not rt.steps.has_gated()
            and not rt.log.has_pending()
            and committer.waiters == 0
            and rt.timers.next_due() is not None
            and self._test_waits()
        )

    def _test_waits(self) -> bool:
        """No task outside the engine sleeps on the real clock.

        A task in ``asyncio.sleep`` (a test polling a ledger every 10 ms, a
        helper that acts after a delay) will act soon: skipping an hour before
        it does would let a run's timeout fire first. A task awaiting the engine
        (a result, an update), a future or an event only waits, as does one
        polling through :meth:`until`.
        """
        own = self.engine._rt._tasks
        for task in asyncio.all_tasks():
            if task is self._skipper or task in own or task.done():
                continue
            if _sleeps(task.get_coro()):
                return False
        return True

    async def _skip_idle(self) -> None:
        env = self._clock
        assert env is not None
        quiet = 0
        while True:
            await asyncio.sleep(0.001)
            if not self._idle():
                quiet = 0
                continue
            quiet += 1
            if quiet < 3:
                continue  # idle on consecutive looks, not between two callbacks
            due = self.engine._rt.timers.next_due()
            now = env.now_ms()
            if due is not None and due > now:
                env.offset_ms += due - now
                self.engine._rt.timers.rearm()
            quiet = 0


def _sleeps(coro: object) -> bool:
    """Whether the chain of awaits from ``coro`` is in ``asyncio.sleep`` (not through ``TestEngine.until``)."""
    for _ in range(1000):  # a chain is short; a cycle (never seen) must not hang the skipper
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        if code is _UNTIL_CODE:
            return False
        if code is _SLEEP_CODE:
            return True
        nxt = getattr(coro, "cr_await", None)
        if nxt is None:
            nxt = getattr(coro, "gi_yieldfrom", None)
        if nxt is None:
            return False
        coro = nxt
    return False


_SLEEP_CODE = asyncio.sleep.__code__
_UNTIL_CODE = TestEngine.until.__code__


# --- recorded histories against new code -------------------------------------------


def load_journal(path: str | os.PathLike[str]) -> list[rec.Record]:
    """The journal in a ``.fjnl`` file written by ``engine.export``."""
    return journal_file.read(path)


def journal_json(journal: list[rec.Record] | str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The normalized, language-neutral JSON view of a journal (or of a ``.fjnl`` file)."""
    return journal_file.journal_json(_records(journal))


def _records(journal: list[rec.Record] | str | os.PathLike[str]) -> list[rec.Record]:
    return list(journal) if isinstance(journal, list) else journal_file.read(journal)


async def replay(
    journal: list[rec.Record] | str | os.PathLike[str], workflows: Definitions,
    **options: Unpack[EngineOptions],
) -> None:
    """Runs ``workflows``' code against a recorded journal, running no step.

    Raises :class:`fusee.DeterminismError` naming the position where the code
    no longer does what the journal recorded (an operation added, removed,
    renamed or reordered without ``ctx.patched``), or when a finished run's
    code now ends differently. When the code raised where the journal
    recorded something else (a bug, or an engine option missing here), that
    exception is raised itself, with a note saying where. A journal of a run
    still under way replays up to where it stopped. ``options`` are those of
    :meth:`fusee.Engine.open` (:class:`EngineOptions`): give the ones the
    application opens its engine with (``limits=``, ``codec=``...). Use it in
    CI with the journals of production runs.
    """
    from fusee.runtime.ended import replay_verifying

    records = _records(journal)
    start = records[0]
    assert isinstance(start, rec.Start)
    async with TestEngine(workflows, skip_time=False, **options) as env:
        rt = env.engine._rt
        wdef = rt.definition(start.wtype, start.version)
        if wdef is None:
            raise rt.unregistered(start.wtype, start.version)
        st = WorkflowState(start.id, 0, wtype=start.wtype, run_id=start.run, version=start.version)
        machine = jm.RunMachine.from_journal(records, len(records))
        err = replay_verifying(rt, st, wdef, machine, records)
        if err is not None:
            raise err


async def replay_dir(
    directory: str | os.PathLike[str], workflows: Definitions, **options: Unpack[EngineOptions]
) -> int:
    """:func:`replay` for every ``.fjnl`` file in ``directory``; returns how many were checked.

    The first divergence raises, its message prefixed with the file's name (an
    exception the code raised gets a note naming the file).
    """
    defs = list(workflows)
    paths = sorted(p for p in os.listdir(directory) if p.endswith(".fjnl"))
    for name in paths:
        try:
            await replay(os.path.join(directory, name), defs, **options)
        except DeterminismError as e:
            raise DeterminismError(f"{name}: {e.detail}", e.seq) from e
        except Exception as e:
            e.add_note(f"replaying {name}")
            raise
    return len(paths)


# --- a crash after every record ----------------------------------------------------------


class CrashCheckFailed(AssertionError):
    """A run recovered from a cut of its journal ended differently, or re-ran a recorded step."""


async def crash_everywhere(
    workflow: WorkflowDef[Any, Any], input: Any = None, *, workflows: Definitions = (),
    workflow_id: str = "crash-everywhere", **options: Unpack[EngineOptions],
) -> int:
    """Runs ``workflow`` once, then again from every prefix of its journal, as after a crash there.

    Each restart must end with the same result (or the same failure) and must
    not run again a step whose result the prefix holds. Raises
    :class:`CrashCheckFailed` naming the first cut that breaks either rule, or
    when there is no cut to check (the run recorded nothing between its start
    and its end: it failed at once, say for a limit the engine lacks); returns
    the number of cuts checked. Step functions run for real at every restart:
    keep their effects harmless (or idempotent by ``info.key``). ``options``
    are those of :meth:`fusee.Engine.open` (:class:`EngineOptions`), for the
    first run and every restart.
    """
    defs = list(workflows) or [workflow]
    if all(d is not workflow for d in defs):
        defs.append(workflow)
    async with TestEngine(defs, **options) as env:
        await env.start(workflow, workflow_id, input)
        expected = await _outcome(env, workflow_id)
        journal = await env.journal(workflow_id)
    assert isinstance(journal[-1], rec.Done), "the run ended: its journal ends with Done"
    cuts = range(1, len(journal) - 1)
    if not cuts:
        raise CrashCheckFailed(
            f"nothing to check: the run of workflow '{workflow.name}' recorded no operation before it "
            f"ended {expected!r}, so no crash point lies between its start and its end (pass the engine "
            "options the workflow needs, e.g. limits=[...], and an input it gets past its start with)"
        )
    for k in cuts:
        prefix = journal[:k]
        recorded = {r.seq for r in prefix if isinstance(r, rec.Step)}
        async with TestEngine(defs, **options) as env:
            rt = env.engine._rt
            rt.steps.started = []
            st = WorkflowState(workflow_id, 0)
            rt.wf[workflow_id] = st
            lsn = rt.adopt(st, prefix)
            await rt.wait_durable(st.shard, lsn)
            got = await _outcome(env, workflow_id)
            again = sorted(seq for wid, seq in rt.steps.started if wid == workflow_id and seq in recorded)
        if again:
            raise CrashCheckFailed(
                f"after a crash at record {k} ({type(journal[k - 1]).__name__}), the steps at positions "
                f"{again} ran again although their results were recorded"
            )
        if got != expected:
            raise CrashCheckFailed(
                f"after a crash at record {k} ({type(journal[k - 1]).__name__}) the run ended "
                f"{got!r}, not {expected!r} as without a crash"
            )
    return len(cuts)


async def _outcome(env: TestEngine, workflow_id: str) -> tuple[str, Any]:
    try:
        return ("ok", await asyncio.wait_for(env.get(workflow_id).result(), 60))
    except FuseeError as e:
        return (type(e).__name__, str(e))
