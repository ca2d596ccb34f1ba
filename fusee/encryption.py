"""Payload encryption at rest: the :class:`Codec` protocol and :class:`AesGcmCodec`.

An engine opened with ``codec=`` passes every payload it writes to disk
(inputs, results, step results and errors, signal, update and completion
values, heartbeat progress, stream chunks, search attributes, audit ``by``
fields) through ``codec.encode`` and every payload it reads back through
``codec.decode``. IDs, workflow and step names, positions, times and record
kinds stay readable, so operators can still list and inspect a log. The
engine applies the codec where records become bytes (``fusee.runtime.sealing``):
in memory, workflow and step code see plain values.

A codec's output must name what decodes it (a key ID), so that records written
before a key rotation stay readable: :class:`AesGcmCodec` writes its key ID in
front of every ciphertext and keeps a set of keys for reading.

A codec whose ``encode`` and ``decode`` take an ``associated_data`` keyword
gets, with every payload, the bytes that say where the payload is stored (its
record's kind, run and position, the field): it authenticates them with the
ciphertext, so a payload moved to another record or run does not decode.
:class:`AesGcmCodec` does (AES-GCM associated data); see docs/encryption.md.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from fusee.errors import DecryptionFailed, MissingKey

#: First byte of an :class:`AesGcmCodec` payload not bound to where it is stored
#: (written without associated data, as every payload was before format 2).
AESGCM_FORMAT = 1
#: First byte of an :class:`AesGcmCodec` payload bound to where it is stored: the
#: associated data given to ``encode`` is authenticated with the key header.
AESGCM_BOUND_FORMAT = 2
_NONCE = 12
_TAG = 16
_KEY_BYTES = 32


@runtime_checkable
class Codec(Protocol):
    """Turns payload bytes into the bytes stored at rest and back (encryption, a KMS, ...).

    ``decode(encode(data)) == data`` must hold for every ``data``, also in a
    later process and after the codec's current key changed: put whatever
    identifies the key (a key ID) into the encoded bytes. ``decode`` raises a
    :class:`fusee.errors.CodecError` subclass (:class:`fusee.errors.MissingKey`
    naming the key ID, :class:`fusee.errors.DecryptionFailed`) rather than
    return wrong bytes; any other exception it raises reaches the caller as a
    ``CodecError``. Both are called on the engine's event loop: keep them fast
    (cache data keys rather than calling a remote KMS per payload).

    Optionally, ``encode`` and ``decode`` also take an ``associated_data:
    bytes | None = None`` keyword (both or neither): the engine then passes
    the bytes naming where the payload is stored, the same to ``decode`` as
    to ``encode``, and the codec must refuse (``DecryptionFailed``) a payload
    whose associated data differs, as AEAD ciphers do. Payloads written
    before a codec took it must still decode (put a format version in the
    encoded bytes).
    """

    def encode(self, data: bytes) -> bytes:
        """The bytes to store for payload ``data``."""
        ...

    def decode(self, data: bytes) -> bytes:
        """The payload that ``encode`` turned into ``data``."""
        ...


def _aesgcm() -> tuple[Any, type[Exception]]:
    try:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError(
            "fusee.AesGcmCodec needs the 'cryptography' package: pip install 'fusee[crypto]'"
        ) from e
    return AESGCM, InvalidTag


class AesGcmCodec:
    """AES-256-GCM encryption of payloads, with key rotation.

    ``keys`` maps key IDs (non-empty strings of at most 255 UTF-8 bytes) to
    32-byte keys; ``current`` is the ID of the key new payloads are encrypted
    with. Every payload gets a fresh random 96-bit nonce (``os.urandom``), so
    encrypting the same value twice gives different bytes; stay well below
    2**32 payloads per key (rotate). The stored form is
    ``[format][id length][key id][nonce][ciphertext + 16-byte tag]``, the
    header (format, key ID) authenticated with the ciphertext. Given
    ``associated_data`` (the engine gives where the payload is stored), the
    format is :data:`AESGCM_BOUND_FORMAT` and that data is authenticated too:
    ``decode`` with other associated data fails. A payload of format
    :data:`AESGCM_FORMAT` (written without it, as before format 2) decodes
    whatever associated data ``decode`` is given. Decoding a payload whose key
    ID is not in ``keys`` raises :class:`fusee.errors.MissingKey`; a changed,
    cut or moved payload raises :class:`fusee.errors.DecryptionFailed`.
    """

    __slots__ = ("_bound_header", "_ciphers", "_current", "_header", "_invalid_tag", "current")

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise ValueError("AesGcmCodec needs keys={key_id: 32-byte key, ...} with at least one key")
        aesgcm, self._invalid_tag = _aesgcm()
        self._ciphers: dict[bytes, Any] = {}
        for key_id, key in keys.items():
            kid = _key_id_bytes(key_id)
            if not isinstance(key, bytes | bytearray) or len(key) != _KEY_BYTES:
                shown = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else type(key).__name__
                raise ValueError(
                    f"key {key_id!r} must be {_KEY_BYTES} bytes for AES-256 (got {shown}): create one with "
                    "fusee.AesGcmCodec.generate_key() and keep it in your secret store"
                )
            self._ciphers[kid] = aesgcm(bytes(key))
        if not isinstance(current, str) or current not in keys:
            raise ValueError(f"current={current!r} is not one of the key IDs in keys= ({sorted(keys)})")
        #: The ID of the key new payloads are encrypted with.
        self.current = current
        kid = current.encode()
        self._current = self._ciphers[kid]
        self._header = bytes([AESGCM_FORMAT, len(kid)]) + kid
        self._bound_header = bytes([AESGCM_BOUND_FORMAT, len(kid)]) + kid

    @staticmethod
    def generate_key() -> bytes:
        """A new random 32-byte AES-256 key (from the OS's secure random source)."""
        return os.urandom(_KEY_BYTES)

    def encode(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        """``data`` encrypted with the current key, tagged with its ID and a fresh nonce.

        With ``associated_data`` (bytes), the payload decodes only with the same
        associated data (format :data:`AESGCM_BOUND_FORMAT`); without, with any.
        """
        nonce = os.urandom(_NONCE)
        if associated_data is None:
            header = self._header
            sealed: bytes = self._current.encrypt(nonce, data, header)
        else:
            header = self._bound_header
            sealed = self._current.encrypt(nonce, data, header + associated_data)
        return header + nonce + sealed

    def decode(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        """The payload in ``data``; MissingKey or DecryptionFailed rather than wrong bytes.

        A bound payload (format 2) decodes only with the ``associated_data`` it
        was encoded with (None counts as empty); an unbound one (format 1,
        written before binding) decodes as it always did.
        """
        fmt = data[0] if data else -1
        if len(data) < 2 or fmt not in (AESGCM_FORMAT, AESGCM_BOUND_FORMAT):
            raise DecryptionFailed(
                "a stored payload is not in AesGcmCodec's format (it was written by another codec, or "
                "changed on disk): open the engine with the codec that wrote it"
            )
        n = data[1]
        kid = bytes(data[2:2 + n])
        body = 2 + n
        key_id = kid.decode("utf-8", "replace")
        if len(data) < body + _NONCE + _TAG:
            raise DecryptionFailed(f"a stored payload encrypted with key {key_id!r} is cut short", key_id)
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise MissingKey(key_id)
        aad = bytes(data[:body])
        if fmt == AESGCM_BOUND_FORMAT:
            aad += associated_data or b""
        try:
            plain: bytes = cipher.decrypt(bytes(data[body:body + _NONCE]), bytes(data[body + _NONCE:]), aad)
        except self._invalid_tag:
            if fmt == AESGCM_BOUND_FORMAT:
                raise DecryptionFailed(
                    f"a stored payload encrypted with key {key_id!r} does not decrypt where it is stored: "
                    "it was changed on disk or moved there from another record or run, or the key given "
                    f"as {key_id!r} is not the key that encrypted it", key_id
                ) from None
            raise DecryptionFailed(
                f"a stored payload encrypted with key {key_id!r} does not decrypt: it was changed on "
                f"disk, or the key given as {key_id!r} is not the key that encrypted it", key_id
            ) from None
        return plain

    def __repr__(self) -> str:  # never the keys
        ids = sorted(k.decode() for k in self._ciphers)
        return f"AesGcmCodec(keys={ids}, current={self.current!r})"


def _key_id_bytes(key_id: object) -> bytes:
    if not isinstance(key_id, str) or not key_id:
        raise ValueError(f"a key ID must be a non-empty string, got {key_id!r}")
    kid = key_id.encode()
    if len(kid) > 255:
        raise ValueError(f"key ID {key_id[:40]!r}... is longer than 255 UTF-8 bytes")
    return kid


def binds(codec: object) -> bool:
    """Whether ``codec``'s ``encode`` and ``decode`` both take an ``associated_data`` keyword.

    TypeError when only one of them does: the two must agree, or nothing
    encoded could be decoded.
    """
    takes = [_takes_associated_data(getattr(codec, m)) for m in ("encode", "decode")]
    if takes[0] != takes[1]:
        raise TypeError(
            f"the codec {codec!r} takes associated_data= in "
            f"{'encode' if takes[0] else 'decode'} but not in {'decode' if takes[0] else 'encode'}: "
            "give both methods the keyword (or neither)"
        )
    return takes[0]


def _takes_associated_data(method: object) -> bool:
    try:
        params = inspect.signature(method).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature: positional data only
        return False
    p = params.get("associated_data")
    return p is not None and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def check_codec(codec: object) -> Codec | None:
    """``codec`` if it has ``encode`` and ``decode`` (or None); TypeError naming what is missing."""
    if codec is None:
        return None
    missing = [m for m in ("encode", "decode") if not callable(getattr(codec, m, None))]
    if missing:
        raise TypeError(
            f"codec= takes an object with encode(bytes) -> bytes and decode(bytes) -> bytes "
            f"(see fusee.Codec), got {codec!r} without {' and '.join(missing)}"
        )
    return codec  # type: ignore[return-value]
