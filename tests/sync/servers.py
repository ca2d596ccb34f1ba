"""Real servers for the host tests: gunicorn (sync workers) as a subprocess in its own session."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def _own_control_socket() -> list[str]:
    # gunicorn 25+ listens on a control socket in the user's home by default: shared by every
    # server of the user, so concurrent test servers would meet there. They need none.
    from gunicorn.config import KNOWN_SETTINGS

    return ["--no-control-socket"] if any(s.name == "no_control_socket" for s in KNOWN_SETTINGS) else []
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")


class Server:
    """A gunicorn master and its workers (one process group: ``kill_all`` is ``kill -9`` of it all)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, base: str) -> None:
        self.proc = proc
        self.log = log
        self.base = base

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=60)

    def kill_all(self) -> None:
        """SIGKILL to the master and every worker at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # a graceful stop: workers finish, the engine closes
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill_all()
        try:  # a worker orphaned by a killed master: ours, so end it by its group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def gunicorn(app: str, d: Path, *args: str, workers: int = 2) -> Iterator[Server]:
    """Serves ``app`` (``module:callable``) with gunicorn sync workers on a free port; yields
    once the master listens. ``$FUSEE_TEST_DIR`` is ``d``; the server's log goes to ``d``."""
    log = d / f"gunicorn-{time.monotonic_ns()}.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), FUSEE_TEST_DIR=str(d),
               FUSEE_TEST_LEDGER=str(d / "ledger.txt"))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-k", "sync", "-w", str(workers), "-b", "127.0.0.1:0",
             "--timeout", "120", "--graceful-timeout", "30", *_own_control_socket(), *args, app],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )
    server: Server | None = None
    try:
        deadline = time.monotonic() + 60
        while server is None:
            m = LISTENING.search(log.read_text(errors="replace"))
            if m:
                server = Server(proc, log, f"http://127.0.0.1:{m.group(1)}")
                break
            assert proc.poll() is None, f"gunicorn exited:\n{log.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"gunicorn did not listen:\n{log.read_text(errors='replace')}"
            time.sleep(0.02)
        yield server
    finally:
        (server or Server(proc, log, "")).stop()


def wait_for(what: str, check: object, timeout: float = 60) -> None:
    """Polls ``check()`` (a callable) until it is true; fails naming ``what`` after ``timeout`` s."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)
