"""What a seed decides: the shape of the world, its faults and its workload.

``SimConfig.for_seed(n)`` derives every knob from ``n`` alone, so a seed
number is all it takes to reproduce a run.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

#: Where the engine's directory lives on the simulated disk.
DATA_DIR = "/sim/data"

#: Job kinds of the built-in workload (see ``fusee.sim.workload``), in a fixed order.
JOB_KINDS: tuple[str, ...] = (
    "order",
    "fanout",
    "pinger",
    "counter",
    "looper",
    "patchy",
    "parent",
    "reader",
    "saga",
    "approval",
    "export",
    "resettable",
)


#: Flush intervals (each at most ``max_io_ms``) after which a finished step's
#: outcome must be durable (see ``SimConfig.durable_within_ms``).
DURABLE_FLUSHES = 10


@dataclasses.dataclass
class SimConfig:
    """Knobs of one simulated run (all times in virtual milliseconds)."""

    seed: int
    shards: int = 1
    #: Workflows the built-in workload starts.
    workflows: int = 10
    #: Client activity with faults on; afterwards faults stop.
    duration_ms: int = 2_000
    #: Mean time between crashes (0: the process never crashes).
    crash_every_ms: int = 0
    #: Chance (per mille, among I/O completions) of a crash right after one.
    crash_after_io_per_mille: int = 0
    #: Chance (per mille) that a flush (fdatasync) fails.
    flush_fail_per_mille: int = 0
    #: Each blocking I/O takes between 0.05 ms and this long.
    max_io_ms: float = 1.0
    #: Messages between shards take between 0 and this long.
    max_msg_ms: float = 0.0
    #: How far the wall clock jumps forward at each restart (0: never).
    clock_jump_ms: int = 0
    #: Engine knobs, handed to ``Engine.open`` when it accepts them.
    park_after_ms: int | None = None
    #: ``memory_budget`` (bytes) and ``max_loaded`` (runs): on a third of the seeds, suspended runs
    #: park at each sweep through them instead of waiting ``park_after_ms`` (None: no bound).
    memory_budget: int | None = None
    max_loaded: int | None = None
    #: Runs recovery loads per batch at each open (``recovery_batch``): small ones make every
    #: recovery load in batches while the first runs already go on.
    recovery_batch: int = 1000
    #: Virtual ms between the engine's periodic checkpoints (``checkpoint_interval``).
    checkpoint_interval_ms: int = 100
    #: Records between checkpoints.
    checkpoint_every: int = 200_000
    segment_bytes: int = 1 << 20
    #: Records longer than this go to the blob area.
    blob_threshold: int = 256 << 10
    #: Every acknowledged workflow must finish within this long once faults stop.
    settle_ms: int = 60_000
    #: The simulated step pool: synchronous step functions running at once.
    step_slots: int = 4
    #: A synchronous step function holds its slot between 0 and this long.
    max_step_ms: float = 2.0
    #: Chance (per mille) that a step of the built-in workload is a
    #: synchronous (blocking) function rather than a coroutine.
    sync_steps_per_mille: int = 500
    #: Mean time between graceful closes with a reopen (0: never).
    close_every_ms: int = 0
    #: ``Engine.close(grace=...)`` in virtual ms.
    close_grace_ms: int = 1_000
    #: ``Engine.open(inline_sync_steps=...)``: None (measured), True (all inline), False (all pooled).
    inline_sync_steps: bool | None = False
    #: ``Engine.open(flush=...)`` as the simulator models it: inline, background or pipeline.
    flush_mode: str = "background"
    #: The engine reports spans to the simulator's tracer (``fusee.sim.tracing``),
    #: when OpenTelemetry's API is installed.
    telemetry: bool = False
    #: ``Engine.open(keep_history=...)``: False on half the seeds, so ended runs keep only
    #: their start and ending (the checkers then judge what the engine kept).
    keep_history: bool = True
    #: Relative weight of each job kind in the built-in workload.
    mix: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(JOB_KINDS, 1))

    @classmethod
    def for_seed(cls, seed: int) -> SimConfig:
        """The configuration seed ``seed`` stands for (the same on every machine)."""
        r = random.Random(seed)
        crash_every = r.choice([0, 150, 400, 900])
        mix = {kind: r.choice([0, 1, 2, 3]) for kind in JOB_KINDS if kind not in ("saga", "approval", "export", "resettable")}
        # Orders are the backbone (pingers and approvals target them).
        mix["order"] = 4 + r.randrange(5)
        # Knobs added later draw from their own stream, so older knobs keep their values.
        s = random.Random(f"steps-{seed}")
        mix["saga"] = s.choice([0, 1, 2, 3])
        max_step_ms = s.choice([1.0, 5.0, 20.0, 60.0])
        h = random.Random(f"hot-{seed}")
        o = random.Random(f"operate-{seed}")
        b = random.Random(f"budget-{seed}")
        pressure = seed % 3 == 1
        mix["approval"] = o.choice([0, 1, 2, 3])
        mix["export"] = o.choice([0, 1, 2, 3])
        mix["resettable"] = o.choice([0, 1, 2, 3])
        return cls(
            seed=seed,
            shards=1 + r.randrange(4),
            workflows=10 + r.randrange(31),
            duration_ms=2_000,
            crash_every_ms=crash_every,
            crash_after_io_per_mille=r.choice([0, 10, 50]) if crash_every else 0,
            flush_fail_per_mille=r.choice([0, 0, 2, 10]),
            max_io_ms=r.choice([0.2, 1.0, 2.0, 4.0]),
            max_msg_ms=r.choice([0.0, 1.0, 2.0]),
            clock_jump_ms=r.choice([0, 0, 0, 50, 5_000]),
            park_after_ms=r.choice([0, 5, 50, None]),
            checkpoint_interval_ms=r.choice([20, 100, 500]),
            segment_bytes=r.choice([16 << 10, 64 << 10, 1 << 20]),
            checkpoint_every=r.choice([25, 200, 200_000]),
            blob_threshold=r.choice([256 << 10, 256 << 10, 64, 512]),
            settle_ms=60_000,
            step_slots=s.choice([1, 2, 4, 8]),
            max_step_ms=max_step_ms,
            sync_steps_per_mille=s.choice([0, 300, 700, 1000]),
            close_every_ms=s.choice([0, 0, 300, 800]),
            # Long enough for any step function to finish (they hold a slot at most max_step_ms).
            close_grace_ms=int(max_step_ms) + 50 + s.randrange(200),
            inline_sync_steps=h.choice([None, None, False, True]),
            # A third of the seeds flush on the loop's thread (the engine's default mode);
            # their own stream leaves every other knob of a seed as it was.
            flush_mode=("inline" if random.Random(f"inline-{seed}").randrange(3) == 0
                        else h.choice(["background", "pipeline"])),
            mix=mix,
            telemetry=random.Random(f"telemetry-{seed}").randrange(3) == 0,
            # 1 byte parks every suspended run at the next sweep; the others a few runs' worth.
            memory_budget=b.choice([1, 1, 16 << 10, 64 << 10]) if pressure else None,
            max_loaded=b.choice([None, 0, 2, 5]) if pressure else None,
            recovery_batch=b.choice([1, 3, 8, 1000]),
            # By parity, as the original does, so every other knob of a seed keeps its value.
            keep_history=seed % 2 == 0,
        )

    def describe(self) -> str:
        """One line naming every knob (the first line of a seed's trace)."""
        mix = ",".join(f"{k}={v}" for k, v in self.mix.items())
        return (
            f"seed={self.seed} shards={self.shards} workflows={self.workflows} "
            f"crash_every_ms={self.crash_every_ms} crash_after_io={self.crash_after_io_per_mille}/1000 "
            f"flush_fail={self.flush_fail_per_mille}/1000 max_io_ms={self.max_io_ms} "
            f"max_msg_ms={self.max_msg_ms} clock_jump_ms={self.clock_jump_ms} "
            f"park_after_ms={self.park_after_ms} checkpoint_ms={self.checkpoint_interval_ms} "
            f"checkpoint_every={self.checkpoint_every} segment_bytes={self.segment_bytes} blob_threshold={self.blob_threshold} "
            f"step_slots={self.step_slots} max_step_ms={self.max_step_ms} sync_steps={self.sync_steps_per_mille}/1000 "
            f"close_every_ms={self.close_every_ms} close_grace_ms={self.close_grace_ms} "
            f"inline_sync_steps={self.inline_sync_steps} flush={self.flush_mode} mix={mix}"
            + (" telemetry=on" if self.telemetry else "")
            + f" memory_budget={self.memory_budget} max_loaded={self.max_loaded} recovery_batch={self.recovery_batch}"
            + ("" if self.keep_history else " keep_history=off")
        )

    @property
    def durable_within_ms(self) -> float:
        """How soon finished work must be durable: ``DURABLE_FLUSHES`` flushes of the slowest I/O.

        One flush is one blocking storage call (at most ``max_io_ms``); a
        record appended while one is in flight goes with the next, so two
        would do; the margin covers a checkpoint and the loop's own turns.
        """
        return DURABLE_FLUSHES * self.max_io_ms + 1.0

    def engine_options(self, accepted: frozenset[str] | None = None) -> dict[str, Any]:
        """Keyword arguments for ``Engine.open`` (only those in ``accepted``, if given)."""
        opts: dict[str, Any] = {
            "shards": self.shards,
            "park_after": None if self.park_after_ms is None else self.park_after_ms / 1000.0,
            "checkpoint_interval": self.checkpoint_interval_ms / 1000.0,
            "checkpoint_every": self.checkpoint_every,
            "segment_bytes": self.segment_bytes,
            "blob_threshold": self.blob_threshold,
            "memory_budget": self.memory_budget,
            "max_loaded": self.max_loaded,
            "recovery_batch": self.recovery_batch,
            "keep_history": self.keep_history,
        }
        if accepted is not None:
            opts = {k: v for k, v in opts.items() if k in accepted}
        return opts
