"""The routing protocol's frames: a 4-byte big-endian length, then a msgpack body.

A request is ``[id, method, args]``; its reply ``[id, OK, value]`` or
``[id, ERROR, error]``. Requests on one connection are answered in any order
(multiplexed by ``id``). Values are plain (msgpack types); workflow payloads
travel as JSON bytes from :mod:`fusee.codec`, so each side types them with its
own annotations. An error travels as its type's module and name, its message
and its plain attributes, and is raised again on the caller's side as the same
``fusee.errors`` type with the same message.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import struct
from typing import Any

import msgspec

from fusee import errors

OK = 0
ERROR = 1
_LEN = struct.Struct(">I")
#: The largest frame either side accepts (a payload larger than the engine stores would be refused anyway).
MAX_FRAME = 256 << 20

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def frame(message: Any) -> bytes:
    body = _encoder.encode(message)
    return _LEN.pack(len(body)) + body


class Outbox:
    """Frames written to one stream, sent together once per loop turn: many calls (a fan-out's
    starts, their replies) cost one ``send`` instead of one each."""

    __slots__ = ("_frames", "_writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._frames: list[bytes] = []

    def write(self, data: bytes) -> None:
        """Queues ``data`` (raises what the stream raises when it is already closed)."""
        if self._writer.is_closing():
            raise ConnectionResetError("the routing connection is closed")
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._send)
        self._frames.append(data)

    def _send(self) -> None:
        frames, self._frames = self._frames, []
        if frames and not self._writer.is_closing():
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                self._writer.write(b"".join(frames))


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message; ``asyncio.IncompleteReadError`` at the end of the stream."""
    head = await reader.readexactly(_LEN.size)
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ConnectionError(f"a routed frame of {n} bytes is larger than the limit ({MAX_FRAME})")
    return _decoder.decode(await reader.readexactly(n))


def _plain(value: Any) -> bool:
    try:
        _encoder.encode(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def error_to_wire(e: BaseException) -> dict[str, Any]:
    cls = type(e)
    args = [a for a in e.args if _plain(a)] if len(e.args) == len([a for a in e.args if _plain(a)]) else [str(e)]
    attrs = {k: v for k, v in vars(e).items() if not k.startswith("_") and _plain(v)}
    return {"module": cls.__module__, "type": cls.__qualname__, "message": str(e), "args": args, "attrs": attrs}


def error_from_wire(d: dict[str, Any]) -> BaseException:
    """The same exception type as the owner raised (a ``fusee.errors`` or builtin type), with its
    message and plain attributes; a type of another module comes back as ``FuseeError``."""
    name, module, message = d.get("type", ""), d.get("module", ""), str(d.get("message", ""))
    cls: Any = None
    if module == errors.__name__:
        cls = getattr(errors, name, None)
    elif module == "builtins":
        cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return errors.FuseeError(f"{module}.{name}: {message}")
    e = cls.__new__(cls)
    BaseException.__init__(e, *d.get("args", [message]))
    for k, v in (d.get("attrs") or {}).items():
        try:
            setattr(e, k, v)
        except AttributeError:
            pass
    if str(e) != message:  # a type whose __str__ is computed: keep the owner's text
        BaseException.__init__(e, message)
    return e
