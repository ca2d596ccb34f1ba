"""The blob area: records too large to copy into a batch, one durable file each.

A blob file is a header (magic, size, crc32c of the bytes) followed by the
bytes. The log writes and fdatasyncs every blob of a batch, then fsyncs the
blob directory, before it writes the batch that references them.
"""

from __future__ import annotations

import struct

from fusee.storage.batch import BlobRef, crc
from fusee.storage.seam import Storage

BLOB_MAGIC = b"FUSEBLOB"
BLOB_HEADER = struct.Struct("<8sQI")


def write_blob(storage: Storage, directory: str, ref: BlobRef, data: bytes, *, sync: bool = True) -> None:
    """Writes ``data`` as the blob ``ref`` names and makes its bytes durable (not yet its name).

    ``sync=False`` only for the ``early_blobs`` sabotage: the bytes stay in the page cache."""
    assert len(data) == ref.size
    fh = storage.open(f"{directory}/{ref.name}", create=True)
    try:
        storage.truncate(fh, 0)
        storage.pwrite(fh, BLOB_HEADER.pack(BLOB_MAGIC, ref.size, ref.crc) + data, 0)
        if sync:
            storage.fdatasync(fh)
    finally:
        storage.close(fh)


def read_blob(storage: Storage, directory: str, ref: BlobRef) -> bytes | None:
    """The blob's bytes, or None when it is missing or does not match ``ref``."""
    path = f"{directory}/{ref.name}"
    if not storage.exists(path):
        return None
    fh = storage.open(path)
    try:
        # The size comes from disk: read no more than the file holds.
        if storage.size(fh) != BLOB_HEADER.size + ref.size:
            return None
        raw = storage.pread(fh, BLOB_HEADER.size + ref.size, 0)
    finally:
        storage.close(fh)
    if len(raw) != BLOB_HEADER.size + ref.size:
        return None
    magic, size, value = BLOB_HEADER.unpack_from(raw)
    data = raw[BLOB_HEADER.size:]
    if magic != BLOB_MAGIC or size != ref.size or value != ref.crc or crc(data) != ref.crc:
        return None
    return data
