"""The workflow table's entries: what the engine knows of each workflow ID."""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING

import msgspec

from fusee.core import records as rec
from fusee.runtime import index

if TYPE_CHECKING:
    from fusee.runtime.run import Run


class WorkflowState(msgspec.Struct, gc=False):
    """What the engine knows of one workflow ID: its current run and how it ended.

    Not tracked by Python's cycle collector (``gc=False``): an engine keeps
    one per workflow, parked ones included, and a collector walking a million
    of them on every full collection costs more than the rest of a start.
    ``run`` and ``waiters`` do lead back to it (through the runtime), so a
    runtime that is done with (closed, or a crashed life in the simulator) calls
    ``Runtime.release_table``, or everything it held would live forever.
    """

    id: str
    shard: int
    wtype: str = ""
    run_id: int = 0
    parent: rec.ParentRef | None = None
    journal: list[rec.Record] = msgspec.field(default_factory=list)
    lsns: list[int] = msgspec.field(default_factory=list)
    run: Run | None = None
    #: How the current run ended (None while it runs).
    status: rec.Status | None = None
    payload: bytes = b""
    done_lsn: int = 0
    #: The ending is durable and is not a hand-over to a next run.
    final: bool = False
    #: Callers waiting for the result (made when the first one comes).
    waiters: list[asyncio.Future[None]] | None = None
    #: The journal, encoded, while no code of the run is in memory (parked or finished).
    packed: bytes | None = None
    #: The packed journal holds a child or a message to another workflow.
    outbox: bool = False
    #: The run ended and its parent, on another part, has not acknowledged the result yet.
    owes_parent: bool = False
    #: A parked run's earliest timer or deadline (0: none).
    wake_ms: int = 0
    #: Fingerprint of the code that last replayed the run (see ``fusee.runtime.verify``).
    code: int = 0
    #: The workflow version the current run started with (its code replays on that version).
    version: int = 1
    #: When this state was made, as a number increasing in the table's order: ``Engine.list``
    #: sorts and pages by it (one counter per process, see ``fusee.runtime.index``).
    seen: int = msgspec.field(default_factory=index.seen_counter.__next__)

    @property
    def running(self) -> bool:
        return self.status is None or self.status == rec.Status.CONTINUED


NO_RECORDS: list[rec.Record] = []
NO_LSNS: list[int] = []



def shard_of(workflow_id: str, shards: int) -> int:
    """The shard of a workflow ID: a stable hash (not Python's per-process ``hash``)."""
    h = hashlib.blake2b(workflow_id.encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % shards


def dedup_key(text: str) -> int:
    """A non-zero 63-bit key for a signal's deduplication text."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return (h >> 1) or 1

def has_outbox(st: WorkflowState) -> bool:
    """Whether the journal holds a child or a message to another workflow."""
    if st.packed is not None:
        return st.outbox
    return any(type(r) is rec.Child or type(r) is rec.Send for r in st.journal)
