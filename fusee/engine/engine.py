"""The embedded engine: open a directory, start and talk to workflows.

Every acknowledgement (a start, a signal, an accepted update, a cancel or a
terminate) is returned only once its record is durable; results and query
answers are released only from durable state.

This engine holds one log (a directory or a PostgreSQL namespace) and knows
nothing of other processes: which process holds it, and routing the others'
calls to that one, is the layer above (:mod:`fusee.scale`), which installs
the opener :meth:`Engine.open` uses (see :func:`install_opener`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from fusee import codec, journal_file, sabotage
from fusee import telemetry as telemetry_config
from fusee.backup import Backup
from fusee.backup.uploader import BackupThread
from fusee.core import journal as jm
from fusee.core import records as rec
from fusee.definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
from fusee.durations import to_ms
from fusee.encryption import Codec, check_codec
from fusee.engine import bulk as bulk_actions
from fusee.engine import collector, periodic, signals, visibility
from fusee.engine.limit_api import LimitCalls
from fusee.engine.object_api import ObjectCalls
from fusee.engine.traced import traced
from fusee.engine.visibility import Metrics, RunPage
from fusee.errors import (
    CodecError,
    CompletionFailed,
    CorruptRecord,
    DirectoryLocked,
    EngineClosed,
    EngineForked,
    FuseeError,
    InvalidWorkflowId,
    LeaseHeld,
    LogCorrupted,
    RunNotCurrent,
    StorageError,
    WrongEventLoop,
)
from fusee.flow.api import BUILTINS as FLOW_BUILTINS
from fusee.flow.api import FlowAPI
from fusee.limits import Limit
from fusee.objects import ObjectDef
from fusee.retry import Retry
from fusee.runtime import ended, history
from fusee.runtime.context import Duration
from fusee.runtime.env import DEFAULT_STEP_THREADS, Env, RealEnv
from fusee.runtime.runtime import DEFAULT_LOAD_ROOM, IF_FINISHED, IF_RUNNING, Runtime
from fusee.runtime.streams import StreamBatch, durable_chunks
from fusee.runtime.table import dedup_key
from fusee.runtime.tokens import parse_token
from fusee.runtime.wfloop import WorkflowLoop
from fusee.sizes import Size, to_bytes
from fusee.steptimes import StepAttempt, step_attempts
from fusee.storage import flush_modes, forks
from fusee.storage import postgres as pg_store
from fusee.storage.committer import GroupCommitter
from fusee.storage.directory import existing_shards
from fusee.storage.holding import Holding
from fusee.storage.log import RESTORE_ADVICE, SharedLog
from fusee.tls import RouteTLS

#: Where an engine opened without a path keeps its (in-memory) directory.
MEMORY_PATH = "/fusee-memory"

#: How long :meth:`Engine.close` lets running step functions finish, by default.
DEFAULT_CLOSE_GRACE = 10.0

T = TypeVar("T")
R = TypeVar("R")
In = TypeVar("In")
Q = TypeVar("Q")
logger = logging.getLogger("fusee")


class _Closes(Protocol):
    async def close(self) -> None: ...

    def descriptors(self) -> set[int]:
        """The sockets it holds (let go of in a forked child, see :mod:`fusee.storage.forks`)."""
        ...


def forked_error(what: str, pid: int) -> EngineForked:
    """The error of a call made in a child forked from the process ``pid`` that opened ``what``."""
    return EngineForked(
        f"this {what} was opened in process {pid} and called in process {os.getpid()}, a child "
        "forked from it: its loop, threads, directory lock and connections stay with the parent, "
        "and nothing was recorded. Open the engine in each process that uses it, after the fork "
        "(gunicorn: drop --preload, or open it lazily at first use; Celery: worker_process_init; "
        "multiprocessing: the 'spawn' or 'forkserver' start method, or open it in the child); "
        "see docs/hosts.md"
    )


#: What :meth:`Engine.open` calls: ``opener(cls, path, **every keyword of open)`` returns the
#: engine. The layer above installs one that picks owner or follower (:mod:`fusee.scale.placement`,
#: imported by the ``fusee`` package); a hook, because this layer must not import the ones above it.
Opener = Callable[..., Awaitable["Engine"]]


async def _hold_alone(cls: type[Engine], path: str | os.PathLike[str] | None, *, exclusive: bool,
                      route_timeout: float, route_address: str | None, route_tls: RouteTLS | None,
                      parts: int | None, front_end: bool = False, **options: Any) -> Engine:
    """Without the layer above nobody follows or serves: the engine holds its log alone."""
    if parts is not None or front_end:
        raise ValueError("parts= and front_end= need fusee.scale (import fusee)")
    return await cls._open(path, **options)


_opener: Opener = _hold_alone


def install_opener(opener: Opener) -> None:
    """Makes :meth:`Engine.open` open through ``opener`` (see :data:`Opener`)."""
    global _opener
    _opener = opener


def shared_directory(path: str | os.PathLike[str] | None, env: Env | None, read_only: bool) -> bool:
    """Whether other processes may open ``path`` too: a directory on the real disk, opened to write
    on the engine's own Env (its lock then carries an epoch, which the next owner raises)."""
    return (env is None and path is not None and not read_only
            and not pg_store.is_dsn(os.fspath(path)))


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One workflow as the engine sees it now."""

    workflow_id: str
    run_id: int
    workflow: str
    #: "running"; "retrying" (a step failed and waits for its next attempt); "paused" (a step's
    #: retries ran out: it waits for a resume); "stuck"; or how it ended: "ok", "failed",
    #: "cancelled", "timed_out", "terminated".
    status: str
    shard: int
    #: Why the run is stuck (status "stuck"), else None.
    stuck_reason: str | None = None
    #: The highest attempt number among its unfinished steps that failed before (0: none).
    attempt: int = 0
    #: The latest failed attempt's error ("Type: message") among its unfinished steps.
    last_error: str | None = None
    #: When the next retry of a failed step is due (UTC), if one waits.
    next_retry: datetime.datetime | None = None
    #: Steps whose retries ran out and wait for ``engine.resume``.
    paused_steps: tuple[str, ...] = ()
    #: Signals, cancels, terminates and resumes made with ``by=``, oldest first
    #: (filled by :meth:`Engine.describe`).
    audit: tuple[Any, ...] = ()
    #: When the current run started (UTC).
    started_at: datetime.datetime | None = None
    #: When the current run ended (UTC), None while it runs.
    ended_at: datetime.datetime | None = None
    #: The current run's search attributes: every ``ctx.set_attributes`` merged, latest last.
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    #: Every journaled step attempt of the current run, in journal order, with when it ran,
    #: how long it took and how long it queued for a permit or a thread (filled by
    #: :meth:`Engine.describe`).
    steps: tuple[StepAttempt, ...] = ()


class RunHandle(Generic[R]):
    """A workflow run, by ID: wait for its result (of type ``R``), signal, query, update,
    cancel or terminate it."""

    __slots__ = ("_engine", "run_id", "workflow_id")

    def __init__(self, engine: Engine, workflow_id: str, run_id: int) -> None:
        self._engine = engine
        self.workflow_id = workflow_id
        #: The run this handle was made for (continue-as-new chains move on to new runs).
        self.run_id = run_id

    async def result(self) -> R:
        """The workflow's result once durable (following continue-as-new).

        Raises :class:`fusee.WorkflowFailed` (or its subclasses for
        cancelled, terminated and timed-out runs) when it ended without one.
        """
        return await self._engine._result(self.workflow_id)  # type: ignore[no-any-return]

    async def signal(
        self, signal: SignalDef[T], value: T = None, *, dedup_key: str | None = None, by: str | None = None  # type: ignore[assignment]
    ) -> None:
        """See :meth:`Engine.signal`."""
        await self._engine.signal(self.workflow_id, signal, value, dedup_key=dedup_key, by=by)

    async def query(self, query: QueryDef[Q], arg: Any = None) -> Q:
        """See :meth:`Engine.query`."""
        return await self._engine.query(self.workflow_id, query, arg)

    async def update(self, update: UpdateDef[T], arg: T = None, *, update_id: str | None = None) -> Any:  # type: ignore[assignment]
        """See :meth:`Engine.update`."""
        return await self._engine.update(self.workflow_id, update, arg, update_id=update_id)

    async def cancel(self, reason: str = "", *, by: str | None = None) -> None:
        """See :meth:`Engine.cancel`."""
        await self._engine.cancel(self.workflow_id, reason, by=by)

    async def terminate(self, reason: str = "", *, by: str | None = None) -> None:
        """See :meth:`Engine.terminate`."""
        await self._engine.terminate(self.workflow_id, reason, by=by)

    async def resume(self, *, by: str | None = None) -> None:
        """See :meth:`Engine.resume`."""
        await self._engine.resume(self.workflow_id, by=by)

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


class Engine(ObjectCalls, LimitCalls, FlowAPI):
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
    #: Spans and metrics (``fusee.otel.OTelTelemetry``), None when telemetry is off.
    _telemetry: Any
    #: Whatever serves other processes' calls on this engine (set by the layer above:
    #: ``fusee.scale.server.RouteServer``), closed at close after the last checkpoint and before
    #: the log lets the directory go (the next owner reuses its address).
    _route_server: _Closes | None
    #: Called once the log let the directory go at close (the layer above: this process's
    #: claim on the directory ends).
    _on_release: list[Callable[[], None]]
    #: Lets go of the garbage collector's tuning (``tune_gc=``), None when not held.
    _gc_release: Callable[[], None] | None = None
    #: The continuous backup (``backup=``), None without one.
    _backup: BackupThread | None = None
    _backup_close_timeout: float = 30.0
    #: The process that opened the engine: in a child forked from it every call raises EngineForked.
    _pid: int

    def __init__(self) -> None:
        raise TypeError("use 'await fusee.Engine.open(path, workflows=[...])'")

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        workflows: Iterable[WorkflowDef[Any, Any] | ObjectDef[Any]] = (),
        shards: int | None = None,
        parts: int | None = None,
        env: Env | None = None,
        retry: Retry | None = None,
        inline_sync_steps: bool | None = None,
        flush: str | None = None,
        step_threads: int = DEFAULT_STEP_THREADS,
        truncate_corrupt: bool = False,
        segment_bytes: int | None = None,
        blob_threshold: int = 256 << 10,
        checkpoint_every: int = 200_000,
        checkpoint_interval: float | None = None,
        checkpoint_bytes: int | None = None,
        park_after: float | None = 60.0,
        max_loaded: int | None = None,
        memory_budget: Size | None = None,
        recovery_batch: int = DEFAULT_LOAD_ROOM,
        retention: float | None = None,
        read_only: bool = False,
        keep_history: bool = True,
        codec: Codec | None = None,
        limits: Iterable[Limit] = (),
        telemetry: bool | telemetry_config.Telemetry | None = None,
        exclusive: bool = False,
        front_end: bool = False,
        route_timeout: float = 30.0,
        namespace: str | None = None,
        lease_ttl: float | None = None,
        route_address: str | None = None,
        route_tls: RouteTLS | None = None,
        backup: Backup | None = None,
        tune_gc: bool = True,
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
        written or locked and no workflow code runs; a directory another process
        has open is read too (see :attr:`live`).

        ``checkpoint_interval`` (seconds) also writes one that often while
        records were appended since the last one.

        ``memory_budget`` (bytes: an int, or a string such as ``"256MiB"``) and
        ``max_loaded`` (runs) bound what the runs loaded in memory hold: once they
        pass either, suspended runs park at once, those quiet longest first,
        whatever ``park_after`` says (a bad size raises
        :class:`fusee.errors.InvalidSize`). ``metrics().loaded_bytes`` is what the
        loaded runs are counted as holding (docs/operations.md says what it counts).
        ``recovery_batch``: unfinished runs replay that many at a time (fewer when
        a batch has replayed for 10 ms); the open returns once the first batch is
        loaded and the others follow in the background, each after the loop had a
        turn, so the first runs (and the other engines of the process) go on while
        later ones wait (``metrics().runs_to_load``). A run something arrives for
        (a signal, a query, a timer) is loaded at once, before its turn.

        ``workflows`` also takes keyed objects (``fusee.object(...)``): each is a
        built-in workflow. ``limits`` declares the step limits steps may name
        (``ctx.step(..., limit=name)``; see :class:`fusee.Limit`).

        ``keep_history=False``: a run that ends keeps only its start, its
        ending and what it owes other workflows (children, messages), in
        memory and in checkpoints (the log keeps everything until the next
        checkpoint). Queries of ended runs, and ``reset``/``fork`` of ended
        runs, then raise :class:`fusee.HistoryUnavailable`.

        ``codec`` (a :class:`fusee.Codec`, e.g. :class:`fusee.AesGcmCodec`)
        encodes every payload the engine stores (inputs, results, errors,
        signal, update and completion values, heartbeats, stream chunks,
        attributes) and decodes it when read back; IDs, names and record kinds
        stay readable. A directory written without a codec opens with one (old
        records stay readable); a payload whose key the codec lacks raises
        :class:`fusee.errors.MissingKey` naming the key ID.
        ``telemetry``: OpenTelemetry spans and metrics (``fusee[otel]``, see
        docs/telemetry.md). None (default): on only if the application already
        set a global OpenTelemetry tracer or meter provider; True: on with the
        global providers; a :class:`fusee.Telemetry`: on with its providers;
        False: off. Asked for without OpenTelemetry installed, it raises
        :class:`fusee.TelemetryUnavailable` before anything is opened.

        Several processes may open one directory (uvicorn or gunicorn workers):
        the first owns it (it runs the workflows and serves the others on a Unix
        socket); each other one is a *follower* whose calls run on the owner, and
        one of them takes over when the owner dies (see docs/scale-out.md).
        ``exclusive=True`` refuses that instead: :class:`fusee.errors.DirectoryLocked`
        if another process holds the directory. A second open of one directory
        within one process always raises it. ``route_timeout`` (seconds) bounds
        how long a follower's call waits for an owner to reach before it raises
        :class:`fusee.errors.OwnerUnreachable`.

        ``path`` may also be a PostgreSQL DSN (``"postgresql://user@host/db"``,
        ``fusee[postgres]``; see docs/postgres.md): records and checkpoints
        live in the tables of ``namespace`` (a PostgreSQL schema, default
        ``"fusee"``; engines with different namespaces share a database), an
        acknowledgement means the server committed, and the engine holds the
        namespace's lease (``lease_ttl`` seconds, default 5, renewed every
        third of it). While another engine's lease on the namespace is live,
        the open returns a *follower* of it (on this machine or another): its
        calls are routed to the owner over TCP, and it takes the namespace
        over once the owner's lease expired; ``exclusive=True`` raises
        :class:`fusee.errors.LeaseHeld` naming the holder instead. The owner
        listens for followers on ``route_address`` (``"host:port"``, default
        ``"127.0.0.1:0"``: this machine only; followers on other machines need
        an address they can reach, e.g. ``"0.0.0.0:7411"``). With ``route_tls``
        (a :class:`fusee.RouteTLS`) routed calls travel over mutual TLS: the
        owner presents its certificate and requires the caller's, both signed by
        the given authority (:class:`fusee.errors.InvalidRouteTLS` at open for a
        file that cannot be loaded). Raises
        :class:`fusee.errors.DatabaseUnavailable` when the server cannot be
        reached, :class:`fusee.errors.SchemaVersionMismatch` for tables a newer
        Fusee wrote. An engine whose lease was taken over (or expired) fails
        with :class:`fusee.errors.LeaseLost` at its next renewal or flush,
        whichever comes first, and acknowledges nothing more.

        ``parts`` (set when a directory is created; an existing parted directory opens
        without it): the directory holds that many parts, each with its own log and lease, and
        every process that opens it holds a fair share of them and runs only their workflows
        and steps, so throughput grows with processes (see docs/scale-out.md#parts). Without
        ``parts``, a directory created now gets the count the ``FUSEE_PARTS`` environment
        variable gives, if it is set (``FUSEE_PARTS=4 uvicorn app:app --workers 4``).

        ``backup`` (a :class:`fusee.Backup`) copies what becomes durable to a
        local directory or S3-compatible storage in the background (never on
        the step path); ``fusee restore`` rebuilds a directory from it. See
        docs/operations.md.

        ``tune_gc`` (default True): while the engine is open, CPython's cyclic
        garbage collector traverses the whole heap ten times less often, if the
        application left its thresholds at the interpreter's defaults (the young
        generations are untouched; the defaults come back at the last close).
        Loaded runs are long-lived objects that leave no cycles, and each full
        traversal of 10,000 of them stalls the loop for over 100 ms. False leaves
        the collector alone (see docs/operations.md#garbage-collection).
        """
        workflows = list(workflows)
        if not isinstance(tune_gc, bool):
            raise TypeError(f"tune_gc must be True or False, got {tune_gc!r}")
        return _Opening(
            _opener(
                cls,
                path,
                exclusive=exclusive,
                front_end=front_end,
                route_timeout=route_timeout,
                parts=parts,
                workflows=workflows,
                shards=shards,
                env=env,
                retry=retry,
                inline_sync_steps=inline_sync_steps,
                flush=flush,
                step_threads=step_threads,
                truncate_corrupt=truncate_corrupt,
                segment_bytes=segment_bytes,
                blob_threshold=blob_threshold,
                checkpoint_every=checkpoint_every,
                checkpoint_interval=checkpoint_interval,
                checkpoint_bytes=checkpoint_bytes,
                park_after=park_after,
                max_loaded=max_loaded,
                memory_budget=memory_budget,
                recovery_batch=recovery_batch,
                retention=retention,
                read_only=read_only,
                keep_history=keep_history,
                codec=codec,
                limits=limits,
                telemetry=telemetry,
                namespace=namespace,
                lease_ttl=lease_ttl,
                route_address=route_address,
                route_tls=route_tls,
                backup=backup,
                tune_gc=tune_gc,
            )
        )

    @classmethod
    async def _open(
        cls,
        path: str | os.PathLike[str] | None,
        *,
        workflows: Iterable[WorkflowDef[Any, Any] | ObjectDef[Any]],
        shards: int | None,
        env: Env | None,
        retry: Retry | None,
        inline_sync_steps: bool | None,
        flush: str | None,
        step_threads: int,
        truncate_corrupt: bool,
        segment_bytes: int | None,
        blob_threshold: int,
        checkpoint_every: int,
        checkpoint_interval: float | None,
        checkpoint_bytes: int | None,
        park_after: float | None,
        max_loaded: int | None,
        retention: float | None,
        memory_budget: Size | None = None,
        recovery_batch: int = DEFAULT_LOAD_ROOM,
        read_only: bool = False,
        keep_history: bool = True,
        codec: Codec | None = None,
        limits: Iterable[Limit] = (),
        telemetry: bool | telemetry_config.Telemetry | None = None,
        _lock: Any = None,
        _epoch: int = 0,
        namespace: str | None = None,
        lease_ttl: float | None = None,
        _pg_lease: Any = None,
        _fence: Callable[[], None] | None = None,
        _holding: Holding | None = None,
        _mail: Any = None,
        backup: Backup | None = None,
        tune_gc: bool = False,
    ) -> Engine:
        """This engine on ``path``, holding its log, or :class:`fusee.errors.DirectoryLocked` /
        :class:`fusee.errors.LeaseHeld` when another holds it (what :meth:`open` does then is the
        opener's choice). ``_lock``/``_epoch`` (a directory) and ``_pg_lease``/``_fence`` (a
        namespace) open it on a lease already won. ``_mail`` (a ``fusee.runtime.runtime.Mail``):
        this engine holds one part of a parted directory, and messages for runs on other parts
        go there (set before recovery, which sends some again)."""
        workflows = list(workflows)
        tel_config = telemetry_config.resolve(telemetry)
        opened_at = asyncio.get_running_loop().time()  # for the recovery line of the log
        registry: dict[tuple[str, int], WorkflowDef[Any, Any]] = {}
        for w in workflows:
            if isinstance(w, ObjectDef):
                w = w.workflow  # a keyed object is a built-in workflow (fusee.objects)
            if not isinstance(w, WorkflowDef):
                raise TypeError(
                    f"workflows=[...] takes functions decorated with @fusee.workflow, got {w!r}"
                )
            key = (w.name, w.version)
            if key in registry and registry[key] is not w:
                raise ValueError(
                    f"two workflows are registered as {w.name!r} version {w.version}: "
                    "give the newer one @fusee.workflow(name, version=N)"
                )
            registry[key] = w
        codec = check_codec(codec)
        for w in FLOW_BUILTINS:  # schedules and windows are workflows of every engine
            registry[(w.name, w.version)] = w
        if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive int, got {checkpoint_every!r}")
        interval = periodic.check_interval(checkpoint_interval)
        if checkpoint_bytes is not None and (not isinstance(checkpoint_bytes, int) or checkpoint_bytes < 1):
            raise ValueError(f"checkpoint_bytes must be a positive int, got {checkpoint_bytes!r}")
        budget_bytes = None if memory_budget is None else to_bytes(memory_budget, "memory_budget")
        if max_loaded is not None and (not isinstance(max_loaded, int) or isinstance(max_loaded, bool)
                                       or max_loaded < 0):
            raise ValueError(f"max_loaded must be an int >= 0 or None, got {max_loaded!r}")
        if not isinstance(recovery_batch, int) or isinstance(recovery_batch, bool) or recovery_batch < 1:
            raise ValueError(f"recovery_batch must be a positive int (runs loaded per batch at open), "
                             f"got {recovery_batch!r}")
        if shards is not None and (not isinstance(shards, int) or isinstance(shards, bool) or shards < 1):
            raise ValueError(f"shards must be a positive int, got {shards!r}")
        if inline_sync_steps not in (None, True, False):
            raise TypeError(f"inline_sync_steps must be True, False or None, got {inline_sync_steps!r}")
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
            env = RealEnv(storage, inline_sync_steps=inline_sync_steps, step_threads=step_threads,
                          flush=flush)
        elif flush is not None:
            raise ValueError("flush=... applies to the engine's own Env: with env=..., set the Env's flush_mode")
        dir_path = MEMORY_PATH if path is None else os.fspath(path)
        on_postgres = pg_store.is_dsn(dir_path)
        shared = shared_directory(path, None if own_env else env, read_only)
        # Segments are preallocated: 64 MiB on a disk, 1 MiB in memory (an engine
        # for tests opens in a millisecond instead of zeroing 64 MiB).
        seg_bytes = segment_bytes if segment_bytes is not None else (1 << 20 if path is None else 64 << 20)
        if not on_postgres and (namespace is not None or lease_ttl is not None):
            raise ValueError("namespace= and lease_ttl= apply to a PostgreSQL DSN "
                             "('postgresql://...'), not to a directory")
        if backup is not None:
            if not isinstance(backup, Backup):
                raise TypeError(f"backup= takes a fusee.Backup, got {backup!r}")
            if path is None or on_postgres or read_only:
                raise ValueError("backup= applies to an engine directory opened to write, not to an "
                                 "engine in memory, a read-only view or a PostgreSQL namespace "
                                 "(back PostgreSQL up with its own tools: docs/postgres.md)")
        if on_postgres and truncate_corrupt:
            raise ValueError("truncate_corrupt= applies to a directory, not to a PostgreSQL namespace")

        def open_log() -> tuple[SharedLog, Any]:
            if on_postgres:
                from fusee.storage.postgres.log import PostgresLog

                pg_log, pg_recovery = PostgresLog.open(
                    dir_path, shards,
                    namespace=pg_store.DEFAULT_NAMESPACE if namespace is None else namespace,
                    lease_ttl=pg_store.DEFAULT_LEASE_TTL if lease_ttl is None else lease_ttl,
                    lease=_pg_lease, read_only=read_only)
                # The same interface as SharedLog (the committer and runtime see no difference).
                return cast(SharedLog, pg_log), pg_recovery
            return SharedLog.open(
                env.storage,
                dir_path,
                shards if shards is not None else _existing_shards(env.storage, dir_path),
                segment_bytes=seg_bytes,
                blob_threshold=blob_threshold,
                truncate_corrupt=truncate_corrupt,
                rng=env.rng,
                read_only=read_only,
                lock=_lock,
                epoch=(_epoch or True) if shared else (_epoch or False),
            )

        # Recovery reads files: off the loop on a real disk, inline on memory or in a simulation.
        try:
            if own_env and path is not None:
                log, recovery = await asyncio.get_running_loop().run_in_executor(None, open_log)
            else:
                log, recovery = open_log()
        except (DirectoryLocked, LeaseHeld):
            if own_env and isinstance(env, RealEnv):
                env.close()
            raise
        self = object.__new__(cls)
        self._pid = os.getpid()
        self._env = env
        self._own_env = own_env
        self._log = log
        if _holding is not None:
            log.holding = _holding  # the simulator's expiring lease, as the owner's clock sees it
        self._closed = False
        self._read_only = read_only
        self._route_server = None
        self._on_release = []
        self._committer = GroupCommitter(
            log,
            run_blocking=env.run_step if sabotage.active.flush_shares_step_pool else env.run_io,
            mode=getattr(env, "flush_mode", None) or (
                flush_modes.INLINE if env.inline_flush else flush_modes.BACKGROUND),
            wait_job=getattr(env, "wait_flush", None),
            on_durable=lambda durable: self._rt.on_durable(durable),
            clock=env.monotonic,
            run_inline=getattr(env, "flush_inline", None),
            hold_timer=getattr(env, "hold_timer", None),
        )
        self._rt = Runtime(
            env,
            self._committer,
            log.shards,
            list(registry.values()),
            retry or Retry(),
            park_after=park_after,
            max_loaded=max_loaded,
            memory_budget=budget_bytes,
            retention=retention,
            checkpoint_every=checkpoint_every,
            codec=codec,
        )
        self._rt.set_load_room(recovery_batch)
        self._rt.mail = _mail
        self._rt.keep_history = bool(keep_history)
        if read_only:
            # A view advances nothing: a parked run's wake-up that came due while the
            # directory was closed must not replay its code here (it would diverge).
            self._rt.timers.close()
        self._telemetry = None
        if tel_config is not None and not read_only:
            from fusee.otel import OTelTelemetry

            self._telemetry = OTelTelemetry(
                tracer_provider=tel_config.tracer_provider, meter_provider=tel_config.meter_provider,
                traces=tel_config.traces, metrics=tel_config.metrics, path=log.dir.path,
                snapshot=self.metrics, loop=self._rt.loop,
                trace_of=self._rt.trace_of,
            )
            self._rt.use_telemetry(self._telemetry)  # before recovery: recovered runs get spans too
        try:
            self._rt.limiter.configure(limits)
            self._load(recovery, f"{log.dir.path}/checkpoint")
            self.recovered_records = len(recovery.records)
            if not read_only:
                self._rt.limiter.recovering = True  # steps issued now may have run before the crash
                self._rt.resume_all()
                self._rt.limiter.recovering = False
                self._rt.check_parked_code()
        except BaseException:
            # A failed open leaves nothing held: the directory can be opened again in-process.
            self._rt.closed = True
            self._rt.timers.close()
            if self._telemetry is not None:
                self._telemetry.close()
            log.close()
            if own_env and isinstance(env, RealEnv):
                env.close()
            raise
        log.on_failed = self._fail_waiters
        if _fence is not None:
            log.fence = _fence
        if checkpoint_bytes is not None:
            log.checkpoint_bytes = checkpoint_bytes
        rt = self._rt

        def checkpoint_soon() -> None:
            rt.loop.call_soon(rt.checkpoint)

        log.on_checkpoint_due = checkpoint_soon
        logger.info(
            "opened %s in %.3f s: %d records read after the checkpoint; %d workflows, %d loaded "
            "(%d replayed), %d more to load in batches of %d, %d stuck",
            log.dir.path, rt.loop.time() - opened_at, self.recovered_records, len(rt.wf), rt.loaded_runs,
            rt.stats["replays"], len(rt.load_queue), rt.load_room, len(rt.stuck),
        )
        if interval is not None and not read_only:
            periodic.every(rt.loop, interval, self._periodic_checkpoint, self._wake_on_append)
        if on_postgres and not read_only:
            pg_log: Any = log
            loop = rt.loop
            # A renewal that finds the lease gone fails the log at once: an idle engine learns it
            # lost the namespace within a third of the TTL, not at its next flush.
            def lost() -> None:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nothing left to fail
                    loop.call_soon_threadsafe(pg_log.lease_lost)

            pg_log.lease.on_lost = lost
        if backup is not None:
            self._backup = backup.start(log)
            self._backup_close_timeout = backup.close_timeout
        forks.hold(self, Engine._descriptors)
        self._gc_release = collector.hold(self) if tune_gc and not read_only else None
        return self

    def _descriptors(self) -> set[int]:
        """What this engine holds that a forked child must let go of: the files of its directory
        (the lock among them) and its route server's sockets (PostgreSQL's connections let go of
        themselves)."""
        fds: set[int] = set()
        if isinstance(self._env, RealEnv) and not pg_store.is_dsn(self._log.dir.path):
            fds |= forks.files_under(self._log.dir.path)
        if self._route_server is not None:
            fds |= self._route_server.descriptors()
        return fds

    @property
    def epoch(self) -> int:
        """The directory's owner epoch this engine writes under (0: in memory, read-only or
        simulated). Each new owner of a directory has a larger one."""
        return self._log.dir.epoch

    @property
    def is_owner(self) -> bool:
        """Whether this engine runs the directory's workflows (a follower routes its calls)."""
        return not self._read_only

    def _periodic_checkpoint(self) -> bool | None:
        """One tick of ``checkpoint_interval``: False once the engine is closed (the ticks stop),
        None when nothing was appended (they pause until something is)."""
        if self._closed:
            return False
        if not self._rt.appended_since_checkpoint():
            return None
        self._rt.checkpoint()
        return True

    def _wake_on_append(self, resume: Callable[[], None]) -> None:
        self._rt.on_first_append = resume

    def _load(self, recovery: Any, ckpt_path: str) -> None:
        """Loads the checkpoint and records; what does not decode is a typed error naming where it is."""
        if recovery.checkpoint is not None:
            try:
                self._rt.load_checkpoint(recovery.checkpoint)
            except CodecError:
                raise  # a key is missing, or a payload does not decrypt: the error says which
            except Exception as e:  # a valid checksum over content this code cannot read
                raise LogCorrupted(ckpt_path, 0, f"the checkpoint's content does not decode "
                                   f"({type(e).__name__}: {e})", RESTORE_ADVICE) from e
        at = 0
        decode = self._rt.sealer.decode

        def decoded() -> Generator[tuple[int, int, rec.Record], None, None]:
            nonlocal at
            for i, (shard, lsn, data) in enumerate(recovery.records):
                at = i
                r = decode(data)
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
        """Wakes every ``result()`` and ``update()`` waiter with EngineClosed, and every waiting stream
        reader (which then raises it): nothing more becomes durable."""
        self._rt.wake_stream_readers()
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

    def _check_process(self) -> None:
        """Refuses a call in a forked child (the engine's loop, threads and lock stay in the parent)."""
        if self._pid != os.getpid():
            raise forked_error("engine", self._pid)

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
        self._check_process()
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

    @overload
    async def start(
        self,
        workflow: WorkflowDef[In, R],
        workflow_id: str,
        input: In = None,  # type: ignore[assignment]
        *,
        if_running: str = "fail",
        if_finished: str = "fail",
        timeout: Duration | None = None,
    ) -> RunHandle[R]: ...

    @overload
    async def start(
        self,
        workflow: str,
        workflow_id: str,
        input: Any = None,
        *,
        if_running: str = "fail",
        if_finished: str = "fail",
        timeout: Duration | None = None,
    ) -> RunHandle[Any]: ...

    @traced("start")
    async def start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        workflow_id: str,
        input: Any = None,
        *,
        if_running: str = "fail",
        if_finished: str = "fail",
        timeout: Duration | None = None,
    ) -> RunHandle[Any]:
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
        trace = self._telemetry.start_trace() if self._telemetry is not None else None
        st, lsn, _ = self._rt.start_workflow(
            wdef, wid, payload, if_running=if_running, if_finished=if_finished, deadline_ms=deadline_ms,
            trace=trace,
        )
        run_id = st.run_id
        await self._durable(st.shard, lsn)
        return RunHandle[Any](self, wid, run_id)

    @overload
    async def execute(
        self,
        workflow: WorkflowDef[In, R],
        workflow_id: str,
        input: In = None,  # type: ignore[assignment]
        *,
        if_running: str = "fail",
        if_finished: str = "fail",
        timeout: Duration | None = None,
    ) -> R: ...

    @overload
    async def execute(
        self,
        workflow: str,
        workflow_id: str,
        input: Any = None,
        *,
        if_running: str = "fail",
        if_finished: str = "fail",
        timeout: Duration | None = None,
    ) -> Any: ...

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

    def get(self, workflow_id: str) -> RunHandle[Any]:
        """A handle to an existing workflow. Raises :class:`fusee.NotFound` if there is none."""
        self._check_open()
        st = self._rt.current(self._check_id(workflow_id))
        return RunHandle(self, workflow_id, st.run_id)

    async def _result(self, workflow_id: str) -> Any:
        self._check_open()
        status, payload = await self._rt.result_of(workflow_id)
        st = self._rt.current(workflow_id)
        wdef = self._rt.definition(st.wtype, st.version)
        return self._rt.raise_for(workflow_id, status, payload, wdef.result_type if wdef else Any)

    @traced("signal")
    async def signal(
        self,
        workflow_id: str,
        signal: SignalDef[T],
        value: T = None,  # type: ignore[assignment]
        *,
        dedup_key: str | None = None,
        by: str | None = None,
    ) -> None:
        """Delivers a signal; returns once it is durable.

        ``by`` (who sent it) is journaled for the audit (``describe().audit``).

        Signals wait in the run until its code waits for them, and are taken
        in arrival order. A signal with a ``dedup_key`` the run has already
        received is dropped (the call still succeeds), also once the run has
        ended: a retry of a call whose first try landed answers as that try did.

        The value is checked before anything is recorded: against ``signal``'s
        type, or, for a signal without one (``fusee.SignalDef(name)``, as HTTP,
        the CLI, the UI and followers send it), against the type the run waits
        for it with or the ``fusee.signal(name, type)`` declarations of this
        process (:class:`SerializationError`); an untyped name known to neither
        raises :class:`fusee.UnknownSignal`. See ``fusee.engine.signals``.
        """
        self._check_open()
        if not isinstance(signal, SignalDef):
            raise TypeError(f"signal takes a signal made with fusee.signal(...), got {signal!r}")
        wid = self._check_id(workflow_id)
        typed = not codec.is_undeclared(signal.type)
        payload = codec.encode_signal(signal, value) if typed else b""
        key = _dedup(dedup_key)
        who = _by(by)
        st = self._rt.current(wid)
        if key and not st.running:
            first = self._rt.ended_resend(st, key)
            if first is not None:
                await self._durable(st.shard, first)
                return
        run = self._rt.running_run(wid)
        if not typed:
            payload = signals.payload(run, signal, value)
        lsn = self._rt.signal(wid, signal.name, payload, key, who)
        await self._durable(st.shard, lsn)

    async def query(self, workflow_id: str, query: QueryDef[Q], arg: Any = None) -> Q:
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
        # One turn of the loop per call (a bare yield, no Future): an answer that is
        # durable already would otherwise never yield, and a caller polling in a loop
        # would starve the run it waits for.
        await asyncio.sleep(0)
        st = self._rt.current(wid)
        if not st.running:
            # The run ended: its code is gone, a read-only replay answers (during retention).
            history.check(self._rt, st, "a query")
            await self._release_in_order(wid, st.shard, st.done_lsn)
            return ended.answer_query(self._rt, st, query, arg)  # type: ignore[no-any-return]
        run = self._rt.running_run(wid)
        answer = run.answer_query(query, arg)
        await self._release_in_order(wid, run.shard, None if sabotage.active.query_from_nondurable else run.machine.gate)
        return answer  # type: ignore[no-any-return]

    async def _release_in_order(self, wid: str, shard: int, lsn: int | None) -> None:
        """Returns once ``lsn`` is durable (None: at once) and the queries of ``wid`` asked before have left.

        Queries of an ended run take their turn too: a live answer asked
        before the run ended may still wait for its state to be durable, and
        the final state must not leave before it.
        """
        # Kept by workflow ID, not on the Run: a run parked and woken between two
        # queries is a new Run object, and the older answer may still be waiting.
        order = self._rt.query_order
        earlier = order.get(wid)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        order[wid] = mine
        try:
            if lsn is not None:
                await self._durable(shard, lsn)
            if earlier is not None and not earlier.done():
                await asyncio.shield(earlier)
        finally:
            mine.set_result(None)
            if order.get(wid) is mine:
                del order[wid]

    @traced("update")
    async def update(
        self,
        workflow_id: str,
        update: UpdateDef[T],
        arg: T = None,  # type: ignore[assignment]
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

    @traced("update_with_start")
    async def update_with_start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        workflow_id: str,
        input: Any,
        update: UpdateDef[Any],
        arg: Any = None,
        *,
        update_id: str | None = None,
        timeout: Duration | None = None,
    ) -> Any:
        """Delivers ``update`` to ``workflow_id``, starting the workflow first if it is not running.

        A running workflow gets the update as :meth:`update` would deliver it.
        Otherwise a new run starts with the update recorded in its start, as
        its first delivery (so the start and the update are durable together;
        the update's validator is not consulted). Returns the handler's
        result once durable. An ``update_id`` answered before returns the same
        answer again.
        """
        self._check_open()
        wdef = self._workflow(workflow)
        wid = self._check_id(workflow_id)
        if not isinstance(update, UpdateDef):
            raise TypeError(f"update_with_start takes an update made with fusee.update(...), got {update!r}")
        uid = update_id if update_id is not None else self._env.rng.getrandbits(128).to_bytes(16, "big").hex()
        if not isinstance(uid, str) or not uid:
            raise TypeError("update_id must be a non-empty string")
        st = self._rt.wf.get(wid)
        if st is None or not st.running:
            if not wdef.takes_input and input is not None:
                raise TypeError(f"workflow '{wdef.name}' takes no input, got {type(input).__name__}")
            payload = codec.encode_input(wdef, input)
            upayload = codec.encode_update_arg(update, arg)
            deadline_ms = self._env.now_ms() + to_ms(timeout) if timeout is not None else 0
            st, lsn, _ = self._rt.start_workflow(
                wdef, wid, payload, if_running="attach", if_finished="start", deadline_ms=deadline_ms,
                update=rec.UpdateWithStart(name=update.name, id=uid, payload=upayload),
                trace=self._telemetry.start_trace() if self._telemetry is not None else None,
            )
            await self._durable(st.shard, lsn)
        return await self.update(wid, update, arg, update_id=uid)

    async def reset(
        self,
        workflow_id: str,
        *,
        before_step: str | None = None,
        before_position: int | None = None,
        reapply_signals: bool = True,
        version: int | None = None,
        by: str | None = None,
    ) -> RunHandle[Any]:
        """Ends the current run and starts a new run of the same ID from its journal before a cut.

        The cut is the first step named ``before_step`` (journaled or running)
        or the operation at ``before_position``: the new run replays what came
        before it and runs live from there (with new step keys). Signals that
        arrived after the cut are delivered again when ``reapply_signals``;
        updates after it are not. ``version`` moves the run to another
        registered version of its workflow. Children started before the cut
        stay with the new run. Returns once the new run is durable.
        """
        return await self._reset(workflow_id, None, before_step, before_position, reapply_signals, version, by)

    async def fork(
        self,
        workflow_id: str,
        new_id: str,
        *,
        before_step: str | None = None,
        before_position: int | None = None,
        reapply_signals: bool = True,
        version: int | None = None,
        by: str | None = None,
    ) -> RunHandle[Any]:
        """Starts ``new_id`` from ``workflow_id``'s journal before a cut (as :meth:`reset`),
        leaving ``workflow_id`` alone. Children of the original are not shared: a child
        the fork still waits for fails there as in use by another workflow."""
        return await self._reset(
            workflow_id, self._check_id(new_id), before_step, before_position, reapply_signals, version, by
        )

    async def _reset(
        self, workflow_id: str, new_id: str | None, before_step: str | None, before_position: int | None,
        reapply_signals: bool, version: int | None, by: str | None,
    ) -> RunHandle[Any]:
        self._check_open()
        wid = self._check_id(workflow_id)
        history.check(self._rt, self._rt.current(wid), "a reset or fork")
        st, lsn = self._rt.reset(
            wid, new_id, before_step=before_step, before_position=before_position,
            reapply_signals=bool(reapply_signals), version=version, by=_by(by),
        )
        run_id = st.run_id  # before the wait: another reset of the ID may replace it meanwhile
        await self._durable(st.shard, lsn)
        return RunHandle(self, st.id, run_id)

    async def cancel(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None:
        """Requests cancellation; returns once the request is durable.

        The run's pending operations raise :class:`fusee.Cancelled`; its code
        may catch it and compensate. A cancel of a run that ended after a
        cancellation was recorded (a client's retry) answers as the first did;
        of a run that ended otherwise, it raises :class:`fusee.WorkflowEnded`.
        """
        self._check_open()
        wid = self._check_id(workflow_id)
        who = _by(by)
        st = self._rt.current(wid)
        if not st.running:
            first = self._rt.ended_resend(st, None)
            if first is not None:
                await self._durable(st.shard, first)
                return
        lsn = self._rt.cancel(wid, str(reason), who)
        await self._durable(st.shard, lsn)

    async def terminate(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None:
        """Ends the run at once without running more of its code; returns once durable."""
        self._check_open()
        wid = self._check_id(workflow_id)
        st = self._rt.current(wid)
        lsn = self._rt.terminate(wid, str(reason), _by(by))
        await self._durable(st.shard, lsn)

    async def bulk(
        self,
        action: str,
        where: str,
        *,
        dry_run: bool = False,
        by: str | None = None,
        limit: int = bulk_actions.MAX_BULK,
        reason: str | None = None,
        signal: SignalDef[Any] | str | None = None,
        value: Any = None,
        before_step: str | None = None,
        before_position: int | None = None,
        reapply_signals: bool | None = None,
    ) -> bulk_actions.BulkResult:
        """Makes ``action`` ("cancel", "terminate", "resume", "signal" or "reset") on every run
        ``where`` matches, up to ``limit`` (at most 1,000) per call, oldest first (or in
        the order of an ``order by`` in ``where``).

        ``dry_run=True`` only counts them (``matched``) and names the first
        ``limit``: nothing is recorded. Otherwise each run gets what the single
        call (:meth:`cancel`, :meth:`terminate`, :meth:`resume`, :meth:`signal`,
        :meth:`reset`) would give it, with ``by`` journaled for the audit, and
        this returns once every action is durable; a run that refuses (it ended
        meanwhile, say) is named in ``failed`` and the others go on. Runs past
        the bound are counted in ``remaining``: call again for them. The
        action applies to unfinished runs (cancel, terminate, signal), paused
        runs (resume) or any run (reset); runs of schedules, windows and keyed
        objects are left out. ``reason`` goes with cancel and terminate,
        ``signal``/``value`` with signal, ``before_step``/``before_position``/
        ``reapply_signals`` with reset; ValueError names an option the action
        does not take or a missing ``where``; :class:`fusee.InvalidQuery` a bad query.
        """
        self._check_open()
        return await bulk_actions.bulk(
            self, action, where, dry_run=bool(dry_run), by=by, limit=limit,
            options={"reason": reason, "signal": signal, "value": value, "before_step": before_step,
                     "before_position": before_position, "reapply_signals": reapply_signals})

    async def resume(self, workflow_id: str, *, by: str | None = None) -> None:
        """Resumes the run's paused steps (their retries ran out) with a fresh retry budget."""
        self._check_open()
        wid = self._check_id(workflow_id)
        st = self._rt.current(wid)
        lsn = self._rt.resume(wid, _by(by))
        await self._durable(st.shard, lsn)

    # --- async completions -----------------------------------------------------

    @traced("complete")
    async def complete(self, token: str, value: Any = None, *, by: str | None = None) -> bool:
        """Completes the ``ctx.await_completion`` that handed out ``token`` with ``value``.

        Returns True once the completion is durable; False when the operation
        was completed already, the token belongs to a stale attempt (a retried
        token function handed out a newer one) or the run ended. Raises
        :class:`fusee.NotFound` for a token of no workflow this engine knows,
        and :class:`fusee.SerializationError` (nothing recorded) when the
        value does not convert to the await's ``result_type``.
        """
        return await self._complete_token(token, rec.Status.OK, value, by)

    @traced("fail_completion")
    async def fail_completion(self, token: str, message: str = "", *, by: str | None = None) -> bool:
        """Fails the ``ctx.await_completion`` that handed out ``token``: it raises
        :class:`fusee.CompletionFailed` with ``message`` in the workflow. Returns
        as :meth:`complete` does."""
        return await self._complete_token(token, rec.Status.FAILED, str(message), by)

    async def _complete_token(self, token: str, status: rec.Status, value: Any, by: str | None) -> bool:
        self._check_open()
        who = _by(by)
        wid, run_id, seq, attempt = parse_token(token)
        st = self._rt.current(wid)
        if st.run_id != run_id or not st.running:
            return False  # an earlier run of the ID, or one that ended
        run = self._rt.loaded(st)
        attempt = run.machine.await_attempt(seq) or attempt if run and sabotage.active.accept_stale_completion else attempt
        if run is None or run.machine.await_attempt(seq) != attempt:
            return False
        op = run.ops.get(seq)
        if status == rec.Status.OK:
            payload = codec.convert(
                value, op.type if op is not None else Any,
                what=f"the value completing '{op.name if op else seq}' of workflow '{wid}'",
                declare="declare it with ctx.await_completion(..., result_type={type})",
            )
        else:
            payload = codec.encode_error(CompletionFailed(value), traceback=False)
        if not run.machine.complete(seq, jm.AsyncCompleted(attempt, status, payload, who)):
            return False
        run.pump()
        await self._durable(run.shard, run.machine.gate)
        return True

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
        self._check_process()  # in a forked child the loop never runs: it would wait forever
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise WrongEventLoop("run_threadsafe was called on the engine's own loop: await the method instead")

        async def call() -> T:
            return await method(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    # --- inspection ---------------------------------------------------------

    async def journal(self, workflow_id: str) -> list[rec.Record]:
        """The durable records of the workflow's current run, in journal order."""
        self._check_open()
        st = self._rt.current(self._check_id(workflow_id))
        durable = self._rt.durable(st.shard)
        journal, lsns = self._rt.journal_of(st)
        return [r for r, lsn in zip(journal, lsns, strict=True) if lsn <= durable]

    async def read_stream_batch(
        self, workflow_id: str, name: str, offset: int = 0, *, wait: Duration | None = None,
        run_id: int | None = None,
    ) -> tuple[list[Any], int, bool]:
        """The durable chunks of stream ``name`` from ``offset``: ``(chunks, next_offset, ended)``.

        With ``wait``, waits up to that long for a first chunk (long polling).
        A reader never sees a chunk change or an offset skipped, and may
        reconnect at any offset. ``ended`` is true once the stream (or the run)
        ended and every chunk before the end was returned. A reader waiting
        when the engine closes or its log fails raises :class:`fusee.EngineClosed`
        at once (chunks that were durable before are returned first). Without
        ``run_id`` it reads the workflow's current run; see :meth:`stream_batch`
        for the run an answer is of, pinning one, and how the stream ended.
        On an engine opened with ``keep_history=False``, a read of a run that ended
        raises :class:`fusee.HistoryUnavailable` (its chunks were not kept).
        """
        b, _ = await self._read_stream(workflow_id, name, offset, wait, run_id, None)
        return b.chunks, b.next_offset, b.ended

    async def stream_batch(
        self, workflow_id: str, name: str, offset: int = 0, *, wait: Duration | None = None,
        run_id: int | None = None,
    ) -> StreamBatch:
        """:meth:`read_stream_batch`, answered as a :class:`fusee.StreamBatch`: the run it read
        (``run_id``), its chunks, and how the stream ended (``end_status``: ``"ok"``,
        ``"failed"``, ... or None while it goes on).

        With ``run_id``, reads that run only: once the workflow's current run is another one
        (after continue-as-new, a reset or a new start) it raises
        :class:`fusee.errors.RunNotCurrent` rather than read the next run's chunks at the
        offset of the earlier run's. Without it, the current run is read; a ``wait`` follows
        the run it first looked at, and raises the same if that run hands over meanwhile.
        """
        b, _ = await self._read_stream(workflow_id, name, offset, wait, run_id, None)
        return b

    async def _read_stream(
        self, workflow_id: str, name: str, offset: int, wait: Duration | None, run_id: int | None,
        hint: int | None,
    ) -> tuple[StreamBatch, int]:
        """``stream_batch``, resuming the journal scan at index ``hint`` of run ``run_id``."""
        self._check_open()
        wid = self._check_id(workflow_id)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        if run_id is not None and (not isinstance(run_id, int) or isinstance(run_id, bool) or run_id <= 0):
            raise ValueError(f"run_id must be a run's ID (an int > 0) or None, got {run_id!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (to_ms(wait) / 1000 if wait is not None else 0)
        while True:
            st = self._rt.current(wid)
            if run_id is not None and st.run_id != run_id:
                raise RunNotCurrent(wid, run_id, st.run_id)
            # Without history an ended run's chunks are gone: "ended" here would cut the
            # stream short at the reader's offset, so say what happened instead.
            history.check(self._rt, st, f"reading stream {name!r}")
            start = hint if hint is not None and run_id is not None else 0
            # A wait follows the run it first looked at: offsets of one run mean nothing in the next.
            run_id = st.run_id
            journal, lsns = self._rt.journal_of(st)
            start = min(start, len(journal))
            chunks, nxt, status, at = durable_chunks(
                journal, lsns, self._rt.durable(st.shard), name, offset, start)
            left = deadline - loop.time()
            if chunks or status is not None or left <= 0:
                end = None if status is None else status.name.lower()
                return StreamBatch(wid, st.run_id, offset, chunks, nxt, end), at
            # Closed or the log failed (also while this reader waited): nothing more will come.
            self._check_open()
            await self._rt.stream_changed(left)

    async def read_stream(
        self, workflow_id: str, name: str, offset: int = 0, *, run_id: int | None = None
    ) -> AsyncIterator[Any]:
        """Follows stream ``name`` from ``offset``, yielding each durable chunk, until it ends.

        It follows one run: ``run_id``, or the workflow's current run when it starts. If that
        run hands over to another before the stream's end was read (continue-as-new),
        :class:`fusee.errors.RunNotCurrent` is raised instead of yielding the next run's chunks.
        """
        hint: int | None = None
        while True:
            b, hint = await self._read_stream(workflow_id, name, offset, 30.0, run_id, hint)
            run_id, offset = b.run_id, b.next_offset
            for chunk in b.chunks:
                yield chunk
            if b.ended:
                return  # the batch that saw the end held every chunk before it

    async def import_journal(
        self, path: str | os.PathLike[str], workflow_id: str | None = None, before_step: str | None = None
    ) -> RunHandle[Any]:
        """Loads an exported journal (a ``.fjnl`` file, see :meth:`export`) as a new run that
        replays it with this engine's code and continues live from where it stopped: how a
        production run is reproduced, and carried on, somewhere else.

        The run takes ``workflow_id`` (default: the journal's own), which must not exist
        here (:class:`fusee.AlreadyExists`). With ``before_step``, the journal is cut before
        the first step of that name, as :meth:`reset` cuts (signals after the cut are
        delivered again): the steps before it are not run again, that one and what follows
        run with the code of now. Without it, everything but the journal's ending is kept.
        The code must replay the kept records (else the run stops with a
        :class:`fusee.DeterminismError`, see ``Engine.stuck``). Returns once the new run is
        durable. A file that is not a journal raises :class:`fusee.CorruptRecord`.
        """
        self._check_open()
        if workflow_id is not None:
            workflow_id = self._check_id(workflow_id)
        if before_step is not None and not isinstance(before_step, str):
            raise TypeError(f"before_step must be a step's name (a str) or None, got {before_step!r}")
        journal = await asyncio.get_running_loop().run_in_executor(None, journal_file.read, path)
        return await self._import_records(journal, workflow_id, before_step)

    async def _import_records(self, journal: list[rec.Record], workflow_id: str | None,
                              before_step: str | None, before_position: int | None = None,
                              reapply_signals: bool = True, version: int | None = None,
                              fork: bool = False, by: str | None = None) -> RunHandle[Any]:
        """:meth:`import_journal` of records already read; with ``fork=True``, the half of a
        :meth:`fork` whose original lives on another part (see ``Runtime.import_run``)."""
        self._check_open()
        st, lsn = self._rt.import_run(journal, workflow_id, before_step, before_position=before_position,
                                      reapply_signals=bool(reapply_signals), version=version,
                                      fork=bool(fork), by=_by(by) if fork else None)
        run_id = st.run_id
        await self._durable(st.shard, lsn)
        return RunHandle(self, st.id, run_id)

    async def export(self, workflow_id: str, path: str | os.PathLike[str]) -> int:
        """Writes the durable journal of the workflow's current run to ``path`` (a ``.fjnl`` file).

        The file is durable when this returns; ``fusee.testing.replay(path,
        workflows)`` checks new code against it. Returns the number of records.
        """
        journal = await self.journal(workflow_id)
        await self._env.run_io(lambda: journal_file.write(path, journal))
        return len(journal)

    def describe(self, workflow_id: str) -> RunSummary:
        """The workflow's summary. Raises :class:`fusee.NotFound` for an unknown ID."""
        self._check_process()  # a forked child would read the parent's state of the fork's instant
        st = self._rt.current(self._check_id(workflow_id))
        return self._summary(st, detail=True)

    def _summary(self, st: Any, detail: bool = False) -> RunSummary:
        stuck = self._rt.stuck.get(st.id)
        status = visibility.status_of(self._rt, st)
        started, ended_ms = visibility.times_of(self._rt, st)
        attributes = self._rt.index.get(st.id)
        summary = RunSummary(
            st.id, st.run_id, st.wtype, status, st.shard, stuck_reason=stuck,
            started_at=visibility.ms_to_datetime(started), ended_at=visibility.ms_to_datetime(ended_ms),
            attributes=dict(attributes) if attributes else {},
        )
        if detail:
            journal = self._rt.journal_of(st)[0]
            summary = dataclasses.replace(summary, audit=_audit_view(journal), steps=step_attempts(journal))
            if st.running:
                summary = dataclasses.replace(summary, **_retry_view(journal))
        return summary

    def runs(self) -> list[RunSummary]:
        """Every workflow the engine knows, in the order they were first seen.

        The retry fields (``attempt``, ``last_error``, ``next_retry``,
        ``paused_steps``) and ``audit`` are filled by :meth:`describe` only;
        ``started_at``, ``ended_at`` and ``attributes`` everywhere.
        """
        self._check_process()
        return [self._summary(st) for st in self._rt.wf.values()]

    def list(self, where: str | None = None, limit: int = 100, cursor: str | None = None, *,
             order: str = "oldest") -> RunPage:
        """A page of workflows matching ``where``, in the order the engine first saw them
        (``order="newest"``: the last seen first), or in the order of the query's ``order by``.

        ``where`` is a query (see docs/api.md), e.g. ``"workflow = 'order' and
        attrs.customer = 'acme'"`` or ``"status = 'paused' and started_at >
        now() - 1h order by started_at desc"``; None lists every workflow. An
        ``order by`` decides the order alone: with ``order="newest"`` too it raises
        :class:`fusee.InvalidQuery` (ties go first seen first). At most ``limit`` (1 to
        10,000) runs per page; pass ``page.cursor`` back (with the same
        ``order``) to get the next page (None: nothing after). Raises
        :class:`fusee.InvalidQuery` naming the position of a mistake in
        ``where`` (:class:`fusee.UnknownStatus` for a status no run has).

        An ``and`` with an ``attrs.<key> = value``, ``attrs.<key> in (...)`` or
        ``workflow_id = ...`` term answers from the attribute index (its time
        grows with the matches, not with the workflows); other queries read
        every workflow. Items are filled as :meth:`runs` fills them (the retry
        fields and ``audit`` only by :meth:`describe`). Answers from memory,
        durable or not yet.
        """
        self._check_process()
        states, next_cursor = visibility.select(self._rt, where, limit, cursor, order)
        return RunPage([self._summary(st) for st in states], next_cursor)

    def counts(self, where: str | None = None) -> dict[str, int]:
        """How many workflows match ``where`` (as :meth:`list` takes it), by status: every
        status of ``fusee.engine.visibility.STATUSES`` is a key, zeros included.

        Walks what ``where`` selects (the whole table without an indexed term);
        answers from memory. Raises :class:`fusee.InvalidQuery` as :meth:`list` does.
        """
        self._check_process()
        return visibility.counts(self._rt, where)

    def metrics(self) -> Metrics:
        """Per-shard counts (runs by status, parked, loaded), step, flush and queue figures.

        A walk of the workflow table (its time grows with the workflows);
        every field is documented on :class:`fusee.Metrics` and in docs/operations.md.
        """
        self._check_process()
        return visibility.metrics(self._rt, self._committer,
                                  backup=self._backup.status() if self._backup is not None else None)

    def stuck(self) -> dict[str, str]:
        """Runs stopped by a determinism error (or an unregistered type), with the message."""
        return dict(self._rt.stuck)

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the engine's log (then nothing more is acknowledged:
        close and reopen), or None."""
        return self._log.failed

    @property
    def live(self) -> bool:
        """Opened ``read_only`` on a directory that another process has open: this engine
        shows what its log held at the open (the other process may have written more)."""
        return self._log.dir.live

    @property
    def stats(self) -> dict[str, int]:
        """Counters since open: steps, replays, runs started, parks, wakes, checkpoints, and where
        synchronous step functions ran (``sync_inline``, ``sync_pooled``, ``sync_demoted``, and
        ``sync_cleared``: slow inline executions a quick probe in the pool then excused) and
        how flushes ran (``flushes``, ``inline_flushes``, ``flush_waits``)."""
        out = dict(self._rt.stats)
        policy = self._rt.steps.sync_policy
        out.update(sync_inline=policy.inline_runs, sync_pooled=policy.pool_runs, sync_demoted=policy.demoted,
                   sync_cleared=policy.cleared,
                   flushes=self._committer.flushes, inline_flushes=self._committer.inline_flushes,
                   flush_waits=self._committer.blocking_waits)
        return out

    # --- checkpoints and closing ------------------------------------------------

    async def checkpoint(self) -> None:
        """Writes a checkpoint now: the next open reads it instead of the log before it.

        The engine also writes one every ``checkpoint_every`` records or
        ``checkpoint_bytes`` bytes, and at close.
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

        In a child forked from the process that opened it, raises
        :class:`fusee.EngineForked` at once: the parent owns the engine.
        """
        self._check_process()
        self._check_loop()
        if self._closed:
            return
        self._closed = True
        forks.release(self)
        rt = self._rt
        rt.closing = True
        grace_s = to_ms(grace) / 1000
        if rt.steps.executing and self._log.failed is None:
            try:
                await asyncio.wait_for(rt.steps.wait_idle(), grace_s)
            except TimeoutError:
                logger.warning("close: %d step function(s) still running after the %ss grace; "
                            "they run again at the next open", rt.steps.executing, grace_s)
        self._fail_waiters(None)  # before the runs stop: callers hear "closed", not "ended"
        rt.park_all()
        if self._telemetry is not None:
            self._telemetry.close()
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
            logger.error("the checkpoint at close failed: %s", e)
        finally:
            if self._backup is not None:
                # After the last checkpoint: the target gets the directory as it is closed.
                await asyncio.get_running_loop().run_in_executor(
                    None, self._backup.stop, self._backup_close_timeout)
                self._backup.release()
            if self._route_server is not None:
                await self._route_server.close()  # before the lock goes: the next owner reuses the address
            await self._committer.close()
            self._log.close()
            for released in self._on_release:
                released()
            if self._own_env and isinstance(self._env, RealEnv):
                self._env.close()
            rt.release_table()
            if self._gc_release is not None:
                self._gc_release()
                self._gc_release = None
        if failed is not None:
            raise failed

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _by(by: str | None) -> bytes | None:
    """Who asked, as journaled for the audit."""
    if by is None:
        return None
    if not isinstance(by, str) or not by:
        raise TypeError(f"by= names who asks: a non-empty str, got {by!r}")
    return by.encode("utf-8", "surrogatepass")


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    """One journaled request from outside the run: who asked for what."""

    #: "signal", "cancel", "terminate", "resume", "complete" or "reset".
    action: str
    #: Who asked (the ``by=`` of the call).
    by: str
    #: The signal's name or the reason given, if any.
    detail: str = ""


def _audit_view(journal: list[rec.Record]) -> tuple[AuditEntry, ...]:
    """The requests with a ``by=`` that the run's journal holds, in order."""
    out: list[AuditEntry] = []
    for r in journal:
        by = getattr(r, "by", None)
        if not by:
            continue
        who = by.decode("utf-8", "replace")
        t = type(r)
        if t is rec.Signal:
            out.append(AuditEntry("signal", who, r.name))  # type: ignore[union-attr]
        elif t is rec.CancelRequest:
            out.append(AuditEntry("cancel", who, r.reason.decode("utf-8", "replace")))  # type: ignore[union-attr]
        elif t is rec.Done:
            out.append(AuditEntry("terminate", who, r.payload.decode("utf-8", "replace")))  # type: ignore[union-attr]
        elif t is rec.Resume:
            out.append(AuditEntry("resume", who))
        elif t is rec.Completed:
            out.append(AuditEntry("complete", who, "failed" if r.status != rec.Status.OK else ""))  # type: ignore[union-attr]
        elif t is rec.Start:
            out.append(AuditEntry("reset", who))
    return tuple(out)


def _retry_view(journal: list[rec.Record]) -> dict[str, Any]:
    """Failed attempts of the run's unfinished steps, from its journal."""
    attempts: dict[int, rec.Attempt] = {}
    for r in journal:
        t = type(r)
        if t is rec.Attempt:
            assert isinstance(r, rec.Attempt)
            attempts[r.seq] = r
        elif t is rec.Step or t is rec.Resume:
            attempts.pop(r.seq, None)  # type: ignore[union-attr]
    if not attempts:
        return {}
    latest = list(attempts.values())[-1]
    try:
        info = codec.decode_error(latest.error)
        last_error: str | None = f"{info.type}: {info.message}"
    except FuseeError:
        last_error = None
    due = [a.retry_at_ms for a in attempts.values() if a.retry_at_ms != rec.PAUSED]
    return {
        "attempt": max(a.attempt for a in attempts.values()),
        "last_error": last_error,
        "next_retry": datetime.datetime.fromtimestamp(min(due) / 1000, tz=datetime.UTC) if due else None,
        "paused_steps": tuple(a.name for a in attempts.values() if a.retry_at_ms == rec.PAUSED),
    }


def _existing_shards(storage: Any, path: str) -> int:
    """The shard count an existing directory was created with (1 for a new one)."""
    return existing_shards(storage, path) or 1


def _dedup(key: str | None) -> int:
    if key is None:
        return 0
    if not isinstance(key, str) or not key:
        raise TypeError(f"dedup_key must be a non-empty string, got {key!r}")
    return dedup_key("client:" + key)


__all__ = ["AuditEntry", "Engine", "RunHandle", "RunSummary"]
