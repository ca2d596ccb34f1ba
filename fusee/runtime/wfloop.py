"""The per-run workflow event loop: deterministic, timeless, I/O-free, driven by the host.

Workflow code is an ``async def`` that runs as an ordinary ``asyncio.Task`` on a
``WorkflowLoop`` of its own, so ``asyncio.gather``, ``asyncio.wait``,
``asyncio.create_task``, ``Event``, ``Queue``, ``Lock``, ``shield`` and
``wait_for`` without a timeout all work inside it. The loop is never run with
``run_forever``: the host resolves the futures workflow code awaits and then
calls :meth:`WorkflowLoop.run_until_quiescent`, which runs ready callbacks in
FIFO order until none is left. With no clock, no timers and no I/O, the same
resolutions in the same order always produce the same execution: that is what
makes replay possible.

While it drains, the loop is the thread's *running* loop (so
``asyncio.get_running_loop()`` in workflow code returns it and asyncio's
primitives bind to it); the previous running loop, usually the host's real
loop in the same thread, is restored afterwards, even when a callback raises.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from asyncio import events
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, NoReturn, TypeVar, TypeVarTuple, Unpack

from fusee.errors import NondeterministicCall

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

# How many times close() cancels tasks that are still pending after a drain:
# a finally block may await another operation, which the next round cancels.
_CLOSE_ROUNDS = 3
# Callbacks each close() round may run: code that swallows cancellation and
# spins must not hang the host.
_CLOSE_BUDGET = 100_000


def _refuse(name: str, hint: str = "") -> Any:
    """A loop method that rejects the call: workflow code has no I/O or threads."""

    def refused(self: WorkflowLoop, *args: Any, **kwargs: Any) -> NoReturn:
        raise NondeterministicCall(f"loop.{name}()", hint)

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Always raises NondeterministicCall: {name} is not deterministic."
    return refused


class _Handle(asyncio.Handle):
    """An asyncio Handle made without asking the loop for its debug mode (it has none)."""

    __slots__ = ()
    # Handle's own attributes, which typeshed does not declare.
    _context: contextvars.Context
    _callback: Callable[..., object]
    _args: tuple[Any, ...]

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop,
                 context: contextvars.Context | None) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class WorkflowLoop(asyncio.AbstractEventLoop):
    """A deterministic event loop for one workflow run.

    Guarantees:
    - callbacks run in exactly the order they were scheduled (FIFO), only
      inside :meth:`run_until_quiescent`, on the calling thread;
    - nothing reads a clock, arms a timer or does I/O: those calls raise
      :class:`fusee.errors.NondeterministicCall`;
    - unhandled exceptions (callbacks that raise, tasks whose failure nobody
      retrieved) are collected in :attr:`unhandled` instead of being printed.

    Not thread-safe: schedule and drain from the host's thread only.
    """

    def __init__(self, name: str = "", owner: Any = None) -> None:
        self.name = name
        #: The run whose code this loop runs (``@fusee.step`` finds its ctx through it).
        self.owner = owner
        #: Context dicts passed to ``call_exception_handler`` (the asyncio
        #: format: ``message``, ``exception``, ``task``/``future``/``handle``).
        self.unhandled: list[dict[str, Any]] = []
        self._ready: deque[_Handle] = deque()
        self._running = False
        self._closed = False
        # Tasks in creation order (strongly held so pending ones are never
        # garbage-collected mid-wait); done ones are pruned as the dict grows.
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._prune_at = 64
        self._exception_handler: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._running else "idle"
        return f"<WorkflowLoop {self.name!r} {state} ready={len(self._ready)}>"

    # --- driving --------------------------------------------------------------

    def run_until_quiescent(self, max_callbacks: int | None = None) -> int:
        """Runs ready callbacks, and those they schedule, until none is left.

        Returns how many callbacks ran (cancelled handles are skipped and not
        counted). With ``max_callbacks``, stops after that many even if more are
        ready (``has_ready()`` then tells): a guard against workflow code that
        never stops yielding (``while True: await asyncio.sleep(0)``).

        The thread's running loop and async-generator hooks are this loop's for
        the duration and restored afterwards, even on exceptions.
        Raises RuntimeError when called while already draining (from workflow
        code) or after :meth:`close`. ``KeyboardInterrupt``/``SystemExit`` from a
        callback propagate, leaving the remaining callbacks queued.
        """
        if self._running:
            raise RuntimeError(
                f"{self!r}: run_until_quiescent() called while the loop is already draining "
                "(from workflow code?); the host drives the loop, workflow code only awaits"
            )
        if self._closed:
            raise RuntimeError(f"{self!r}: the workflow loop is closed")
        ready = self._ready
        if not ready:
            return 0
        assert max_callbacks is None or max_callbacks >= 1, max_callbacks
        previous = events._get_running_loop()
        hooks = sys.get_asyncgen_hooks()
        events._set_running_loop(self)
        sys.set_asyncgen_hooks(firstiter=self._asyncgen_firstiter, finalizer=self._asyncgen_finalizer)
        self._running = True
        ran = 0
        limit = -1 if max_callbacks is None else max_callbacks
        try:
            while ready and ran != limit:
                handle = ready.popleft()
                if handle._cancelled:
                    continue
                ran += 1
                # What Handle._run does, without its frame: this loop runs for every resumption.
                try:
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self.call_exception_handler(
                        {"message": f"Exception in callback {handle._callback!r}", "exception": exc, "handle": handle}
                    )
        finally:
            self._running = False
            sys.set_asyncgen_hooks(*hooks)
            events._set_running_loop(previous)
        return ran

    def has_ready(self) -> bool:
        """True when callbacks wait to run (the host should drain)."""
        return bool(self._ready)

    def is_running(self) -> bool:
        """True only while :meth:`run_until_quiescent` drains this loop."""
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Cancels every pending task of the loop, drains, then marks the loop closed.

        Tasks are cancelled in creation order and the loop drains after each
        round, so ``finally`` blocks and ``except CancelledError`` handlers in
        workflow code run now, deterministically. A task that awaits something
        again while being cancelled is cancelled again, up to a few rounds; any
        task still pending after that (or code that swallows cancellation and
        keeps spinning) is abandoned. Idempotent; raises RuntimeError while the
        loop drains.
        """
        if self._running:
            raise RuntimeError(f"{self!r}: cannot close a workflow loop from inside its own drain")
        if self._closed:
            return
        for _ in range(_CLOSE_ROUNDS):
            pending = [task for task in self._tasks if not task.done()]
            if not pending and not self._ready:
                break
            for task in pending:
                task.cancel()
            self.run_until_quiescent(_CLOSE_BUDGET)
        self._tasks.clear()
        self._ready.clear()
        self._closed = True

    def run_forever(self) -> None:
        raise RuntimeError("a WorkflowLoop is driven by the host with run_until_quiescent(), never run_forever()")

    def run_until_complete(self, future: Any) -> Any:
        raise RuntimeError("a WorkflowLoop is driven by the host with run_until_quiescent(), never run_until_complete()")

    def stop(self) -> None:
        raise RuntimeError("a WorkflowLoop never runs forever, so it cannot be stopped; close() it instead")

    # --- scheduling -----------------------------------------------------------

    def call_soon(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """Queues ``callback(*args)`` to run in the next drain, after everything queued before."""
        if self._closed:
            raise RuntimeError(f"{self!r}: the workflow loop is closed")
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def create_future(self) -> asyncio.Future[Any]:
        """A new pending Future bound to this loop (resolve it from the host, then drain)."""
        return asyncio.Future(loop=self)

    def create_task(
        self,
        coro: Coroutine[Any, Any, _T] | Generator[Any, None, _T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[_T]:
        """Wraps ``coro`` in a Task of this loop; its first step runs in the next drain."""
        if self._closed:
            if hasattr(coro, "close"):
                coro.close()
            raise RuntimeError(f"{self!r}: the workflow loop is closed")
        task: asyncio.Task[_T] = asyncio.Task(coro, loop=self, name=name, context=context)
        tasks = self._tasks
        tasks[task] = None
        if len(tasks) > self._prune_at:
            self._tasks = tasks = {t: None for t in tasks if not t.done()}
            self._prune_at = max(64, 2 * len(tasks))
        return task

    def get_task_factory(self) -> None:
        return None

    # --- no clock, no timers ------------------------------------------------

    def time(self) -> float:
        """Always raises: workflow code has no clock (use ``ctx.now()``, which is recorded)."""
        raise NondeterministicCall(
            "reading the event loop's clock (loop.time(), asyncio.timeout())",
            "use ctx.now() for the time (recorded once, replayed), await ctx.sleep(...) for "
            "delays and the timeout= of ctx operations for timeouts",
        )

    def call_later(self, delay: float, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts,
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """Always raises: timers are not durable (``asyncio.sleep(delay)`` and timeouts land here)."""
        raise NondeterministicCall(
            f"a timer (asyncio.sleep({delay!r}), a timeout or loop.call_later())"
        )

    def call_at(self, when: float, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """Always raises: timers are not durable."""
        raise NondeterministicCall("a timer (loop.call_at(), a timeout)")

    # --- errors and debugging -------------------------------------------------

    def get_debug(self) -> bool:
        return False

    def set_debug(self, enabled: bool) -> None:
        if enabled:
            raise RuntimeError("a WorkflowLoop has no debug mode")

    def get_exception_handler(self) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None:
        return self._exception_handler

    def set_exception_handler(
        self, handler: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> None:
        """Routes unhandled-exception contexts to ``handler`` instead of :attr:`unhandled`."""
        self._exception_handler = handler

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        """Records the context in :attr:`unhandled` (never prints)."""
        self.unhandled.append(context)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """Hands an unhandled-exception context to the handler, or records it in :attr:`unhandled`."""
        handler = self._exception_handler
        if handler is None:
            self.unhandled.append(context)
            return
        try:
            handler(self, context)
        except Exception as exc:  # a faulty handler must not break the drain
            self.unhandled.append({"message": "exception in the exception handler", "exception": exc,
                                   "context": context})

    # --- async generators ---------------------------------------------------

    def _asyncgen_firstiter(self, agen: Any) -> None:
        # Nothing to track: close() cancels the tasks that iterate generators,
        # and the finalizer below closes abandoned ones on this loop.
        pass

    def _asyncgen_finalizer(self, agen: Any) -> None:
        # An abandoned async generator of workflow code is closed on this loop,
        # not the host's, so its finally blocks run among the workflow's tasks.
        if not self._closed:
            self.call_soon(self.create_task, agen.aclose())

    async def shutdown_asyncgens(self) -> None:
        return None

    async def shutdown_default_executor(self) -> None:
        return None

    # --- everything else is I/O or threads: refused ---------------------------

    call_soon_threadsafe = _refuse(
        "call_soon_threadsafe", "workflow code runs on one thread; use ctx.step(...) for work elsewhere"
    )
    run_in_executor = _refuse("run_in_executor", "run blocking work in a step: await ctx.step(name, fn)")
    set_default_executor = _refuse("set_default_executor")
    getaddrinfo = _refuse("getaddrinfo")
    getnameinfo = _refuse("getnameinfo")
    create_connection = _refuse("create_connection")
    create_server = _refuse("create_server")
    sendfile = _refuse("sendfile")
    start_tls = _refuse("start_tls")
    create_unix_connection = _refuse("create_unix_connection")
    create_unix_server = _refuse("create_unix_server")
    connect_accepted_socket = _refuse("connect_accepted_socket")
    create_datagram_endpoint = _refuse("create_datagram_endpoint")
    connect_read_pipe = _refuse("connect_read_pipe")
    connect_write_pipe = _refuse("connect_write_pipe")
    subprocess_shell = _refuse("subprocess_shell")
    subprocess_exec = _refuse("subprocess_exec")
    add_reader = _refuse("add_reader")
    remove_reader = _refuse("remove_reader")
    add_writer = _refuse("add_writer")
    remove_writer = _refuse("remove_writer")
    sock_recv = _refuse("sock_recv")
    sock_recv_into = _refuse("sock_recv_into")
    sock_recvfrom = _refuse("sock_recvfrom")
    sock_recvfrom_into = _refuse("sock_recvfrom_into")
    sock_sendall = _refuse("sock_sendall")
    sock_sendto = _refuse("sock_sendto")
    sock_connect = _refuse("sock_connect")
    sock_accept = _refuse("sock_accept")
    sock_sendfile = _refuse("sock_sendfile")
    add_signal_handler = _refuse("add_signal_handler")
    remove_signal_handler = _refuse("remove_signal_handler")
    set_task_factory = _refuse("set_task_factory")
