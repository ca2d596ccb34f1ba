"""Recovery: rebuilding the workflow table from a checkpoint and the log after it, and resuming.

A checkpoint holds every workflow's current run (its packed journal, whether it
is parked and until when); the log after it adds records in order. At open,
unfinished runs that were loaded replay their code; parked ones stay parked,
and what any journal still owes others (children to start or hear from,
signals to send) is redone, since a crash may have lost it on the way.

Runs replay in batches of ``load_room`` (``Engine.open(recovery_batch=...)``):
the first batch before the open returns, each next one after the loop had a
turn, so the first runs' steps go on while later ones still wait to load. A
run something arrives for (a signal, a query) is loaded at once, out of turn.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from fusee.core import records as rec
from fusee.runtime import budget, history, parking
from fusee.runtime.index import decode_attributes
from fusee.runtime.snapshot import CheckpointEntry, pack, unpack
from fusee.runtime.table import WorkflowState, dedup_key, has_outbox
from fusee.runtime.timers import WAKE

log = logging.getLogger("fusee")

if TYPE_CHECKING:
    from fusee.limits import Limiter
    from fusee.runtime.index import AttributeIndex


class RecoveryHost(history.HistoryHost, parking.ParkingHost, Protocol):
    """What recovery asks of the runtime (``Runtime`` provides it): its tables, and the
    runtime's own ways to load, continue and redo runs (recovery calls them, it does not
    reimplement them)."""

    _outbox_at_open: set[str]
    #: Unfinished runs recovery has still to load, in order, and their IDs (what ``loaded``
    #: looks up to load one out of turn) with the run each was queued as.
    load_queue: collections.deque[WorkflowState]
    to_load: dict[str, int]
    #: Runs loaded per batch at open.
    load_room: int

    @property
    def by_run(self) -> dict[int, WorkflowState]: ...
    @property
    def index(self) -> AttributeIndex: ...
    @property
    def stuck(self) -> dict[str, str]: ...
    @property
    def limiter(self) -> Limiter: ...

    def journal_of(self, st: WorkflowState) -> tuple[list[rec.Record], list[int]]: ...
    def _load_run(self, st: WorkflowState) -> None: ...
    def _continue(self, st: WorkflowState) -> None: ...
    def _apply_close_policy(self, st: WorkflowState) -> None: ...
    def _send(self, fn: Callable[..., None], *args: Any) -> None: ...
    def _close_child(self, ref: rec.ParentRef, child: rec.Child) -> None: ...
    def _signal_quiet(self, target: str, name: str, payload: bytes, key: int) -> None: ...
    def _start_child(self, ref: rec.ParentRef, child: rec.Child) -> None: ...
    def report_to_parent(self, st: WorkflowState, *, again: bool = False) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


def load_records(rt: RecoveryHost, records: Iterable[tuple[int, int, rec.Record]]) -> None:
    """Rebuilds the workflow table from recovered records, in log order."""
    for shard, lsn, r in records:
        if type(r) is rec.Start:
            assert isinstance(r, rec.Start)
            st = rt.wf.get(r.id)
            if st is None:
                st = rt.wf[r.id] = WorkflowState(r.id, shard)
            if st.run_id:
                rt.by_run.pop(st.run_id, None)
            st.wtype = r.wtype
            st.version = r.version
            st.run_id = r.run
            st.parent = r.parent
            st.journal = [r]
            st.lsns = [lsn]
            st.packed = None
            st.status = None
            st.payload = b""
            st.final = False
            rt.by_run[r.run] = st
            rt.index.on_record(r.id, r)
            continue
        st2 = rt.by_run.get(r.run)
        if st2 is None or st2.run_id != r.run:
            continue  # a record of a run a later start replaced
        if st2.packed is not None:
            # New records for a parked run: it replays at open.
            st2.journal, st2.lsns = unpack(st2.packed, rt.sealer)
            st2.packed = None
        st2.journal.append(r)
        st2.lsns.append(lsn)
        if type(r) is rec.Attributes:
            rt.index.on_record(st2.id, r)
        if type(r) is rec.Done:
            assert isinstance(r, rec.Done)
            st2.status = r.status
            st2.payload = r.payload
            st2.done_lsn = lsn
            st2.final = r.status != rec.Status.CONTINUED


def resume_all(rt: RecoveryHost) -> None:
    """Queues every unfinished run to load and replay its code (the first batch loads now, the
    rest in the background); hands over continued runs.

    Parked runs stay parked; what their journals still owe others
    (children to start or to hear from, signals to send) is redone
    without replaying them, since a crash may have lost it on the way.
    """
    outbox = rt._outbox_at_open
    rt._outbox_at_open = set()
    for st in list(rt.wf.values()):
        if st.status is None:
            if st.packed is None:
                rt.load_queue.append(st)
                rt.to_load[st.id] = st.run_id
            elif st.id in outbox:
                redo_outbox(rt, st)
        elif st.status == rec.Status.CONTINUED:
            rt._continue(st)
    for st in list(rt.wf.values()):
        if st.final and st.packed is None and not rt.keep_history:
            history.trim(rt, st)  # ended in the log after the checkpoint: trimmed as a live run is
        if st.final and (st.packed is None or st.id in outbox):
            # A finished run's child starts and signals may have been lost on the way too.
            redo_outbox(rt, st)
            rt._apply_close_policy(st)
    load_batch(rt)
    if rt.load_queue:
        rt.spawn(load_rest(rt))


#: How long one batch of recovery replays before it lets the loop take a turn (the rest wait for
#: the next batch): a long journal's replay must not stall the other engines of the process
#: (the other parts it holds) for as long as all of it takes.
LOAD_TURN_S = 0.01


def load_batch(rt: RecoveryHost) -> None:
    """Loads and replays the next queued runs (those that still wait to load): at most
    ``load_room`` of them, and no more once the batch has replayed for :data:`LOAD_TURN_S`."""
    room = loaded = rt.load_room
    queue, to_load = rt.load_queue, rt.to_load
    clock = rt.env.monotonic
    until = clock() + LOAD_TURN_S
    rt.limiter.recovering = True  # steps issued now may have run before the crash
    try:
        while room > 0 and queue:
            st = queue.popleft()
            if to_load.pop(st.id, None) != st.run_id or not waits_to_load(rt, st):
                continue  # loaded out of turn, ended or replaced meanwhile
            rt._load_run(st)
            room -= 1
            if clock() >= until:
                break
    finally:
        rt.limiter.recovering = False
    if room < loaded:
        rt.stats["recovery_batches"] += 1
    log.debug("recovery loaded a batch of %d runs; %d still to load", loaded - room, len(queue))
    budget.settle(rt)


async def load_rest(rt: RecoveryHost) -> None:
    """The batches after the first, each once the loop has had a turn (the runs loaded so
    far run their steps meanwhile)."""
    while rt.load_queue and not rt.closed:
        await asyncio.sleep(0)
        if rt.closed:
            return
        load_batch(rt)


def waits_to_load(rt: RecoveryHost, st: WorkflowState) -> bool:
    """Whether ``st``'s run is unfinished, neither loaded nor parked nor stuck."""
    return st.status is None and st.run is None and st.packed is None and st.id not in rt.stuck


def load_now(rt: RecoveryHost, st: WorkflowState) -> bool:
    """Loads a run recovery queued, out of turn (something arrived for it); False if it was not queued."""
    if rt.to_load.pop(st.id, None) != st.run_id or not waits_to_load(rt, st):
        return False
    was, rt.limiter.recovering = rt.limiter.recovering, True
    try:
        rt._load_run(st)
    finally:
        rt.limiter.recovering = was
    return True


def redo_outbox(rt: RecoveryHost, st: WorkflowState) -> None:
    journal, _ = rt.journal_of(st)
    children: dict[int, rec.Child] = {}
    for r in journal:
        t = type(r)
        if t is rec.Child:
            assert isinstance(r, rec.Child)
            children[r.seq] = r
        elif t is rec.ChildDone:
            assert isinstance(r, rec.ChildDone)
            child = children.pop(r.seq, None)
            if child is not None and r.status == rec.Status.TIMED_OUT:
                # The parent stopped waiting; a crash may have kept the policy from the child.
                ref = rec.ParentRef(id=st.id, run=st.run_id, seq=r.seq)
                rt._send(rt._close_child, ref, child)
        elif t is rec.Send:
            assert isinstance(r, rec.Send)
            key = dedup_key(f"send:{r.run}:{r.seq}")
            rt._send(rt._signal_quiet, r.target, r.name, r.payload, key)
    for seq, child in children.items():
        ref = rec.ParentRef(id=st.id, run=st.run_id, seq=seq)
        rt._send(rt._start_child, ref, child)
    if st.final and st.parent is not None and (st.owes_parent or st.packed is None):
        # Ended after the checkpoint, or its parent had not acknowledged the result at it: a
        # parent on another part may still wait for it (the part changed hands meanwhile).
        start = journal[0] if journal else None
        if not (isinstance(start, rec.Start) and start.policy & rec.DETACHED):
            rt.report_to_parent(st, again=True)


def checkpoint_state(rt: RecoveryHost) -> bytes:
    """Every workflow's current run: its journal and whether it is parked (and until when).

    Recovery reads this instead of the log before the checkpoint; parked
    runs stay parked (they are not replayed at open).
    """
    out: list[CheckpointEntry] = []
    for st in rt.wf.values():
        if st.packed is not None:
            journal = st.packed
            wake = st.wake_ms if st.status is None else -1
        else:
            journal = pack(st.journal, st.lsns, rt.sealer)
            run = st.run
            # A suspended run needs no replay to go on: the next open keeps it parked.
            wake = parking.wake_time(rt, run) if run is not None and parking.parkable(rt, run) else -1
        status = -1 if st.status is None else int(st.status)
        # A run whose ending is in the log but not yet known durable has not told its parent.
        owes = st.owes_parent or (st.parent is not None and st.status is not None and not st.final
                                  and st.status != rec.Status.CONTINUED)
        out.append(
            CheckpointEntry(
                st.id, st.shard, st.wtype, st.run_id, st.parent, status, wake, journal,
                has_outbox(st), st.code, st.version, rt.sealer.seal_bytes(rt.index.encoded(st.id), st.id),
                rt.sealer.codec is not None, owes,
            )
        )
    return msgspec.msgpack.encode(out)




def load_checkpoint(rt: RecoveryHost, state: bytes) -> None:
    """Rebuilds the workflow table from a checkpoint (before the log after it is loaded)."""
    for e in msgspec.msgpack.decode(state, type=list[CheckpointEntry]):
        if e.outbox or e.owes_parent:
            rt._outbox_at_open.add(e.id)
        outbox = e.outbox
        st = WorkflowState(e.id, e.shard)
        st.wtype = e.wtype
        st.run_id = e.run_id
        st.parent = e.parent
        st.code = e.code
        st.version = e.version
        rt.wf[e.id] = st
        rt.by_run[e.run_id] = st
        st.outbox = outbox
        st.owes_parent = e.owes_parent
        if e.attributes:
            attributes = rt.sealer.open_bytes(e.attributes, e.id) if e.sealed else e.attributes
            rt.index.replace(e.id, decode_attributes(attributes))
        if e.status >= 0:
            st.packed = e.journal
            st.status = rec.Status(e.status)
            journal, lsns = unpack(e.journal, rt.sealer)
            done = journal[-1]
            if isinstance(done, rec.Done):
                st.payload = done.payload
                st.done_lsn = lsns[-1]
            st.final = st.status != rec.Status.CONTINUED
            if st.status == rec.Status.CONTINUED:
                st.journal, st.lsns, st.packed = journal, lsns, None
        elif e.wake_ms >= 0:
            st.packed = e.journal
            st.wake_ms = e.wake_ms
            if e.wake_ms > 0:
                rt.timers.push(e.wake_ms, WAKE, e.id, e.run_id)
        else:
            st.journal, st.lsns = unpack(e.journal, rt.sealer)
