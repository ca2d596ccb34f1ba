"""A follower: an ``Engine.open`` of a directory another process owns.

It runs no workflow code. Every call is encoded (payloads checked and
encoded with the caller's own annotations, as the owner would) and routed to
the owner over its socket; the answer comes back typed by the caller's
annotations. Synchronous reads (``describe``, ``list``, ``runs``,
``metrics``) cannot wait for a socket without blocking the loop: they answer
from a read-only view of the directory, refreshed in the background (see
:meth:`Follower.refresh`).

A thread waits for the directory's lease. When the owner dies, the kernel
releases its lock, one follower gets it, opens the directory as an owner (a
new epoch, recovery as at a restart), serves, and from then on runs its own
calls locally; the others reconnect to it. A call in flight when the owner
died is sent again when that is safe (it names its effect: an update or
object call ID, a signal's dedup key, which a follower always gives, a start
that fails or attaches, reads); otherwise it raises
:class:`fusee.errors.OutcomeUnknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fusee import codec, journal_file
from fusee.core import records as rec
from fusee.definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
from fusee.durations import to_ms
from fusee.engine.engine import Engine, RunHandle, RunSummary
from fusee.engine.visibility import Metrics, RunPage
from fusee.errors import (
    AlreadyExists,
    EngineClosed,
    FuseeError,
    NotWindowed,
    OutcomeUnknown,
    OwnerUnreachable,
    RoutingRefused,
    StorageError,
    WrongEventLoop,
)
from fusee.flow.api import ScheduleList
from fusee.flow.rules import Receipt
from fusee.limits import KEEP, Limit, LimitStatus
from fusee.objects import ObjectDef
from fusee.runtime.runtime import IF_FINISHED, IF_RUNNING
from fusee.runtime.streams import StreamBatch
from fusee.scale import wire
from fusee.scale.owner import HELD_HERE, dir_key, open_owner
from fusee.scale.places import DirectoryPlace, Place, TLSDropped, WaitingLease
from fusee.scale.server import dispatch
from fusee.storage import forks
from fusee.tls import RouteTLS

logger = logging.getLogger("fusee.scale")

#: How long a follower's view of the directory serves synchronous reads before it is read again.
VIEW_TTL = 0.2
#: How many times a follower reads the live directory for its view before giving up until the next read.
_VIEW_TRIES = 5
class _Lost(Exception):
    """The connection to the owner broke before the answer came."""


class _Connection:
    """One socket to the owner; requests multiplexed by ID."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, epoch: int) -> None:
        self.reader, self.writer, self.epoch = reader, writer, epoch
        self.outbox = wire.Outbox(writer)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.alive = True
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                rid, status, value = await wire.read_frame(self.reader)
                fut = self.pending.pop(rid, None)
                if fut is None or fut.done():
                    continue
                if status == wire.OK:
                    fut.set_result(value)
                else:
                    fut.set_exception(wire.error_from_wire(value))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            pass
        finally:
            self.close()

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(_Lost())
        self.pending.clear()
        self.writer.close()
        if self.task is not asyncio.current_task():
            self.task.cancel()  # nothing more will be read: no reader left pending at loop close

    async def call(self, method: str, args: list[Any]) -> Any:
        if not self.alive:
            raise _Lost()
        self.next_id += 1
        rid = self.next_id
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        try:
            self.outbox.write(wire.frame([rid, method, args]))
        except (ConnectionError, OSError, RuntimeError):
            self.pending.pop(rid, None)
            self.close()
            raise _Lost() from None
        try:
            return await fut
        finally:
            self.pending.pop(rid, None)


class _Call:
    """What happened to one routed call: whether it was sent again after losing its owner."""

    __slots__ = ("again", "retried")

    def __init__(self, again: list[Any] | None = None) -> None:
        self.retried = False
        #: The arguments to send instead when the call is sent again.
        self.again = again


def _secs(d: Any) -> float | None:
    return None if d is None else to_ms(d) / 1000


class Follower(Engine):
    """An engine on a directory another process owns: its calls run on the owner.

    Made by :meth:`fusee.Engine.open` when the directory is held by another process
    (pass ``exclusive=True`` to get :class:`fusee.errors.DirectoryLocked` instead).
    Every call keeps its meaning: an acknowledgement means durable on the owner.
    """

    _path: str
    _options: dict[str, Any]
    _registry: dict[tuple[str, int], WorkflowDef[Any, Any]]
    _by_name: dict[str, WorkflowDef[Any, Any]]
    _objects: dict[str, ObjectDef[Any]]
    _route_timeout: float
    #: Where this process serves the others once it took over (a namespace: ``Engine.open``'s ``route_address``).
    _route_address: str | None
    _route_tls: RouteTLS | None
    #: The last TLS connection the owner ended before the routing handshake (None after a good one).
    _tls_dropped: TLSDropped | None
    _place: Place
    _lease: WaitingLease | None
    _stop: threading.Event
    #: Opened with ``front_end=True``: it never takes the lease, so this process never runs a step.
    front_end: bool
    _local: Engine | None
    _conn: _Connection | None
    _changed: asyncio.Event
    #: The dial under way, shared by every call that needs a connection meanwhile.
    _dialing: asyncio.Task[_Connection | None] | None
    _dial_deadline: float
    _view: Engine | None
    _view_at: float
    _view_task: asyncio.Task[None] | None
    _tasks: set[asyncio.Task[Any]]
    #: The takeover under way (opening the directory as its owner), if one is.
    _taking_over: asyncio.Task[Any] | None
    _key: tuple[int, int] | None
    _floop: asyncio.AbstractEventLoop

    @classmethod
    async def follow(cls, place: Place, options: dict[str, Any], route_timeout: float,
                     route_address: str | None = None, route_tls: RouteTLS | None = None, *,
                     take_over: bool = True) -> Follower:
        """A follower of ``place`` (which another engine owns); starts waiting for its lease.
        ``options``: what ``Engine._open`` needs to open the place itself when it takes over.
        ``take_over=False``: a front end, which never waits for the lease (nor takes it)."""
        self = object.__new__(cls)
        self._pid = os.getpid()
        self._place = place
        self._path = place.label
        self._options = options
        self._route_timeout = float(route_timeout)
        self._route_address = route_address
        self._route_tls = route_tls
        self._tls_dropped = None
        self._registry, self._by_name, self._objects = {}, {}, {}
        for w in options.get("workflows", ()):
            if isinstance(w, ObjectDef):
                self._objects[w.name] = w
                w = w.workflow
            self._registry[(w.name, w.version)] = w
            best = self._by_name.get(w.name)
            if best is None or w.version > best.version:
                self._by_name[w.name] = w
        self._floop = asyncio.get_running_loop()
        self._closed = False
        self._read_only = False
        self._local = None
        self._conn = None
        self._changed = asyncio.Event()
        self._dialing, self._dial_deadline = None, 0.0
        self._view, self._view_at, self._view_task = None, 0.0, None
        self._tasks = set()
        self._taking_over = None
        self._telemetry = None
        self._route_server = None
        self._on_release = []
        self.recovered_records = 0
        self._env = types.SimpleNamespace(rng=random.Random(os.urandom(16)))
        self._key = dir_key(place.target) if isinstance(place, DirectoryPlace) else None
        if self._key is not None:
            HELD_HERE.add(self._key)
        self._lease = None
        self._stop = threading.Event()
        self.front_end = not take_over
        if take_over:
            self._start_waiting()
        await place.owner()  # who serves now (its epoch), before the first call needs it
        if place.watch_every is not None:
            self._spawn(self._watch_owner(place.watch_every))
        await self._refresh_quietly()  # without a view, sync reads say so; routed calls work anyway
        forks.hold(self, Follower._descriptors)
        return self

    def _descriptors(self) -> set[int]:
        """What a forked child must let go of: the directory's files (the lease waiting on its lock
        among them) and the socket to the owner (a PostgreSQL lease's connection lets go of itself)."""
        fds = forks.files_under(self._place.target) if self._key is not None else set()
        conn = self._conn
        sock = conn.writer.get_extra_info("socket") if conn is not None else None
        if sock is not None:
            fds.add(sock.fileno())
        return fds

    # --- the lease and takeover ---------------------------------------------------------

    def _start_waiting(self) -> None:
        place, stop, loop = self._place, self._stop, self._floop

        def wait() -> None:
            try:
                lease = self._lease = place.new_lease()
                if stop.is_set():  # closed while the lease was being made
                    lease.release()
                    return
                won = lease.wait_acquire(stop)
                if won:
                    place.won(lease)
            except Exception as e:  # e.g. the directory was removed, the database unreachable
                logger.error("follower of %s stopped waiting for its lease: %s", self._path, e)
                return
            if won:
                try:
                    loop.call_soon_threadsafe(self._spawn, self._take_over())
                except RuntimeError:  # the loop is closed: give the lease back for another follower
                    lease.release()

        threading.Thread(target=wait, name=f"fusee-lease {self._path}", daemon=True).start()

    async def _watch_owner(self, every: float) -> None:
        """Drops the connection to an owner whose lease another engine took (a stopped or cut-off
        owner answers nothing, and would never close it): calls waiting on it are sent again to
        the new owner when that is safe, else raise ``OutcomeUnknown``."""
        while not self._closed and self._local is None:
            await asyncio.sleep(every)
            conn = self._conn
            if conn is None or not conn.alive:
                continue
            address = await self._place.owner()
            if address is not None and self._place.epoch > conn.epoch:
                logger.info("follower of %s: epoch %d took over from %d; dropping the old connection",
                            self._path, self._place.epoch, conn.epoch)
                conn.close()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _take_over(self) -> None:
        """The owner is gone and we hold the lease: open the directory as its owner.

        close() waits for this instead of cancelling it: an open cancelled half-way would leave
        the engine its thread goes on opening, and the lock it holds, with nobody to close them
        (a process that goes on after closing the engine would hold the directory for good)."""
        self._taking_over = asyncio.current_task()
        try:
            await self._open_as_owner()
        finally:
            self._taking_over = None

    async def _open_as_owner(self) -> None:
        lease = self._lease
        assert lease is not None
        if self._closed:
            lease.release()
            return
        try:
            eng = await open_owner(Engine, self._place.target, self._options, route_address=self._route_address,
                                   route_tls=self._route_tls,
                                   claim=False, **self._place.takeover_options(lease))
        except Exception as e:
            logger.error("follower of %s took the lease (epoch %d) but could not open the directory: %s; "
                         "waiting for the lease again", self._path, lease.epoch, e)
            lease.release()
            if not self._closed:
                self._start_waiting()
            return
        if self._closed:
            await eng.close()
            return
        logger.info("took over %s as owner (epoch %d)", self._path, eng.epoch)
        self._local = eng
        if self._conn is not None:
            self._conn.close()
        self._wake()
        view, self._view = self._view, None
        if view is not None:  # reads go to the local engine from now on
            await view.close()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def is_owner(self) -> bool:
        return self._local is not None

    @property
    def _rt(self) -> Any:  # type: ignore[override]
        """The runtime of the local engine once this process owns the directory, else of the view
        (read-only: for lookups such as the registered workflows, never to act)."""
        return self._view_engine()._rt

    @property
    def epoch(self) -> int:
        if self._local is not None:
            return self._local.epoch
        return self._place.epoch

    # --- routing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        self._check_process()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._floop:
            raise WrongEventLoop("the engine was called from another thread or event loop than the one "
                                 "it was opened on; use engine.run_threadsafe(...) from other threads")
        if self._closed:
            raise EngineClosed("the engine is closed: open it again to continue")

    async def _connect(self, deadline: float) -> _Connection | None:
        """A live connection to the owner, or None once this process became the owner."""
        conn = self._conn
        if self._local is None and conn is not None and conn.alive:
            return conn
        # One dial at a time, and every caller (a burst of calls at start or after a takeover)
        # shares it. They all wake in the loop turn it ends in: a lock would let them through one
        # turn each, and under load a turn is long.
        while True:
            dial = self._dialing
            if dial is None or dial.done():
                dial = self._dialing = asyncio.create_task(self._connect_once(deadline))
                self._dial_deadline = deadline
                self._tasks.add(dial)
                dial.add_done_callback(self._dialled)
            dial_deadline = self._dial_deadline
            try:
                async with asyncio.timeout_at(deadline):
                    return await asyncio.shield(dial)
            except TimeoutError:
                raise self._unreachable() from None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if dial.cancelled() and task is not None and not task.cancelling():
                    raise EngineClosed("the engine was closed while a call waited for its owner") from None
                raise
            except (OwnerUnreachable, RoutingRefused):
                if dial_deadline >= deadline or asyncio.get_running_loop().time() < dial_deadline:
                    raise
                # The dial gave up at the deadline of the call that began it: this call has time left.

    def _dialled(self, dial: asyncio.Task[Any]) -> None:
        self._tasks.discard(dial)
        if not dial.cancelled():
            dial.exception()  # retrieved: the callers that shared the dial raise it (or timed out first)

    def _unreachable(self) -> OwnerUnreachable | RoutingRefused:
        if self._tls_dropped is not None:
            return RoutingRefused(f"{self._tls_dropped} (for {self._route_timeout:g} s: the call was not sent)")
        return OwnerUnreachable(
            f"no owner of {self._path} answered within {self._route_timeout:g} s: the call was not "
            "sent, so nothing was done. Is a process holding the directory (stopped, or still "
            "recovering)? Make the call again, or open with a longer route_timeout=")

    async def _connect_once(self, deadline: float) -> _Connection | None:
        loop = asyncio.get_running_loop()
        pause = 0.001
        while True:
            if self._local is not None:
                return None
            if self._conn is not None and self._conn.alive:
                return self._conn
            address = await self._place.owner()
            if address is not None:
                epoch = self._place.epoch
                try:
                    reader, writer = await self._place.connect(address)
                except TLSDropped as e:
                    self._tls_dropped = e
                except OSError:
                    pass  # a dead owner's address: its successor has not published yet
                else:
                    self._tls_dropped = None
                    if self._local is not None:
                        writer.close()
                        return None
                    conn = _Connection(reader, writer, epoch)
                    self._tasks.add(conn.task)  # awaited at close, whichever connection it was
                    conn.task.add_done_callback(self._tasks.discard)
                    # A stopped owner's socket still accepts connections (the kernel's backlog):
                    # only an answer within the deadline shows it serves.
                    try:
                        await asyncio.wait_for(conn.call("ping", []), max(deadline - loop.time(), 0.001))
                    except (_Lost, TimeoutError):
                        conn.close()
                    else:
                        self._conn = conn
                        return conn
            left = deadline - loop.time()
            if left <= 0:
                raise self._unreachable()
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(pause, left))
            pause = min(pause * 2, 0.05)

    async def _route(self, method: str, args: list[Any], *, safe: bool, call: _Call | None = None) -> Any:
        """Runs ``method`` on the owner (or here, once this process owns the directory)."""
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._route_timeout
        while True:
            if self._local is not None:
                return await dispatch(self._local, method, args)
            conn = await self._connect(deadline)
            if conn is None:
                continue
            try:
                return await conn.call(method, args)
            except (_Lost, EngineClosed) as e:
                lost = isinstance(e, _Lost)
                if not lost and not safe:
                    raise
                conn.close()
                if not safe:
                    raise OutcomeUnknown(
                        f"the owner of {self._path} (epoch {conn.epoch}) went away while it ran "
                        f"{method}: it may or may not have been done, and repeating it is not safe. "
                        "Look at the run (describe, journal) once another owner serves, then decide "
                        "whether to call again", method=method) from None
                if self._closed:
                    raise EngineClosed("the engine was closed while a call waited for its owner") from None
                if call is not None:
                    call.retried = True
                    if call.again is not None:
                        args = call.again
                deadline = loop.time() + self._route_timeout  # the next owner gets a full deadline

    # --- encoding the caller's values -------------------------------------------------------

    def _workflow_input(self, workflow: Any, input: Any) -> tuple[Any, bytes | None]:
        if isinstance(workflow, WorkflowDef):
            wdef: WorkflowDef[Any, Any] | None = workflow
            ref: Any = [workflow.name, workflow.version]
        elif isinstance(workflow, str):
            wdef, ref = self._by_name.get(workflow), workflow
        else:
            raise TypeError(f"expected a @fusee.workflow or its name, got {workflow!r}")
        if wdef is None:
            return ref, None if input is None else codec.encode(input)
        if not wdef.takes_input and input is not None:
            raise TypeError(f"workflow '{wdef.name}' takes no input, got {type(input).__name__}")
        if not wdef.takes_input:
            return ref, None
        return ref, codec.encode_input(wdef, input)

    def _handle(self, got: list[Any]) -> RunHandle[Any]:
        return RunHandle(self, got[0], got[1])

    # --- the client API, routed -------------------------------------------------------------

    async def start(
        self, workflow: WorkflowDef[Any, Any] | str, workflow_id: str, input: Any = None, *,
        if_running: str = "fail", if_finished: str = "fail", timeout: Any = None,
    ) -> RunHandle[Any]:
        """See :meth:`fusee.Engine.start`; durable on the owner when it returns."""
        self._check_open()
        wid = self._check_id(workflow_id)
        if if_running not in IF_RUNNING:
            raise ValueError(f"if_running must be one of {IF_RUNNING}, got {if_running!r}")
        if if_finished not in IF_FINISHED:
            raise ValueError(f"if_finished must be one of {IF_FINISHED}, got {if_finished!r}")
        ref, inp = self._workflow_input(workflow, input)
        safe = if_running in ("fail", "attach") and if_finished in ("fail", "attach")
        args = [ref, wid, inp, if_running, if_finished, _secs(timeout)]
        call = _Call(again=[*args, True])
        try:
            got = await self._route("start", args, safe=safe, call=call)
        except AlreadyExists:
            if call.retried:
                raise OutcomeUnknown(
                    f"the owner went away while it started {wid!r}; the start was sent again to the next "
                    f"owner, which found {wid!r} already there with another workflow or input: it may be "
                    f"this call's start or another's. engine.get({wid!r}).describe() shows the run",
                    method="start") from None
            raise
        return self._handle(got)

    def get(self, workflow_id: str) -> RunHandle[Any]:
        """A handle to ``workflow_id``. On a follower the ID is not checked here (the view may
        not show a run started a moment ago): the handle's calls raise ``NotFound`` instead."""
        if self._local is not None:
            return self._local.get(workflow_id)
        self._check_open()
        wid = self._check_id(workflow_id)
        st = self._view._rt.wf.get(wid) if self._view is not None else None
        return RunHandle(self, wid, st.run_id if st is not None else 0)

    async def _result(self, workflow_id: str) -> Any:
        wtype, version, data = await self._route("result", [workflow_id], safe=True)
        wdef = self._registry.get((wtype, version))
        return codec.decode(data, wdef.result_type if wdef is not None else Any)

    async def signal(
        self, workflow_id: str, signal: SignalDef[Any], value: Any = None, *,
        dedup_key: str | None = None, by: str | None = None,
    ) -> None:
        """See :meth:`fusee.Engine.signal`. Without a ``dedup_key`` a follower gives one of its
        own, so that a signal in flight when the owner died is sent again safely (once)."""
        self._check_open()
        if not isinstance(signal, SignalDef):
            raise TypeError(f"signal takes a signal made with fusee.signal(...), got {signal!r}")
        wid = self._check_id(workflow_id)
        payload = codec.encode_signal(signal, value)
        if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key):
            raise TypeError(f"dedup_key must be a non-empty string, got {dedup_key!r}")
        key = dedup_key if dedup_key is not None else "route:" + self._token()
        await self._route("signal", [wid, signal.name, payload, key, by], safe=True)
        self._stale()

    async def query(self, workflow_id: str, query: QueryDef[Any], arg: Any = None) -> Any:
        """See :meth:`fusee.Engine.query`; the answer is typed by ``query``'s ``result_type``."""
        self._check_open()
        if not isinstance(query, QueryDef):
            raise TypeError(f"query takes a query made with fusee.query(...), got {query!r}")
        wid = self._check_id(workflow_id)
        data = await self._route("query", [wid, query.name, None if arg is None else codec.encode(arg)], safe=True)
        return codec.decode(data, query.result_type)

    async def update(
        self, workflow_id: str, update: UpdateDef[Any], arg: Any = None, *, update_id: str | None = None,
    ) -> Any:
        """See :meth:`fusee.Engine.update` (a follower gives an ``update_id`` when none is given)."""
        self._check_open()
        if not isinstance(update, UpdateDef):
            raise TypeError(f"update takes an update made with fusee.update(...), got {update!r}")
        wid = self._check_id(workflow_id)
        uid = self._update_id(update_id)
        data = await self._route("update", [wid, update.name, codec.encode_update_arg(update, arg), uid], safe=True)
        self._stale()
        return codec.decode(data, update.result_type)

    async def update_with_start(
        self, workflow: WorkflowDef[Any, Any] | str, workflow_id: str, input: Any, update: UpdateDef[Any],
        arg: Any = None, *, update_id: str | None = None, timeout: Any = None,
    ) -> Any:
        """See :meth:`fusee.Engine.update_with_start`."""
        self._check_open()
        wid = self._check_id(workflow_id)
        if not isinstance(update, UpdateDef):
            raise TypeError(f"update_with_start takes an update made with fusee.update(...), got {update!r}")
        ref, inp = self._workflow_input(workflow, input)
        uid = self._update_id(update_id)
        data = await self._route(
            "update_with_start",
            [ref, wid, inp, update.name, codec.encode_update_arg(update, arg), uid, _secs(timeout)], safe=True)
        self._stale()
        return codec.decode(data, update.result_type)

    def _update_id(self, update_id: str | None) -> str:
        if update_id is None:
            return self._token()
        if not isinstance(update_id, str) or not update_id:
            raise TypeError("update_id must be a non-empty string")
        return update_id

    def _token(self) -> str:
        return self._env.rng.getrandbits(128).to_bytes(16, "big").hex()

    async def _reset(
        self, workflow_id: str, new_id: str | None, before_step: str | None, before_position: int | None,
        reapply_signals: bool, version: int | None, by: str | None,
    ) -> RunHandle[Any]:
        got = await self._route("reset", [self._check_id(workflow_id), new_id, before_step, before_position,
                                          bool(reapply_signals), version, by], safe=False)
        self._stale()
        return self._handle(got)

    async def _import_records(self, journal: list[rec.Record], workflow_id: str | None,
                              before_step: str | None, before_position: int | None = None,
                              reapply_signals: bool = True, version: int | None = None,
                              fork: bool = False, by: str | None = None) -> RunHandle[Any]:
        got = await self._route("import_records", [journal_file.dumps(journal), workflow_id, before_step,
                                                   before_position, bool(reapply_signals), version,
                                                   bool(fork), by], safe=False)
        self._stale()
        return self._handle(got)

    async def cancel(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None:
        """See :meth:`fusee.Engine.cancel` (sent again after a takeover: a second request is harmless)."""
        await self._route("cancel", [self._check_id(workflow_id), str(reason), by], safe=True)
        self._stale()

    async def terminate(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None:
        """See :meth:`fusee.Engine.terminate`."""
        await self._route("terminate", [self._check_id(workflow_id), str(reason), by], safe=False)
        self._stale()

    async def resume(self, workflow_id: str, *, by: str | None = None) -> None:
        """See :meth:`fusee.Engine.resume`."""
        await self._route("resume", [self._check_id(workflow_id), by], safe=True)
        self._stale()

    async def complete(self, token: str, value: Any = None, *, by: str | None = None) -> bool:
        """See :meth:`fusee.Engine.complete`."""
        return bool(await self._route("complete", [token, codec.encode(value), by], safe=False))

    async def fail_completion(self, token: str, message: str = "", *, by: str | None = None) -> bool:
        """See :meth:`fusee.Engine.fail_completion`."""
        return bool(await self._route("fail_completion", [token, str(message), by], safe=False))

    async def journal(self, workflow_id: str) -> list[rec.Record]:
        """See :meth:`fusee.Engine.journal`."""
        got = await self._route("journal", [self._check_id(workflow_id)], safe=True)
        return [rec.decode(b) for b in got]

    async def read_stream_batch(
        self, workflow_id: str, name: str, offset: int = 0, *, wait: Any = None, run_id: int | None = None
    ) -> tuple[list[Any], int, bool]:
        """See :meth:`fusee.Engine.read_stream_batch`."""
        b = await self.stream_batch(workflow_id, name, offset, wait=wait, run_id=run_id)
        return b.chunks, b.next_offset, b.ended

    async def stream_batch(
        self, workflow_id: str, name: str, offset: int = 0, *, wait: Any = None, run_id: int | None = None
    ) -> StreamBatch:
        """See :meth:`fusee.Engine.stream_batch`."""
        wid = self._check_id(workflow_id)
        data, nxt, _ended, run, end = await self._route(
            "read_stream", [wid, name, offset, _secs(wait), run_id], safe=True)
        return StreamBatch(wid, run, offset, codec.decode(data), nxt, end)

    async def read_stream(
        self, workflow_id: str, name: str, offset: int = 0, *, run_id: int | None = None
    ) -> AsyncIterator[Any]:
        """See :meth:`fusee.Engine.read_stream` (it follows one run)."""
        while True:
            b = await self.stream_batch(workflow_id, name, offset, wait=30.0, run_id=run_id)
            run_id, offset = b.run_id, b.next_offset
            for chunk in b.chunks:
                yield chunk
            if b.ended:
                return

    async def export(self, workflow_id: str, path: str | os.PathLike[str]) -> int:
        """See :meth:`fusee.Engine.export` (the file is written by this process)."""
        journal = await self.journal(workflow_id)
        await asyncio.get_running_loop().run_in_executor(None, journal_file.write, path, journal)
        return len(journal)

    async def checkpoint(self) -> None:
        """Asks the owner to write a checkpoint now."""
        await self._route("checkpoint", [], safe=True)

    # --- objects, schedules and windows -------------------------------------------------------

    def _check_object(self, obj: ObjectDef[Any]) -> None:
        self._check_open()
        if not isinstance(obj, ObjectDef):
            raise TypeError(f"expected an object made with fusee.object(...), got {obj!r}")

    async def schedule(
        self, schedule_id: str, workflow: WorkflowDef[Any, Any] | str, input: Any = None, *, every: Any = None,
        cron: str | None = None, timezone: str = "UTC", jitter: Any = None, overlap: str = "skip",
        catchup_window: Any = "1h", paused: bool = False,
    ) -> None:
        """See :meth:`fusee.Engine.schedule` (the same spec twice does nothing: sent again safely)."""
        ref, inp = self._workflow_input(workflow, input)
        await self._route("schedule", [schedule_id, ref, inp, _secs(every), cron, timezone, _secs(jitter),
                                       overlap, _secs(catchup_window), bool(paused)], safe=True)

    async def _schedule_state(self, schedule_id: str, request: dict[str, Any]) -> dict[str, Any]:
        safe = request.get("op") in ("describe", "pause", "unpause")
        got: dict[str, Any] = await self._route("schedule_state", [schedule_id, request], safe=safe)
        return got

    def schedules(self) -> ScheduleList:
        """On a follower: the schedules its view of the directory shows (none until the view's
        owner ran them; use ``describe_schedule`` for one schedule's current state)."""
        if self._local is not None:
            return self._local.schedules()
        return ScheduleList()

    async def asked_schedule_states(self) -> list[dict[str, Any]]:
        """The state of every schedule the owner runs, asked of it (see ``_schedule_states``)."""
        if self._local is not None:
            return self._local._schedule_states()
        got: list[dict[str, Any]] = await self._route("schedules", [], safe=True)
        return got

    async def enqueue(
        self, workflow: WorkflowDef[Any, Any] | str, key: str, event: Any, *, event_id: str | None = None,
    ) -> Receipt:
        """See :meth:`fusee.Engine.enqueue` (a follower gives an ``event_id`` when none is given)."""
        self._check_open()
        wdef = workflow if isinstance(workflow, WorkflowDef) else self._by_name.get(str(workflow))
        if wdef is not None and wdef.window is None:
            raise NotWindowed(f"workflow '{wdef.name}' has no window: declare it with "
                              "@fusee.workflow(name, debounce=fusee.Debounce(...)) or batch=fusee.Batch(...)")
        ref = [wdef.name, wdef.version] if wdef is not None else workflow
        if event_id is not None and (not isinstance(event_id, str) or not event_id):
            raise TypeError(f"event_id must be a non-empty string, got {event_id!r}")
        eid = event_id if event_id is not None else self._token()
        data = codec.encode_input(wdef, [event]) if wdef is not None else codec.encode([event])
        window_id, position = await self._route(
            "enqueue", [ref, key, codec.encode(codec.decode(data)[0]), eid], safe=True)
        return Receipt(window_id, position)

    # --- synchronous reads: a read-only view of the directory ---------------------------------

    def _stale(self) -> None:
        self._view_at = 0.0

    async def refresh(self) -> None:
        """Reads the directory again for the synchronous reads (``describe``, ``list``, ``runs``,
        ``metrics``): after it, they show everything acknowledged before the call. Raises the
        storage error when the directory could not be read (several tries: a live log may be
        met half written)."""
        self._check_open()
        if self._local is None:
            for attempt in range(_VIEW_TRIES):
                try:
                    await self._refresh_view()
                    return
                except StorageError:
                    if attempt == _VIEW_TRIES - 1:
                        raise
                    await asyncio.sleep(0.01 * (attempt + 1))

    async def _refresh_view(self) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time()
        # A view writes nothing: no backup either (the follower keeps it for when it takes over).
        opts = {**self._options, "read_only": True, "park_after": None, "truncate_corrupt": False,
                "checkpoint_interval": None, "telemetry": False, "step_threads": 1, "backup": None,
                "_mail": None}
        view = await Engine._open(self._place.target, **opts)
        old, self._view, self._view_at = self._view, view, at
        if old is not None:
            await old.close()

    def _view_engine(self) -> Engine:
        if self._local is not None:
            return self._local
        now = self._floop.time()
        if now - self._view_at > VIEW_TTL and (self._view_task is None or self._view_task.done()) \
                and not self._closed:
            self._view_task = self._floop.create_task(self._refresh_quietly())
        if self._view is None:
            raise FuseeError(
                f"this follower of {self._path} could not read the directory yet (the owner writes "
                "fast, or it is damaged): await engine.refresh() and ask again")
        return self._view

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception as e:  # the next read tries again; the old view keeps answering
            logger.warning("follower of %s could not read the directory again: %s", self._path, e)

    def describe(self, workflow_id: str) -> RunSummary:
        """See :meth:`fusee.Engine.describe`. On a follower, from its view of the directory, which
        may lag the owner by about 0.2 s (``await engine.refresh()`` catches up)."""
        return self._view_engine().describe(workflow_id)

    def runs(self) -> list[RunSummary]:
        """See :meth:`fusee.Engine.runs` (on a follower, from its view: see :meth:`describe`)."""
        return self._view_engine().runs()

    def list(self, where: str | None = None, limit: int = 100, cursor: str | None = None, *,
             order: str = "oldest") -> RunPage:
        """See :meth:`fusee.Engine.list` (on a follower, from its view: see :meth:`describe`)."""
        return self._view_engine().list(where, limit, cursor, order=order)

    def counts(self, where: str | None = None) -> dict[str, int]:
        """See :meth:`fusee.Engine.counts` (on a follower, from its view: see :meth:`describe`)."""
        return self._view_engine().counts(where)

    def metrics(self) -> Metrics:
        """See :meth:`fusee.Engine.metrics` (on a follower, the view's counts; flush and step
        figures are the owner's own)."""
        return self._view_engine().metrics()

    def stuck(self) -> dict[str, str]:
        return self._view_engine().stuck()

    def limits(self) -> dict[str, LimitStatus]:
        return self._view_engine().limits()

    def set_limit(self, name: str, *, concurrency: Any = KEEP, per_second: Any = KEEP,
                  weights: Any = KEEP) -> Limit:
        """See :meth:`fusee.Engine.set_limit`: once this process took the directory over (its steps run
        here). Before, limits bound the owner's step executions: change them in the owning process."""
        if self._local is not None:
            return self._local.set_limit(name, concurrency=concurrency, per_second=per_second, weights=weights)
        raise FuseeError("set_limit on a follower: limits bound the steps the owner runs; call it in the "
                         "process that owns the directory (engine.is_owner)")

    @property
    def failure(self) -> BaseException | None:
        return self._local.failure if self._local is not None else None

    @property
    def live(self) -> bool:
        return self._local is None

    @property
    def stats(self) -> dict[str, int]:
        return self._local.stats if self._local is not None else {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._floop

    def run_threadsafe(self, method: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None = None,
                       **kwargs: Any) -> Any:
        self._check_process()  # in a forked child the loop never runs: it would wait forever

        async def call() -> Any:
            return await method(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), self._floop).result(timeout)

    # --- closing --------------------------------------------------------------------------

    async def close(self, grace: Any = 10.0) -> None:
        """Stops following (and, if this process took the directory over, closes it as its owner).

        In a child forked from the process that opened it, raises :class:`fusee.EngineForked`.
        """
        self._check_process()
        if self._closed:
            return
        self._closed = True
        forks.release(self)
        self._stop.set()
        taking = self._taking_over
        if self._lease is not None and self._local is None and taking is None:
            # Once the local engine opened on it, closing that engine releases it; a takeover
            # under way closes the engine it opens (it sees _closed) and so releases it too.
            self._lease.release()
        self._place.close()
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(BaseException):
                await self._conn.task
        for t in list(self._tasks):
            if t is not taking:
                t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._view_task is not None:
            self._view_task.cancel()
            with contextlib.suppress(BaseException):
                await self._view_task
        if self._view is not None:
            await self._view.close()
        if self._local is not None:
            await self._local.close(grace)
        if self._key is not None:
            HELD_HERE.discard(self._key)

    def __repr__(self) -> str:
        role = (f"owner, epoch {self._local.epoch}" if self._local is not None
                else "front end" if self.front_end else "follower")
        return f"<fusee engine on {self._path} ({role})>"
