"""Records as bytes at rest: the one place payloads pass through the engine's codec.

Every record the engine stores (the log, blobs, packed journals of parked and
ended runs, checkpoints) becomes bytes through :meth:`Sealer.encode` and comes
back through :meth:`Sealer.decode`. With a codec (``Engine.open(codec=...)``)
every ``bytes`` field of a record (found from the record types themselves, so
a field added later is covered too) is encoded by it; IDs, names, positions,
times and the record's kind stay readable. Empty payloads and ``None`` stay as
they are.

A sealed record starts with :data:`SEALED` instead of the format version
byte, so a log may mix both: records written before a codec was configured
stay readable, and a sealed record read without a codec is a typed error
(:class:`fusee.errors.MissingKey`), never garbage.
"""

from __future__ import annotations

import typing
from typing import Any, Final

import msgspec

from fusee.core import records as rec
from fusee.encryption import Codec
from fusee.errors import CodecError, CorruptRecord, MissingKey

#: First byte of a sealed record (a plain one starts with ``rec.FORMAT_VERSION``).
SEALED: Final = 0x80 | rec.FORMAT_VERSION
_SEALED_BYTE: Final = bytes([SEALED])

#: Per field to seal: its name, and for a nested struct the plan of its own fields.
Plan = tuple[tuple[str, Any], ...]


def _plan(tp: Any) -> Plan:
    hints = typing.get_type_hints(tp)
    out: list[tuple[str, Any]] = []
    for name in tp.__struct_fields__:
        kinds = set(typing.get_args(hints[name])) or {hints[name]}
        kinds.discard(type(None))
        if kinds == {bytes}:
            out.append((name, None))
        elif len(kinds) == 1:
            (kind,) = kinds
            if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
                sub = _plan(kind)
                if sub:
                    out.append((name, sub))
    return tuple(out)


#: The payload fields of every record type.
PLANS: Final[dict[type, Plan]] = {t: _plan(t) for t in rec.RECORD_TYPES}

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[rec.Record] = msgspec.msgpack.Decoder(rec.Record)


def _transform(value: Any, plan: Plan, fn: Any) -> Any:
    changes: dict[str, Any] = {}
    for name, sub in plan:
        v = getattr(value, name)
        if not v:
            continue  # None and b"" stay as they are
        changes[name] = fn(v) if sub is None else _transform(v, sub, fn)
    return msgspec.structs.replace(value, **changes) if changes else value


def peek(data: bytes | bytearray | memoryview) -> rec.Record:
    """The record in ``data``, its payloads left as stored (ciphertext if sealed).

    For reading what stays readable (kinds, IDs, times) without the codec.
    """
    if len(data) >= 2 and data[0] == SEALED:
        try:
            return _decoder.decode(memoryview(data)[1:])
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, OverflowError,
                RecursionError) as e:
            raise CorruptRecord(f"sealed record does not decode: {e}") from None
    return rec.decode(data)


class Sealer:
    """Encodes records to their bytes at rest and back, through ``codec`` if there is one."""

    __slots__ = ("codec", "decode", "encode")

    def __init__(self, codec: Codec | None = None) -> None:
        self.codec = codec
        # Without a codec the plain functions themselves: no cost on the step path.
        self.encode: typing.Callable[[rec.Record], bytes] = rec.encode if codec is None else self._seal
        self.decode: typing.Callable[[bytes | bytearray | memoryview], rec.Record] = (
            _plain_decode if codec is None else self._open)

    def seal_bytes(self, data: bytes) -> bytes:
        """One payload as stored (unchanged without a codec, or when empty)."""
        if self.codec is None or not data:
            return data
        return self._encode_payload(data)

    def open_bytes(self, data: bytes) -> bytes:
        """The payload :meth:`seal_bytes` stored as ``data`` with a codec (MissingKey without one)."""
        if not data:
            return data
        if self.codec is None:
            raise MissingKey("", "the checkpoint holds encrypted payloads and the engine was opened "
                             "without a codec: open it with the codec= (and keys) it was written with")
        return self._decode_payload(data)

    def _encode_payload(self, data: bytes) -> bytes:
        assert self.codec is not None
        try:
            out = self.codec.encode(bytes(data))
        except CodecError:
            raise
        except Exception as e:
            raise CodecError(f"the payload codec {self.codec!r} failed to encode a payload: "
                             f"{type(e).__name__}: {e}") from e
        if not isinstance(out, bytes) or not out:
            raise CodecError(f"the payload codec {self.codec!r} returned {type(out).__name__} "
                             "from encode: it must return non-empty bytes")
        return out

    def _decode_payload(self, data: bytes) -> bytes:
        assert self.codec is not None
        try:
            out = self.codec.decode(bytes(data))
        except CodecError:
            raise
        except Exception as e:
            raise CodecError(f"the payload codec {self.codec!r} failed to decode a stored payload: "
                             f"{type(e).__name__}: {e}") from e
        if not isinstance(out, bytes | bytearray):
            raise CodecError(f"the payload codec {self.codec!r} returned {type(out).__name__} "
                             "from decode: it must return bytes")
        return bytes(out)

    def _seal(self, r: rec.Record) -> bytes:
        plan = PLANS[type(r)]
        if plan:
            r = _transform(r, plan, self._encode_payload)
        return _SEALED_BYTE + _encoder.encode(r)

    def _open(self, data: bytes | bytearray | memoryview) -> rec.Record:
        if len(data) < 2 or data[0] != SEALED:
            return rec.decode(data)  # plain: written without a codec
        r = peek(data)
        assert self.codec is not None
        plan = PLANS[type(r)]
        return _transform(r, plan, self._decode_payload) if plan else r


def _plain_decode(data: bytes | bytearray | memoryview) -> rec.Record:
    """``rec.decode`` (no cost on the way of plain records), naming a sealed record for what it is."""
    try:
        return rec.decode(data)
    except CorruptRecord:
        if len(data) >= 2 and data[0] == SEALED:
            raise MissingKey("", _without_codec(peek(data))) from None
        raise


def _without_codec(r: rec.Record) -> str:
    return (
        f"a {type(r).__name__} record of run {r.run} holds encrypted payloads, and the engine was "
        "opened without a codec: open it with the codec= (and keys) it was written with"
    )
