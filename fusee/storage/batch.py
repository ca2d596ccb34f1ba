"""The on-disk format of log segments and batches (see docs/storage.md).

A segment starts with a header in its first ``align`` bytes; batches follow,
each starting on an ``align`` boundary. A batch is a header, then per-shard
sections of length-prefixed records::

    segment header  magic "FUSEESEG", version, align, segment number, life,
                    salt, base seq, previous segment, its valid end, its last
                    batch crc, (version 2:) the preallocated size, header crc
    batch header    magic, length, crc, sections, seq, prev crc, records, life
    section         shard, count, first lsn, then ``count`` records
    record          u32 length (top bit: a blob reference) + bytes

The batch crc is crc32c over the segment's salt, then the batch with its crc
field left out. This module only encodes and decodes; it makes no decisions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

VERSION = 2
SEG_MAGIC = b"FUSEESEG"
BATCH_MAGIC = 0x31425346  # b"FSB1" little-endian
BATCH_MAGIC_BYTES = struct.pack("<I", BATCH_MAGIC)

SEG_HEADER_V1 = struct.Struct("<8sHHIQQQQQQII")
#: Version 2 adds the size the segment was preallocated to: a shorter file was cut.
SEG_HEADER = struct.Struct("<8sHHIQQQQQQIQI")
BATCH_HEADER = struct.Struct("<IIIIQIIQ")
SECTION = struct.Struct("<IIQ")
U32 = struct.Struct("<I")
BLOB_REF = struct.Struct("<QQQI")  # life, number, size, crc of the blob's bytes
BLOB_FLAG = 1 << 31
MAX_RECORD = BLOB_FLAG - 1
#: Bounds on what a segment header may say (a larger value is damage, not a segment).
MAX_ALIGN = 1 << 20
MAX_SEGMENT = 1 << 40

assert BATCH_HEADER.size == 40 and SECTION.size == 16


def crc(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """crc32c of ``data``, continuing from ``seed``."""
    return int(crc32c.crc32c(data, seed))


def align_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def salt_for(salt_seed: int, segment: int) -> int:
    """The salt of a segment: distinct per segment of a life, unpredictable across lives."""
    return (salt_seed + segment * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class SegmentHeader:
    align: int
    segment: int
    life: int
    salt: int
    base_seq: int  # seq of this segment's first batch
    prev_segment: int  # 0: none
    prev_end: int  # where the previous segment's accepted batches end
    prev_crc: int  # crc of the previous segment's last accepted batch (0: none)
    size: int = 0  # bytes preallocated at creation (0: a version-1 header, size unknown)
    crc: int = 0

    def encode(self) -> bytes:
        body = SEG_HEADER.pack(SEG_MAGIC, VERSION, 0, self.align, self.segment, self.life, self.salt,
                               self.base_seq, self.prev_segment, self.prev_end, self.prev_crc,
                               self.size, 0)
        return body[:-4] + U32.pack(crc(body[:-4]))

    @classmethod
    def decode(cls, data: bytes | memoryview) -> SegmentHeader | None:
        """The header, or None when the bytes are not a complete, intact one."""
        if len(data) < SEG_HEADER_V1.size:
            return None
        (version,) = struct.unpack_from("<H", data, 8)
        st = SEG_HEADER if version == VERSION else SEG_HEADER_V1
        if len(data) < st.size:
            return None
        fields = st.unpack_from(data)
        magic, version, _flags, align, segment, life, salt, base_seq, prev_segment, prev_end, prev_crc = fields[:11]
        size = fields[11] if st is SEG_HEADER else 0
        (stored,) = U32.unpack_from(data, st.size - 4)
        if magic != SEG_MAGIC or version not in (1, VERSION) or stored != crc(data[:st.size - 4]):
            return None
        if align < st.size or align & (align - 1) or align > MAX_ALIGN or size > MAX_SEGMENT:
            return None  # counts from disk are bounded before anything acts on them
        return cls(align, segment, life, salt, base_seq, prev_segment, prev_end, prev_crc, size, stored)

    def chain_start(self) -> int:
        """The ``prev crc`` the segment's first batch carries."""
        return self.crc


def seal(buf: bytearray, *, salt: int, sections: int, records: int, seq: int, prev_crc: int,
         life: int) -> int:
    """Fills in the header at the front of ``buf`` (reserved by the builder); returns the batch crc."""
    length = len(buf)
    assert length <= 0xFFFFFFFF, "a batch must stay under 4 GiB"
    BATCH_HEADER.pack_into(buf, 0, BATCH_MAGIC, length, 0, sections, seq, prev_crc, records, life)
    value = batch_crc(buf, salt)
    U32.pack_into(buf, 8, value)
    return value


def batch_crc(batch: bytes | bytearray | memoryview, salt: int) -> int:
    """The crc a batch must carry: over the salt, then the batch without its crc field."""
    view = memoryview(batch)
    value = crc(struct.pack("<Q", salt))
    value = crc(view[:8], value)
    return crc(view[12:], value)


@dataclass(frozen=True)
class BatchHeader:
    length: int
    crc: int
    sections: int
    seq: int
    prev_crc: int
    records: int
    life: int

    @classmethod
    def decode(cls, data: bytes | memoryview, offset: int) -> BatchHeader | None:
        """The header at ``offset`` if it starts with the magic and fits; no crc check."""
        if offset + BATCH_HEADER.size > len(data):
            return None
        magic, length, value, sections, seq, prev, records, life = BATCH_HEADER.unpack_from(data, offset)
        if magic != BATCH_MAGIC or length < BATCH_HEADER.size:
            return None
        return cls(length, value, sections, seq, prev, records, life)


@dataclass(frozen=True)
class BlobRef:
    life: int
    number: int
    size: int
    crc: int

    @property
    def name(self) -> str:
        return blob_name(self.life, self.number)


def blob_name(life: int, number: int) -> str:
    return f"{life:016x}-{number:08d}.blob"


class MalformedBatch(ValueError):
    """A batch whose crc is right but whose body does not parse (a bug, or sabotage)."""


def parse_body(batch: bytes | memoryview, sections: int, records: int
               ) -> list[tuple[int, int, bytes | BlobRef]]:
    """The batch's records as (shard, lsn, bytes or blob reference), in log order."""
    view = memoryview(batch)
    end = len(view)
    pos = BATCH_HEADER.size
    out: list[tuple[int, int, bytes | BlobRef]] = []
    for _ in range(sections):
        if pos + SECTION.size > end:
            raise MalformedBatch("section header past the end of the batch")
        shard, count, lsn = SECTION.unpack_from(view, pos)
        pos += SECTION.size
        for i in range(count):
            if pos + 4 > end:
                raise MalformedBatch("record length past the end of the batch")
            (n,) = U32.unpack_from(view, pos)
            pos += 4
            if n & BLOB_FLAG:
                if pos + BLOB_REF.size > end:
                    raise MalformedBatch("blob reference past the end of the batch")
                out.append((shard, lsn + i, BlobRef(*BLOB_REF.unpack_from(view, pos))))
                pos += BLOB_REF.size
            else:
                if pos + n > end:
                    raise MalformedBatch("record past the end of the batch")
                out.append((shard, lsn + i, bytes(view[pos:pos + n])))
                pos += n
    if pos != end or len(out) != records:
        raise MalformedBatch("batch length or record count disagrees with its sections")
    return out


class BatchBuilder:
    """Accumulates records (from the owner thread) into the bytes of one batch.

    The header's bytes are reserved up front and the body is built in place,
    so sealing a batch copies nothing.
    """

    __slots__ = ("blobs", "buf", "count", "count_at", "records", "sections", "shard")

    def __init__(self) -> None:
        self.buf = bytearray(BATCH_HEADER.size)
        self.sections = 0
        self.records = 0
        self.shard = -1  # shard of the open section
        self.count = 0  # records in the open section
        self.count_at = 0  # where the open section's count goes
        self.blobs: list[tuple[BlobRef, bytes]] = []

    def open_section(self, shard: int, first_lsn: int) -> None:
        if self.shard >= 0:
            U32.pack_into(self.buf, self.count_at, self.count)
        self.count_at = len(self.buf) + 4
        self.buf += SECTION.pack(shard, 0, first_lsn)
        self.shard = shard
        self.count = 0
        self.sections += 1

    def close_section(self) -> None:
        if self.shard >= 0:
            U32.pack_into(self.buf, self.count_at, self.count)
