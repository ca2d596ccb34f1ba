"""Journals at rest: a parked or finished run's packed journal, and checkpoint entries."""

from __future__ import annotations

import msgspec

from fusee.core import records as rec
from fusee.runtime.sealing import Sealer


def pack(journal: list[rec.Record], lsns: list[int], sealer: Sealer) -> bytes:
    """A run's journal as one bytes object: what a parked or finished run keeps in memory.

    Its records are as at rest (``sealer``): a checkpoint writes it as it is.
    """
    enc = sealer.encode
    return msgspec.msgpack.encode([(lsn, enc(r)) for lsn, r in zip(lsns, journal, strict=True)])


def unpack(packed: bytes, sealer: Sealer) -> tuple[list[rec.Record], list[int]]:
    items = msgspec.msgpack.decode(packed, type=list[tuple[int, bytes]])
    dec = sealer.decode
    return [dec(data) for _, data in items], [lsn for lsn, _ in items]


def first_record(packed: bytes, sealer: Sealer) -> rec.Record | None:
    """The first record of a packed journal (None if it is empty), without decoding the rest.

    A parent with thousands of children is asked for its Start at every child start.
    """
    items = msgspec.msgpack.decode(packed, type=list[tuple[int, msgspec.Raw]])
    if not items:
        return None
    return sealer.decode(msgspec.msgpack.decode(items[0][1], type=bytes))


class CheckpointEntry(msgspec.Struct, array_like=True, gc=False):
    """One workflow in a checkpoint."""

    id: str
    shard: int
    wtype: str
    run_id: int
    parent: rec.ParentRef | None
    #: How the current run ended, or -1 while it runs.
    status: int
    #: A parked run's next timer (0: none), or -1 for a run to replay at open.
    wake_ms: int
    journal: bytes
    #: The journal holds children or messages to other workflows: at open they
    #: are checked (resent) without replaying the run.
    outbox: bool = False
    #: Fingerprint of the workflow code that last replayed the run (0: unknown):
    #: a parked run whose code changed since is checked at open.
    code: int = 0
    #: The workflow version the run started with.
    version: int = 1
    #: The run's merged search attributes (codec-encoded JSON object; b"": none),
    #: so that the attribute index is rebuilt at open without unpacking journals.
    attributes: bytes = b""
    #: ``attributes`` went through the engine's payload codec (``fusee.runtime.sealing``).
    sealed: bool = False
    #: The run ended and its parent, on another part, had not acknowledged the result: the
    #: next holder of the part sends it again.
    owes_parent: bool = False
