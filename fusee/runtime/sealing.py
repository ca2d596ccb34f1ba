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

A codec that takes associated data (``fusee.encryption.binds``) gets with each
payload where it belongs: the record's kind, the field, and the record's
fields in :data:`BINDING` (its run, position, names). They are the record's
own readable fields, so they are the same wherever its bytes go (a
checkpoint, a parked journal, a blob), and whatever copies records to another
run (reset, fork, continue-as-new) copies plain records, sealed again with
their new run. A payload moved to another record or run then does not
decrypt: :class:`fusee.errors.DecryptionFailed` naming the run and record.
"""

from __future__ import annotations

import typing
from typing import Any, Final

import msgspec

from fusee.core import records as rec
from fusee.encryption import Codec, binds
from fusee.errors import CodecError, CorruptRecord, DecryptionFailed, MissingKey

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

#: Per record type with payloads, the fields its payloads are bound to (with its kind and
#: the field's name): where the record belongs (run, position, names) and what it says
#: (a status: an error is not a result). Frozen: never change an entry, or what was
#: written before stops decoding; a field added to a record later is simply not bound.
BINDING: Final[dict[type, tuple[str, ...]]] = {
    rec.Start: ("run", "id", "wtype", "version"),
    rec.Step: ("run", "seq", "name", "attempt", "status"),
    rec.Attempt: ("run", "seq", "name", "attempt"),
    rec.Resume: ("run", "seq", "attempt"),
    rec.Signal: ("run", "name", "dedup"),
    rec.Value: ("run", "seq", "kind"),
    rec.Child: ("run", "seq", "wtype", "id"),
    rec.ChildDone: ("run", "seq", "status"),
    rec.Send: ("run", "seq", "target", "name"),
    rec.Cancel: ("run",),
    rec.Done: ("run", "status"),
    rec.Update: ("run", "name", "id"),
    rec.UpdateDone: ("run", "seq", "ordinal", "status"),
    rec.Heartbeat: ("run", "seq", "attempt"),
    rec.Completed: ("run", "seq", "attempt", "status"),
    rec.Attributes: ("run", "seq"),
    rec.Chunk: ("run", "seq", "attempt", "stream", "offset"),
    rec.CancelRequest: ("run",),
}
#: Domains of associated data: a record's payload, and a checkpoint's attributes of a workflow.
_RECORD_DOMAIN: Final = "fusee.record"
_ATTRIBUTES_DOMAIN: Final = "fusee.attributes"
_TAGS: Final[dict[type, int]] = {t: t.__struct_config__.tag for t in rec.RECORD_TYPES}  # type: ignore[misc]

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[rec.Record] = msgspec.msgpack.Decoder(rec.Record)


def where(r: rec.Record, field: str) -> bytes:
    """The associated data of payload ``field`` (a dotted path) of record ``r``."""
    t = type(r)
    return _encoder.encode((_RECORD_DOMAIN, _TAGS[t], field, [getattr(r, f) for f in BINDING[t]]))


def _transform(r: rec.Record, value: Any, plan: Plan, fn: Any, prefix: str = "") -> Any:
    changes: dict[str, Any] = {}
    for name, sub in plan:
        v = getattr(value, name)
        if not v:
            continue  # None and b"" stay as they are
        path = prefix + name
        changes[name] = fn(v, r, path) if sub is None else _transform(r, v, sub, fn, path + ".")
    return msgspec.structs.replace(value, **changes) if changes else value


class _Binding(typing.Protocol):
    def encode(self, data: bytes, associated_data: bytes | None = None) -> bytes: ...

    def decode(self, data: bytes, associated_data: bytes | None = None) -> bytes: ...


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

    __slots__ = ("binds", "codec", "decode", "encode")

    def __init__(self, codec: Codec | None = None) -> None:
        self.codec = codec
        #: The codec takes associated data: each payload is bound to where it is stored.
        self.binds = codec is not None and binds(codec)
        # Without a codec the plain functions themselves: no cost on the step path.
        self.encode: typing.Callable[[rec.Record], bytes] = rec.encode if codec is None else self._seal
        self.decode: typing.Callable[[bytes | bytearray | memoryview], rec.Record] = (
            _plain_decode if codec is None else self._open)

    def seal_bytes(self, data: bytes, workflow_id: str) -> bytes:
        """Workflow ``workflow_id``'s attributes as a checkpoint stores them (unchanged without a codec, or when empty)."""
        if self.codec is None or not data:
            return data
        return self._encode_payload(data, _encoder.encode((_ATTRIBUTES_DOMAIN, workflow_id)))

    def open_bytes(self, data: bytes, workflow_id: str) -> bytes:
        """The attributes :meth:`seal_bytes` stored as ``data`` with a codec (MissingKey without one)."""
        if not data:
            return data
        if self.codec is None:
            raise MissingKey("", "the checkpoint holds encrypted payloads and the engine was opened "
                             "without a codec: open it with the codec= (and keys) it was written with")
        try:
            return self._decode_payload(data, _encoder.encode((_ATTRIBUTES_DOMAIN, workflow_id)))
        except DecryptionFailed as e:
            raise DecryptionFailed(
                f"the search attributes of workflow {workflow_id!r} in the checkpoint do not decrypt: "
                f"{e}. Restore the directory from a backup", e.key_id, record="checkpoint.attributes",
            ) from None

    def _encode_payload(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        assert self.codec is not None
        try:
            if associated_data is not None and self.binds:
                out = typing.cast(_Binding, self.codec).encode(bytes(data), associated_data=associated_data)
            else:
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

    def _decode_payload(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        assert self.codec is not None
        try:
            if associated_data is not None and self.binds:
                out = typing.cast(_Binding, self.codec).decode(bytes(data), associated_data=associated_data)
            else:
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

    def _seal_field(self, data: bytes, r: rec.Record, field: str) -> bytes:
        return self._encode_payload(data, where(r, field) if self.binds else None)

    def _open_field(self, data: bytes, r: rec.Record, field: str) -> bytes:
        try:
            return self._decode_payload(data, where(r, field) if self.binds else None)
        except DecryptionFailed as e:
            kind = type(r).__name__
            of = f" (workflow {r.id!r})" if isinstance(r, rec.Start) else ""
            raise DecryptionFailed(
                f"the {field} of a {kind} record of run {r.run}{of} does not decrypt, so it is not "
                f"used: {e}. Restore the directory from a backup (or find what changed its files)",
                e.key_id, run=r.run, record=f"{kind}.{field}",
            ) from None

    def _seal(self, r: rec.Record) -> bytes:
        plan = PLANS[type(r)]
        if plan:
            r = _transform(r, r, plan, self._seal_field)
        return _SEALED_BYTE + _encoder.encode(r)

    def _open(self, data: bytes | bytearray | memoryview) -> rec.Record:
        if len(data) < 2 or data[0] != SEALED:
            return rec.decode(data)  # plain: written without a codec
        r = peek(data)
        assert self.codec is not None
        plan = PLANS[type(r)]
        return _transform(r, r, plan, self._open_field) if plan else r


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
