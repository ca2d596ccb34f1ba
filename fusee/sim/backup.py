"""The simulator's backup world: a log on a ``SimDisk``, written and checkpointed while the real
``Uploader`` copies it to a ``SimTarget`` that fails, stalls, and loses the upload a crash
interrupts. The engine's writes run *during* the uploads (each ``put`` lets the world move on:
appends, flushes, checkpoints that remove segments and blobs), which is where a backup meets
a live log. After every cycle and every crash, a restore of the newest point and of a random
earlier one must hold a prefix of the acknowledged history: per shard, positions 1..k without
a gap, and every record acknowledged by the point's time.

    python -m fusee.sim.backup [--seeds N] [--start S]

Restores go through ``fusee.backup.restore`` into a temporary directory on the real disk (the
restore is file I/O by nature); everything else is in memory and deterministic per seed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections.abc import Callable

from fusee.backup.restore import list_points, restore
from fusee.backup.uploader import Uploader
from fusee.errors import FuseeError
from fusee.storage.log import SharedLog
from fusee.storage.posix import PosixStorage
from fusee.storage.simdisk import SimDisk

SHARDS = 2
PATH = "/data"
#: The sabotage switches this world must catch (tests/sim/test_backup_sim.py).
SWITCHES = ("backup_no_recheck",)


class _Crash(Exception):
    """The process dies inside an upload: the object being uploaded is lost."""


class SimTarget:
    """An object store in memory whose uploads fail, stall or die with the process."""

    name = "sim-target"

    def __init__(self, rng: random.Random, on_put: Callable[[], None]) -> None:
        self.rng = rng
        self.objects: dict[str, bytes] = {}
        self.on_put = on_put
        self.fail_rate = 0.05
        self.crash_rate = 0.01

    def put(self, key: str, data: bytes) -> None:
        self.on_put()  # the engine goes on writing while the upload is under way
        roll = self.rng.random()
        if roll < self.crash_rate:
            raise _Crash(key)
        if roll < self.crash_rate + self.fail_rate:
            raise OSError(f"simulated upload failure of {key}")
        self.objects[key] = bytes(data)

    def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise FileNotFoundError(key) from None

    def exists(self, key: str) -> bool:
        return key in self.objects

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))


class _Source:
    def __init__(self, log: SharedLog) -> None:
        self.storage = log.storage
        self.path = log.dir.path
        self.durable_end = log.durable_end

    def close(self) -> None:
        pass


class BackupWorld:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.disk = SimDisk(random.Random(seed + 1))
        self.clock = 0.0
        #: Per shard, (time acknowledged, lsn) in order.
        self.acked: list[list[tuple[float, int]]] = [[] for _ in range(SHARDS)]
        self.target = SimTarget(random.Random(seed + 2), self.activity)
        self.violations: list[str] = []
        self.lives = 0
        self._open()

    def _open(self) -> None:
        self.lives += 1
        self.log, _ = SharedLog.open(self.disk, PATH, SHARDS, segment_bytes=8192, blob_threshold=700,
                                     align=512, rng=random.Random(self.seed * 1000 + self.lives))
        self.uploader = Uploader(_Source(self.log), self.target, clock=lambda: self.clock)

    def activity(self) -> None:
        """The engine between two of the backup's reads: appends and flushes, now and then a
        checkpoint."""
        if self.rng.random() < 0.5:
            return
        log = self.log
        for _ in range(self.rng.randint(1, 6)):
            shard = self.rng.randrange(SHARDS)
            lsn = log.appended(shard) + 1
            size = 900 if self.rng.random() < 0.15 else 30
            log.append(shard, f"{shard}:{lsn}:".encode().ljust(size, b"."))
        log.flush()
        self.clock += 0.001
        for shard in range(SHARDS):
            durable = log.durable(shard)
            acked = self.acked[shard]
            if not acked or acked[-1][1] < durable:
                acked.append((self.clock, durable))
        if self.rng.random() < 0.15:
            log.checkpoint(json.dumps(log.appended_lsns()).encode())
        self.clock += 0.001

    def crash(self) -> None:
        self.disk.crash_process()
        if self.rng.random() < 0.3:
            self.disk.power_loss()
        self._open()

    def acked_by(self, shard: int, t: float) -> int:
        return max((lsn for at, lsn in self.acked[shard] if at <= t), default=0)

    def check_restore(self, at: float | None) -> None:
        where = tempfile.mkdtemp(prefix="fusee-sim-backup-")
        try:
            try:
                done = restore(self.target, f"{where}/d", at=at)
            except FuseeError as e:
                self.violations.append(f"seed {self.seed}: restore at {at} failed: {e}")
                return
            log, rec = SharedLog.open(PosixStorage(), f"{where}/d", SHARDS, read_only=True)
            log.close()
            base = json.loads(rec.checkpoint) if rec.checkpoint else [0] * SHARDS
            t = done.time.timestamp()
            for shard in range(SHARDS):
                lsns = [lsn for s, lsn, _ in rec.records if s == shard]
                expected = list(range(base[shard] + 1, base[shard] + 1 + len(lsns)))
                if lsns != expected:
                    self.violations.append(f"seed {self.seed}: shard {shard} restored with a gap: "
                                           f"{lsns[:5]}... after {base[shard]}")
                held = base[shard] + len(lsns)
                need = self.acked_by(shard, t)
                if held < need:
                    self.violations.append(f"seed {self.seed}: the point of {t:.3f} holds shard "
                                           f"{shard} up to {held}, but {need} was acknowledged by then")
        finally:
            shutil.rmtree(where, ignore_errors=True)

    def run(self, steps: int = 40) -> list[str]:
        stalled = 0
        for _ in range(steps):
            self.activity()
            if stalled:
                stalled -= 1
                continue
            if self.rng.random() < 0.1:
                stalled = self.rng.randint(1, 5)  # the target stalls: no cycle for a while
                continue
            try:
                self.uploader.cycle()
            except OSError:
                continue
            except _Crash:
                self.crash()
                continue
            self.check_restore(None)
            points = list_points(self.target)
            if len(points) > 1:
                self.check_restore(self.rng.choice(points[:-1]).time.timestamp())
            if self.violations:
                break
        return self.violations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--start", type=int, default=0)
    args = parser.parse_args(argv)
    failed = 0
    for seed in range(args.start, args.start + args.seeds):
        violations = BackupWorld(seed).run()
        if violations:
            failed += 1
            print("\n".join(violations))
    print(f"{args.seeds - failed}/{args.seeds} seeds passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
