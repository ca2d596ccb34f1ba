"""Keyed objects: durable state per key, changed by handlers that take turns.

``cart = fusee.object("cart", state=Cart)`` declares an object; handlers are
``@cart.exclusive`` (they may write the state; one at a time per key, in
arrival order) or ``@cart.shared`` (they read it; any number at once, never
beside an exclusive one). ``await engine.call(cart.add, key, arg, call_id=...)``
returns the handler's result once it is durable.

How it is built on the journal: each (object, key) is a workflow run of the
built-in workflow ``fusee.object:<name>`` with ID ``@<name>/<key>``. Calls are
updates of that run (the update ID is the call ID), so a call is journaled
before its handler runs, its handler runs as workflow code (steps, sleeps and
waits are journaled like any workflow's), and its answer is released only once
durable. The state lives in the run's memory and is rebuilt by replay; the
run's own code enforces the exclusive/shared discipline with a first-come
first-served gate (arrival order is the journaled delivery order, the same on
every replay). After ``calls_per_run`` calls, when no handler runs, the run
continues as new with its state, version and the answers of the last
``remember_calls`` call IDs, so a key's journal never grows without bound and
a repeated call ID is answered from that table after the hand-over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import typing
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from typing_extensions import TypeVar as DefaultTypeVar

from fusee import codec, sabotage
from fusee.definitions import QueryDef, UpdateDef, WorkflowDef
from fusee.errors import (
    DeterminismError,
    NondeterministicCall,
    ObjectStateReadOnly,
)
from fusee.runtime.context import Ctx

S = TypeVar("S")
R = TypeVar("R")
#: A handler's argument type; ``Handler[int]`` (no argument type given) means ``Handler[int, Any]``.
A = DefaultTypeVar("A", default=Any)

#: The update that carries a call: {"h": handler, "id": call ID, "a": argument as JSON}.
CALL = UpdateDef[Any]("fusee.object.call")
#: The update that carries an operator's edit: {"op": "set"|"clear"|"patch", "value", "if_version"}.
EDIT = UpdateDef[Any]("fusee.object.edit")
#: The query that reads the state: {"state": JSON, "version": int}.
STATE = QueryDef[Any]("fusee.object.state")

#: Workflow names of objects start with this.
PREFIX = "fusee.object:"


@dataclasses.dataclass(frozen=True)
class ObjectState(Generic[S]):
    """An object's state as :meth:`fusee.Engine.object_state` read it.

    ``version`` counts the writes (0: never written); pass it as ``if_version``
    to an edit so that it applies only to the state you read.
    """

    value: S
    version: int


class Handler(Generic[R, A]):
    """A handler of an object, made by ``@obj.exclusive`` or ``@obj.shared``; call it with
    ``await engine.call(handler, key, arg)``.

    ``Handler[R, A]``: its result type ``R`` and argument type ``A`` (None for a
    handler without argument), which type checkers check at ``engine.call``.
    """

    __slots__ = ("arg_type", "fn", "kind", "name", "obj", "result_type", "takes_arg")

    def __init__(self, obj: ObjectDef[Any], fn: Callable[..., Awaitable[R]], kind: str) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"object handler {fn.__name__!r} must be an 'async def' function")
        params = list(inspect.signature(fn).parameters.values())
        if not params or len(params) > 2:
            raise TypeError(
                f"object handler {fn.__name__!r} must take (ctx) or (ctx, arg), got {len(params)} parameters"
            )
        try:
            hints = typing.get_type_hints(fn)
        except Exception:
            hints = {}
        self.obj = obj
        self.fn = fn
        self.kind = kind
        self.name: str = fn.__name__
        self.takes_arg = len(params) == 2
        self.arg_type: Any = hints.get(params[1].name, Any) if self.takes_arg else type(None)
        self.result_type: Any = hints.get("return", Any)

    def __call__(self, *args: Any, **kwargs: Any) -> typing.NoReturn:
        raise TypeError(
            f"handler {self.name!r} of object {self.obj.name!r} is not called directly: use "
            f"await engine.call(handler, key, arg)"
        )

    def __repr__(self) -> str:
        return f"<{self.kind} handler {self.obj.name}.{self.name}>"


class ObjectDef(Generic[S]):
    """A keyed object: its name, state type and handlers. Declare it with :func:`object`
    and register it with ``Engine.open(..., workflows=[..., obj])``."""

    def __init__(self, name: str, state: Any, initial: Any, calls_per_run: int, remember_calls: int) -> None:
        self.name = name
        self.state_type = state
        self.handlers: dict[str, Handler[Any]] = {}
        self.calls_per_run = calls_per_run
        self.remember_calls = remember_calls
        self.initial_json = to_plain(initial, state, f"the initial state of object {name!r}")
        self.workflow: WorkflowDef[Any, None] = WorkflowDef(
            PREFIX + name, self._main, 1, Any, type(None), True
        )

    # --- declaring -------------------------------------------------------------------

    @typing.overload
    def exclusive(self, fn: Callable[[ObjectCtx[S]], Awaitable[R]]) -> Handler[R, None]: ...

    @typing.overload
    def exclusive(self, fn: Callable[[ObjectCtx[S], A], Awaitable[R]]) -> Handler[R, A]: ...

    def exclusive(self, fn: Callable[..., Awaitable[R]]) -> Handler[R, Any]:
        """Declares a handler that may write the state: one runs at a time per key, in arrival order."""
        return self._add(Handler(self, fn, "exclusive"))

    @typing.overload
    def shared(self, fn: Callable[[ObjectCtx[S]], Awaitable[R]]) -> Handler[R, None]: ...

    @typing.overload
    def shared(self, fn: Callable[[ObjectCtx[S], A], Awaitable[R]]) -> Handler[R, A]: ...

    def shared(self, fn: Callable[..., Awaitable[R]]) -> Handler[R, Any]:
        """Declares a handler that reads the state: several run at once, never beside an exclusive one."""
        return self._add(Handler(self, fn, "shared"))

    def _add(self, h: Handler[R, Any]) -> Handler[R, Any]:
        if h.name in self.handlers:
            raise ValueError(f"object {self.name!r} has two handlers named {h.name!r}")
        self.handlers[h.name] = h
        return h

    def workflow_id(self, key: str) -> str:
        """The ID of the run that holds ``key``'s state."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"an object key must be a non-empty string, got {key!r}")
        return f"@{self.name}/{key}"

    def start_input(self) -> dict[str, Any]:
        return {"state": self.initial_json, "version": 0, "answers": []}

    def decode_state(self, plain: Any) -> S:
        # A fresh copy every time: a handler that changes it in place changes nothing durable.
        return codec.decode(codec.encode(plain), self.state_type)  # type: ignore[no-any-return]

    @staticmethod
    def decode_result(plain: Any, tp: Any) -> Any:
        return codec.decode(codec.encode(plain), tp)

    def __repr__(self) -> str:
        return f"<object {self.name!r}>"

    # --- the run's code ----------------------------------------------------------------

    async def _main(self, ctx: Ctx, start: Any) -> None:
        key = ctx.workflow_id[len(self.name) + 2:]
        cell = _Cell(start["state"], int(start["version"]))
        answers: OrderedDict[str, Any] = OrderedDict((cid, env) for cid, env in start["answers"])
        gate = _Gate()
        idle = asyncio.Event()
        counts = {"done": 0, "running": 0}

        def remember(cid: str, env: Any) -> None:
            answers[cid] = env
            while len(answers) > self.remember_calls:
                answers.popitem(last=False)

        def finished() -> None:
            counts["done"] += 1
            counts["running"] -= 1
            if counts["done"] >= self.calls_per_run and counts["running"] == 0:
                idle.set()

        async def on_call(arg: Any) -> Any:
            cid = arg["id"]
            known = answers.get(cid)
            if known is not None and not sabotage.active.object_forget_call_ids:
                return known
            counts["running"] += 1
            try:
                h = self.handlers.get(arg["h"])
                if h is None:
                    env: Any = {"err": ["UnknownHandler", f"object {self.name!r} has no handler {arg['h']!r}"]}
                else:
                    env = await self._handle(ctx, key, cell, gate, h, arg["a"])
                remember(cid, env)
                return env
            finally:
                finished()

        async def on_edit(arg: Any) -> Any:
            counts["running"] += 1
            await gate.enter("exclusive")
            try:
                want = arg.get("if_version")
                if want is not None and want != cell.version:
                    return {"conflict": cell.version}
                op = arg["op"]
                if op == "set":
                    cell.json = arg["value"]
                elif op == "clear":
                    cell.json = self.initial_json
                else:
                    try:
                        cell.json = _apply_patch(self, cell.json, arg["value"])
                    except Exception as e:
                        return {"err": [type(e).__name__, str(e)]}
                cell.version += 1
                return {"ok": cell.version}
            finally:
                gate.leave("exclusive")
                finished()

        ctx.on_update(CALL, on_call)
        ctx.on_update(EDIT, on_edit)
        ctx.on_query(STATE, lambda: {"state": cell.json, "version": cell.version})
        while True:
            await idle.wait()
            idle.clear()
            if counts["running"] == 0 and gate.idle():
                # What handlers sent must have arrived before the hand-over (or continuing
                # would wait, and a call could run meanwhile); then look again.
                await ctx._run.deliveries_settled()
                if counts["running"] == 0 and gate.idle():
                    break  # else a call began meanwhile: its end sets idle again
        # Nothing runs and no delivery can come between this check and the hand-over.
        await ctx.continue_as_new(
            {"state": cell.json, "version": cell.version, "answers": [[c, e] for c, e in answers.items()]}
        )

    async def _handle(self, ctx: Ctx, key: str, cell: _Cell, gate: _Gate, h: Handler[Any], arg: Any) -> Any:
        locked = not (h.kind == "exclusive" and sabotage.active.object_exclusive_unlocked)
        if locked:
            await gate.enter(h.kind)
        before = (cell.json, cell.version)
        try:
            octx: ObjectCtx[Any] = ObjectCtx._make(ctx, self, key, cell, h.kind == "exclusive")
            try:
                if h.takes_arg:
                    result = await h.fn(octx, codec.retype(arg, h.arg_type))
                else:
                    result = await h.fn(octx)
                return {"ok": to_plain(result, h.result_type, f"the result of handler {self.name}.{h.name}")}
            except (DeterminismError, NondeterministicCall):
                raise  # the run stops on these: they are not the handler's answer
            except Exception as e:
                if h.kind == "exclusive":
                    cell.json, cell.version = before  # a handler that raised leaves the state as it was
                return {"err": [type(e).__name__, str(e)]}
        finally:
            if locked:
                gate.leave(h.kind)


@typing.overload
def object(
    name: str,
    *,
    state: type[S],
    initial: Any = ...,
    calls_per_run: int = 1000,
    remember_calls: int = 10_000,
) -> ObjectDef[S]: ...


@typing.overload
def object(
    name: str,
    *,
    state: Any = Any,
    initial: Any = ...,
    calls_per_run: int = 1000,
    remember_calls: int = 10_000,
) -> ObjectDef[Any]: ...


def object(
    name: str,
    *,
    state: Any = Any,
    initial: Any = ...,
    calls_per_run: int = 1000,
    remember_calls: int = 10_000,
) -> ObjectDef[S]:
    """Declares a keyed object whose state is of type ``state``.

    ``initial`` is a key's state before its first write (default: ``state()``
    when that works, the empty value of a generic alias's origin for
    ``list[str]``, ``dict[str, int]`` and the like, else None). After ``calls_per_run`` calls a key's run
    continues as new (its journal stays small); the answers of its last
    ``remember_calls`` call IDs are kept, so a call ID repeated within that
    many later calls of the same key gets the same answer (an older one runs
    its handler again).
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise TypeError(f"an object name must be a non-empty string without '/', got {name!r}")
    for what, n in (("calls_per_run", calls_per_run), ("remember_calls", remember_calls)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"object {name!r}: {what} must be a positive int, got {n!r}")
    if initial is ...:
        # A generic alias (list[str], dict[str, int]) is not a type: its origin makes the empty value.
        make = state if isinstance(state, type) else typing.get_origin(state)
        try:
            initial = make() if isinstance(make, type) else None
        except Exception:
            initial = None
    return ObjectDef(name, state, initial, calls_per_run, remember_calls)


class _Cell:
    """A key's state as JSON, and how many writes it has seen."""

    __slots__ = ("json", "version")

    def __init__(self, json: Any, version: int) -> None:
        self.json = json
        self.version = version


class _Gate:
    """First come, first served: exclusive entries alone, shared ones together.

    A waiting exclusive entry holds back shared ones that arrive after it, so
    handlers start in arrival order and an exclusive one is never starved.
    """

    def __init__(self) -> None:
        self.exclusive = False
        self.shared = 0
        self.queue: list[tuple[str, asyncio.Future[None]]] = []

    def _fits(self, kind: str) -> bool:
        if kind == "exclusive":
            return not self.exclusive and self.shared == 0
        return not self.exclusive

    def _take(self, kind: str) -> None:
        if kind == "exclusive":
            self.exclusive = True
        else:
            self.shared += 1

    def idle(self) -> bool:
        return not self.exclusive and self.shared == 0 and not self.queue

    async def enter(self, kind: str) -> None:
        if not self.queue and self._fits(kind):
            self._take(kind)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (kind, fut)
        self.queue.append(entry)
        try:
            await fut
        except BaseException:
            # Cancelled while waiting (the run's code is being torn down): leave no trace.
            if entry in self.queue:
                self.queue.remove(entry)
            elif not fut.cancelled():
                self.leave(kind)  # it was let in just as it was cancelled
            raise

    def leave(self, kind: str) -> None:
        if kind == "exclusive":
            assert self.exclusive
            self.exclusive = False
        else:
            assert self.shared > 0
            self.shared -= 1
        while self.queue and self._fits(self.queue[0][0]):
            k, fut = self.queue.pop(0)
            if fut.done():
                continue
            self._take(k)
            fut.set_result(None)


class ObjectCtx(Ctx, Generic[S]):
    """What an object handler gets: everything :class:`fusee.Ctx` offers, plus its key and state."""

    __slots__ = ("_cell", "_obj", "_snapshot", "_writer", "key")

    key: str
    _cell: _Cell
    _obj: ObjectDef[Any]
    _snapshot: Any
    _writer: bool

    @classmethod
    def _make(cls, ctx: Ctx, obj: ObjectDef[Any], key: str, cell: _Cell, writer: bool) -> ObjectCtx[Any]:
        octx: ObjectCtx[Any] = cls.__new__(cls)
        Ctx.__init__(octx, ctx._run)
        octx.key = key
        octx._obj = obj
        octx._cell = cell
        octx._writer = writer
        octx._snapshot = cell.json  # a shared handler reads the state as of its start
        return octx

    @property
    def state(self) -> S:
        """The key's state (a copy: change it with :meth:`set_state`)."""
        return self._obj.decode_state(self._cell.json if self._writer else self._snapshot)  # type: ignore[no-any-return]

    @property
    def version(self) -> int:
        """How many writes the state has seen."""
        return self._cell.version

    def set_state(self, value: S) -> None:
        """Replaces the key's state (exclusive handlers only; durable with the call's answer).

        Raises :class:`fusee.SerializationError` if ``value`` does not convert to
        the object's state type (nothing changes), :class:`fusee.ObjectStateReadOnly`
        in a shared handler.
        """
        if not self._writer:
            raise ObjectStateReadOnly(
                f"handler of object {self._obj.name!r} is shared: it may read ctx.state but not "
                "set it; declare it with @obj.exclusive to write"
            )
        self._cell.json = to_plain(value, self._obj.state_type, f"the state of object {self._obj.name!r}")
        self._cell.version += 1


def to_plain(value: Any, tp: Any, what: str) -> Any:
    """``value`` as plain JSON, checked against ``tp`` (SerializationError otherwise)."""
    return codec.decode(
        codec.convert(value, tp, what=what, declare="declare its type (state=..., or annotate the handler)")
    )


def _apply_patch(obj: ObjectDef[Any], state: Any, patch: Any) -> Any:
    import jsonpatch

    patched = jsonpatch.apply_patch(state, patch, in_place=False)
    codec.retype(patched, obj.state_type)  # the patched state must still be a state
    return patched


def declared(versions: Mapping[tuple[str, int], Any]) -> dict[str, ObjectDef[Any]]:
    """The keyed objects among an engine's registered workflows (its ``(type, version)`` table),
    by name."""
    out: dict[str, ObjectDef[Any]] = {}
    for (wtype, _), definition in versions.items():
        owner = getattr(getattr(definition, "fn", None), "__self__", None)
        if wtype.startswith(PREFIX) and isinstance(owner, ObjectDef):
            out[owner.name] = owner
    return out
