"""A blocking engine for synchronous hosts: threads, Flask and Django views, scripts, trio.

:class:`SyncEngine` runs an ordinary :class:`fusee.Engine` on an event loop of
its own in a background daemon thread; each method submits the engine's
coroutine there (``asyncio.run_coroutine_threadsafe``) and blocks the calling
thread until it returns. Workflow code stays ``async def`` and runs on that
loop; step functions stay plain functions. Any number of threads may call at
once: the engine only ever runs on its loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

from fusee import telemetry as telemetry_config
from fusee.core import records as rec
from fusee.definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
from fusee.encryption import Codec
from fusee.engine.bulk import BulkResult
from fusee.engine.engine import DEFAULT_CLOSE_GRACE, Engine, RunHandle, RunSummary, forked_error
from fusee.engine.visibility import Metrics, RunPage
from fusee.errors import EngineClosed, WrongEventLoop
from fusee.flow.api import ScheduleInfo, ScheduleList
from fusee.flow.rules import Receipt
from fusee.limits import KEEP, Limit, LimitStatus
from fusee.objects import Handler, ObjectDef, ObjectState
from fusee.retry import Retry
from fusee.runtime.context import Duration
from fusee.runtime.env import DEFAULT_STEP_THREADS, Env
from fusee.runtime.runtime import DEFAULT_LOAD_ROOM
from fusee.runtime.streams import StreamBatch
from fusee.sizes import Size
from fusee.tls import RouteTLS

T = TypeVar("T")
R = TypeVar("R")
In = TypeVar("In")
Q = TypeVar("Q")
A = TypeVar("A")
S = TypeVar("S")
E = TypeVar("E")

#: How long one wait of :meth:`SyncEngine.read_stream` polls before asking again (seconds).
_STREAM_WAIT = 30.0
#: Every engine open in this process, so a forked child marks them all unusable at once.
_OPEN: weakref.WeakSet[SyncEngine] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The loop thread does not exist in the child: a call would wait on it forever. (What the
    # engine holds, its directory's lock among it, the child lets go of: fusee.storage.forks.)
    for engine in list(_OPEN):
        engine._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SyncRunHandle(Generic[R]):
    """A workflow run, by ID, for blocking callers (see :class:`fusee.RunHandle`)."""

    __slots__ = ("_engine", "_handle")

    def __init__(self, engine: SyncEngine, handle: RunHandle[R]) -> None:
        self._engine = engine
        self._handle = handle

    @property
    def workflow_id(self) -> str:
        return self._handle.workflow_id

    @property
    def run_id(self) -> int:
        """The run this handle was made for (continue-as-new chains move on to new runs)."""
        return self._handle.run_id

    def result(self, timeout: float | None = None) -> R:
        """Blocks until the workflow's result is durable (following continue-as-new) and returns it.

        Raises :class:`fusee.WorkflowFailed` (or its subclasses) when it ended
        without one, and ``TimeoutError`` when ``timeout`` seconds pass first
        (the run goes on; ask again).
        """
        return self._engine._run(self._handle.result, _wait=timeout)

    def signal(
        self, signal: SignalDef[T], value: T = None, *, dedup_key: str | None = None, by: str | None = None  # type: ignore[assignment]
    ) -> None:
        """See :meth:`fusee.Engine.signal`."""
        self._engine._run(self._handle.signal, signal, value, dedup_key=dedup_key, by=by)

    def query(self, query: QueryDef[Q], arg: Any = None) -> Q:
        """See :meth:`fusee.Engine.query`."""
        answer: Q = self._engine._run(self._handle.query, query, arg)
        return answer

    def update(self, update: UpdateDef[T], arg: T = None, *, update_id: str | None = None) -> Any:  # type: ignore[assignment]
        """See :meth:`fusee.Engine.update`."""
        return self._engine._run(self._handle.update, update, arg, update_id=update_id)

    def cancel(self, reason: str = "", *, by: str | None = None) -> None:
        """See :meth:`fusee.Engine.cancel`."""
        self._engine._run(self._handle.cancel, reason, by=by)

    def terminate(self, reason: str = "", *, by: str | None = None) -> None:
        """See :meth:`fusee.Engine.terminate`."""
        self._engine._run(self._handle.terminate, reason, by=by)

    def resume(self, *, by: str | None = None) -> None:
        """See :meth:`fusee.Engine.resume`."""
        self._engine._run(self._handle.resume, by=by)

    def describe(self) -> RunSummary:
        """The workflow's current summary."""
        return self._engine._call(self._handle.describe)

    def __repr__(self) -> str:
        return f"SyncRunHandle({self.workflow_id!r}, run={self.run_id})"


class SyncEngine:
    """An engine on one directory for synchronous code. Open it with :meth:`SyncEngine.open`.

    Every method blocks until the engine's answer (the same answer, and the
    same :mod:`fusee.errors`, as :class:`fusee.Engine`'s method of that name),
    and is safe from any number of threads at once.
    """

    _engine: Engine

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._loop = loop
        self._thread = thread
        self._pid = os.getpid()
        self._forked = False
        self._closed = False
        self._close_lock = threading.Lock()
        #: What ended the loop thread other than close (kept to raise at the next call and at close).
        self._thread_error: BaseException | None = None

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
        tune_gc: bool = True,
    ) -> SyncEngine:
        """Opens (or creates) ``path`` (a directory, a PostgreSQL DSN, or None for memory) and recovers it,
        as :meth:`fusee.Engine.open` does with the same options, on a loop thread of its own.

        Returns once recovery is done; the engine's own errors (for example
        :class:`fusee.DirectoryLocked`) are raised here and the thread is
        stopped. Use it as a context manager, or call :meth:`close`.
        """
        options: dict[str, Any] = dict(
            workflows=list(workflows), shards=shards, parts=parts, env=env, retry=retry, inline_sync_steps=inline_sync_steps,
            flush=flush, step_threads=step_threads, truncate_corrupt=truncate_corrupt,
            segment_bytes=segment_bytes, blob_threshold=blob_threshold, checkpoint_every=checkpoint_every,
            checkpoint_interval=checkpoint_interval, checkpoint_bytes=checkpoint_bytes, park_after=park_after,
            max_loaded=max_loaded, memory_budget=memory_budget, recovery_batch=recovery_batch, retention=retention, read_only=read_only, keep_history=keep_history,
            codec=codec, limits=list(limits), telemetry=telemetry, exclusive=exclusive,
            front_end=front_end, route_timeout=route_timeout, namespace=namespace, lease_ttl=lease_ttl, route_address=route_address,
            route_tls=route_tls, tune_gc=tune_gc,
        )
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        holder: list[SyncEngine] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            ready.set()
            try:
                loop.run_forever()
            except BaseException as e:  # kept: raised at the next call and at close, never lost
                if holder:
                    holder[0]._thread_error = e
            finally:
                # Calls still waiting on the loop end now (as EngineClosed, see _submit), never hang.
                try:
                    tasks = asyncio.all_tasks(loop)
                    for task in tasks:
                        task.cancel()
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()

        thread = threading.Thread(target=serve, name="fusee-sync-engine", daemon=True)
        self = cls(loop, thread)
        holder.append(self)
        thread.start()
        ready.wait()

        async def opening() -> Engine:
            return await Engine.open(path, **options)

        try:
            self._engine = asyncio.run_coroutine_threadsafe(opening(), loop).result()
        except BaseException:
            self._stop_thread()
            raise
        _OPEN.add(self)
        return self

    # --- plumbing ------------------------------------------------------------------

    def _check(self) -> None:
        if self._forked or os.getpid() != self._pid:
            raise forked_error("SyncEngine", self._pid)
        if self._thread_error is not None:
            raise EngineClosed(
                f"the engine's loop thread failed ({type(self._thread_error).__name__}: {self._thread_error}); "
                "close this SyncEngine and open it again"
            ) from self._thread_error
        if threading.current_thread() is self._thread:
            raise WrongEventLoop(
                "a SyncEngine method was called on the engine's own loop thread (a step function run "
                "inline, or workflow code): that would wait for itself; await the fusee.Engine method instead"
            )

    def _submit(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop stopped (closed, or its thread died)
            coro.close()
            self._check()
            raise EngineClosed("the engine is closed: open it again to continue") from None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                # In slices: a call that reached the loop just as its thread died is never run,
                # and its future never completes; the thread's end must end the wait too.
                left = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
                try:
                    return fut.result(left)
                except concurrent.futures.TimeoutError:
                    if not self._thread.is_alive():
                        fut.cancel()
                        self._check()
                        raise EngineClosed("the engine's loop thread ended while this call waited: "
                                           "open it again to continue") from None
                    if deadline is not None and time.monotonic() >= deadline:
                        fut.cancel()  # only the wait ends; what was acknowledged stays acknowledged
                        raise TimeoutError(f"no answer within {timeout} s") from None
        except concurrent.futures.CancelledError:
            if not self._closed and self._thread_error is None and self._thread.is_alive():
                raise
            self._check()  # the loop thread failed: its error, chained
            raise EngineClosed("the engine closed while this call waited: open it again to continue") from None

    def _run(
        self, method: Callable[..., Awaitable[T]], /, *args: Any, _wait: float | None = None, **kwargs: Any
    ) -> T:
        """Runs the engine coroutine method on the loop and blocks for its answer."""
        self._check()

        async def call() -> T:
            return await method(*args, **kwargs)

        return self._submit(call(), _wait)

    def _call(self, method: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Runs a plain engine method on the loop: the engine's state is only read there."""
        self._check()

        async def call() -> T:
            return method(*args, **kwargs)

        return self._submit(call(), None)

    def _stop_thread(self) -> None:
        if self._thread.is_alive() and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:
                pass  # it stopped already
        self._thread.join()

    # --- the engine underneath -----------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The asyncio engine underneath (call it only on :attr:`loop`)."""
        return self._engine

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine runs on, in the background thread."""
        return self._loop

    # --- the client API --------------------------------------------------------------

    @overload
    def start(
        self, workflow: WorkflowDef[In, R], workflow_id: str, input: In = None,  # type: ignore[assignment]
        *, if_running: str = "fail", if_finished: str = "fail", timeout: Duration | None = None,
    ) -> SyncRunHandle[R]: ...

    @overload
    def start(
        self, workflow: str, workflow_id: str, input: Any = None,
        *, if_running: str = "fail", if_finished: str = "fail", timeout: Duration | None = None,
    ) -> SyncRunHandle[Any]: ...

    def start(
        self, workflow: WorkflowDef[Any, Any] | str, workflow_id: str, input: Any = None,
        *, if_running: str = "fail", if_finished: str = "fail", timeout: Duration | None = None,
    ) -> SyncRunHandle[Any]:
        """Starts ``workflow`` as ``workflow_id``; returns once its start is durable (see :meth:`fusee.Engine.start`)."""
        h: RunHandle[Any] = self._run(
            self._engine.start, workflow, workflow_id, input,
            if_running=if_running, if_finished=if_finished, timeout=timeout,
        )
        return SyncRunHandle(self, h)

    @overload
    def execute(
        self, workflow: WorkflowDef[In, R], workflow_id: str, input: In = None,  # type: ignore[assignment]
        *, if_running: str = "fail", if_finished: str = "fail", timeout: Duration | None = None,
    ) -> R: ...

    @overload
    def execute(
        self, workflow: str, workflow_id: str, input: Any = None,
        *, if_running: str = "fail", if_finished: str = "fail", timeout: Duration | None = None,
    ) -> Any: ...

    def execute(
        self, workflow: WorkflowDef[Any, Any] | str, workflow_id: str, input: Any = None,
        *, if_running: str = "fail", if_finished: str = "fail", timeout: Duration | None = None,
    ) -> Any:
        """Starts ``workflow`` and blocks until its result (see :meth:`fusee.Engine.execute`)."""
        return self._run(
            self._engine.execute, workflow, workflow_id, input,
            if_running=if_running, if_finished=if_finished, timeout=timeout,
        )

    def get(self, workflow_id: str) -> SyncRunHandle[Any]:
        """A handle to an existing workflow. Raises :class:`fusee.NotFound` if there is none."""
        return SyncRunHandle(self, self._call(self._engine.get, workflow_id))

    def signal(
        self, workflow_id: str, signal: SignalDef[T], value: T = None,  # type: ignore[assignment]
        *, dedup_key: str | None = None, by: str | None = None,
    ) -> None:
        """Delivers a signal; returns once it is durable (see :meth:`fusee.Engine.signal`)."""
        self._run(self._engine.signal, workflow_id, signal, value, dedup_key=dedup_key, by=by)

    def query(self, workflow_id: str, query: QueryDef[Q], arg: Any = None) -> Q:
        """Answers ``query`` from the run's durable state (see :meth:`fusee.Engine.query`)."""
        answer: Q = self._run(self._engine.query, workflow_id, query, arg)
        return answer

    def update(
        self, workflow_id: str, update: UpdateDef[T], arg: T = None,  # type: ignore[assignment]
        *, update_id: str | None = None,
    ) -> Any:
        """Runs an update and returns the handler's durable result (see :meth:`fusee.Engine.update`)."""
        return self._run(self._engine.update, workflow_id, update, arg, update_id=update_id)

    def update_with_start(
        self, workflow: WorkflowDef[Any, Any] | str, workflow_id: str, input: Any, update: UpdateDef[Any],
        arg: Any = None, *, update_id: str | None = None, timeout: Duration | None = None,
    ) -> Any:
        """Delivers ``update``, starting the workflow first if it is not running (see
        :meth:`fusee.Engine.update_with_start`)."""
        return self._run(
            self._engine.update_with_start, workflow, workflow_id, input, update, arg,
            update_id=update_id, timeout=timeout,
        )

    def reset(
        self, workflow_id: str, *, before_step: str | None = None, before_position: int | None = None,
        reapply_signals: bool = True, version: int | None = None, by: str | None = None,
    ) -> SyncRunHandle[Any]:
        """Starts a new run of the ID from its journal before a cut (see :meth:`fusee.Engine.reset`)."""
        h: RunHandle[Any] = self._run(
            self._engine.reset, workflow_id, before_step=before_step, before_position=before_position,
            reapply_signals=reapply_signals, version=version, by=by,
        )
        return SyncRunHandle(self, h)

    def fork(
        self, workflow_id: str, new_id: str, *, before_step: str | None = None, before_position: int | None = None,
        reapply_signals: bool = True, version: int | None = None, by: str | None = None,
    ) -> SyncRunHandle[Any]:
        """Starts ``new_id`` from ``workflow_id``'s journal before a cut (see :meth:`fusee.Engine.fork`)."""
        h: RunHandle[Any] = self._run(
            self._engine.fork, workflow_id, new_id, before_step=before_step, before_position=before_position,
            reapply_signals=reapply_signals, version=version, by=by,
        )
        return SyncRunHandle(self, h)

    def import_journal(
        self, path: str | os.PathLike[str], workflow_id: str | None = None, before_step: str | None = None
    ) -> SyncRunHandle[Any]:
        """Loads an exported ``.fjnl`` as a new run that replays and continues (see
        :meth:`fusee.Engine.import_journal`)."""
        h: RunHandle[Any] = self._run(self._engine.import_journal, path, workflow_id, before_step)
        return SyncRunHandle(self, h)

    def cancel(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None:
        """Requests cancellation; returns once the request is durable."""
        self._run(self._engine.cancel, workflow_id, reason, by=by)

    def terminate(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None:
        """Ends the run at once without running more of its code; returns once durable."""
        self._run(self._engine.terminate, workflow_id, reason, by=by)

    def resume(self, workflow_id: str, *, by: str | None = None) -> None:
        """Resumes the run's paused steps with a fresh retry budget."""
        self._run(self._engine.resume, workflow_id, by=by)

    def bulk(self, action: str, where: str, **options: Any) -> BulkResult:
        """Makes ``action`` on every run ``where`` matches, or counts them with
        ``dry_run=True`` (see :meth:`fusee.Engine.bulk` for the options)."""
        return self._run(self._engine.bulk, action, where, **options)

    def complete(self, token: str, value: Any = None, *, by: str | None = None) -> bool:
        """Completes a ``ctx.await_completion`` (see :meth:`fusee.Engine.complete`)."""
        return self._run(self._engine.complete, token, value, by=by)

    def fail_completion(self, token: str, message: str = "", *, by: str | None = None) -> bool:
        """Fails a ``ctx.await_completion`` (see :meth:`fusee.Engine.fail_completion`)."""
        return self._run(self._engine.fail_completion, token, message, by=by)

    # --- keyed objects and limits ------------------------------------------------------

    @overload
    def call(self, handler: Handler[R, None], key: str, arg: None = None, *, call_id: str | None = None) -> R: ...

    @overload
    def call(self, handler: Handler[R, A], key: str, arg: A, *, call_id: str | None = None) -> R: ...

    def call(self, handler: Handler[R, Any], key: str, arg: Any = None, *, call_id: str | None = None) -> R:
        """Runs an object handler for ``key`` and returns its durable result (see :meth:`fusee.Engine.call`)."""
        answer: R = self._run(self._engine.call, handler, key, arg, call_id=call_id)
        return answer

    def object_state(self, obj: ObjectDef[S], key: str) -> ObjectState[S]:
        """``key``'s durable state and version (see :meth:`fusee.Engine.object_state`)."""
        return self._run(self._engine.object_state, obj, key)

    def set_object_state(self, obj: ObjectDef[S], key: str, value: S, *, if_version: int | None = None) -> int:
        """Replaces ``key``'s state; returns the new version once durable."""
        return self._run(self._engine.set_object_state, obj, key, value, if_version=if_version)

    def clear_object_state(self, obj: ObjectDef[Any], key: str, *, if_version: int | None = None) -> int:
        """Puts ``key``'s state back to the object's initial state."""
        return self._run(self._engine.clear_object_state, obj, key, if_version=if_version)

    def patch_object_state(
        self, obj: ObjectDef[Any], key: str, patch: list[dict[str, Any]], *, if_version: int | None = None
    ) -> int:
        """Applies a JSON Patch to ``key``'s state (see :meth:`fusee.Engine.patch_object_state`)."""
        return self._run(self._engine.patch_object_state, obj, key, patch, if_version=if_version)

    def set_limit(self, name: str, *, concurrency: Any = KEEP, per_second: Any = KEEP, weights: Any = KEEP) -> Limit:
        """Changes a limit's bounds now (see :meth:`fusee.Engine.set_limit`)."""
        return self._call(self._engine.set_limit, name, concurrency=concurrency, per_second=per_second,
                          weights=weights)

    def limits(self) -> dict[str, LimitStatus]:
        """Each limit's bounds, permits out and waiting executions."""
        return self._call(self._engine.limits)

    # --- schedules and windows ---------------------------------------------------------

    @overload
    def schedule(
        self, schedule_id: str, workflow: WorkflowDef[In, Any], input: In = None,  # type: ignore[assignment]
        *, every: Any = None, cron: str | None = None, timezone: str = "UTC", jitter: Any = None,
        overlap: str = "skip", catchup_window: Any = "1h", paused: bool = False,
    ) -> None: ...

    @overload
    def schedule(
        self, schedule_id: str, workflow: str, input: Any = None,
        *, every: Any = None, cron: str | None = None, timezone: str = "UTC", jitter: Any = None,
        overlap: str = "skip", catchup_window: Any = "1h", paused: bool = False,
    ) -> None: ...

    def schedule(
        self, schedule_id: str, workflow: WorkflowDef[Any, Any] | str, input: Any = None,
        *, every: Any = None, cron: str | None = None, timezone: str = "UTC", jitter: Any = None,
        overlap: str = "skip", catchup_window: Any = "1h", paused: bool = False,
    ) -> None:
        """Makes a schedule; returns once durable (see :meth:`fusee.Engine.schedule`)."""
        self._run(
            self._engine.schedule, schedule_id, workflow, input, every=every, cron=cron, timezone=timezone,
            jitter=jitter, overlap=overlap, catchup_window=catchup_window, paused=paused,
        )

    def schedules(self) -> ScheduleList:
        """Every schedule, by ID."""
        return self._call(self._engine.schedules)

    def describe_schedule(self, schedule_id: str) -> ScheduleInfo:
        """One schedule's durable state. Raises :class:`fusee.ScheduleNotFound`."""
        return self._run(self._engine.describe_schedule, schedule_id)

    def pause_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Stops starting runs; durable when it returns."""
        return self._run(self._engine.pause_schedule, schedule_id)

    def unpause_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Starts runs again from the next scheduled time."""
        return self._run(self._engine.unpause_schedule, schedule_id)

    def trigger_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Starts a run now, under the overlap policy."""
        return self._run(self._engine.trigger_schedule, schedule_id)

    def backfill_schedule(self, schedule_id: str, start: datetime.datetime, end: datetime.datetime) -> ScheduleInfo:
        """Runs the scheduled times in ``[start, end)`` (see :meth:`fusee.Engine.backfill_schedule`)."""
        return self._run(self._engine.backfill_schedule, schedule_id, start, end)

    def delete_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Ends the schedule (its runs go on); returns its final state."""
        return self._run(self._engine.delete_schedule, schedule_id)

    @overload
    def enqueue(
        self, workflow: WorkflowDef[list[E], Any], key: str, event: E, *, event_id: str | None = None,
    ) -> Receipt: ...

    @overload
    def enqueue(self, workflow: str, key: str, event: Any, *, event_id: str | None = None) -> Receipt: ...

    def enqueue(
        self, workflow: WorkflowDef[Any, Any] | str, key: str, event: Any, *, event_id: str | None = None,
    ) -> Receipt:
        """Adds ``event`` to ``key``'s open window; returns once durable (see :meth:`fusee.Engine.enqueue`)."""
        return self._run(self._engine.enqueue, workflow, key, event, event_id=event_id)

    # --- inspection --------------------------------------------------------------------

    def journal(self, workflow_id: str) -> list[rec.Record]:
        """The durable records of the workflow's current run, in journal order."""
        return self._run(self._engine.journal, workflow_id)

    def read_stream_batch(
        self, workflow_id: str, name: str, offset: int = 0, *, wait: Duration | None = None,
        run_id: int | None = None,
    ) -> tuple[list[Any], int, bool]:
        """The durable chunks of stream ``name`` from ``offset`` (see :meth:`fusee.Engine.read_stream_batch`)."""
        return self._run(self._engine.read_stream_batch, workflow_id, name, offset, wait=wait, run_id=run_id)

    def stream_batch(
        self, workflow_id: str, name: str, offset: int = 0, *, wait: Duration | None = None,
        run_id: int | None = None,
    ) -> StreamBatch:
        """One read of stream ``name`` naming its run and how it ended (see :meth:`fusee.Engine.stream_batch`)."""
        return self._run(self._engine.stream_batch, workflow_id, name, offset, wait=wait, run_id=run_id)

    def read_stream(
        self, workflow_id: str, name: str, offset: int = 0, *, run_id: int | None = None
    ) -> Iterator[Any]:
        """Follows stream ``name`` from ``offset``, yielding each durable chunk, until it ends.

        It follows one run, as :meth:`fusee.Engine.read_stream` does. Each wait for more
        blocks this thread only; the iterator may be dropped at any point (nothing is left
        running on the engine).
        """
        while True:
            b = self.stream_batch(workflow_id, name, offset, wait=_STREAM_WAIT, run_id=run_id)
            run_id, offset = b.run_id, b.next_offset
            yield from b.chunks
            if b.ended:
                return

    def export(self, workflow_id: str, path: str | os.PathLike[str]) -> int:
        """Writes the run's durable journal to ``path`` (a ``.fjnl`` file); returns the record count."""
        return self._run(self._engine.export, workflow_id, path)

    def describe(self, workflow_id: str) -> RunSummary:
        """The workflow's summary. Raises :class:`fusee.NotFound` for an unknown ID."""
        return self._call(self._engine.describe, workflow_id)

    def runs(self) -> list[RunSummary]:
        """Every workflow the engine knows, in the order they were first seen."""
        return self._call(self._engine.runs)

    def list(self, where: str | None = None, limit: int = 100, cursor: str | None = None, *,
             order: str = "oldest") -> RunPage:
        """A page of workflows matching ``where`` (see :meth:`fusee.Engine.list`)."""
        return self._call(self._engine.list, where, limit, cursor, order=order)

    def counts(self, where: str | None = None) -> dict[str, int]:
        """How many workflows match ``where``, by status (see :meth:`fusee.Engine.counts`)."""
        return self._call(self._engine.counts, where)

    def metrics(self) -> Metrics:
        """Per-shard counts, step, flush and queue figures (see :meth:`fusee.Engine.metrics`)."""
        return self._call(self._engine.metrics)

    def stuck(self) -> dict[str, str]:
        """Runs stopped by a determinism error (or an unregistered type), with the message."""
        return self._call(self._engine.stuck)

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the engine's log, or None (see :attr:`fusee.Engine.failure`)."""
        return self._call(lambda: self._engine.failure)

    @property
    def live(self) -> bool:
        """Opened ``read_only`` on a directory another process has open."""
        return self._call(lambda: self._engine.live)

    @property
    def stats(self) -> dict[str, int]:
        """Counters since open (see :attr:`fusee.Engine.stats`)."""
        return self._call(lambda: self._engine.stats)

    @property
    def epoch(self) -> int:
        """The directory's owner epoch this engine writes under."""
        return self._call(lambda: self._engine.epoch)

    @property
    def is_owner(self) -> bool:
        """Whether this engine runs the directory's workflows (a follower routes its calls)."""
        return self._call(lambda: self._engine.is_owner)

    # --- checkpoints and closing ---------------------------------------------------------

    def checkpoint(self) -> None:
        """Writes a checkpoint now (see :meth:`fusee.Engine.checkpoint`)."""
        self._run(self._engine.checkpoint)

    def close(self, grace: Duration = DEFAULT_CLOSE_GRACE) -> None:
        """Closes the engine gracefully (see :meth:`fusee.Engine.close`), stops its loop and joins its thread.

        Calls made after it raise :class:`fusee.EngineClosed`; a second close
        does nothing. If the loop thread failed, its error is raised here.
        Raises :class:`fusee.EngineForked` in a forked child (the parent owns
        the engine: close it there).
        """
        self._check_fork()
        if threading.current_thread() is self._thread:
            raise WrongEventLoop("SyncEngine.close was called on the engine's own loop thread: "
                                 "it would wait for itself; close it from another thread")
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._thread.is_alive() and self._thread_error is None:
                    asyncio.run_coroutine_threadsafe(self._engine.close(grace), self._loop).result()
            finally:
                _OPEN.discard(self)
                self._stop_thread()
            if self._thread_error is not None:
                raise EngineClosed(
                    f"the engine's loop thread failed: {type(self._thread_error).__name__}: {self._thread_error}"
                ) from self._thread_error

    def _check_fork(self) -> None:
        if self._forked or os.getpid() != self._pid:
            self._check()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SyncEngine(pid={self._pid}, closed={self._closed})"
