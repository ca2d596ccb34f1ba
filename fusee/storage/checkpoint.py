"""The checkpoint file: an opaque snapshot of shard state as of per-shard log positions.

Format: magic, version, shard count, start segment, state length, (version
2:) the seq of the log's last batch when it was written, one LSN per shard,
the state, then crc32c of everything before it. Recovery refuses a log that
ends before that batch or before those LSNs: the checkpoint pins the log's end. It is replaced
atomically (temp file, fdatasync, rename, directory fsync), so a crash leaves
the old or the new checkpoint, never a mix.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fusee.storage.batch import U32, crc

CKPT_MAGIC = b"FUSECKPT"
CKPT_VERSION = 2
CKPT_HEADER_V1 = struct.Struct("<8sHIQQ")
CKPT_HEADER = struct.Struct("<8sHIQQQ")
NAME = "checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    #: Every record of shard ``s`` with LSN ≤ ``lsns[s]`` is part of ``state``.
    lsns: tuple[int, ...]
    #: The first segment recovery must read (earlier ones are wholly covered).
    start_segment: int
    state: bytes
    #: The seq of the last batch the log held when the checkpoint was written (0: unknown).
    end_seq: int = 0

    def encode(self) -> bytes:
        head = CKPT_HEADER.pack(CKPT_MAGIC, CKPT_VERSION, len(self.lsns), self.start_segment,
                                len(self.state), self.end_seq)
        body = head + struct.pack(f"<{len(self.lsns)}Q", *self.lsns) + self.state
        return body + U32.pack(crc(body))

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint | None:
        """The checkpoint, or None if the bytes are damaged or incomplete."""
        if len(data) < CKPT_HEADER_V1.size + 4:
            return None
        magic, version, shards, start, state_len = CKPT_HEADER_V1.unpack_from(data)
        head = CKPT_HEADER if version == CKPT_VERSION else CKPT_HEADER_V1
        want = head.size + 8 * shards + state_len + 4
        if magic != CKPT_MAGIC or version not in (1, CKPT_VERSION) or len(data) != want:
            return None
        if U32.unpack_from(data, want - 4)[0] != crc(data[:want - 4]):
            return None
        end_seq = head.unpack_from(data)[5] if head is CKPT_HEADER else 0
        lsns = struct.unpack_from(f"<{shards}Q", data, head.size)
        state = data[head.size + 8 * shards:want - 4]
        return cls(tuple(lsns), start, bytes(state), end_seq)
