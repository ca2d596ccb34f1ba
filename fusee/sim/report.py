"""Coverage counters of one simulated run, and of many.

A checker that never sees a path exercised proves nothing about it: these
counters show which paths a seed range really went through (a test asserts
each is above zero across the CI range).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Report:
    """What happened in one seed's run."""

    seed: int = 0
    workflows: int = 0
    #: Acknowledged workflows whose result the client got.
    finished: int = 0
    crashes: int = 0
    #: Crashes right after an I/O completed, before the engine heard of it.
    crashes_after_io: int = 0
    #: Crashes that took the power too (unsynced writes resolved); the others keep the page cache.
    power_losses: int = 0
    #: Processes killed inside an fdatasync (the write stays cached, unsynced).
    kills_in_sync: int = 0
    #: Lock files an outside hand deleted (a second opener must still be refused).
    lock_deletions: int = 0
    #: Directories an outside hand renamed and restored from a copy while the engine ran.
    dir_moves: int = 0
    #: Supervisor restarts after the log failed (not a crash).
    restarts: int = 0
    flush_failures: int = 0
    #: Recoveries that found (and dropped) a torn tail.
    torn_tails: int = 0
    #: Runs the engine replayed from their journal (after a crash or a park).
    replays: int = 0
    parked: int = 0
    #: Of the parks, those the memory budget or ``max_loaded`` asked for (a third of the seeds).
    budget_parks: int = 0
    #: Batches of runs recovery loaded at the opens (more than one per open with a small batch).
    recovery_batches: int = 0
    #: Checkpoints the engine wrote (by record count or by ``checkpoint_interval_ms``).
    checkpoints: int = 0
    reads_rerun: int = 0
    service_calls: int = 0
    transient_failures: int = 0
    signals: int = 0
    updates: int = 0
    updates_rejected: int = 0
    queries: int = 0
    cancels: int = 0
    children: int = 0
    continued: int = 0
    patched: int = 0
    client_retries: int = 0
    terminates: int = 0
    #: Synchronous step functions the simulated step pool ran.
    sync_steps: int = 0
    #: Synchronous step functions run on the loop's thread, and flushes it blocked for (pipeline).
    inline_steps: int = 0
    flush_waits: int = 0
    #: Graceful closes (each followed by a reopen), and requests refused during one.
    closes: int = 0
    calls_refused: int = 0
    #: Closes that began while a step function ran, and cancels acknowledged while one of their run's did.
    closes_mid_step: int = 0
    cancels_mid_step: int = 0
    #: Stream chunks readers got, streams read to their end, and reads again from an earlier offset.
    chunks_read: int = 0
    streams_read: int = 0
    stream_rereads: int = 0
    #: Payloads the simulated codec encoded (a third of seeds run one) and its key rotations.
    payloads_encoded: int = 0
    key_rotations: int = 0
    #: Completions accepted, and ones refused (a duplicate or a stale token).
    completions: int = 0
    completions_refused: int = 0
    #: Export attempts that began from progress an earlier attempt reported.
    resumed_exports: int = 0
    #: Acknowledged resets, and signals they delivered again.
    resets: int = 0
    signals_reapplied: int = 0
    #: Signals sent with a wrong value or an unknown name, refused with the typed error; and
    #: journaled signals a wait passed over (it cannot decode them), as the engine counted them.
    signals_refused: int = 0
    signals_dropped: int = 0
    #: Keyed object calls answered, and steps that ran under a step limit.
    object_calls: int = 0
    limited_steps: int = 0
    #: Scheduled runs that ran, and scheduled times a schedule skipped and counted
    #: (overlap, catch-up window, pause).
    scheduled: int = 0
    schedule_skips: int = 0
    #: Enqueued events acknowledged (distinct event IDs), and the window runs that took them.
    events_queued: int = 0
    windows_run: int = 0
    #: Batches the log wrote and records it offloaded to its blob area, over all lives.
    log_batches: int = 0
    offloaded: int = 0
    #: Seeds without history (``keep_history=False``): requests an ended run refused with
    #: ``HistoryUnavailable`` (a query, a reset), and stream readers cut short by a run's end.
    history_refused: int = 0
    streams_cut: int = 0
    sim_ms: int = 0
    #: Times every process life's loop found nothing ready and jumped its clock ahead.
    clock_jumps: int = 0

    def line(self) -> str:
        """The counters on one line (``name=value`` in field order)."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


#: Counters that the CI seed range must see above zero.
COVERAGE = (
    "crashes",
    "crashes_after_io",
    "power_losses",
    "kills_in_sync",
    "lock_deletions",
    "dir_moves",
    "flush_failures",
    "torn_tails",
    "replays",
    "budget_parks",
    "recovery_batches",
    "checkpoints",
    "reads_rerun",
    "transient_failures",
    "signals",
    "updates",
    "updates_rejected",
    "queries",
    "cancels",
    "children",
    "continued",
    "patched",
    "client_retries",
    "terminates",
    "sync_steps",
    "inline_steps",
    "flush_waits",
    "closes",
    "calls_refused",
    "closes_mid_step",
    "cancels_mid_step",
    "completions",
    "completions_refused",
    "resumed_exports",
    "resets",
    "signals_reapplied",
    "signals_refused",
    "signals_dropped",
    "chunks_read",
    "streams_read",
    "stream_rereads",
    "payloads_encoded",
    "key_rotations",
    "object_calls",
    "limited_steps",
    "scheduled",
    "schedule_skips",
    "events_queued",
    "windows_run",
    "log_batches",
    "offloaded",
    "history_refused",
    "streams_cut",
)


@dataclasses.dataclass
class Totals:
    """Counters summed over a range of seeds."""

    seeds: int = 0
    counters: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, report: Report) -> None:
        self.seeds += 1
        for f in dataclasses.fields(report):
            if f.name == "seed":
                continue
            self.counters[f.name] = self.counters.get(f.name, 0) + int(getattr(report, f.name))

    def missing(self, names: tuple[str, ...] = COVERAGE) -> list[str]:
        """Coverage counters still at zero."""
        return [n for n in names if self.counters.get(n, 0) == 0]

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.counters.items())
