"""The blob area: records too large to copy into a batch, kept in one durable file per batch.

A blob file (a pack) holds the offloaded records of one batch, in the order
the batch references them: each is a header (magic, size, crc32c of the
bytes) followed by the bytes. The log writes and fdatasyncs the pack, then
fsyncs the blob directory, before it writes the batch that references it:
three syncs per batch, however many records it offloads. A file written
before packs existed holds one record, which is the same format.

Every reference to a pack names the pack (its life and number) with the
record's size and crc; the i-th reference a batch makes to a pack is its
i-th entry.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from fusee.storage.batch import BlobRef, crc
from fusee.storage.seam import Storage

BLOB_MAGIC = b"FUSEBLOB"
BLOB_HEADER = struct.Struct("<8sQI")


def encode_pack(blobs: Sequence[tuple[BlobRef, bytes]]) -> bytes:
    """The bytes of a pack holding ``blobs`` in order."""
    out = bytearray()
    for ref, data in blobs:
        assert len(data) == ref.size
        out += BLOB_HEADER.pack(BLOB_MAGIC, ref.size, ref.crc)
        out += data
    return bytes(out)


def write_pack(storage: Storage, directory: str, name: str, blobs: Sequence[tuple[BlobRef, bytes]], *,
               sync: bool = True) -> None:
    """Writes ``blobs`` as the pack ``name`` and makes its bytes durable (not yet its name).

    ``sync=False`` only for the ``early_blobs`` sabotage: the bytes stay in the page cache."""
    fh = storage.open(f"{directory}/{name}", create=True)
    try:
        storage.truncate(fh, 0)
        storage.pwrite(fh, encode_pack(blobs), 0)
        if sync:
            storage.fdatasync(fh)
    finally:
        storage.close(fh)


def write_blob(storage: Storage, directory: str, ref: BlobRef, data: bytes, *, sync: bool = True) -> None:
    """Writes a pack of one record, named by ``ref``."""
    write_pack(storage, directory, ref.name, [(ref, data)], sync=sync)


def decode_pack(raw: bytes) -> list[tuple[int, int, bytes]] | None:
    """A pack's entries as (size, crc, bytes), or None when any is damaged or bytes follow the last."""
    out: list[tuple[int, int, bytes]] = []
    pos, end = 0, len(raw)
    while pos < end:
        if end - pos < BLOB_HEADER.size:
            return None
        magic, size, value = BLOB_HEADER.unpack_from(raw, pos)
        pos += BLOB_HEADER.size
        if magic != BLOB_MAGIC or size > end - pos:
            return None
        data = raw[pos:pos + size]
        if crc(data) != value:
            return None
        out.append((size, value, data))
        pos += size
    return out if out else None


def read_pack(storage: Storage, directory: str, name: str) -> list[tuple[int, int, bytes]] | None:
    """The entries of the pack ``name``, or None when it is missing or damaged."""
    path = f"{directory}/{name}"
    if not storage.exists(path):
        return None
    fh = storage.open(path)
    try:
        raw = storage.pread(fh, storage.size(fh), 0)
    finally:
        storage.close(fh)
    return decode_pack(raw)


def entry(entries: list[tuple[int, int, bytes]] | None, index: int, ref: BlobRef) -> bytes | None:
    """The ``index``-th entry of a pack if it is the record ``ref`` describes, else None."""
    if entries is None or index >= len(entries):
        return None
    size, value, data = entries[index]
    if size != ref.size or value != ref.crc:
        return None
    return data


def read_blob(storage: Storage, directory: str, ref: BlobRef, index: int = 0) -> bytes | None:
    """The bytes of the ``index``-th record of the pack ``ref`` names, or None when it is
    missing or does not match ``ref``."""
    return entry(read_pack(storage, directory, ref.name), index, ref)
