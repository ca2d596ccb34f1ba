"""``Ctx``: what workflow code uses instead of clocks, randomness and I/O.

Every method journals what it does. Methods that start an operation take the
operation's journal position when they are *called* (not when they are
awaited), so concurrent branches get the same positions on every replay.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable
from types import FunctionType
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    ParamSpec,
    Protocol,
    TypeVar,
    TypeVarTuple,
    overload,
)

from fusee import codec
from fusee.declarations import QueryDef, SignalDef, UpdateDef, WorkflowDef
from fusee.errors import FuseeError

if TYPE_CHECKING:
    import asyncio

    from fusee.core import journal as jm
    from fusee.retry import Retry
    from fusee.runtime.streams import StepStream

T = TypeVar("T")
R = TypeVar("R")
In = TypeVar("In")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")

Duration = float | int | datetime.timedelta | str


class _Limits(Protocol):
    limiter: Any  # fusee.limits.Limiter: checks a step's limit= at ctx.step


class CtxRun(Protocol):
    """What a :class:`Ctx` asks of its run (``fusee.runtime.run.Run`` provides it).

    Defined here, below the run, so that ``Ctx`` does not import the run back;
    a call through it costs what a call on the run itself costs.
    """

    workflow_id: str
    run_id: int

    @property
    def machine(self) -> jm.RunMachine: ...
    @property
    def rt(self) -> _Limits: ...

    def op_step(
        self, name: str, fn: Callable[..., Any], retry: Retry | None, timeout: Any, read_only: bool,
        result_type: Any, heartbeat_timeout: Any = None, limit: Any = None,
    ) -> asyncio.Future[Any]: ...
    def op_await(
        self, name: str, fn: Callable[..., Any], retry: Retry | None, timeout: Any, result_type: Any,
    ) -> asyncio.Future[Any]: ...
    def op_sleep(self, name: str, duration: Any) -> asyncio.Future[Any]: ...
    def op_wait(self, signal: SignalDef[Any], timeout: Any) -> asyncio.Future[Any]: ...
    def op_child(
        self, workflow: WorkflowDef[Any, Any], workflow_id: str, input: Any, close_policy: str, timeout: Any,
        detached: bool,
    ) -> asyncio.Future[Any]: ...
    def op_send(self, target: str, signal: SignalDef[Any], value: Any) -> asyncio.Future[Any]: ...
    def op_stream(self, name: str) -> Any: ...
    def op_now(self) -> datetime.datetime: ...
    def op_random(self) -> float: ...
    def op_uuid(self) -> uuid.UUID: ...
    def op_patched(self, patch_id: str) -> bool: ...
    def op_attributes(self, attributes: dict[str, Any]) -> None: ...
    def op_continue_as_new(self, input: Any) -> Awaitable[None]: ...
    def deliveries_settled(self) -> Awaitable[None]: ...
    def set_query_handler(self, query: QueryDef[Any], handler: Callable[..., Any]) -> None: ...
    def set_update_handler(
        self, update: UpdateDef[Any], handler: Callable[..., Any], validator: Callable[..., Any] | None
    ) -> None: ...


class ContinueAsNew(BaseException):
    """Raised by :meth:`Ctx.continue_as_new` to end the run and hand over to a new one.

    It derives from BaseException so that ``except Exception`` in workflow
    code does not swallow it.
    """

    def __init__(self, payload: bytes) -> None:
        super().__init__("continue as new")
        self.payload = payload


class OutsideWorkflow(FuseeError, RuntimeError):
    """A ``ctx`` method was called from outside its workflow's code."""


class StepInfo:
    """What a step function may take as its only argument.

    ``key`` is an idempotency key, stable across retries and crashes and
    distinct across runs (pass it to the service you call). ``attempt`` counts
    from 1 (from the last resume, for a paused and resumed step).
    """

    __slots__ = (
        "_cancel_requested",
        "_heartbeat",
        "_stream",
        "attempt",
        "key",
        "name",
        "progress",
        "run_id",
        "token",
        "workflow_id",
    )

    def __init__(
        self,
        name: str,
        key: str,
        attempt: int,
        workflow_id: str,
        run_id: int,
        progress: Any,
        heartbeat: Callable[[Any], None],
        cancel_requested: Callable[[], bool] = lambda: False,
        token: str | None = None,
        stream: Callable[[str], StepStream] | None = None,
    ) -> None:
        self.name = name
        self._stream = stream
        #: In ``ctx.await_completion``'s function: the token to hand to the outside
        #: world (``engine.complete(token, value)``); None in an ordinary step.
        self.token = token
        self.key = key
        self.attempt = attempt
        self.workflow_id = workflow_id
        self.run_id = run_id
        #: The latest progress an earlier attempt reported with heartbeat(), or None.
        self.progress = progress
        self._heartbeat = heartbeat
        self._cancel_requested = cancel_requested

    def heartbeat(self, progress: Any = None) -> None:
        """Records progress; a later attempt of this step sees it as ``info.progress``.

        Safe to call from a synchronous step function's thread. Only the latest
        progress per flush is journaled.
        """
        self._heartbeat(progress)

    def stream(self, name: str) -> StepStream:
        """A stream this step writes (``.write(chunk)``, ``.close()``), also from a thread.

        Running again, the step continues after the chunks its earlier attempts
        recorded: ``.recorded`` says how many there are (reading it makes the next
        write the one after them), or the step writes them again and they are
        checked and dropped. Its result completes the stream. See ``engine.read_stream``.
        """
        if self._stream is None:
            raise RuntimeError("this StepInfo has no stream: it belongs to no running step")
        return self._stream(name)

    @property
    def cancel_requested(self) -> bool:
        """Whether the run's cancellation was requested while this function runs.

        A synchronous step function cannot be interrupted: it runs to its end
        and its outcome is journaled before the workflow sees ``Cancelled``.
        Long functions may check this and stop early (return or raise).
        """
        return self._cancel_requested()

    def __repr__(self) -> str:
        return f"StepInfo(name={self.name!r}, key={self.key!r}, attempt={self.attempt})"


#: The step whose function runs in this context (read by ``fusee.step_info()``):
#: a maker of its StepInfo, so steps that never ask pay nothing to build one.
CURRENT_STEP: contextvars.ContextVar[Callable[[], StepInfo] | None] = contextvars.ContextVar(
    "fusee_current_step", default=None
)


class ChildHandle:
    """A child workflow started with :meth:`Ctx.start_child` (the parent does not wait for it)."""

    __slots__ = ("workflow_id",)

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id

    def __repr__(self) -> str:
        return f"ChildHandle({self.workflow_id!r})"


def takes_step_info(fn: Callable[..., Any]) -> bool:
    """Whether a step function wants a :class:`StepInfo`: its first parameter is
    required, or annotated ``StepInfo``.

    A parameter with a default (``lambda i=i: ...``, the usual way to capture a
    loop variable) is left to its default.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return False
        ann = p.annotation
        if ann is StepInfo or (isinstance(ann, str) and ann.rsplit(".", 1)[-1] == "StepInfo"):
            return True
        return p.default is p.empty
    return False


#: Whether a step function wants a StepInfo, per (function, count of args, kwargs' names).
_wants_info: dict[Any, bool] = {}


def bind_step_args(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
    """``fn`` with ``args`` and ``kwargs`` bound, taking a StepInfo first if ``fn`` wants one.

    ``fn`` wants one when its first parameter is annotated ``StepInfo``, or
    when it has one more required positional parameter than ``args`` fill.
    The answer is cached per function's code (a closure made per step is
    inspected once).
    """
    try:
        sig = signature_key(fn)
        key: Any = None if sig is None else (sig, len(args), tuple(kwargs))
        wants = None if key is None else _wants_info.get(key)
    except TypeError:
        key, wants = None, None
    if wants is None:
        wants = _wants_step_info(fn, args, kwargs)
        if key is not None and len(_wants_info) < 8192:
            _wants_info[key] = wants
    if not wants:
        return functools.partial(fn, *args, **kwargs)
    if inspect.iscoroutinefunction(fn):
        async def with_info_async(info: StepInfo) -> Any:
            return await fn(info, *args, **kwargs)

        return with_info_async

    def with_info(info: StepInfo) -> Any:
        return fn(info, *args, **kwargs)

    return with_info


def signature_key(fn: Callable[..., Any]) -> Any:
    """What fixes ``fn``'s parameters, cheaply: its code (and how a partial or a bound method shifts them).

    None for a callable whose signature is declared apart from its code
    (``__wrapped__``, ``__signature__``): those are inspected every time.
    """
    # A plain function (what a step passes, alone or in a partial) without the attribute misses
    # below: one whose __dict__ is empty has no __wrapped__ or __signature__.
    if type(fn) is FunctionType and not fn.__dict__:
        return fn.__code__
    if isinstance(fn, functools.partial):
        inner = signature_key(fn.func)
        return None if inner is None else ("partial", inner, len(fn.args), tuple(fn.keywords))
    if hasattr(fn, "__wrapped__") or hasattr(fn, "__signature__"):
        return None
    code = getattr(fn, "__code__", None)
    if code is not None:
        return code
    func = getattr(fn, "__func__", None)
    if func is not None:
        return ("method", signature_key(func))
    return fn if hasattr(fn, "__name__") else ("instance", type(fn))


_fn_cache: dict[Any, tuple[bool, bool, Any]] = {}


def describe_fn(fn: Callable[..., Any]) -> tuple[bool, bool, Any]:
    """(takes a StepInfo, is a coroutine function, return annotation) of a step function.

    Cached per code object (and how a partial or a bound method shifts its
    parameters): a loop of steps made from one lambda pays for the inspection
    once.
    """
    key = None
    try:
        key = signature_key(fn)
        if key is not None:
            return _fn_cache[key]
    except (KeyError, TypeError):
        pass
    v = (takes_step_info(fn), inspect.iscoroutinefunction(fn), _return_type(fn))
    try:
        if key is not None and len(_fn_cache) < 4096:
            _fn_cache[key] = v
    except TypeError:
        pass
    return v


def _return_type(fn: Callable[..., Any]) -> Any:
    return codec.return_type_of(fn)


def _wants_step_info(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        params = [
            p for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in kwargs
        ]
    except (TypeError, ValueError):
        return False
    if not params:
        return False
    ann = params[0].annotation
    required = [p for p in params if p.default is p.empty]
    return ann is StepInfo or (isinstance(ann, str) and ann.rsplit(".", 1)[-1] == "StepInfo") \
        or len(required) == len(args) + 1


def takes_argument(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts one positional argument (a step info, a query arg)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL):
            return True
    return False


class Ctx:
    """The durable API of one workflow run; the first argument of every workflow."""

    __slots__ = ("_run",)

    def __init__(self, run: CtxRun) -> None:
        self._run = run

    # --- identity -----------------------------------------------------

    @property
    def workflow_id(self) -> str:
        """The workflow's ID (shared by the runs of a continue-as-new chain)."""
        return self._run.workflow_id

    @property
    def run_id(self) -> int:
        """This run's ID: distinct for every run, including continued ones."""
        return self._run.run_id

    @property
    def is_replaying(self) -> bool:
        """True while the code re-executes operations its journal already holds."""
        return self._run.machine.is_replaying()

    @property
    def journal_size(self) -> int:
        """How many operations (steps, timers, waits, values, children, ...) this run's code
        has started so far. The same on every replay, so the code may decide on it: a
        long-lived workflow continues as new (``ctx.continue_as_new``) once its history
        grows past a bound, and the next run starts from 0."""
        return self._run.machine.journal_size()

    # --- operations -----------------------------------------------------

    # How type checkers see ctx.step: the result is the function's (awaited, for an async
    # one), its arguments are checked against it. PEP 612 puts nothing between P.args and
    # P.kwargs, so the function's keyword arguments (ParamSpec overloads) and the step's
    # options (TypeVarTuple overloads, positional arguments only) are typed in separate
    # overloads; a call with both takes functools.partial (or a lambda). Each shape comes
    # without a StepInfo first parameter and with one, async before sync.
    @overload
    def step(
        self, name: str, fn: Callable[..., Any], *args: Any, result_type: type[T], retry: Retry | None = None,
        timeout: Duration | None = None, read_only: bool = False, heartbeat_timeout: Duration | None = None,
        limit: str | None = None, priority: int = 0, fairness_key: str | None = None, **kwargs: Any,
    ) -> Awaitable[T]: ...

    @overload
    def step(self, name: str, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]: ...

    @overload
    def step(self, name: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]: ...

    @overload
    def step(
        self, name: str, fn: Callable[Concatenate[StepInfo, P], Awaitable[R]], *args: P.args, **kwargs: P.kwargs,
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self, name: str, fn: Callable[Concatenate[StepInfo, P], R], *args: P.args, **kwargs: P.kwargs,
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self, name: str, fn: Callable[[*Ts], Awaitable[R]], *args: *Ts, retry: Retry | None = None,
        timeout: Duration | None = None, read_only: bool = False, result_type: None = None,
        heartbeat_timeout: Duration | None = None, limit: str | None = None, priority: int = 0,
        fairness_key: str | None = None,
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self, name: str, fn: Callable[[*Ts], R], *args: *Ts, retry: Retry | None = None,
        timeout: Duration | None = None, read_only: bool = False, result_type: None = None,
        heartbeat_timeout: Duration | None = None, limit: str | None = None, priority: int = 0,
        fairness_key: str | None = None,
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self, name: str, fn: Callable[[StepInfo, *Ts], Awaitable[R]], *args: *Ts, retry: Retry | None = None,
        timeout: Duration | None = None, read_only: bool = False, result_type: None = None,
        heartbeat_timeout: Duration | None = None, limit: str | None = None, priority: int = 0,
        fairness_key: str | None = None,
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self, name: str, fn: Callable[[StepInfo, *Ts], R], *args: *Ts, retry: Retry | None = None,
        timeout: Duration | None = None, read_only: bool = False, result_type: None = None,
        heartbeat_timeout: Duration | None = None, limit: str | None = None, priority: int = 0,
        fairness_key: str | None = None,
    ) -> Awaitable[R]: ...

    @overload
    def step(  # type: ignore[overload-cannot-match]
        # A lambda with a default (``lambda t=total: t + 1``): mypy infers no type for it against
        # the shapes above, so it lands here (no arguments, so a wrong one is still an error).
        self, name: str, fn: Callable[..., R], *, retry: Retry | None = None,
        timeout: Duration | None = None, read_only: bool = False, result_type: None = None,
        heartbeat_timeout: Duration | None = None, limit: str | None = None, priority: int = 0,
        fairness_key: str | None = None,
    ) -> Awaitable[R]: ...

    def step(  # type: ignore[misc]  # mypy cannot match an implementation to TypeVarTuple overloads
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        read_only: bool = False,
        result_type: Any = None,
        heartbeat_timeout: Duration | None = None,
        limit: str | None = None,
        priority: int = 0,
        fairness_key: str | None = None,
        **kwargs: Any,
    ) -> Awaitable[Any]:
        """Runs ``fn`` at most once to success and journals its result.

        ``args`` and ``kwargs`` (other than the options below) are passed to
        ``fn``, after its :class:`StepInfo` when it takes one:
        ``ctx.step("fetch", fetch, url)`` needs no closure over ``url``.

        ``fn`` is sync or async and takes no argument or a :class:`StepInfo`.
        It runs only once everything this run journaled before it is durable
        (``read_only=True`` lets it run ahead of the disk: use it for reads
        without effects). On replay the recorded result is returned and
        ``fn`` is not called. Failures are retried per ``retry``; when they
        run out, awaiting raises :class:`fusee.StepFailed` (or the step
        pauses until resumed, with ``Retry(pause_when_exhausted=True)``).

        ``timeout`` bounds each attempt; ``heartbeat_timeout`` fails an attempt
        that reports no ``info.heartbeat(...)`` for that long (the next attempt
        sees the latest progress as ``info.progress``). An async function is
        cancelled then; a synchronous one runs to its end first (its result is
        discarded), so two attempts never overlap.

        ``limit`` names a :class:`fusee.Limit` the engine was opened with: each
        attempt waits for a permit of it (highest ``priority`` first, fairness
        keys in weighted turns) and holds it while the function runs; an
        unknown name raises :class:`fusee.UnknownLimit` here.
        """
        req = None
        if limit is not None:
            req = self._run.rt.limiter.request(limit, priority, fairness_key)
        if args or kwargs:
            if result_type is None:
                result_type = describe_fn(fn)[2]
            fn = bind_step_args(fn, args, kwargs)
        return self._run.op_step(name, fn, retry, timeout, read_only, result_type, heartbeat_timeout, req)

    @overload
    def await_completion(
        self, name: str, fn: Callable[..., Any], *, retry: Retry | None = None, timeout: Duration | None = None,
        result_type: type[T],
    ) -> Awaitable[T]: ...

    @overload
    def await_completion(
        self, name: str, fn: Callable[..., Any], *, retry: Retry | None = None, timeout: Duration | None = None,
        result_type: None = None,
    ) -> Awaitable[Any]: ...

    def await_completion(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        result_type: Any = None,
    ) -> Awaitable[Any]:
        """Waits durably for a value that the outside world reports with ``engine.complete``.

        ``fn`` runs like a step's function (after the journal is durable, with
        ``retry`` and a per-attempt ``timeout``) and receives a
        :class:`StepInfo` whose ``token`` it hands out (an e-mail link, a
        webhook registration). Once it returned, the run waits (and parks if
        it waits long) for ``await engine.complete(token, value)``, whose
        value, converted to ``result_type``, is returned here; after
        ``engine.fail_completion(token, message)`` this raises
        :class:`fusee.CompletionFailed`. A retried ``fn`` hands out a new
        token and the old one is refused; a replay after the token went out
        waits again without running ``fn``.
        """
        return self._run.op_await(name, fn, retry, timeout, result_type)

    def sleep(self, name: str, duration: Duration) -> Awaitable[None]:
        """Sleeps durably: the timer survives crashes and restarts."""
        return self._run.op_sleep(name, duration)

    def wait_for(self, signal: SignalDef[T], *, timeout: Duration | None = None) -> Awaitable[T | None]:
        """Waits for the next signal of this kind (in arrival order); None on timeout."""
        return self._run.op_wait(signal, timeout)

    def child(
        self,
        workflow: WorkflowDef[In, T],
        workflow_id: str,
        input: In = None,  # type: ignore[assignment]  # None for a workflow without input
        *,
        close_policy: str = "terminate",
        timeout: Duration | None = None,
    ) -> Awaitable[T]:
        """Starts a child workflow and waits for its result.

        ``close_policy`` says what happens to the child if this run ends
        first: ``"terminate"``, ``"request_cancel"`` or ``"abandon"``.
        ``timeout`` bounds the wait: past it this raises
        :class:`fusee.WorkflowTimedOut` and the child gets its close policy.
        The deadline is journaled: it holds across crashes.
        """
        return self._run.op_child(workflow, workflow_id, input, close_policy, timeout, detached=False)

    def start_child(
        self,
        workflow: WorkflowDef[In, Any],
        workflow_id: str,
        input: In = None,  # type: ignore[assignment]  # None for a workflow without input
        *,
        close_policy: str = "abandon",
    ) -> Awaitable[ChildHandle]:
        """Starts a child workflow without waiting for its result."""
        return self._run.op_child(workflow, workflow_id, input, close_policy, None, detached=True)

    def signal_workflow(self, workflow_id: str, signal: SignalDef[T], value: T = None) -> Awaitable[None]:  # type: ignore[assignment]
        """Sends a signal to another workflow, exactly once, once this run's journal is durable."""
        return self._run.op_send(workflow_id, signal, value)

    def stream(self, name: str) -> Any:
        """A stream workflow code writes: ``await w.write(chunk)``, ``await w.close()``.

        Readers (``engine.read_stream``) see durable chunks in order, never
        changed; replay writes nothing again.
        """
        return self._run.op_stream(name)

    def now(self) -> datetime.datetime:
        """The current time (UTC), recorded: replay returns the same value."""
        return self._run.op_now()

    def random(self) -> float:
        """A random float in [0, 1), recorded: replay returns the same value."""
        return self._run.op_random()

    def uuid4(self) -> uuid.UUID:
        """A random UUID, recorded: replay returns the same value."""
        return self._run.op_uuid()

    def patched(self, patch_id: str) -> bool:
        """True for runs that reach this point with the new code; False for runs replaying old history.

        Use it to change workflow code without breaking runs already under way.
        """
        return self._run.op_patched(patch_id)

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        """Records search attributes for this run."""
        self._run.op_attributes(attributes)

    def continue_as_new(self, input: Any = None) -> Awaitable[None]:
        """Ends this run and starts the next run of the same workflow ID with ``input``.

        ``result()`` of the workflow follows the chain. Child starts and signals this
        run sent are durable where they went before the run ends (it waits for them
        if it must), so a crash right after the end loses none of them.
        """
        return self._run.op_continue_as_new(input)

    # --- handlers -------------------------------------------------------

    def on_query(self, query: QueryDef[Any], handler: Callable[..., Any]) -> None:
        """Answers ``query`` with ``handler`` (called with the query's argument, if it takes one).

        The handler must only read the workflow's state.
        """
        self._run.set_query_handler(query, handler)

    def on_update(
        self,
        update: UpdateDef[T],
        handler: Callable[..., Any],
        *,
        validator: Callable[[T], Any] | None = None,
    ) -> None:
        """Handles ``update``: ``validator`` may reject it (by raising) before anything is recorded;
        ``handler`` (sync or async, may run steps) produces the caller's result."""
        self._run.set_update_handler(update, handler, validator)
