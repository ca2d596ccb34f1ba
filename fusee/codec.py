"""Values to bytes and back, typed by annotations; errors recorded as data.

Workflow inputs and results, step results and signal, update and query
payloads are journaled as JSON (``msgspec.json``). Supported values: JSON types
(None, bool, int, float, str, list, dict), tuples, sets, bytes (base64),
dataclasses, TypedDicts, NamedTuples, msgspec Structs, enums, datetime/date/
time/timedelta, UUID, Decimal, and pydantic v2 models (pydantic is optional and
imported only when a pydantic type shows up). Decoding converts to the
annotated type, so a function's annotations are the schema.

Values are checked *before* they are recorded (:func:`convert`): a value
must convert to the type its reader declared, and where no type is declared
(``Any``: an unannotated step function, an untyped signal) it must be plain
JSON, which comes back as itself. A value that would come back as another
type (bytes as a base64 string, a tuple as a list, a dataclass as a dict) is
refused with a :class:`~fusee.errors.SerializationError` saying which type to
declare, so the value code sees live and on replay is always the same.

Errors are journaled as :class:`ErrorInfo` (type name, module, message and the
traceback text), never pickled: the exception object cannot survive a crash,
its description can.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
import sys
import traceback as tb
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from fusee.errors import RecordedError, SerializationError, StepFailed, WorkflowFailed

SUPPORTED = (
    "JSON types (None, bool, int, float, str, list, dict), tuples, sets, bytes, dataclasses, "
    "TypedDicts, NamedTuples, msgspec Structs, enums, datetime/date/time/timedelta, UUID, Decimal "
    "and pydantic v2 models"
)

#: Longest traceback text kept in an ErrorInfo (its last lines are the useful ones).
MAX_TRACEBACK_CHARS = 16_000
#: Deepest nesting of lists, dicts and objects a value may have. Checked when it is
#: encoded, so a value that is recorded can always be decoded again (decoding recurses).
MAX_DEPTH = 256


def _type_name(tp: object) -> str:
    if isinstance(tp, type):
        return tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
    return repr(tp).replace("typing.", "")


def _pydantic() -> Any:
    """The pydantic module if the program already imported it (a model can exist only then)."""
    return sys.modules.get("pydantic")


def _enc_hook(value: object) -> object:
    pydantic = _pydantic()
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    raise SerializationError(
        f"cannot encode a value of type {_type_name(type(value))}: supported are {SUPPORTED}"
    )


class Codec:
    """Converts Python values to JSON bytes and back, typed by annotations.

    Decoders are built once per type and cached. Instances are cheap; one
    module-level instance serves :func:`encode` and :func:`decode`.
    """

    def __init__(self) -> None:
        self._encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
        self._any = msgspec.json.Decoder()
        self._decoders: dict[object, Callable[[bytes | bytearray | memoryview], Any]] = {}

    def encode(self, value: object) -> bytes:
        """The JSON bytes of ``value``; raises SerializationError naming an unsupported type."""
        try:
            out = self._encoder.encode(value)
        except SerializationError:
            raise
        except RecursionError:
            raise SerializationError(
                f"cannot encode a value of type {_type_name(type(value))}: it is nested deeper than "
                f"{MAX_DEPTH} levels (or holds a reference cycle)"
            ) from None
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as error:
            raise SerializationError(
                f"cannot encode a value of type {_type_name(type(value))} ({error}): "
                f"supported are {SUPPORTED}"
            ) from error
        _check_encoded(value, out)
        return out

    def decode(self, data: bytes | bytearray | memoryview, tp: object = Any) -> Any:
        """The value of type ``tp`` in ``data`` (``Any``: plain JSON values).

        Raises SerializationError naming the type and the offending field when
        the bytes do not convert, or when ``tp`` is not a supported type.
        """
        if tp is Any or tp is object or tp is inspect.Parameter.empty:
            try:
                return self._any.decode(data)
            except msgspec.DecodeError as error:
                raise SerializationError(f"the value is not valid JSON: {error}") from error
            except RecursionError:
                raise SerializationError(f"the value is nested deeper than {MAX_DEPTH} levels") from None
        return self._decoder_for(tp)(data)

    def _decoder_for(self, tp: object) -> Callable[[bytes | bytearray | memoryview], Any]:
        try:
            return self._decoders[tp]
        except KeyError:
            decoder = self._build_decoder(tp)
            self._decoders[tp] = decoder
            return decoder
        except TypeError:  # an unhashable annotation: build it every time
            return self._build_decoder(tp)

    def _build_decoder(self, tp: object) -> Callable[[bytes | bytearray | memoryview], Any]:
        name = _type_name(tp)
        try:
            msgspec_decoder = msgspec.json.Decoder(type=tp, dec_hook=_dec_hook)
        except TypeError as unsupported:
            raise SerializationError(
                f"cannot decode values of type {name} ({unsupported}): supported are {SUPPORTED}"
            ) from None

        def decode(data: bytes | bytearray | memoryview) -> Any:
            try:
                return msgspec_decoder.decode(data)
            except msgspec.ValidationError as error:
                raise SerializationError(f"the value is not a valid {name}: {error}") from error
            except msgspec.DecodeError as error:
                raise SerializationError(f"the value for {name} is not valid JSON: {error}") from error
            except RecursionError:
                raise SerializationError(
                    f"the value for {name} is nested deeper than {MAX_DEPTH} levels") from None

        return decode


def _dec_hook(tp: type, value: object) -> object:
    """Builds the types msgspec does not know natively (pydantic models) from decoded JSON.

    A ValueError or TypeError raised here reaches the caller as a
    SerializationError naming the JSON path of the value.
    """
    pydantic = _pydantic()
    if pydantic is None and getattr(tp, "__pydantic_core_schema__", None) is not None:
        pydantic = importlib.import_module("pydantic")  # a pydantic class exists: it is installed
    if pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        model: Any = tp
        return model.model_validate(value)  # its ValidationError is a ValueError
    raise TypeError(f"{_type_name(tp)} is not a supported type (supported are {SUPPORTED})")


_STRINGS = re.compile(rb'"(?:[^"\\\\]|\\\\.)*"')
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _check_encoded(value: object, out: bytes) -> None:
    """Refuses what JSON cannot carry faithfully: NaN and infinities, and nesting past MAX_DEPTH.

    msgspec writes a non-finite float as ``null``, which would come back as None.
    Both checks cost nothing for the common value: they look closer only when
    ``null`` appears, or when there are at least MAX_DEPTH opening brackets.
    """
    if b"null" in out:
        _refuse_non_finite(value)
    if out.count(b"[") + out.count(b"{") > MAX_DEPTH:
        # Strings out, one kind of bracket; each pass removes the innermost pairs.
        shape = _STRINGS.sub(b"", out).translate(_TO_SQUARE, _NOT_BRACKETS)
        for _ in range(MAX_DEPTH):
            shape = shape.replace(b"[]", b"")
            if not shape:
                return
        raise SerializationError(
            f"cannot encode a value of type {_type_name(type(value))}: it is nested deeper than "
            f"{MAX_DEPTH} levels (the limit keeps every recorded value decodable)"
        )


def _refuse_non_finite(value: object) -> None:
    stack = [msgspec.to_builtins(value, enc_hook=_enc_hook)]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise SerializationError(
                f"cannot encode {v!r} (in a value of type {_type_name(type(value))}): JSON has no NaN or "
                "infinity, and writing null would come back as None. Encode it yourself, e.g. as a "
                "string or None"
            )
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


_default = Codec()

#: Decoders of the exact types, for the hot path of step results (``decode_exact``).
EXACT_DECODERS: dict[object, Callable[[bytes], Any]] = {
    t: msgspec.json.Decoder(type=t).decode for t in (int, str, bool)
}
#: What an exact decoder raises for bytes of another type (call :func:`decode` then, for the message).
ExactDecodeError = msgspec.DecodeError


def encode(value: object) -> bytes:
    """The JSON bytes of ``value``; raises SerializationError naming an unsupported type."""
    return _default.encode(value)


def decode(data: bytes | bytearray | memoryview, tp: object = Any) -> Any:
    """The value of annotated type ``tp`` in ``data``; SerializationError names type and field on failure."""
    return _default.decode(data, tp)


def is_undeclared(tp: object) -> bool:
    """Whether ``tp`` declares nothing (``Any``, ``object``, a missing annotation)."""
    return tp is Any or tp is object or tp is inspect.Parameter.empty


_JSON_SCALARS = frozenset({str, int, bool, type(None)})
#: Declared types a value of exactly that type converts to unchanged (not float: NaN).
_EXACT = frozenset({str, int, bool})


def _plain(value: object) -> bool:
    """Whether ``value`` is plain JSON (the fast check; :func:`_unfaithful` says where it is not)."""
    t = type(value)
    if t in _JSON_SCALARS:
        return True
    if t is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    if t is list:
        return all(map(_plain, value))  # type: ignore[call-overload]
    if t is dict:
        d: dict[Any, Any] = value  # type: ignore[assignment]
        return all(type(k) is str for k in d) and all(map(_plain, d.values()))
    return False


def _unfaithful(value: object) -> tuple[str, object] | None:
    """The first part of ``value`` that plain JSON would not give back as itself: (path, part).

    Plain JSON is None, bool, int, finite float, str, list, and dict with str
    keys (exact types: an IntEnum or a str subclass comes back as int or str).
    None when the whole value is plain JSON.
    """
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, v = stack.pop()
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            continue
        if t is float:
            if math.isfinite(v):  # type: ignore[arg-type]
                continue
            return path, v
        if t is list:
            assert isinstance(v, list)
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(v))))
            continue
        if t is dict:
            assert isinstance(v, dict)
            items = list(v.items())
            for k, _ in items:
                if type(k) is not str:
                    return f"{path}[{k!r}] (a key)", k
            stack.extend((f"{path}[{k!r}]", item) for k, item in reversed(items))
            continue
        return path, v
    return None


def _json_kind(data: bytes) -> str:
    back = _default.decode(data)
    return "null" if back is None else type(back).__name__


def convert(value: object, tp: object, *, what: str, declare: str) -> bytes:
    """The bytes to record for ``value``, which its reader will decode as ``tp``.

    Guarantees that decoding the bytes as ``tp`` succeeds and, when ``tp``
    declares nothing (``Any``), gives back a value of the same type as
    ``value``; otherwise raises :class:`SerializationError` before anything is
    recorded. ``what`` names the value in the message ("the input of workflow
    'x'"); ``declare`` says how to declare a type, with ``{type}`` standing
    for the value's type ("pass result_type={type} to ctx.step").
    """
    data = encode(value)
    if tp is type(value) and tp in _EXACT:
        return data  # decodes to itself: the hot path of typed steps skips the decode
    if is_undeclared(tp):
        try:
            plain = _plain(value)
        except RecursionError:  # nested deeper than the stack: the walk below has no limit
            plain = False
        found = None if plain else _unfaithful(value)
        if found is not None:
            path, part = found
            if type(part) is float:
                raise SerializationError(
                    f"{what} {'holds' if path else 'is'} {part!r}{' at ' + path if path else ''}, which JSON "
                    "cannot hold (it would come back as null): record None or a string instead"
                )
            if path.endswith("(a key)"):
                back = "str (JSON object keys are strings)"
            else:
                back = _json_kind(encode(part))
            kind = _type_name(type(part))
            where = f" holds {kind} at {path}, which" if path else f" is {kind}, which"
            top = _type_name(type(value))
            advice = declare.replace("{type}", f"{top}[...]" if path else top)
            raise SerializationError(
                f"{what}{where} would come back as {back}: values are recorded as JSON and no "
                f"type is declared to convert it back. To keep its type, {advice}; or use plain "
                "JSON values (None, bool, int, float, str, list, dict with str keys)"
            )
        return data
    try:
        _default.decode(data, tp)
    except SerializationError as e:
        raise SerializationError(f"{what} does not convert to its declared type {_type_name(tp)}: {e}") from None
    return data


def encode_input(workflow: Any, value: object) -> bytes:
    """A workflow's input as recorded, checked against its input annotation (see :func:`convert`)."""
    return convert(
        value,
        workflow.input_type,
        what=f"the input of workflow '{workflow.name}'",
        declare="annotate the workflow function's input parameter (input: {type})",
    )


def encode_result(workflow: Any, value: object) -> bytes:
    """A workflow's result as recorded, checked against its return annotation (see :func:`convert`)."""
    return convert(
        value,
        workflow.result_type,
        what=f"the result of workflow '{workflow.name}'",
        declare="annotate the workflow function's return type (-> {type})",
    )


def encode_signal(signal: Any, value: object) -> bytes:
    """A signal's value as recorded, checked against the signal's declared type (see :func:`convert`)."""
    return convert(
        value,
        signal.type,
        what=f"the value of signal '{signal.name}'",
        declare=f"declare the signal with its type: fusee.signal('{signal.name}', {{type}})",
    )


def encode_update_arg(update: Any, value: object) -> bytes:
    """An update's argument as recorded, checked against its declared type (see :func:`convert`)."""
    return convert(
        value,
        update.arg_type,
        what=f"the argument of update '{update.name}'",
        declare=f"declare the update with its type: fusee.update('{update.name}', {{type}})",
    )


def encode_update_result(update: Any, value: object) -> bytes:
    """An update handler's result as recorded, checked against the update's ``result_type``."""
    return convert(
        value,
        getattr(update, "result_type", Any),
        what=f"the result of update '{update.name}'",
        declare=f"declare the update's result type: fusee.update('{update.name}', ..., result_type={{type}})",
    )


def query_answer(query: Any, value: object) -> Any:
    """A query handler's answer as the caller gets it: a copy converted to the query's ``result_type``.

    A copy (through JSON), so that later changes of the workflow's state do
    not show through; checked like a recorded value (see :func:`convert`).
    """
    tp = getattr(query, "result_type", Any)
    data = convert(
        value,
        tp,
        what=f"the answer to query '{query.name}'",
        declare=f"declare the query's result type: fusee.query('{query.name}', result_type={{type}})",
    )
    return decode(data, tp)


def retype(value: object, tp: object) -> Any:
    """A plain JSON ``value`` (an untyped decode's) converted to ``tp``, as decoding its bytes as ``tp`` would."""
    if is_undeclared(tp):
        return value
    return decode(encode(value), tp)


def encode_step_result(op: Any, value: object) -> bytes:
    """A step's result as recorded, checked against its declared type.

    ``op`` has the step's ``name`` and its ``type`` (``result_type=``, else the
    function's return annotation, else ``Any``); see :func:`convert`.
    """
    tp = getattr(op, "type", Any)
    t = type(value)
    if t in _EXACT and (tp is t or tp is Any):
        # str, int and bool are JSON exactly and decode to themselves: nothing to check.
        return _default._encoder.encode(value)
    name = getattr(op, "name", "")
    return convert(
        value,
        getattr(op, "type", Any),
        what=f"the result of step '{name}'",
        declare=f"pass result_type={{type}} to ctx.step('{name}', ...) or annotate the step function's return type",
    )


# --- annotations --------------------------------------------------------------


def _annotated_function(fn: Callable[..., Any]) -> Any:
    """The plain function whose annotations describe calling ``fn``."""
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.ismethod(target):
        target = target.__func__
    if not inspect.isfunction(target) and not isinstance(target, type) and callable(target):
        call = inspect.getattr_static(type(target), "__call__", None)
        if inspect.isfunction(call):
            target = call
    return inspect.unwrap(target)


def type_hints_of(fn: Callable[..., Any]) -> tuple[list[object], object]:
    """The types of ``fn``'s positional parameters, in order, and of its result.

    Resolves string annotations (``from __future__ import annotations``) with
    ``typing.get_type_hints``; bound methods and ``functools.partial`` objects
    report only the parameters still to be passed. Unannotated parameters and
    results are ``Any``; ``-> None`` is ``NoneType``. Raises SerializationError
    when an annotation names something that cannot be resolved.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: nothing to go by
        return [], Any
    target = _annotated_function(fn)
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except NameError as error:
        name = getattr(fn, "__qualname__", repr(fn))
        raise SerializationError(
            f"cannot resolve the annotations of {name}: {error}. Annotations are evaluated in the "
            "function's module, so define or import the types they name at module level"
        ) from error
    except TypeError:  # not a function get_type_hints understands: use raw annotations
        hints = {}

    def resolve(name: str, raw: object) -> object:
        if name in hints:
            return hints[name]
        if raw is inspect.Parameter.empty or isinstance(raw, str):
            return Any
        return raw

    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [resolve(p.name, p.annotation) for p in signature.parameters.values() if p.kind in positional]
    return params, resolve("return", signature.return_annotation)


def return_type_of(fn: Callable[..., Any]) -> Any:
    """The type ``fn``'s return annotation names, or ``Any`` (none, or one that does not resolve).

    Sees through ``functools.partial``, bound methods and callable objects.
    Only the return annotation is resolved when another one does not (a
    parameter typed with a name imported only for type checkers).
    """
    target = _annotated_function(fn)
    if isinstance(target, type):
        return Any  # a class called as a step: its annotations are its fields
    try:
        return typing.get_type_hints(target).get("return", Any)
    except Exception:
        pass
    raw = getattr(target, "__annotations__", {}).get("return", Any)
    if not isinstance(raw, str):
        return raw
    try:
        return eval(raw, getattr(target, "__globals__", {}))  # as get_type_hints does, for this one
    except Exception:
        return Any


# --- errors -------------------------------------------------------------------


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An exception as data: what the journal keeps of a failure."""

    type: str
    module: str
    message: str
    traceback: str | None = None

    @property
    def qualname(self) -> str:
        """``module.Type`` (just ``Type`` for builtins)."""
        return self.type if self.module in ("builtins", "") else f"{self.module}.{self.type}"

    @property
    def summary(self) -> str:
        """``Type: message`` in one line."""
        return f"{self.qualname}: {self.message}" if self.message else self.qualname

    @classmethod
    def from_exception(cls, exc: BaseException, *, traceback: bool = True) -> ErrorInfo:
        """Describes ``exc``; keeps at most the last MAX_TRACEBACK_CHARS of its traceback."""
        kind = type(exc)
        text = None
        if traceback:
            text = "".join(tb.format_exception(exc))
            if len(text) > MAX_TRACEBACK_CHARS:
                text = "...\n" + text[-MAX_TRACEBACK_CHARS:]
        return cls(type=kind.__qualname__, module=kind.__module__, message=str(exc), traceback=text)

    def as_exception(self) -> RecordedError:
        """A stand-in exception carrying this description (for ``__cause__``)."""
        return RecordedError(self.type, self.module, self.message, self.traceback)

    def step_failed(self, step: str) -> StepFailed:
        """The StepFailed to raise in workflow code when step ``step`` failed with this error."""
        error = StepFailed(f"step {step!r} failed: {self.summary}", step=step, error_type=self.qualname)
        error.__cause__ = self.as_exception()
        return error

    def workflow_failed(self, workflow_id: str = "", *, status: str = "failed") -> WorkflowFailed:
        """The WorkflowFailed a caller gets for a run that ended with this error (``cause`` is self)."""
        run = f"workflow {workflow_id!r}" if workflow_id else "the workflow"
        error = WorkflowFailed(f"{run} {status}: {self.summary}", status=status, cause=self)
        error.__cause__ = self.as_exception()
        return error


_error_encoder = msgspec.json.Encoder()
_error_decoder = msgspec.json.Decoder(ErrorInfo)


def encode_error(exc: BaseException, *, traceback: bool = True) -> bytes:
    """The journal bytes describing ``exc`` (see :class:`ErrorInfo`)."""
    return _error_encoder.encode(ErrorInfo.from_exception(exc, traceback=traceback))


def decode_error(data: bytes | bytearray | memoryview) -> ErrorInfo:
    """The :class:`ErrorInfo` in bytes written by :func:`encode_error`."""
    try:
        return _error_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise SerializationError(f"the bytes do not hold a recorded error: {error}") from error
