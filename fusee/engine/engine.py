"""The embedded engine: open a directory, start and talk to workflows.

Every acknowledgement (a start, a signal, an accepted update, a cancel or a
terminate) is returned only once its record is durable; results and query
answers are released only from durable state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
from collections.abc import Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, TypeVar

from fusee import codec, sabotage
from fusee.core import records as rec
from fusee.definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
from fusee.durations import to_ms
from fusee.engine import periodic
from fusee.errors import EngineClosed, FuseeError, LogFailed, WrongEventLoop
from fusee.retry import Retry
from fusee.runtime import ended
from fusee.runtime.context import Duration
from fusee.runtime.env import DEFAULT_STEP_THREADS, Env, RealEnv
from fusee.runtime.runtime import IF_FINISHED, IF_RUNNING, Runtime, dedup_key
from fusee.runtime.wfloop import WorkflowLoop
from fusee.storage.committer import GroupCommitter
from fusee.storage.log import SharedLog

#: Where an engine opened without a path keeps its (in-memory) directory.
MEMORY_PATH = "/fusee-memory"

#: How long :meth:`Engine.close` lets running step functions finish, by default.
DEFAULT_CLOSE_GRACE = 10.0

T = TypeVar("T")
log = logging.getLogger("fusee")


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One workflow as the engine sees it now."""

    workflow_id: str
    run_id: int
    workflow: str
    #: "running", "stuck", or how it ended: "ok", "failed", "cancelled", "terminated", ...
    status: str
    shard: int


class RunHandle:
    """A workflow run, by ID: wait for its result, signal, query, update, cancel or terminate it."""

    __slots__ = ("_engine", "run_id", "workflow_id")

    def __init__(self, engine: Engine, workflow_id: str, run_id: int) -> None:
        self._engine = engine
        self.workflow_id = workflow_id
        #: The run this handle was made for (continue-as-new chains move on to new runs).
        self.run_id = run_id

    async def result(self) -> Any:
        """The workflow's result once durable (following continue-as-new).

        Raises :class:`fusee.WorkflowFailed` (or its subclasses for
        cancelled, terminated and timed-out runs) when it ended without one.
        """
        return await self._engine._result(self.workflow_id)

    async def signal(self, signal: SignalDef[Any], value: Any = None, *, dedup_key: str | None = None) -> None:
        """See :meth:`Engine.signal`."""
        await self._engine.signal(self.workflow_id, signal, value, dedup_key=dedup_key)

    async def query(self, query: QueryDef, arg: Any = None) -> Any:
        """See :meth:`Engine.query`."""
        return await self._engine.query(self.workflow_id, query, arg)

    async def update(self, update: UpdateDef[Any], arg: Any = None, *, update_id: str | None = None) -> Any:
        """See :meth:`Engine.update`."""
        return await self._engine.update(self.workflow_id, update, arg, update_id=update_id)

    async def cancel(self, reason: str = "") -> None:
        """See :meth:`Engine.cancel`."""
        await self._engine.cancel(self.workflow_id, reason)

    async def terminate(self, reason: str = "") -> None:
        """See :meth:`Engine.terminate`."""
        await self._engine.terminate(self.workflow_id, reason)

    async def resume(self) -> None:
        """See :meth:`Engine.resume`."""
        await self._engine.resume(self.workflow_id)

    def describe(self) -> RunSummary:
        """The workflow's current summary."""
        return self._engine.describe(self.workflow_id)

    def __repr__(self) -> str:
        return f"RunHandle({self.workflow_id!r}, run={self.run_id})"


class _Opening:
    """What :meth:`Engine.open` returns: await it, or use it with ``async with``."""

    def __init__(self, coro: Any) -> None:
        self._coro = coro
        self._engine: Engine | None = None

    def __await__(self) -> Generator[Any, None, Engine]:
        return self._coro.__await__()  # type: ignore[no-any-return]

    async def __aenter__(self) -> Engine:
        self._engine = await self._coro
        return self._engine

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._engine is not None:
            await self._engine.close()


class Engine:
    """An engine on one directory. Open it with :meth:`Engine.open`."""

    _env: Env
    _own_env: bool
    _log: SharedLog
    _closed: bool
    _committer: GroupCommitter
    _rt: Runtime
    #: Log records the last open read after the checkpoint.
    recovered_records: int

    def __init__(self) -> None:
        raise TypeError("use 'await fusee.Engine.open(path, workflows=[...])'")

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        workflows: Iterable[WorkflowDef[Any, Any]] = (),
        shards: int | None = None,
        env: Env | None = None,
        retry: Retry | None = None,
        inline_sync_steps: bool = False,
        step_threads: int = DEFAULT_STEP_THREADS,
        truncate_corrupt: bool = False,
        segment_bytes: int = 64 << 20,
        blob_threshold: int = 256 << 10,
        checkpoint_every: int = 200_000,
        checkpoint_interval: float | None = None,
        park_after: float | None = 60.0,
        max_loaded: int | None = None,
        retention: float | None = None,
    ) -> _Opening:
        """Opens (or creates) the engine directory ``path`` and recovers it.

        Every unfinished run's code replays its journal and continues. With
        ``path=None`` the same engine runs on memory (for tests: nothing
        survives the process). ``shards`` is fixed when the directory is
        created. ``truncate_corrupt`` is the operator's option to open a log
        damaged before its tail by truncating it at the damage (it loses what
        followed). Raises :class:`fusee.errors.DirectoryLocked` if another
        process holds the directory.

        A checkpoint is written every ``checkpoint_every`` records and, with
        ``checkpoint_interval`` (seconds), also that often while records were
        appended since the last one: either bounds what the next open reads.
        """
        return _Opening(
            cls._open(
                path,
                workflows=workflows,
                shards=shards,
                env=env,
                retry=retry,
                inline_sync_steps=inline_sync_steps,
                step_threads=step_threads,
                truncate_corrupt=truncate_corrupt,
                segment_bytes=segment_bytes,
                blob_threshold=blob_threshold,
                checkpoint_every=checkpoint_every,
                checkpoint_interval=checkpoint_interval,
                park_after=park_after,
                max_loaded=max_loaded,
                retention=retention,
            )
        )

    @classmethod
    async def _open(
        cls,
        path: str | os.PathLike[str] | None,
        *,
        workflows: Iterable[WorkflowDef[Any, Any]],
        shards: int | None,
        env: Env | None,
        retry: Retry | None,
        inline_sync_steps: bool,
        step_threads: int,
        truncate_corrupt: bool,
        segment_bytes: int,
        blob_threshold: int,
        checkpoint_every: int,
        checkpoint_interval: float | None,
        park_after: float | None,
        max_loaded: int | None,
        retention: float | None,
    ) -> Engine:
        registry: dict[str, WorkflowDef[Any, Any]] = {}
        for w in workflows:
            if not isinstance(w, WorkflowDef):
                raise TypeError(
                    f"workflows=[...] takes functions decorated with @fusee.workflow, got {w!r}"
                )
            if w.name in registry and registry[w.name] is not w:
                raise ValueError(f"two workflows are registered under the name {w.name!r}")
            registry[w.name] = w
        if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive int, got {checkpoint_every!r}")
        interval = periodic.check_interval(checkpoint_interval)
        if shards is not None and (not isinstance(shards, int) or isinstance(shards, bool) or shards < 1):
            raise ValueError(f"shards must be a positive int, got {shards!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"retry must be a fusee.Retry, got {retry!r}")
        own_env = env is None
        if env is None:
            if path is None:
                from fusee.storage.simdisk import SimDisk

                storage: Any = SimDisk(random.Random(0))
            else:
                from fusee.storage.posix import PosixStorage

                storage = PosixStorage()
            env = RealEnv(storage, inline_sync_steps=inline_sync_steps, step_threads=step_threads)
        dir_path = MEMORY_PATH if path is None else os.fspath(path)
        def open_log() -> tuple[SharedLog, Any]:
            return SharedLog.open(
                env.storage,
                dir_path,
                shards if shards is not None else _existing_shards(env.storage, dir_path),
                segment_bytes=segment_bytes,
                blob_threshold=blob_threshold,
                truncate_corrupt=truncate_corrupt,
                rng=env.rng,
            )

        # Recovery reads files: off the loop on a real disk, inline on memory or in a simulation.
        if own_env and path is not None:
            log, recovery = await asyncio.get_running_loop().run_in_executor(None, open_log)
        else:
            log, recovery = open_log()
        self = object.__new__(cls)
        self._env = env
        self._own_env = own_env
        self._log = log
        self._closed = False
        self._committer = GroupCommitter(
            log,
            run_blocking=env.run_step if sabotage.active.flush_shares_step_pool else env.run_io,
            inline=env.inline_flush,
            on_durable=lambda durable: self._rt.on_durable(durable),
        )
        self._rt = Runtime(
            env,
            self._committer,
            log.shards,
            registry,
            retry or Retry(),
            park_after=park_after,
            max_loaded=max_loaded,
            retention=retention,
            checkpoint_every=checkpoint_every,
        )
        if recovery.checkpoint is not None:
            self._rt.load_checkpoint(recovery.checkpoint)
        self._rt.load((shard, lsn, rec.decode(data)) for shard, lsn, data in recovery.records)
        self.recovered_records = len(recovery.records)
        self._rt.resume_all()
        if interval is not None:
            periodic.every(self._rt.loop, interval, self._periodic_checkpoint)
        return self

    def _periodic_checkpoint(self) -> bool:
        """One tick of ``checkpoint_interval``: False once the engine is closed (the ticks stop)."""
        if self._closed:
            return False
        if self._rt.appended_since_checkpoint():
            self._rt.checkpoint()
        return True

    # --- helpers ---------------------------------------------------------

    def _check_loop(self) -> None:
        """Every entry point runs on the engine's loop: refuse others before anything is recorded."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is self._rt.loop:
            return
        if isinstance(loop, WorkflowLoop):
            raise WrongEventLoop(
                "the engine was called from workflow code; use ctx (ctx.child, "
                "ctx.signal_workflow, ...) or call the engine from a step function"
            )
        raise WrongEventLoop(
            "the engine was called from another thread or event loop than the one it was opened on; "
            "use engine.run_threadsafe(engine.signal, ...) (or asyncio.run_coroutine_threadsafe(..., "
            "engine.loop)) from other threads"
        )

    def _check_open(self) -> None:
        self._check_loop()
        if self._closed:
            raise EngineClosed("the engine is closed: open it again to continue")
        failed = self._log.failed
        if failed is not None:
            raise EngineClosed(
                f"the engine's log failed ({failed}); nothing after the failure was acknowledged. "
                "Close the engine and open the directory again."
            ) from failed

    async def _durable(self, shard: int, lsn: int) -> None:
        if sabotage.active.ack_before_durable:
            return
        try:
            await self._rt.wait_durable(shard, lsn)
        except LogFailed as e:
            raise EngineClosed(
                f"the engine's log failed ({e}); this request was not acknowledged. "
                "Close the engine and open the directory again."
            ) from e

    def _workflow(self, workflow: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]:
        return self._rt.check_registered(workflow)

    @staticmethod
    def _check_id(workflow_id: object) -> str:
        if not isinstance(workflow_id, str) or not workflow_id:
            raise TypeError(f"a workflow id must be a non-empty string, got {workflow_id!r}")
        return workflow_id

    # --- the client API -----------------------------------------------------

    async def start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        workflow_id: str,
        input: Any = None,
        *,
        if_running: str = "fail",
        if_finished: str = "fail",
        timeout: Duration | None = None,
    ) -> RunHandle:
        """Starts ``workflow`` as ``workflow_id`` and returns once its start is durable.

        If the ID is running: ``if_running`` is ``"fail"`` (raise
        :class:`fusee.AlreadyExists`), ``"attach"`` (return its handle) or
        ``"terminate"`` (end it and start anew). If it finished:
        ``if_finished`` is ``"fail"``, ``"attach"`` (its stored result) or
        ``"start"`` (run it again).

        ``timeout`` bounds the whole workflow (across continue-as-new): when it
        passes, the run ends at once as timed out (``result()`` raises
        :class:`fusee.WorkflowTimedOut`) and its children follow their close
        policy. The deadline is journaled: it holds across crashes.
        """
        self._check_open()
        deadline_ms = self._env.now_ms() + to_ms(timeout) if timeout is not None else 0
        wdef = self._workflow(workflow)
        wid = self._check_id(workflow_id)
        if if_running not in IF_RUNNING:
            raise ValueError(f"if_running must be one of {IF_RUNNING}, got {if_running!r}")
        if if_finished not in IF_FINISHED:
            raise ValueError(f"if_finished must be one of {IF_FINISHED}, got {if_finished!r}")
        if not wdef.takes_input and input is not None:
            raise TypeError(f"workflow '{wdef.name}' takes no input, got {type(input).__name__}")
        payload = codec.encode_input(wdef, input)
        st, lsn, _ = self._rt.start_workflow(
            wdef, wid, payload, if_running=if_running, if_finished=if_finished, deadline_ms=deadline_ms
        )
        run_id = st.run_id
        await self._durable(st.shard, lsn)
        return RunHandle(self, wid, run_id)

    async def execute(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        workflow_id: str,
        input: Any = None,
        *,
        if_running: str = "fail",
        if_finished: str = "fail",
        timeout: Duration | None = None,
    ) -> Any:
        """Starts ``workflow`` and returns its result (see :meth:`start` and :meth:`RunHandle.result`)."""
        h = await self.start(
            workflow, workflow_id, input, if_running=if_running, if_finished=if_finished, timeout=timeout
        )
        return await h.result()

    def get(self, workflow_id: str) -> RunHandle:
        """A handle to an existing workflow. Raises :class:`fusee.NotFound` if there is none."""
        self._check_open()
        st = self._rt.current(self._check_id(workflow_id))
        return RunHandle(self, workflow_id, st.run_id)

    async def _result(self, workflow_id: str) -> Any:
        self._check_open()
        status, payload = await self._rt.result_of(workflow_id)
        st = self._rt.current(workflow_id)
        wdef = self._rt.workflows.get(st.wtype)
        return self._rt.raise_for(workflow_id, status, payload, wdef.result_type if wdef else Any)

    async def signal(
        self,
        workflow_id: str,
        signal: SignalDef[Any],
        value: Any = None,
        *,
        dedup_key: str | None = None,
    ) -> None:
        """Delivers a signal; returns once it is durable.

        Signals wait in the run until its code waits for them, and are taken
        in arrival order. A signal with a ``dedup_key`` the run has already
        received is dropped (the call still succeeds).
        """
        self._check_open()
        if not isinstance(signal, SignalDef):
            raise TypeError(f"signal takes a signal made with fusee.signal(...), got {signal!r}")
        wid = self._check_id(workflow_id)
        payload = codec.encode_signal(signal, value)
        key = _dedup(dedup_key)
        st = self._rt.current(wid)
        lsn = self._rt.signal(wid, signal.name, payload, key, None)
        await self._durable(st.shard, lsn)

    async def query(self, workflow_id: str, query: QueryDef, arg: Any = None) -> Any:
        """Answers ``query`` from the run's state, once that state is durable.

        An ended run is answered too, until its retention ends: its code is
        gone, so its journal is replayed (read-only: nothing is recorded, no
        step runs) to rebuild the handler's state as it ended.

        Answers to queries of one run are released in the order the queries
        were asked, so a later answer never shows an older state than an
        earlier one.
        """
        self._check_open()
        if not isinstance(query, QueryDef):
            raise TypeError(f"query takes a query made with fusee.query(...), got {query!r}")
        wid = self._check_id(workflow_id)
        st = self._rt.current(wid)
        if not st.running:
            # The run ended: its code is gone, a read-only replay answers (during retention).
            await self._durable(st.shard, st.done_lsn)
            return ended.answer_query(self._rt, st, query, arg)
        run = self._rt.running_run(wid)
        answer = run.answer_query(query, arg)
        earlier = run.last_answer
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        run.last_answer = mine
        try:
            if not sabotage.active.query_from_nondurable:
                await self._durable(run.shard, run.machine.gate)
            if earlier is not None and not earlier.done():
                await asyncio.shield(earlier)
        finally:
            mine.set_result(None)
        return answer

    async def update(
        self,
        workflow_id: str,
        update: UpdateDef[Any],
        arg: Any = None,
        *,
        update_id: str | None = None,
    ) -> Any:
        """Runs an update: the validator may reject it (its error is raised here, nothing is recorded);
        otherwise the handler's result is returned once durable. An ``update_id`` that was
        answered before returns the same answer again."""
        self._check_open()
        if not isinstance(update, UpdateDef):
            raise TypeError(f"update takes an update made with fusee.update(...), got {update!r}")
        run = self._rt.running_run(self._check_id(workflow_id))
        payload = codec.encode_update_arg(update, arg)
        uid = update_id if update_id is not None else self._env.rng.getrandbits(128).to_bytes(16, "big").hex()
        if not isinstance(uid, str) or not uid:
            raise TypeError("update_id must be a non-empty string")
        done = run.update_results.get(uid)
        if done is not None:
            await self._durable(run.shard, run.machine.gate)
            status, result = done
            if status == rec.Status.OK:
                return codec.decode(result, update.result_type)
            from fusee.errors import UpdateFailed

            info = codec.decode_error(result)
            raise UpdateFailed(f"update handler failed: {info.type}: {info.message}")
        inflight = run.update_inflight.get(uid)
        if inflight is not None:
            return codec.retype(await asyncio.shield(inflight), update.result_type)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if run.attach_update(uid, fut):
            # Accepted before (perhaps in an earlier life) and still running: wait for its answer.
            return codec.retype(await fut, update.result_type)
        run.offer_update(update.name, uid, payload, fut)
        return codec.retype(await fut, update.result_type)

    async def cancel(self, workflow_id: str, reason: str = "") -> None:
        """Requests cancellation; returns once the request is durable.

        The run's pending operations raise :class:`fusee.Cancelled`; its code
        may catch it and compensate.
        """
        self._check_open()
        wid = self._check_id(workflow_id)
        st = self._rt.current(wid)
        lsn = self._rt.cancel(wid, str(reason), None)
        await self._durable(st.shard, lsn)

    async def terminate(self, workflow_id: str, reason: str = "") -> None:
        """Ends the run at once without running more of its code; returns once durable."""
        self._check_open()
        wid = self._check_id(workflow_id)
        st = self._rt.current(wid)
        lsn = self._rt.terminate(wid, str(reason), None)
        await self._durable(st.shard, lsn)

    async def resume(self, workflow_id: str) -> None:
        """Resumes the run's paused steps (their retries ran out) with a fresh retry budget."""
        self._check_open()
        wid = self._check_id(workflow_id)
        st = self._rt.current(wid)
        lsn = self._rt.resume(wid, None)
        await self._durable(st.shard, lsn)

    # --- other threads -------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine runs on: every call must be made there."""
        return self._rt.loop

    def run_threadsafe(
        self, method: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> T:
        """Calls an engine coroutine method from another thread and returns its result.

        ``engine.run_threadsafe(engine.signal, "order-1", approve, True)``
        runs ``engine.signal(...)`` on the engine's loop and blocks this thread
        until it returns (or ``timeout`` seconds pass: ``TimeoutError``). It
        must not be called from the engine's own loop (that would deadlock):
        there, ``await`` the method directly.
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._rt.loop:
            raise WrongEventLoop("run_threadsafe was called on the engine's own loop: await the method instead")

        async def call() -> T:
            return await method(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), self._rt.loop).result(timeout)

    # --- inspection ---------------------------------------------------------

    async def journal(self, workflow_id: str) -> list[rec.Record]:
        """The durable records of the workflow's current run, in journal order."""
        self._check_open()
        st = self._rt.current(self._check_id(workflow_id))
        durable = self._rt.durable(st.shard)
        journal, lsns = self._rt.journal_of(st)
        return [r for r, lsn in zip(journal, lsns, strict=True) if lsn <= durable]

    def describe(self, workflow_id: str) -> RunSummary:
        """The workflow's summary. Raises :class:`fusee.NotFound` for an unknown ID."""
        st = self._rt.current(self._check_id(workflow_id))
        return self._summary(st)

    def _summary(self, st: Any) -> RunSummary:
        if st.id in self._rt.stuck:
            status = "stuck"
        elif st.status is None or st.status == rec.Status.CONTINUED:
            status = "running"
        else:
            status = st.status.name.lower()
        return RunSummary(st.id, st.run_id, st.wtype, status, st.shard)

    def runs(self) -> list[RunSummary]:
        """Every workflow the engine knows, in the order they were first seen."""
        return [self._summary(st) for st in self._rt.wf.values()]

    def stuck(self) -> dict[str, str]:
        """Runs stopped by a determinism error (or an unregistered type), with the message."""
        return dict(self._rt.stuck)

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the engine's log (then nothing more is acknowledged:
        close and reopen), or None."""
        return self._log.failed

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._rt.stats)

    # --- checkpoints and closing ------------------------------------------------

    async def checkpoint(self) -> None:
        """Writes a checkpoint now: the next open reads it instead of the log before it.

        The engine also writes one every ``checkpoint_every`` records, and at close.
        """
        self._check_open()
        self._rt.checkpoint()

    async def close(self, grace: Duration = DEFAULT_CLOSE_GRACE) -> None:
        """Stops the engine gracefully.

        New calls are refused at once (:class:`fusee.EngineClosed`) and no new
        step function starts. Step functions already running get up to
        ``grace`` (default 10 s) to finish; their results are journaled, so they
        do not run again at the next open. Then workflow code stops where it
        is (it continues at the next open), everything journaled is made
        durable, and a checkpoint is written. A step still running when the
        grace ends has its result dropped: it runs again at the next open.
        """
        self._check_loop()
        if self._closed:
            return
        self._closed = True
        rt = self._rt
        rt.closing = True
        grace_s = to_ms(grace) / 1000
        if rt.steps.executing and self._log.failed is None:
            try:
                await asyncio.wait_for(rt.steps.wait_idle(), grace_s)
            except TimeoutError:
                log.warning("close: %d step function(s) still running after the %ss grace; "
                            "they run again at the next open", rt.steps.executing, grace_s)
        rt.park_all()
        rt.closed = True
        rt.timers.close()
        for st in rt.wf.values():
            if st.run is not None:
                st.run.kill()
        for t in list(rt._tasks):
            t.cancel()
        if rt._tasks:
            await asyncio.gather(*rt._tasks, return_exceptions=True)
        try:
            if self._log.failed is None:
                self._log.checkpoint(rt.checkpoint_state())
        except FuseeError:
            pass
        finally:
            await self._committer.close()
            self._log.close()
            if self._own_env and isinstance(self._env, RealEnv):
                self._env.close()

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _existing_shards(storage: Any, path: str) -> int:
    """The shard count an existing directory was created with (1 for a new one)."""
    import json

    from fusee.storage.seam import read_whole

    meta = f"{path.rstrip('/')}/meta"
    try:
        if storage.exists(meta):
            return int(json.loads(read_whole(storage, meta))["shards"])
    except (ValueError, KeyError, TypeError, OSError):
        pass  # the log's own open reports a damaged meta file clearly
    return 1


def _dedup(key: str | None) -> int:
    if key is None:
        return 0
    if not isinstance(key, str) or not key:
        raise TypeError(f"dedup_key must be a non-empty string, got {key!r}")
    return dedup_key("client:" + key)


__all__ = ["Engine", "RunHandle", "RunSummary"]
