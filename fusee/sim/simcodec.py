"""A deterministic payload codec for the simulator, with key IDs and rotation.

AES-GCM draws a random nonce per payload (``os.urandom``), which a simulation
cannot replay from its seed; this stand-in (as the original's ``SimCodec``)
keeps the shape that matters to the engine: every payload passes through it,
its output names the key that decodes it, the current key changes at every
crash (rotation), a payload of a key it lacks is a typed error, and a payload
is bound to where it is stored (a checksum of its associated data, checked on
decode): if recovery, parking, a checkpoint, reset, fork or continue-as-new
ever read a payload elsewhere than where it was written, the seed fails with
``DecryptionFailed``. The real cipher is tested outside the simulator
(``tests/engine/test_encryption.py``).
"""

from __future__ import annotations

import zlib

from fusee.errors import DecryptionFailed, MissingKey

MAGIC = b"SIMC"
#: A payload bound to its associated data: ``SIMB``, key ID, crc32 of the data, body.
BOUND_MAGIC = b"SIMB"
#: Key IDs and the byte each one's "cipher" mixes in.
KEYS = {"s1": 0x5A, "s2": 0xA7}
#: Per key, the byte-wise XOR as a translation table (bytes.translate runs in C).
_XOR = {kid: bytes(b ^ x for b in range(256)) for kid, x in KEYS.items()}


class SimCodec:
    """Reverses the bytes and XORs them with the current key's byte, after ``SIMC`` and the key ID."""

    def __init__(self) -> None:
        self.current = "s1"
        self.encoded = 0
        self.decoded = 0
        self.rotations = 0

    def rotate(self) -> None:
        """New payloads use the other key; both stay readable."""
        self.current = "s2" if self.current == "s1" else "s1"
        self.rotations += 1

    def encode(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        self.encoded += 1
        body = data[::-1].translate(_XOR[self.current])
        if associated_data is None:
            return MAGIC + self.current.encode() + body
        return BOUND_MAGIC + self.current.encode() + zlib.crc32(associated_data).to_bytes(4, "big") + body

    def decode(self, data: bytes, associated_data: bytes | None = None) -> bytes:
        self.decoded += 1
        bound = data.startswith(BOUND_MAGIC)
        if not (bound or data.startswith(MAGIC)) or len(data) < (10 if bound else 6):
            raise DecryptionFailed("a stored payload is not a SimCodec payload")
        kid = data[4:6].decode("ascii", "replace")
        table = _XOR.get(kid)
        if table is None:
            raise MissingKey(kid)
        if not bound:
            return data[6:].translate(table)[::-1]
        if int.from_bytes(data[6:10], "big") != zlib.crc32(associated_data or b""):
            raise DecryptionFailed(f"a SimCodec payload of key {kid!r} is read elsewhere than where it was "
                                   "written (its associated data differs)", kid)
        return data[10:].translate(table)[::-1]
