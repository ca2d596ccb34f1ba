"""Values to bytes and back, typed by annotations; errors recorded as data.

Workflow inputs and results, step results and signal, update and query
payloads are journaled as JSON (``msgspec.json``). Supported values: JSON types
(None, bool, int, float, str, list, dict), tuples, sets, bytes (base64),
dataclasses, TypedDicts, NamedTuples, msgspec Structs, enums, datetime/date/
time/timedelta, UUID, Decimal, and pydantic v2 models (pydantic is optional and
imported only when a pydantic type shows up). Decoding converts to the
annotated type, so a function's annotations are the schema.

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
                raise SerializationError(f"cannot decode the bytes as JSON: {error}") from error
            except RecursionError:
                raise SerializationError(f"cannot decode the bytes: nested deeper than {MAX_DEPTH} levels") from None
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
                raise SerializationError(f"cannot convert the bytes to {name}: {error}") from error
            except msgspec.DecodeError as error:
                raise SerializationError(f"cannot decode the bytes as JSON for {name}: {error}") from error
            except RecursionError:
                raise SerializationError(
                    f"cannot decode the bytes as {name}: nested deeper than {MAX_DEPTH} levels") from None

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


def encode(value: object) -> bytes:
    """The JSON bytes of ``value``; raises SerializationError naming an unsupported type."""
    return _default.encode(value)


def decode(data: bytes | bytearray | memoryview, tp: object = Any) -> Any:
    """The value of annotated type ``tp`` in ``data``; SerializationError names type and field on failure."""
    return _default.decode(data, tp)


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
