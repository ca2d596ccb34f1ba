"""``fusee workers MODULE:FACTORY -n N``: N worker processes on one engine, supervised.

Each worker imports ``MODULE``, opens the engine ``FACTORY`` returns (an Engine,
or a function or awaitable returning one), holds it open (on a parted
directory, a share of its parts: docs/scale-out.md#parts) and closes it
gracefully on SIGTERM or SIGINT. The supervisor starts the workers, restarts
one that dies (after a second; a worker that dies within its first seconds
five times in a row stops them all: the factory is broken), and on SIGTERM or
SIGINT stops every worker and waits for them.

A worker is ``python -m fusee.cli.workers MODULE:FACTORY INDEX`` with
``FUSEE_WORKER_INDEX`` set to its index (0 .. N-1), which a factory may read,
``FUSEE_WORKERS`` to N, and ``FUSEE_PARTS`` to the part count a directory
created now gets (``--parts``, else ``FUSEE_PARTS`` as given, else N when N > 1),
so that N workers on a new directory split its work with no ``parts=`` in the
factory. A worker whose engine has no parts says so when there are several
workers: one of them would run every step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

from fusee.http.serve import load_factory, open_engine
from fusee.scale.parts import PARTS_ENV, PartedEngine

#: The worker count, in each worker's environment.
WORKERS_ENV = "FUSEE_WORKERS"

#: A worker that ends sooner than this after its start counts as failing to start.
EARLY_EXIT_S = 3.0
#: Early exits in a row (of any one worker) after which the supervisor gives up.
MAX_EARLY_EXITS = 5
RESTART_DELAY_S = 1.0


def _say(text: str) -> None:
    print(f"fusee workers: {text}", file=sys.stderr, flush=True)


def run_worker(spec: str, index: int) -> int:
    """One worker: opens the engine, holds it until SIGTERM or SIGINT, then closes it."""
    factory = load_factory(spec)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        engine = await open_engine(factory)
        try:
            _say(f"worker {index} (pid {os.getpid()}) opened {engine!r}")
            if index == 0 and int(os.environ.get(WORKERS_ENV, "1")) > 1 and not isinstance(engine, PartedEngine):
                _say("the engine has no parts (its directory or namespace existed without them, or it is "
                     "not on a directory): one worker runs every workflow and step, the others route to it. "
                     "Create the directory with parts= or under FUSEE_PARTS (docs/scale-out.md#parts)")
            await stop.wait()
        finally:
            await engine.close()
        _say(f"worker {index} (pid {os.getpid()}) closed")

    asyncio.run(main())
    return 0


class Supervisor:
    """Starts ``count`` workers of ``spec`` and keeps them running until :meth:`stop`."""

    def __init__(self, spec: str, count: int, parts: int | None = None) -> None:
        if count < 1:
            raise ValueError(f"give at least one worker, got {count}")
        if parts is not None and parts < 1:
            raise ValueError(f"give at least one part, got {parts}")
        load_factory(spec)  # a typo in MODULE:FACTORY fails here, once, not in every worker
        self.spec, self.count = spec, count
        #: What FUSEE_PARTS the workers get (None: as the supervisor's environment has it).
        if parts is not None:
            self.parts: str | None = str(parts)
        elif os.environ.get(PARTS_ENV, "").strip():
            self.parts = None
        else:
            self.parts = str(count) if count > 1 else None
        self.stopping = False
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._started: dict[int, float] = {}
        self._early: dict[int, int] = {}

    def _spawn(self, index: int) -> None:
        env = dict(os.environ, FUSEE_WORKER_INDEX=str(index))
        env[WORKERS_ENV] = str(self.count)
        if self.parts is not None:
            env[PARTS_ENV] = self.parts  # only a directory created now takes it (parts_from_env)
        if os.getcwd() not in env.get("PYTHONPATH", "").split(os.pathsep):
            # The factory's module is found from where the command runs, as in the supervisor.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
        self.procs[index] = subprocess.Popen([sys.executable, "-m", "fusee.cli.workers", self.spec, str(index)],
                                             env=env)
        self._started[index] = time.monotonic()

    def stop(self, *_: Any) -> None:
        """Asks every worker to close (SIGTERM); :meth:`run` returns once they have."""
        self.stopping = True
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Runs until stopped; 0 once every worker closed cleanly, 1 if the workers could not run."""
        for i in range(self.count):
            self._spawn(i)
        _say(f"{self.count} workers of {self.spec} started (pids {', '.join(str(p.pid) for p in self.procs.values())})")
        failed = False
        while self.procs:
            for index, p in list(self.procs.items()):
                code = p.poll()
                if code is None:
                    continue
                del self.procs[index]
                if self.stopping:
                    failed |= code != 0
                    continue
                early = time.monotonic() - self._started[index] < EARLY_EXIT_S
                self._early[index] = self._early.get(index, 0) + 1 if early else 0
                if self._early[index] >= MAX_EARLY_EXITS:
                    _say(f"worker {index} exited {MAX_EARLY_EXITS} times right after its start "
                         f"(last exit code {code}): stopping all workers")
                    failed = True
                    self.stop()
                    continue
                _say(f"worker {index} (pid {p.pid}) exited with code {code}: starting it again")
                time.sleep(RESTART_DELAY_S)
                if not self.stopping:
                    self._spawn(index)
            time.sleep(0.05)
        return 1 if failed else 0


def supervise(spec: str, count: int, parts: int | None = None) -> int:
    """The command: runs ``count`` workers until SIGTERM or SIGINT; the exit code. ``parts``: the
    part count of a directory the workers create (default: ``FUSEE_PARTS``, else ``count``)."""
    sup = Supervisor(spec, count, parts)
    signal.signal(signal.SIGTERM, sup.stop)
    signal.signal(signal.SIGINT, sup.stop)
    return sup.run()


if __name__ == "__main__":
    sys.exit(run_worker(sys.argv[1], int(sys.argv[2])))
