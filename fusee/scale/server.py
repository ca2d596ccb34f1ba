"""The owner's side of routing: a server that runs followers' calls on its engine.

On a directory it listens on a Unix socket (callers of this machine's user);
on a PostgreSQL namespace on TCP (callers proving the namespace's routing
secret, see :mod:`fusee.scale.tcp`).

Each request runs as its own task (a slow ``result()`` does not hold up a
signal behind it) and its reply is written when the engine's call returns:
an acknowledgement means what it means locally, durable. Nothing here runs
until a follower connects, so a single process pays nothing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from fusee import codec, journal_file, sabotage
from fusee.core import records as rec
from fusee.definitions import QueryDef, SignalDef, UpdateDef
from fusee.errors import AlreadyExists, FencedSender, FuseeError
from fusee.runtime.runtime import MAIL_TYPES
from fusee.scale import tcp, wire
from fusee.tls import HANDSHAKE_TIMEOUT_S, RouteTLS

if TYPE_CHECKING:
    from fusee.engine.engine import Engine
    from fusee.scale.lease import Lease

logger = logging.getLogger("fusee.scale")

#: The socket's file in the directory, where Linux's abstract namespace does not exist.
SOCKET_FILE = "owner.sock"
_SUN_PATH_MAX = 107
#: How long a TCP caller has to prove the routing secret.
_HANDSHAKE_S = 10.0


def socket_address(path: str, epoch: int) -> str:
    """Where the owner of ``path`` listens: ``@fusee-<hash>-<epoch>`` in Linux's abstract namespace.

    Abstract, so the directory holds no socket file: backups, ``tar`` and tools
    that read every file of it never meet one. Elsewhere ``<path>/owner.sock``
    (when it fits a socket address).
    """
    full = f"{os.path.abspath(path)}/{SOCKET_FILE}"
    if not sys.platform.startswith("linux") and len(full.encode()) <= _SUN_PATH_MAX:
        return full
    digest = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:24]
    return f"@fusee-{digest}-{epoch}"


def os_address(address: str) -> str:
    """The address as ``socket`` takes it (a leading NUL for the abstract namespace)."""
    return "\0" + address[1:] if address.startswith("@") else address


# --- the calls a follower may route -----------------------------------------------------


def _value(data: bytes | None) -> Any:
    return None if data is None else codec.decode(data)


def _workflow(eng: Engine, ref: Any) -> Any:
    """A workflow as the follower named it: ``[name, version]`` (its definition) or a name."""
    if isinstance(ref, list):
        found = eng._rt.versions.get((ref[0], ref[1]))
        return found if found is not None else ref[0]
    return ref


async def _start(eng: Engine, wref: Any, wid: str, inp: bytes | None, if_running: str, if_finished: str,
                 timeout: float | None, again: bool = False) -> Any:
    workflow = _workflow(eng, wref)
    try:
        h = await eng.start(workflow, wid, _value(inp), if_running=if_running,
                            if_finished=if_finished, timeout=timeout)
    except AlreadyExists:
        # Sent again after the previous owner died mid-call: the run found is this call's own
        # start if it has the same workflow and input (then it answers as the first try would have).
        if not again:
            raise
        st = eng._rt.current(wid)
        first = eng._rt.journal_of(st)[0][:1]
        wdef = eng._workflow(workflow)
        same = (bool(first) and type(first[0]) is rec.Start and first[0].wtype == wdef.name
                and first[0].input == codec.encode_input(wdef, _value(inp)))
        if not same:
            raise
        await eng._durable(st.shard, eng._rt.durable(st.shard))
        return [wid, st.run_id]
    return [h.workflow_id, h.run_id]


async def _result(eng: Engine, wid: str) -> Any:
    value = await eng._result(wid)
    st = eng._rt.current(wid)
    return [st.wtype, st.version, codec.encode(value)]


async def _signal(eng: Engine, wid: str, name: str, value: bytes | None, dedup: str | None, by: str | None) -> Any:
    await eng.signal(wid, SignalDef(name), _value(value), dedup_key=dedup, by=by)


async def _query(eng: Engine, wid: str, name: str, arg: bytes | None) -> Any:
    # Raw: the answer's JSON as the workflow's own annotations made it; the caller types it.
    answer: Any = await eng.query(wid, QueryDef(name, msgspec.Raw), _value(arg))
    return bytes(answer)


async def _update(eng: Engine, wid: str, name: str, arg: bytes | None, uid: str) -> Any:
    answer = await eng.update(wid, UpdateDef(name, Any, msgspec.Raw), _value(arg), update_id=uid)
    return bytes(answer)


async def _update_with_start(eng: Engine, wref: Any, wid: str, inp: bytes | None, name: str, arg: bytes | None,
                             uid: str, timeout: float | None) -> Any:
    answer = await eng.update_with_start(_workflow(eng, wref), wid, _value(inp), UpdateDef(name, Any, msgspec.Raw),
                                         _value(arg), update_id=uid, timeout=timeout)
    return bytes(answer)


async def _cancel(eng: Engine, wid: str, reason: str, by: str | None) -> Any:
    await eng.cancel(wid, reason, by=by)


async def _terminate(eng: Engine, wid: str, reason: str, by: str | None) -> Any:
    await eng.terminate(wid, reason, by=by)


async def _resume(eng: Engine, wid: str, by: str | None) -> Any:
    await eng.resume(wid, by=by)


async def _complete(eng: Engine, token: str, value: bytes | None, by: str | None) -> Any:
    return await eng.complete(token, _value(value), by=by)


async def _fail_completion(eng: Engine, token: str, message: str, by: str | None) -> Any:
    return await eng.fail_completion(token, message, by=by)


async def _reset(eng: Engine, wid: str, new_id: str | None, before_step: str | None, before_position: int | None,
                 reapply: bool, version: int | None, by: str | None) -> Any:
    h = await eng._reset(wid, new_id, before_step, before_position, reapply, version, by)
    return [h.workflow_id, h.run_id]


async def _import_records(eng: Engine, data: bytes, wid: str | None, before_step: str | None,
                          before_position: int | None = None, reapply: bool = True, version: int | None = None,
                          fork: bool = False, by: str | None = None) -> Any:
    h = await eng._import_records(journal_file.loads(data, "a routed journal"), wid, before_step,
                                  before_position, reapply, version, fork, by)
    return [h.workflow_id, h.run_id]


async def _journal(eng: Engine, wid: str) -> Any:
    return [rec.encode(r) for r in await eng.journal(wid)]


async def _read_stream(eng: Engine, wid: str, name: str, offset: int, wait: float | None,
                       run_id: int | None = None) -> Any:
    b = await eng.stream_batch(wid, name, offset, wait=wait, run_id=run_id)
    return [codec.encode(b.chunks), b.next_offset, b.ended, b.run_id, b.end_status]


async def _checkpoint(eng: Engine) -> Any:
    await eng.checkpoint()


async def _schedule(eng: Engine, sid: str, wref: Any, inp: bytes | None, every: float | None, cron: str | None,
                    timezone: str, jitter: float | None, overlap: str, catchup: float, paused: bool) -> Any:
    await eng.schedule(sid, _workflow(eng, wref), _value(inp), every=every, cron=cron, timezone=timezone,
                       jitter=jitter, overlap=overlap, catchup_window=catchup, paused=paused)


async def _schedule_state(eng: Engine, sid: str, request: dict[str, Any]) -> Any:
    return await eng._schedule_state(sid, request)


async def _schedules(eng: Engine) -> Any:
    return eng._schedule_states()


async def _enqueue(eng: Engine, wref: Any, key: str, event: bytes | None, event_id: str) -> Any:
    r = await eng.enqueue(_workflow(eng, wref), key, _value(event), event_id=event_id)
    return [r.window_id, r.position]


async def _relay(eng: Engine, kind: str, data: bytes, part: int, epoch: int) -> Any:
    """A message from a run on another part (``fusee.scale.parts``), applied here once, durably."""
    rt = eng._rt
    mail = rt.mail
    if mail is None or kind not in MAIL_TYPES:
        raise FuseeError(f"this engine holds no part of a parted directory, or {kind!r} is no message: "
                         "are both processes running the same version of fusee?")
    if not sabotage.active.relay_ignores_fence and mail.fenced(part, epoch):
        raise FencedSender(f"a message from part {part} under epoch {epoch} was refused: that part has "
                           "a newer holder, which sends again what its runs still owe")
    await rt.receive(kind, msgspec.msgpack.decode(data, type=MAIL_TYPES[kind]))
    return []


async def _ping(eng: Engine) -> Any:
    return [os.getpid()]


#: Every call a follower may route, by name.
CALLS: dict[str, Callable[..., Awaitable[Any]]] = {
    "start": _start, "result": _result, "signal": _signal, "query": _query, "update": _update,
    "update_with_start": _update_with_start, "cancel": _cancel, "terminate": _terminate, "resume": _resume,
    "complete": _complete, "fail_completion": _fail_completion, "reset": _reset, "journal": _journal,
    "import_records": _import_records,
    "read_stream": _read_stream, "checkpoint": _checkpoint, "schedule": _schedule,
    "schedule_state": _schedule_state, "schedules": _schedules, "enqueue": _enqueue, "ping": _ping,
    "relay": _relay,
}


async def dispatch(eng: Engine, method: str, args: list[Any]) -> Any:
    """Runs one routed call on ``eng`` (the owner's engine)."""
    fn = CALLS.get(method)
    if fn is None:
        raise FuseeError(f"the owner does not know the routed call {method!r}: are both processes "
                         "running the same version of fusee?")
    return await fn(eng, *args)


# --- the server ---------------------------------------------------------------------------


class RouteServer:
    """Serves routed calls on the owner's engine at the address its lease publishes."""

    def __init__(self, engine: Engine, lease: Lease, path: str, *, tcp: str | None = None,
                 secret: bytes | None = None, tls: RouteTLS | None = None) -> None:
        assert (tcp is None) == (secret is None), "a TCP server authenticates its callers"
        assert tls is None or tcp is not None, "TLS is for TCP"
        self.engine = engine
        self.lease = lease
        self.path = path
        #: ``host:port`` to listen on (a PostgreSQL namespace's owner), or None for the Unix socket.
        self.tcp = tcp
        self._secret = secret
        self._tls = tls
        self.address = ""
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Calls served, for tests and metrics.
        self.served = 0

    async def start(self) -> str:
        """Listens and publishes the address; returns it."""
        if self.tcp is not None:
            host, port = tcp.parse_address(self.tcp)
            tls = self._tls
            if tls is None:
                self._server = await asyncio.start_server(self._serve_conn, host, port, limit=1 << 20)
            else:
                self._server = await asyncio.start_server(
                    self._serve_conn, host, port, limit=1 << 20, ssl=tls.server_context(),
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
            bound = self._server.sockets[0].getsockname()
            self.address = tcp.published(host, bound[1], tls=tls is not None)
            await asyncio.get_running_loop().run_in_executor(None, self.lease.publish, self.address)
            return self.address
        address = socket_address(self.path, self.lease.epoch)
        target = os_address(address)
        if not address.startswith("@"):
            # A dead owner's socket file: we hold the lease, so nobody else listens on it.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
        self._server = await asyncio.start_unix_server(self._serve_conn, path=target, limit=1 << 20)
        self.address = address
        self.lease.publish(address)
        return address

    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._secret is not None:
            try:
                proved = await asyncio.wait_for(tcp.server_handshake(reader, writer, self._secret),
                                                _HANDSHAKE_S)
            except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, asyncio.CancelledError):
                proved = False
            if not proved:
                writer.close()
                return
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            sock = writer.get_extra_info("socket")
            if sock is not None and not _same_user(sock):
                writer.close()  # an abstract socket is reachable by any user of the machine: refuse others
                return
        self._conns.add(writer)
        outbox = wire.Outbox(writer)
        try:
            while True:
                try:
                    msg = await wire.read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.CancelledError:
                    # The loop is shutting down: asyncio's server callback would log a cancelled
                    # handler as an error, and there is nothing left to answer.
                    return
                t = asyncio.create_task(self._answer(writer, outbox, msg))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, outbox: wire.Outbox, msg: Any) -> None:
        rid, method, args = msg
        try:
            value = await dispatch(self.engine, method, args)
            out = wire.frame([rid, wire.OK, value])
        except Exception as e:
            out = wire.frame([rid, wire.ERROR, wire.error_to_wire(e)])
        self.served += 1
        if writer.is_closing():
            return
        outbox.write(out)
        if writer.transport.get_write_buffer_size() > 1 << 20:
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    def descriptors(self) -> set[int]:
        """The sockets it listens and serves on (a forked child lets go of them)."""
        fds = {sock.fileno() for sock in (self._server.sockets if self._server is not None else ())}
        for writer in list(self._conns):
            conn = writer.get_extra_info("socket")
            if conn is not None:
                fds.add(conn.fileno())
        return fds

    async def close(self) -> None:
        """Stops listening and drops every connection (followers find the next owner)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._conns):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.address and self.tcp is None and not self.address.startswith("@"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)


def _same_user(sock: socket.socket) -> bool:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return True  # no peer credentials on this platform: the socket file's permissions apply
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())
