"""Issue 28: continuous backup to a real S3-compatible server (moto's standalone server, a
subprocess of the test): the engine killed (-9) under load, then the server killed (-9) and
started again empty; the engine goes on acknowledging meanwhile, the backup uploads everything
again, and restores hold every acknowledged start (checked against the app's ledger)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3  # the dev extra installs it, and moto[server]
import pytest

import fusee.backup as fb
from tests.backup.crash import App, Ledger, check_point, run_ids

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1"}


class Moto:
    """moto_server on a port of its own; ``kill`` loses every object (it keeps them in memory)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = Path(sys.executable).with_name("moto_server")
        self.p = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="backups")
                return
            except Exception:
                if self.p.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.p is not None
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(30)


@pytest.fixture
def moto() -> Iterator[Moto]:
    server = Moto()
    server.start()
    try:
        yield server
    finally:
        if server.p is not None and server.p.poll() is None:
            server.kill()


def test_s3_backup_survives_killed_engine_and_killed_server(tmp_path: Path, moto: Moto,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    env = {**CREDENTIALS, "BACKUP_ENDPOINT": moto.endpoint}
    data, control, url = tmp_path / "data", tmp_path / "control", "s3://backups/prod/engine"

    app = App(data, url, control, env)
    app.wait_for(lambda: (app.status() or {}).get("points", 0) >= 4 and len(Ledger(control).acked) >= 200,
                 "points in S3 under load")
    app.kill()
    newest = fb.restore(url, tmp_path / "after-kill", endpoint_url=moto.endpoint)
    check_point(run_ids(tmp_path / "after-kill"), Ledger(control), newest.time.timestamp())

    app = App(data, url, control, env)
    app.wait_for(lambda: (app.status() or {}).get("points", 0) >= 2, "points after the restart")
    moto.kill()
    app.wait_for(lambda: (app.status() or {}).get("failures", 0) >= 2, "failures reported")
    acked = len(Ledger(control).acked)
    # The engine does not wait for its backup: starts go on being acknowledged.
    app.wait_for(lambda: len(Ledger(control).acked) >= acked + 100, "acknowledgements while S3 is down")
    status = app.status()
    assert status is not None and status["last_error"] and status["lag_s"] > 0

    moto.start()  # empty: every object the backup uploaded is gone
    app.wait_for(lambda: (app.status() or {}).get("failures", 1) == 0
                 and (app.status() or {}).get("position", 0) > status["position"], "the backup resumes")
    app.stop()
    ledger = Ledger(control)
    final = fb.restore(url, tmp_path / "final", endpoint_url=moto.endpoint)
    restored = run_ids(tmp_path / "final")
    assert set(ledger.acked) <= restored, sorted(set(ledger.acked) - restored)[:5]
    check_point(restored, ledger, final.time.timestamp())
    assert os.listdir(tmp_path / "final")
