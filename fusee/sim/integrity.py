"""The log's integrity under the worst power loss, checked at any moment of a seed.

A crash model that keeps, drops or tears unsynced writes at random finds an
ordering bug only when its dice fall the wrong way. This checker asks the
certain question instead: if the power failed *now* and every unsynced write
and name were lost, would the log open, would every intact batch find the
blobs it references, and would every record the engine counts as durable be
there? It looks at a copy of the disk, so the seed's own run is unchanged.
"""

from __future__ import annotations

import random

from fusee import errors
from fusee.sim import checkers
from fusee.storage.log import SharedLog
from fusee.storage.simdisk import SimDisk


@checkers.tallied
def check_log_integrity(disk: SimDisk, path: str, shards: int, segment_bytes: int,
                        durable: list[int] | None, when: str) -> list[str]:
    """Violations of the log at ``path`` as the worst power loss at this moment would leave it.

    ``durable``: per shard, the last position the engine counts durable (it acknowledged
    work up to there), or None when the engine promises nothing (its log failed).
    """
    image = disk.worst_case_image()
    try:
        log, _ = SharedLog.open(image, path, shards, segment_bytes=segment_bytes, read_only=True,
                                rng=random.Random(0))
    except errors.LogCorrupted as e:
        return [f"log integrity {when}: after the worst power loss the log does not open: {e}"]
    except errors.StorageError as e:
        return [f"log integrity {when}: after the worst power loss the directory does not open: "
                f"{type(e).__name__}: {e}"]
    try:
        kept = [log.durable(s) for s in range(shards)]
    finally:
        log.close()
    if durable is None:
        return []
    return [f"log integrity {when}: the engine counts shard {s}'s records up to {d} durable, but the "
            f"worst power loss keeps only up to {k}"
            for s, (d, k) in enumerate(zip(durable, kept, strict=True)) if k < d]
