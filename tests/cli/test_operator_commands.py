"""Finding trouble and acting in bulk from the ``fusee`` command (real subprocesses)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import fusee
from tests.cli.test_commands import FUSEE, fusee_cmd, one_line_error, ops_app, serving


def _directory(path: Path) -> None:
    """A closed directory with a paused run and three orders waiting for their approval."""

    async def setup() -> None:
        ops_app.FIXED.clear()
        async with fusee.Engine.open(path, workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20) as engine:
            await engine.start(ops_app.pauser, "p-1")
            for i in range(3):
                await engine.start(ops_app.order, f"o-{i}", "acme")
            while engine.describe("p-1").status != "paused" or not all(
                    engine.describe(f"o-{i}").attributes for i in range(3)):
                await asyncio.sleep(0.005)

    asyncio.run(setup())


def _ids(p: subprocess.CompletedProcess[str]) -> list[str]:
    assert p.returncode == 0, p.stderr
    return [s["workflow_id"] for s in json.loads(p.stdout)["items"]]


def test_runs_by_status_newest_first_since_and_counts_offline(tmp_path: Path) -> None:
    d = tmp_path / "e"
    _directory(d)
    assert _ids(fusee_cmd("runs", str(d), "--status", "paused", "--json")) == ["p-1"]
    assert _ids(fusee_cmd("runs", str(d), "--status", "running", "--json")) == ["o-0", "o-1", "o-2"]
    assert _ids(fusee_cmd("runs", str(d), "--newest", "--limit", "2", "--json")) == ["o-2", "o-1"]
    assert _ids(fusee_cmd("runs", str(d), "--since", "1h", "--workflow", "order", "--json")) == [
        "o-0", "o-1", "o-2"]

    # An order by in --where stays last when the other filters join it; its cursors page on.
    assert _ids(fusee_cmd("runs", str(d), "--where", "workflow_id != 'x' order by workflow_id desc",
                          "--status", "running", "--limit", "2", "--all", "--json")) == ["o-2", "o-1", "o-0"]
    assert _ids(fusee_cmd("runs", str(d), "--where", "order by status, workflow_id desc", "--json")) == [
        "p-1", "o-2", "o-1", "o-0"]
    line = one_line_error(fusee_cmd("runs", str(d), "--newest", "--where", "order by workflow_id"))
    assert "both set the order" in line

    p = fusee_cmd("runs", str(d), "--status", "pasued")
    assert p.returncode == 2 and "'pasued' is not one of" in p.stderr and "'paused'" in p.stderr
    line = one_line_error(fusee_cmd("runs", str(d), "--where", "status = 'pasued'"))
    assert "unknown status 'pasued': use one of running, retrying, paused" in line
    p = fusee_cmd("runs", str(d), "--since", "an hour")
    assert p.returncode == 2 and "not a duration" in p.stderr

    p = fusee_cmd("count", str(d), "--json")
    assert p.returncode == 0, p.stderr
    assert {k: v for k, v in json.loads(p.stdout)["counts"].items() if v} == {"running": 3, "paused": 1}
    p = fusee_cmd("count", str(d), "--workflow", "order")
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.strip().splitlines()]
    assert ["running", "3"] in rows and ["total", "3"] in rows and ["paused", "1"] not in rows


def test_bulk_counts_asks_and_acts_with_the_audit(tmp_path: Path) -> None:
    with serving(tmp_path) as (url, token):
        auth = ("--url", url, "--token", token)
        for i in range(3):
            assert fusee_cmd("start", "order", f"o-{i}", "acme", *auth).returncode == 0

        p = fusee_cmd("bulk", "cancel", "--workflow", "order", "--dry-run", *auth)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "cancel would apply to 3 run(s) matching workflow in ('order')"

        def bulk(*args: str, answer: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([FUSEE, "bulk", *args, *auth], input=answer, capture_output=True, text=True,
                                  timeout=120)

        p = bulk("cancel", "--workflow", "order", "--by", "ada", answer="n\n")
        assert p.returncode == 1 and "not confirmed: nothing was changed" in p.stderr
        assert "cancel 3 run(s) matching workflow in ('order') (o-0, o-1, o-2)?" in p.stderr
        p = fusee_cmd("count", "--workflow", "order", "--json", *auth)
        assert json.loads(p.stdout)["counts"]["running"] == 3

        p = bulk("cancel", "--where", "workflow_id in ('o-0', 'o-1')", "--by", "ada", "--reason", "dup",
                 answer="y\n")
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "cancel: done for 2 run(s)"
        shown = json.loads(fusee_cmd("show", "o-0", "--json", *auth).stdout)["summary"]
        assert shown["audit"] == [{"action": "cancel", "by": "ada", "detail": "dup"}]

        p = fusee_cmd("bulk", "terminate", "--workflow", "order", "--yes", "--by", "ops", "--json", *auth)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["done"] == ["o-2"]  # the cancelled ones ended: terminate does not apply

        line = one_line_error(fusee_cmd("bulk", "cancel", "--status", "paused", "--reason", "x", "--yes",
                                        str(tmp_path)))
        assert "--url" in line
        p = fusee_cmd("bulk", "cancel", "--yes", *auth)
        assert p.returncode == 2 and "name the runs" in p.stderr
        line = one_line_error(fusee_cmd("bulk", "resume", "--status", "paused", "--reason", "x", "--yes", *auth))
        assert "takes no reason" in line


def test_serve_logs_the_engine_with_run_and_step_fields(tmp_path: Path) -> None:
    import os
    import time

    import httpx

    from tests.cli.test_commands import APP_DIR, free_port

    port = free_port()
    env = {**os.environ, "OPS_DIR": str(tmp_path / "served")}
    env.pop("FUSEE_TOKEN", None)
    proc = subprocess.Popen([FUSEE, "serve", "ops_app:make_engine", "--port", str(port), "--log-level", "info"],
                            cwd=APP_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.post(f"{url}/api/runs", json={"workflow": "pauser", "workflow_id": "p-1"})
        assert r.status_code == 201, r.text
        while httpx.get(f"{url}/api/runs/p-1").json()["status"] != "paused":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    paused = [line for line in err.splitlines() if "paused after attempt" in line]
    assert len(paused) == 1, err
    assert " WARNING fusee: " in paused[0]
    import re

    assert re.search(r"retries it workflow_id='p-1' workflow='pauser' run_id=\d+ step='call'$", paused[0]), paused[0]
    retried = [line for line in err.splitlines() if "failed (ConnectionError" in line and "retrying" in line]
    assert retried and " INFO fusee: " in retried[0] and "step='call'" in retried[0]
