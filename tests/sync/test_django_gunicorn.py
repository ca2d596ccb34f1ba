"""Django views on SyncEngine under a real gunicorn (sync workers), through kill -9 and a restart."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

from tests.sync.servers import gunicorn

APP = "tests.sync.django_wsgi:application"
ORDERS = [f"dj{i}" for i in range(6)]


def test_django_under_gunicorn_starts_signals_and_survives_kill_9(tmp_path: Path) -> None:
    with gunicorn(APP, tmp_path, workers=2) as s:
        with s.client() as c:
            for oid in ORDERS:  # each start is durable once its response arrives
                assert c.post(f"/orders/{oid}").json() == {"workflow_id": oid}
            assert c.post(f"/orders/{ORDERS[0]}/approve", data={"who": "eve"}).json() == {"ok": True}
            assert c.get(f"/orders/{ORDERS[0]}/result").json() == {"result": f"charge-{ORDERS[0]} by eve"}
        s.kill_all()  # kill -9 of the master and both workers, the other orders waiting for approval
    assert s.proc.returncode == -signal.SIGKILL

    with gunicorn(APP, tmp_path, workers=2) as s, s.client() as c:
        for oid in ORDERS[1:]:  # the restarted server continues every acknowledged run
            assert c.post(f"/orders/{oid}/approve", data={"who": "eve"}).json() == {"ok": True}
        for oid in ORDERS:
            assert c.get(f"/orders/{oid}/result").json() == {"result": f"charge-{oid} by eve"}
        missing = c.post("/orders/nobody/approve", data={"who": "eve"})
        assert missing.status_code == 404 and "nobody" in missing.json()["error"]
    runs = Counter((tmp_path / "ledger.txt").read_text().splitlines())
    # Each charge ran once (none was running at the kill); a reservation at most once more
    # (the kill may have taken it mid-run, before its result was durable).
    assert all(runs[f"charge:{oid}"] == 1 and 1 <= runs[f"reserve:{oid}"] <= 2 for oid in ORDERS), runs
