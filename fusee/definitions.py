"""Workflow, signal, query and update definitions: plain values users declare once.

The values themselves are ``fusee.declarations`` (below the runtime, re-exported
here); this module declares them, and types ``@workflow`` against :class:`fusee.Ctx`.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

# The data classes live below the runtime (which reads them); this module, above it, declares them.
from fusee.declarations import QueryDef as QueryDef
from fusee.declarations import R_co as R_co
from fusee.declarations import SignalDef as SignalDef
from fusee.declarations import UpdateDef as UpdateDef
from fusee.declarations import WorkflowDef as WorkflowDef

if TYPE_CHECKING:
    # Only to type what @workflow accepts: a function taking a Ctx.
    from fusee.runtime.context import Ctx

T = TypeVar("T")
R = TypeVar("R")


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a {kind} name must be a non-empty string, got {name!r}")
    return name


@typing.overload
def signal(name: str) -> SignalDef[Any]: ...


@typing.overload
def signal(name: str, type: type[T]) -> SignalDef[T]: ...


@typing.overload
def signal(name: str, type: Any) -> SignalDef[Any]: ...


def signal(name: str, type: Any = Any) -> SignalDef[Any]:
    """Declares a signal: ``approve = fusee.signal("approve", int)`` is a ``SignalDef[int]``,
    and type checkers check the values sent with it.

    The declaration is also remembered by name in this process: a signal sent by name
    only (over HTTP, from the CLI or the UI, routed from another process) is checked
    against it (see :func:`declared_signal_types`).
    """
    sig: SignalDef[Any] = SignalDef(_check_name("signal", name), type)
    known = _DECLARED.setdefault(sig.name, [])
    if not any(t is type or _same(t, type) for t in known):
        known.append(type)
    return sig


#: Every signal type declared with :func:`signal` in this process, by name, in declaration
#: order. Only ``fusee.signal(...)`` adds to it: ``SignalDef(name)``, which callers that know
#: only a name build, declares nothing.
_DECLARED: dict[str, list[Any]] = {}


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an annotation whose == misbehaves is a different one
        return False


def declared_signal_types(name: str) -> tuple[Any, ...]:
    """The types ``fusee.signal(name, ...)`` was declared with in this process (empty: none)."""
    return tuple(_DECLARED.get(name, ()))


def declared_signal_names() -> list[str]:
    """The names of the signals declared with ``fusee.signal(...)`` in this process, sorted."""
    return sorted(_DECLARED)


@typing.overload
def query(name: str) -> QueryDef[Any]: ...


@typing.overload
def query(name: str, result_type: type[T]) -> QueryDef[T]: ...


@typing.overload
def query(name: str, result_type: Any) -> QueryDef[Any]: ...


def query(name: str, result_type: Any = Any) -> QueryDef[Any]:
    """Declares a query: ``status = fusee.query("status", result_type=Status)``.

    Callers get answers converted to ``result_type``; without one, answers
    must be plain JSON (see :func:`fusee.codec.convert`).
    """
    return QueryDef(_check_name("query", name), result_type)


@typing.overload
def update(name: str) -> UpdateDef[Any]: ...


@typing.overload
def update(name: str, arg_type: type[T], result_type: Any = Any) -> UpdateDef[T]: ...


@typing.overload
def update(name: str, arg_type: Any, result_type: Any = Any) -> UpdateDef[Any]: ...


def update(name: str, arg_type: Any = Any, result_type: Any = Any) -> UpdateDef[Any]:
    """Declares an update: ``add = fusee.update("add", int, result_type=int)``.

    Arguments are checked against ``arg_type`` before anything is recorded;
    handler results are recorded as ``result_type`` and callers get them
    converted to it. Where a type is not given, values must be plain JSON.
    """
    return UpdateDef(_check_name("update", name), arg_type, result_type)


In = TypeVar("In")
Out = TypeVar("Out")


class _WorkflowDecorator(typing.Protocol):
    """What ``@fusee.workflow(...)`` applies: it keeps the function's input and result types."""

    @typing.overload
    def __call__(self, fn: Callable[[Ctx], Awaitable[Out]]) -> WorkflowDef[None, Out]: ...

    @typing.overload
    def __call__(self, fn: Callable[[Ctx, In], Awaitable[Out]]) -> WorkflowDef[In, Out]: ...


def workflow(
    name: str | None = None, *, version: int = 1, debounce: Any = None, batch: Any = None
) -> _WorkflowDecorator:
    """Declares an ``async def`` as a durable workflow.

    The function takes a :class:`fusee.Ctx` and at most one input; its
    annotations type the input and the result (JSON types, dataclasses,
    TypedDicts, msgspec Structs, pydantic models).

    ``debounce=fusee.Debounce(...)`` or ``batch=fusee.Batch(...)`` makes it a
    window workflow: its input is the ``list`` of events that
    ``engine.enqueue`` gathered for one key (see docs/flow.md).
    """
    if callable(name) and not isinstance(name, str):
        raise TypeError("use @fusee.workflow(\"name\") with a name, not bare @fusee.workflow")
    from fusee.flow.rules import Batch, Debounce

    if debounce is not None and batch is not None:
        raise TypeError("a workflow takes debounce= or batch=, not both")
    if debounce is not None and not isinstance(debounce, Debounce):
        raise TypeError(f"debounce= takes a fusee.Debounce(...), got {debounce!r}")
    if batch is not None and not isinstance(batch, Batch):
        raise TypeError(f"batch= takes a fusee.Batch(...), got {batch!r}")
    window = debounce if debounce is not None else batch

    def wrap(fn: Callable[..., Awaitable[Any]]) -> WorkflowDef[Any, Any]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"workflow {fn.__name__!r} must be an 'async def' function")
        wname = _check_name("workflow", name if name is not None else fn.__name__)
        if not isinstance(version, int) or version < 1:
            raise TypeError(f"workflow version must be a positive int, got {version!r}")
        params = list(inspect.signature(fn).parameters.values())
        if not params or len(params) > 2:
            raise TypeError(
                f"workflow {wname!r} must take (ctx) or (ctx, input), got {len(params)} parameters"
            )
        try:
            hints = typing.get_type_hints(fn)
        except Exception:
            # Some annotation does not resolve (``ctx: Ctx`` imported only for
            # type checkers, say): resolve the two that type values one by one.
            hints = {}
        if len(params) == 2:
            input_type = _annotation(wname, fn, hints, params[1].name, params[1].annotation)
        else:
            input_type = type(None)
        result_type = _annotation(wname, fn, hints, "return", inspect.signature(fn).return_annotation)
        if window is not None and (len(params) != 2 or ":" in wname):
            raise TypeError(
                f"window workflow {wname!r} must take (ctx, events: list[Event]) and have a name "
                "without ':' (its window run IDs are '<name>:<key>#<n>')"
            )
        return WorkflowDef(wname, fn, version, input_type, result_type, len(params) == 2, window)

    return wrap


def _annotation(workflow: str, fn: Callable[..., Any], hints: dict[str, Any], name: str, raw: Any) -> Any:
    """The type an input or result annotation names (``Any`` when there is none).

    A string annotation that names nothing resolvable is an error now, not a
    silent ``Any``: the type decides how recorded values convert back.
    """
    if name in hints:
        return hints[name]
    if raw is inspect.Parameter.empty or raw is inspect.Signature.empty:
        return Any
    if not isinstance(raw, str):
        return raw
    try:
        return eval(raw, getattr(fn, "__globals__", {}))  # what get_type_hints does for one annotation
    except Exception as error:
        from fusee.errors import SerializationError

        what = "result" if name == "return" else f"input '{name}'"
        raise SerializationError(
            f"workflow '{workflow}': the annotation {raw!r} of its {what} does not resolve ({error}); "
            "annotations are evaluated in the function's module, so define or import the type at "
            "module level"
        ) from None
