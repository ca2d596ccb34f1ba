"""The Celery app of docs/hosts.md under a real worker (prefork, two pool processes): kill -9 and restart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import celery
from kombu.transport import filesystem
from kombu.utils.json import dumps

import fusee
from tests.sync.servers import ROOT, wait_for

TASKS = re.compile(r"^```python\n(# tasks\.py.*?)^```", re.S | re.M)
ORDERS = ["c0", "c1", "c2", "c3"]
APPROVED_FIRST = ORDERS[:2]


def write_app(d: Path) -> Path:
    """docs/hosts.md's tasks.py, as written, and the ledger wrapper beside it."""
    m = TASKS.search((ROOT / "docs" / "hosts.md").read_text())
    assert m, "docs/hosts.md has no ```python block starting with '# tasks.py'"
    app = d / "app"
    app.mkdir()
    (app / "tasks.py").write_text(m.group(1))
    (app / "celery_ledger.py").write_text((Path(__file__).parent / "celery_ledger.py").read_text())
    return app


@contextmanager
def worker(app: Path, data: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A celery_ledger worker`` in a session of its own; yields once it is ready."""
    log = data / f"worker-{time.monotonic_ns()}.log"
    env = dict(os.environ, PYTHONPATH=f"{app}{os.pathsep}{ROOT}", MYAPP_DATA=str(data),
               FUSEE_TEST_LEDGER=str(data / "ledger.txt"))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_ledger", "worker", "--pool", "prefork",
             "--concurrency", "2", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-n", f"w{time.monotonic_ns()}@localhost"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=app, start_new_session=True,
        )
    try:
        wait_for("the worker being ready", lambda: proc.poll() is not None or " ready." in log.read_text())
        assert proc.poll() is None, log.read_text()
        yield proc
    except BaseException:
        # A task that never answers says nothing by itself: show what the worker said.
        sys.stderr.write(f"--- the worker's log ({log}):\n{log.read_text()[-20000:]}\n")
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # a warm shutdown: each pool process closes its engine
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever is left of the group is ours
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)


class WholeMessageChannel(filesystem.Channel):
    """kombu's filesystem channel, but each message file appears whole.

    kombu creates a message file under its final name and then writes it, and a worker that
    lists the folder in between reads an empty file and dies (``Unrecoverable error:
    JSONDecodeError``, seen on a loaded CI machine). Written under a name the worker skips and
    renamed into place, a message is either absent or complete.
    """

    def _put(self, queue: str, payload: object, **kwargs: object) -> None:
        name = f"{int(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        part = folder / f".{name}.part"  # '.'-first: not '<id>.<queue>.msg', so never taken
        part.write_bytes(dumps(payload).encode())
        os.replace(part, folder / name)


class WholeMessageTransport(filesystem.Transport):
    Channel = WholeMessageChannel


def client(data: Path) -> celery.Celery:
    """A producer configured as tasks.py configures the worker (the same folders)."""
    c = celery.Celery("client", broker="filesystem://", backend=f"file://{data}/results")
    c.conf.broker_transport = WholeMessageTransport
    queue = str(data / "queue")
    c.conf.broker_transport_options = {"data_folder_in": queue, "data_folder_out": queue,
                                       "control_folder": str(data / "control")}
    return c


def recorded(data: Path) -> dict[str, list[str]]:
    """Each order's durable records (type names, steps as ``Step:name``), read from the directory."""
    with fusee.SyncEngine.open(data / "engine", read_only=True) as view:
        out: dict[str, list[str]] = {}
        for oid in ORDERS:
            try:
                journal = view.journal(oid)
            except fusee.NotFound:
                continue
            out[oid] = [f"Step:{r.name}" if type(r).__name__ == "Step" else type(r).__name__
                        for r in journal]
        return out


def test_celery_worker_runs_the_docs_app_and_survives_kill_9(tmp_path: Path) -> None:
    app = write_app(tmp_path)
    c = client(tmp_path)
    with worker(app, tmp_path) as proc:
        placed = [c.send_task("tasks.place_order", [oid]) for oid in ORDERS]
        assert [r.get(timeout=60) for r in placed] == ORDERS  # each start is durable
        for oid in APPROVED_FIRST:
            c.send_task("tasks.approve_order", [oid, "ann"]).get(timeout=60)
        done_first = [c.send_task("tasks.order_result", [oid]) for oid in APPROVED_FIRST]
        assert [r.get(timeout=60) for r in done_first] == [
            f"charged {oid}, approved by ann" for oid in APPROVED_FIRST]
        # The others are mid-workflow: reserved (durably), waiting for their approval.
        wait_for("every order reserved", lambda: all(
            "Step:reserve" in recorded(tmp_path).get(oid, []) for oid in ORDERS))
        os.killpg(proc.pid, signal.SIGKILL)  # the main process and both pool processes
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    before = recorded(tmp_path)  # what was acknowledged before the kill
    assert all("Step:reserve" in before[oid] for oid in ORDERS), before
    assert all("Step:charge" in before[oid] for oid in APPROVED_FIRST), before
    with worker(app, tmp_path):
        for oid in ORDERS:  # a client's retry of the first approvals too: deduplicated
            c.send_task("tasks.approve_order", [oid, "bob"]).get(timeout=60)
        results = [c.send_task("tasks.order_result", [oid]) for oid in ORDERS]
        assert [r.get(timeout=60) for r in results] == (
            [f"charged {oid}, approved by ann" for oid in APPROVED_FIRST]
            + [f"charged {oid}, approved by bob" for oid in ORDERS[2:]])

    runs = Counter((tmp_path / "ledger.txt").read_text().splitlines())
    for oid in ORDERS:
        for step in ("reserve", "charge"):
            if f"Step:{step}" in before[oid]:  # recorded before the kill: never run again
                assert runs[f"{step}:{oid}"] == 1, (oid, step, runs)
            else:  # not recorded: it ran after the restart (and at most once before)
                assert 1 <= runs[f"{step}:{oid}"] <= 2, (oid, step, runs)
