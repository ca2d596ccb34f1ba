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
from collections.abc import Generator, Iterable
from types import TracebackType
from typing import Any

from fusee import codec, sabotage
from fusee.core import records as rec
from fusee.definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
from fusee.errors import (
    CorruptRecord,
    EngineClosed,
    FuseeError,
    InvalidWorkflowId,
    LogCorrupted,
    StorageError,
)
from fusee.retry import Retry
from fusee.runtime.env import Env, RealEnv
from fusee.runtime.runtime import IF_FINISHED, IF_RUNNING, Runtime, dedup_key
from fusee.storage.committer import GroupCommitter
from fusee.storage.directory import existing_shards
from fusee.storage.log import RESTORE_ADVICE, SharedLog

_logger = logging.getLogger("fusee")

#: Where an engine opened without a path keeps its (in-memory) directory.
MEMORY_PATH = "/fusee-memory"


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
    #: Opened for inspection only: nothing is written, no workflow code runs.
    _read_only: bool
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
        truncate_corrupt: bool = False,
        segment_bytes: int = 64 << 20,
        blob_threshold: int = 256 << 10,
        checkpoint_every: int = 200_000,
        checkpoint_bytes: int | None = None,
        park_after: float | None = 60.0,
        max_loaded: int | None = None,
        retention: float | None = None,
        read_only: bool = False,
    ) -> _Opening:
        """Opens (or creates) the engine directory ``path`` and recovers it.

        Every unfinished run's code replays its journal and continues. With
        ``path=None`` the same engine runs on memory (for tests: nothing
        survives the process). ``shards`` is fixed when the directory is
        created. ``truncate_corrupt`` is the operator's option to open a log
        damaged before its tail by truncating it at the damage (it loses what
        followed). A checkpoint is written every ``checkpoint_every`` records
        and every ``checkpoint_bytes`` bytes of records (default: one segment,
        ``segment_bytes``), which bounds recovery's time and memory. Raises
        :class:`fusee.errors.DirectoryLocked` if another
        process holds the directory, :class:`fusee.errors.NotAnEngineDirectory`
        if ``path`` is a file or a non-empty directory that no engine created
        (it is left untouched). ``read_only=True`` opens an existing directory
        for inspection (``runs``, ``describe``, ``journal``): nothing is
        written and no workflow code runs.
        """
        return _Opening(
            cls._open(
                path,
                workflows=workflows,
                shards=shards,
                env=env,
                retry=retry,
                inline_sync_steps=inline_sync_steps,
                truncate_corrupt=truncate_corrupt,
                segment_bytes=segment_bytes,
                blob_threshold=blob_threshold,
                checkpoint_every=checkpoint_every,
                checkpoint_bytes=checkpoint_bytes,
                park_after=park_after,
                max_loaded=max_loaded,
                retention=retention,
                read_only=read_only,
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
        truncate_corrupt: bool,
        segment_bytes: int,
        blob_threshold: int,
        checkpoint_every: int,
        checkpoint_bytes: int | None,
        park_after: float | None,
        max_loaded: int | None,
        retention: float | None,
        read_only: bool = False,
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
        if checkpoint_bytes is not None and (not isinstance(checkpoint_bytes, int) or checkpoint_bytes < 1):
            raise ValueError(f"checkpoint_bytes must be a positive int, got {checkpoint_bytes!r}")
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
            env = RealEnv(storage, inline_sync_steps=inline_sync_steps)
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
                read_only=read_only,
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
        self._read_only = read_only
        self._committer = GroupCommitter(
            log,
            run_blocking=env.run_blocking,
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
        try:
            self._load(recovery, f"{log.dir.path}/checkpoint")
            self.recovered_records = len(recovery.records)
            if not read_only:
                self._rt.resume_all()
        except BaseException:
            # A failed open leaves nothing held: the directory can be opened again in-process.
            self._rt.closed = True
            self._rt.timers.close()
            log.close()
            if own_env and isinstance(env, RealEnv):
                env.close()
            raise
        log.on_failed = self._fail_waiters
        if checkpoint_bytes is not None:
            log.checkpoint_bytes = checkpoint_bytes
        rt = self._rt

        def checkpoint_soon() -> None:
            rt.loop.call_soon(rt.checkpoint)

        log.on_checkpoint_due = checkpoint_soon
        return self

    def _load(self, recovery: Any, ckpt_path: str) -> None:
        """Loads the checkpoint and records; what does not decode is a typed error naming where it is."""
        if recovery.checkpoint is not None:
            try:
                self._rt.load_checkpoint(recovery.checkpoint)
            except Exception as e:  # a valid checksum over content this code cannot read
                raise LogCorrupted(ckpt_path, 0, f"the checkpoint's content does not decode "
                                   f"({type(e).__name__}: {e})", RESTORE_ADVICE) from e
        at = 0

        def decoded() -> Generator[tuple[int, int, rec.Record], None, None]:
            nonlocal at
            for i, (shard, lsn, data) in enumerate(recovery.records):
                at = i
                r = rec.decode(data)
                if type(r) is rec.Start and not r.id:
                    raise CorruptRecord("a Start record with an empty workflow ID")
                yield shard, lsn, r

        try:
            self._rt.load(decoded())
        except (CorruptRecord, ValueError, TypeError, IndexError, KeyError, RecursionError) as e:
            path, offset = recovery.where(at) or (None, None)
            shard, lsn, _ = recovery.records[at]
            detail = e.detail if isinstance(e, CorruptRecord) else f"{type(e).__name__}: {e}"
            raise CorruptRecord(
                f"log record {lsn} of shard {shard} cannot be loaded ({detail}). Restore the directory "
                "from a backup; the engine cannot open a log with a record it does not understand",
                path=path, offset=offset,
            ) from e

    def _fail_waiters(self, cause: BaseException | None) -> None:
        """Wakes every ``result()`` and ``update()`` waiter with EngineClosed: nothing more becomes durable."""
        why = "was closed" if cause is None else f"log failed ({cause})"
        for st in self._rt.wf.values():
            waiters: list[asyncio.Future[Any]] = list(st.waiters or ())
            st.waiters = None
            run = st.run
            if run is not None:
                waiters.extend(run.update_waiters.values())
                waiters.extend(run.update_inflight.values())
                for futs in run.update_by_ordinal.values():
                    waiters.extend(futs)
            for fut in waiters:
                if not fut.done():
                    err = EngineClosed(
                        f"the engine {why} while a caller waited on {st.id!r}; nothing more is "
                        "acknowledged. Open the directory again and ask again (the run continues there)."
                    )
                    err.__cause__ = cause
                    fut.set_exception(err)

    # --- helpers ---------------------------------------------------------

    def _check_open(self) -> None:
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
        except StorageError as e:
            if self._closed:
                raise EngineClosed(
                    "the engine was closed before this request became durable; it was not "
                    "acknowledged. Open the directory again and retry it."
                ) from e
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
        try:
            workflow_id.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidWorkflowId(
                f"workflow id {workflow_id!r} is not valid Unicode text (it holds a lone surrogate) "
                "and cannot be journaled: pass a proper str (decode bytes with errors='strict')"
            ) from None
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
    ) -> RunHandle:
        """Starts ``workflow`` as ``workflow_id`` and returns once its start is durable.

        If the ID is running: ``if_running`` is ``"fail"`` (raise
        :class:`fusee.AlreadyExists`), ``"attach"`` (return its handle) or
        ``"terminate"`` (end it and start anew). If it finished:
        ``if_finished`` is ``"fail"``, ``"attach"`` (its stored result) or
        ``"start"`` (run it again).
        """
        self._check_open()
        wdef = self._workflow(workflow)
        wid = self._check_id(workflow_id)
        if if_running not in IF_RUNNING:
            raise ValueError(f"if_running must be one of {IF_RUNNING}, got {if_running!r}")
        if if_finished not in IF_FINISHED:
            raise ValueError(f"if_finished must be one of {IF_FINISHED}, got {if_finished!r}")
        if not wdef.takes_input and input is not None:
            raise TypeError(f"workflow '{wdef.name}' takes no input, got {type(input).__name__}")
        payload = codec.encode(input)
        st, lsn, _ = self._rt.start_workflow(
            wdef, wid, payload, if_running=if_running, if_finished=if_finished
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
    ) -> Any:
        """Starts ``workflow`` and returns its result (see :meth:`start` and :meth:`RunHandle.result`)."""
        h = await self.start(workflow, workflow_id, input, if_running=if_running, if_finished=if_finished)
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
        payload = codec.encode(value)
        key = _dedup(dedup_key)
        st = self._rt.current(wid)
        lsn = self._rt.signal(wid, signal.name, payload, key, None)
        await self._durable(st.shard, lsn)

    async def query(self, workflow_id: str, query: QueryDef, arg: Any = None) -> Any:
        """Answers ``query`` from the run's state, once that state is durable.

        Answers to queries of one run are released in the order the queries
        were asked, so a later answer never shows an older state than an
        earlier one.
        """
        self._check_open()
        if not isinstance(query, QueryDef):
            raise TypeError(f"query takes a query made with fusee.query(...), got {query!r}")
        run = self._rt.running_run(self._check_id(workflow_id))
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
        payload = codec.encode(arg)
        uid = update_id if update_id is not None else self._env.rng.getrandbits(128).to_bytes(16, "big").hex()
        if not isinstance(uid, str) or not uid:
            raise TypeError("update_id must be a non-empty string")
        done = run.update_results.get(uid)
        if done is not None:
            await self._durable(run.shard, run.machine.gate)
            status, result = done
            if status == rec.Status.OK:
                return codec.decode(result)
            from fusee.errors import UpdateFailed

            info = codec.decode_error(result)
            raise UpdateFailed(f"update handler failed: {info.type}: {info.message}")
        inflight = run.update_inflight.get(uid)
        if inflight is not None:
            return await asyncio.shield(inflight)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if run.attach_update(uid, fut):
            # Accepted before (perhaps in an earlier life) and still running: wait for its answer.
            return await fut
        run.offer_update(update.name, uid, payload, fut)
        return await fut

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

        The engine also writes one every ``checkpoint_every`` records or
        ``checkpoint_bytes`` bytes, and at close.
        """
        self._check_open()
        self._rt.checkpoint()

    async def close(self) -> None:
        """Stops the engine: running code stops where it is (it continues at the next open),
        everything acknowledged is already durable, and a checkpoint is written."""
        if self._closed:
            return
        self._closed = True
        rt = self._rt
        self._fail_waiters(None)  # before the runs stop: callers hear "closed", not "ended"
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
        failed: FuseeError | None = None
        try:
            if self._log.failed is None and not self._read_only:
                self._log.checkpoint(rt.checkpoint_state())
        except FuseeError as e:
            # Nothing acknowledged is lost (the log has it all), but the caller must hear of it.
            failed = e
            _logger.error("fusee: the checkpoint at close failed: %s", e)
        finally:
            await self._committer.close()
            self._log.close()
            if self._own_env and isinstance(self._env, RealEnv):
                self._env.close()
        if failed is not None:
            raise failed

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _existing_shards(storage: Any, path: str) -> int:
    """The shard count an existing directory was created with (1 for a new one)."""
    return existing_shards(storage, path) or 1


def _dedup(key: str | None) -> int:
    if key is None:
        return 0
    if not isinstance(key, str) or not key:
        raise TypeError(f"dedup_key must be a non-empty string, got {key!r}")
    return dedup_key("client:" + key)


__all__ = ["Engine", "RunHandle", "RunSummary"]
