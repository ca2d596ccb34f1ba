"""Deliberate engine bugs, off by default, switched on only by tests.

Each switch breaks one promise the engine makes (durability, gating, recovery).
The simulator's sabotage test turns one on at a time and requires some seed in
a bounded range to catch it: proof that the checkers can fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator


@dataclasses.dataclass
class Sabotage:
    # storage
    accept_torn_batch: bool = False
    skip_dir_fsync: bool = False
    retry_failed_fsync: bool = False
    skip_recovery_sync: bool = False
    #: The log writes a batch as soon as the blobs it references are written, before they are
    #: durable (no fdatasync of a blob, no fsync of the blob directory).
    early_blobs: bool = False
    # engine
    ack_before_durable: bool = False
    step_before_gate: bool = False
    query_from_nondurable: bool = False
    drop_outbox_message: bool = False
    #: A step covered by a requested cancel starts anyway (and the cancel does
    #: not wait for running steps).
    step_after_cancel: bool = False
    #: The log's flush runs in the step pool (queues behind step functions).
    flush_shares_step_pool: bool = False
    #: ``engine.complete`` accepts a token of a stale attempt (as if it were the current one).
    accept_stale_completion: bool = False
    #: A step attempt starts from progress (``info.progress``) no attempt reported.
    resume_unreported_progress: bool = False
    #: ``reset`` delivers the signals that arrived after the cut twice.
    reapply_signal_twice: bool = False
    #: A signal sent by name only (HTTP, CLI, UI, a follower) is journaled without checking its
    #: name or its value's type (as before issue 22).
    signal_by_name_unchecked: bool = False
    #: A wait takes a journaled signal its type cannot decode (the run fails at wait_for).
    undecodable_signal_taken: bool = False
    #: A synchronous step function that blocked the event loop keeps running on it.
    inline_never_demoted: bool = False
    #: A step function lent the loop's thread starts without handing what is pending to the disk.
    inline_step_holds_flush: bool = False
    #: A step run at once (inline, or async without suspending) counts as one waiting for its
    #: gate: nothing asks for a flush of what its run appends next (it waits for other activity).
    no_flush_after_direct_step: bool = False
    #: Group commit does not wait for records about to come: producers (steps released and
    #: not yet started, executions in flight) go uncounted, so runs taking turns flush alone.
    flush_before_producers: bool = False
    #: A hand-off before a cheap step function sends what is pending once the round has waited
    #: one flush time, without the producers' records: concurrent runs split into groups that
    #: take turns through the log's thread (the rule before 2026-12-04).
    hand_off_splits_rounds: bool = False
    #: Stream readers are shown chunks that are not durable yet (a crash may take them back).
    stream_shows_nondurable: bool = False
    # keyed objects and step limits
    #: An exclusive object handler runs without taking its key's lock.
    object_exclusive_unlocked: bool = False
    #: A repeated object ``call_id`` is handled again once the object's run continued as new.
    object_forget_call_ids: bool = False
    #: A step issued while the engine recovers takes its permit without it being counted.
    limit_uncounted_after_recovery: bool = False
    #: A fairness key keeps its turn until its waiters run out (no round robin).
    limit_unfair: bool = False
    #: A run replayed (after a crash, or woken from parking) starts a new trace instead of
    #: continuing the one journaled in its Start record.
    lose_trace_on_replay: bool = False
    #: A read-only open takes the directory's lock (shared), as inspections once did:
    #: a live engine's lock then refuses the operator's read.
    read_only_locks: bool = False
    #: A schedule starts its runs under IDs with a random suffix instead of ``{id}@{time}``
    #: (a backfill or trigger of a time that fired starts it again).
    schedule_random_id: bool = False
    #: A window coordinator drops its open window's newest event when it continues as new.
    window_drops_on_continue: bool = False
    #: The log does not notice that its directory's path names another directory (renamed
    #: and restored from a copy): it acknowledges work a restart on the path will not find.
    ignore_moved_directory: bool = False
    # backups (caught by fusee.sim.backup)
    #: A backup cycle does not read the checkpoint again before it writes its point: a
    #: checkpoint that removed segments or blobs meanwhile leaves a point that lacks them.
    backup_no_recheck: bool = False
    # scale-out (caught by fusee.sim.scaleout, not by the single-process world)
    #: A new owner writes its epoch without syncing it: a power loss takes it back.
    epoch_not_durable: bool = False
    #: A flush (or checkpoint) of a namespace is written without checking the writer still holds
    #: the lease under its epoch (caught by fusee.sim.expiry).
    append_skips_epoch_check: bool = False
    #: A step's function begins after the engine's lease lapsed by its own clock (a stopped owner
    #: whose flush came back committed runs the steps it released; caught by fusee.sim.expiry).
    step_ignores_lease_deadline: bool = False
    #: A lease renewal extends a lease that already expired (caught by fusee.sim.expiry).
    renewal_ignores_expiry: bool = False
    # parted directories (caught by fusee.sim.parted)
    #: A part's holder applies a message relayed from another part without checking that the
    #: sender's part still has the sender's epoch (mail from a replaced holder is applied).
    relay_ignores_fence: bool = False
    #: A part acknowledges a relayed message before what it journaled is durable (a power loss
    #: loses a message its sender counts delivered).
    mail_acked_before_durable: bool = False
    #: A signal relayed from another part is journaled without its dedup key (one sent again
    #: is taken again).
    relay_drops_dedup_key: bool = False


#: The switches in force. Engine code reads them; only tests write them.
active = Sabotage()


@contextlib.contextmanager
def sabotaged(**switches: bool) -> Iterator[Sabotage]:
    """Turns the named switches on for the ``with`` block (tests only)."""
    global active
    saved = active
    active = dataclasses.replace(saved, **switches)
    try:
        yield active
    finally:
        active = saved
