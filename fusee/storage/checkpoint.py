"""The checkpoint file: an opaque snapshot of shard state as of per-shard log positions.

Format: magic, version, shard count, start segment, state length, one LSN per
shard, the state, then crc32c of everything before it. It is replaced
atomically (temp file, fdatasync, rename, directory fsync), so a crash leaves
the old or the new checkpoint, never a mix.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fusee.storage.batch import U32, crc

CKPT_MAGIC = b"FUSECKPT"
CKPT_VERSION = 1
CKPT_HEADER = struct.Struct("<8sHIQQ")
NAME = "checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    #: Every record of shard ``s`` with LSN ≤ ``lsns[s]`` is part of ``state``.
    lsns: tuple[int, ...]
    #: The first segment recovery must read (earlier ones are wholly covered).
    start_segment: int
    state: bytes

    def encode(self) -> bytes:
        head = CKPT_HEADER.pack(CKPT_MAGIC, CKPT_VERSION, len(self.lsns), self.start_segment,
                                len(self.state))
        body = head + struct.pack(f"<{len(self.lsns)}Q", *self.lsns) + self.state
        return body + U32.pack(crc(body))

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint | None:
        """The checkpoint, or None if the bytes are damaged or incomplete."""
        if len(data) < CKPT_HEADER.size + 4:
            return None
        magic, version, shards, start, state_len = CKPT_HEADER.unpack_from(data)
        want = CKPT_HEADER.size + 8 * shards + state_len + 4
        if magic != CKPT_MAGIC or version != CKPT_VERSION or len(data) != want:
            return None
        if U32.unpack_from(data, want - 4)[0] != crc(data[:want - 4]):
            return None
        lsns = struct.unpack_from(f"<{shards}Q", data, CKPT_HEADER.size)
        state = data[CKPT_HEADER.size + 8 * shards:want - 4]
        return cls(tuple(lsns), start, bytes(state))
