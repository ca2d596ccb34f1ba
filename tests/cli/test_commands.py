"""The ``fusee`` command, run as a real subprocess (``.venv/bin/fusee``) as an operator runs it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

import fusee
import fusee.testing

HERE = Path(__file__).parent
APP_DIR = HERE.parent / "http"
sys.path.insert(0, str(APP_DIR))
import ops_app  # noqa: E402

FUSEE = str(Path(sys.executable).parent / "fusee")


def fusee_cmd(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("FUSEE_URL", "FUSEE_TOKEN")}
    return subprocess.run([FUSEE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**e, **(env or {})}, cwd=cwd)


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one line on stderr and no traceback."""
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("fusee: ")
    return lines[0]


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root`` with its size and mtime (ns)."""
    out = {".": (0, root.stat().st_mtime_ns)}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


def make_directory(path: Path) -> None:
    """An engine directory (closed) with a finished order and one waiting for its approval."""

    async def setup() -> None:
        async with fusee.Engine.open(path, workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20) as engine:
            await engine.start(ops_app.order, "o-1", "acme")
            await engine.start(ops_app.order, "o-2", "zed")
            await engine.signal("o-2", ops_app.approve, True, by="ada")
            await engine.get("o-2").result()

    asyncio.run(setup())


def test_offline_reads_list_show_and_change_nothing(tmp_path: Path) -> None:
    d = tmp_path / "e"
    make_directory(d)
    before = tree(d)

    p = fusee_cmd("runs", str(d), "--json")
    assert p.returncode == 0, p.stderr
    page = json.loads(p.stdout)
    assert [(s["workflow_id"], s["status"]) for s in page["items"]] == [("o-1", "running"), ("o-2", "ok")]
    assert page["items"][1]["ended_at"].endswith("Z")

    p = fusee_cmd("runs", str(d))
    assert p.returncode == 0
    assert "\x1b[" not in p.stdout  # no colours off a terminal
    lines = p.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["WORKFLOW", "ID", "TYPE"]
    assert lines[1].split()[:3] == ["o-1", "order", "running"]
    assert "customer=acme" in lines[1]

    p = fusee_cmd("runs", str(d), "--status", "ok", "--json")
    assert [s["workflow_id"] for s in json.loads(p.stdout)["items"]] == ["o-2"]
    p = fusee_cmd("runs", str(d), "--where", "attrs.customer = 'acme'", "--json")
    assert [s["workflow_id"] for s in json.loads(p.stdout)["items"]] == ["o-1"]
    p = fusee_cmd("runs", str(d), "--attr", "customer=zed", "--workflow", "order", "--json")
    assert [s["workflow_id"] for s in json.loads(p.stdout)["items"]] == ["o-2"]

    p = fusee_cmd("runs", str(d), "--limit", "1", "--json")
    first = json.loads(p.stdout)
    assert [s["workflow_id"] for s in first["items"]] == ["o-1"] and first["cursor"]
    p = fusee_cmd("runs", str(d), "--limit", "1", "--cursor", first["cursor"], "--json")
    assert [s["workflow_id"] for s in json.loads(p.stdout)["items"]] == ["o-2"]
    p = fusee_cmd("runs", str(d), "--limit", "1", "--all", "--json")
    assert [s["workflow_id"] for s in json.loads(p.stdout)["items"]] == ["o-1", "o-2"]
    p = fusee_cmd("runs", str(d), "--limit", "1")
    assert f"more: --cursor {first['cursor']}" in p.stdout

    p = fusee_cmd("show", str(d), "o-2")
    assert p.returncode == 0, p.stderr
    assert "signal by ada (approve)" in p.stdout
    steps = [line.split() for line in p.stdout.splitlines() if " step " in line]
    # The step's row: when it began and how long it took (µs or ms on this machine).
    assert steps and steps[0][3:7] == ["step", "reserve", "ok", "1"] and steps[0][8] in ("µs", "ms"), steps
    assert "result: shipped" in p.stdout

    p = fusee_cmd("show", str(d), "o-2", "--json")
    shown = json.loads(p.stdout)
    assert shown["summary"]["status"] == "ok"
    assert shown["timeline"][0]["kind"] == "start"
    assert "$bytes" not in p.stdout

    p = fusee_cmd("journal", str(d), "o-2")
    records = json.loads(p.stdout)
    assert records[0]["kind"] == "Start" and records[0]["started_at"].endswith("Z")

    p = fusee_cmd("metrics", str(d), "--json")
    assert json.loads(p.stdout)["shards"][0]["runs"] == {"ok": 1, "running": 1}

    out = tmp_path / "o-2.fjnl"
    p = fusee_cmd("export", str(d), "o-2", str(out))
    assert p.returncode == 0, p.stderr
    p = fusee_cmd("import", str(out), "--json")
    assert json.loads(p.stdout)["timeline"][-1]["result"] == "shipped"
    p = fusee_cmd("import", str(out), "--replay", "ops_app:WORKFLOWS", cwd=APP_DIR)
    assert p.returncode == 0, p.stderr
    assert "replays" in p.stdout

    assert tree(d) == before


def test_a_directory_a_live_process_has_open_is_read_and_left_unchanged(tmp_path: Path) -> None:
    d = tmp_path / "e"
    app = subprocess.Popen([sys.executable, str(APP_DIR / "ops_app.py"), str(d)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert app.stdout is not None
        assert app.stdout.readline().strip() == "ready", app.stderr.read() if app.stderr else ""
        before = tree(d)
        p = fusee_cmd("runs", str(d), "--json")
        assert p.returncode == 0, p.stderr
        assert [s["workflow_id"] for s in json.loads(p.stdout)["items"]] == ["o-live"]
        assert "live process" in p.stderr
        p = fusee_cmd("show", str(d), "o-live")
        assert p.returncode == 0, p.stderr
        assert "reserve" in p.stdout or "start" in p.stdout
        p = fusee_cmd("journal", str(d), "o-live")
        assert json.loads(p.stdout)[0]["input"] == "acme"
        assert tree(d) == before
        assert app.poll() is None  # the application was not disturbed
    finally:
        app.kill()
        app.wait()


def test_errors_are_one_line_and_exit_1(tmp_path: Path) -> None:
    d = tmp_path / "e"
    make_directory(d)
    assert "no workflow with id 'nope'" in one_line_error(fusee_cmd("show", str(d), "nope"))
    missing = tmp_path / "typo"
    assert "does not exist" in one_line_error(fusee_cmd("runs", str(missing)))
    assert not missing.exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    assert "not an engine directory" in one_line_error(fusee_cmd("runs", str(foreign)))
    assert sorted(os.listdir(foreign)) == ["x"]
    assert "invalid query at position" in one_line_error(fusee_cmd("runs", str(d), "--where", "status ="))
    line = one_line_error(fusee_cmd("cancel", "o-1"))
    assert "--url" in line
    line = one_line_error(fusee_cmd("terminate", str(d), "o-1"))  # a directory is never written
    assert "--url" in line and "read" in line
    line = one_line_error(fusee_cmd("runs", "--url", f"http://127.0.0.1:{free_port()}"))
    assert "connection refused" in line
    p = fusee_cmd("runs")
    assert "directory" in one_line_error(p)
    p = fusee_cmd("frobnicate")
    assert p.returncode == 2 and "Traceback" not in p.stderr


@pytest.mark.parametrize(("position", "field"), [(0, "started_ms"), (1, "fire_at_ms"), (2, "finished_ms")])
def test_import_of_a_journal_with_an_impossible_time_names_the_record(
        tmp_path: Path, position: int, field: str) -> None:
    from fusee import journal_file
    from fusee.core import records as rec

    start = rec.Start(run=1, id="o-1", wtype="order", version=1, codec=0, started_ms=1_700_000_000_000,
                      deadline_ms=0, parent=None, policy=0, update=None, input=b'"acme"')
    records: list[rec.Record] = [start, rec.Timer(run=1, seq=0, name="nap", fire_at_ms=1_700_000_001_000),
                                 rec.Done(run=1, status=rec.Status.OK, finished_ms=1_700_000_002_000,
                                          payload=b"1", by=None)]
    records[position] = msgspec.structs.replace(records[position], **{field: 10**16})  # year 318857
    path = tmp_path / "odd.fjnl"
    journal_file.write(path, records)  # a valid checksum over an impossible time
    for args in ((), ("--json",)):
        line = one_line_error(fusee_cmd("import", str(path), *args))
        kind = type(records[position]).__name__
        assert f"record {position} ({kind})" in line and field in line and "ValueError" not in line, line
    with pytest.raises(fusee.CorruptRecord, match=f"record {position}"):
        fusee.testing.load_journal(path)


def test_sim_and_disk_check(tmp_path: Path) -> None:
    p = fusee_cmd("sim", "--seed", "3", "--quiet")
    assert p.returncode == 0, p.stderr
    p = fusee_cmd("disk-check", str(tmp_path), "--count", "20")
    assert p.returncode == 0, p.stderr
    assert "fdatasync" in p.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``fusee serve ops_app:make_engine`` with a token, as a subprocess: (url, token)."""
    with serving(tmp_path) as url_token:
        yield url_token


@contextlib.contextmanager
def serving(tmp_path: Path, *options: str) -> Iterator[tuple[str, str]]:
    """``fusee serve ops_app:make_engine --token ... *options`` until the block ends: (url, token)."""
    port = free_port()
    token = "s3cret-token"
    env = {**os.environ, "OPS_DIR": str(tmp_path / "served")}
    env.pop("FUSEE_TOKEN", None)
    proc = subprocess.Popen([FUSEE, "serve", "ops_app:make_engine", "--port", str(port), "--token", token,
                             "--log-level", "warning", *options], cwd=APP_DIR, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until it answers (bounded)
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{url}/api/metrics", headers={"Authorization": f"Bearer {token}"},
                             timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "fusee serve did not answer"
            time.sleep(0.05)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_url_target_against_fusee_serve(served: tuple[str, str]) -> None:
    url, token = served
    auth = ("--url", url, "--token", token)

    line = one_line_error(fusee_cmd("runs", "--url", url, "--token", "wrong"))
    assert "token" in line.lower()
    line = one_line_error(fusee_cmd("runs", "--url", url))
    assert "token" in line.lower()

    p = fusee_cmd("start", "order", "o-1", "acme", *auth)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("started o-1")
    p = fusee_cmd("start", "order", "o-2", '"zed"', *auth)
    assert p.returncode == 0, p.stderr
    assert "already" in one_line_error(fusee_cmd("start", "order", "o-1", "acme", *auth)).lower()

    def status(wid: str) -> Any:
        p = fusee_cmd("show", wid, "--json", env={"FUSEE_URL": url, "FUSEE_TOKEN": token})
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    deadline = time.monotonic() + 60
    while not any(e["kind"] == "wait" for e in status("o-1")["timeline"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p = fusee_cmd("query", "o-1", "state", *auth)
    assert json.loads(p.stdout) == "reserved"

    # A value of the wrong type and a misspelled name are refused, and record nothing (the audit below).
    assert "bool" in one_line_error(fusee_cmd("signal", "o-1", "approve", "yes", *auth))
    assert "'approve'" in one_line_error(fusee_cmd("signal", "o-1", "aprove", "true", *auth))
    p = fusee_cmd("signal", "o-1", "approve", "true", "--by", "ada", *auth)
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 60
    while status("o-1")["summary"]["status"] != "ok":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    shown = status("o-1")
    assert shown["summary"]["audit"] == [{"action": "signal", "by": "ada", "detail": "approve"}]
    assert shown["timeline"][-1]["result"] == "shipped"

    p = fusee_cmd("terminate", "o-2", "--reason", "test", "--by", "ops", *auth)
    assert p.returncode == 0, p.stderr
    p = fusee_cmd("runs", *auth, "--json")
    assert {s["workflow_id"]: s["status"] for s in json.loads(p.stdout)["items"]} == {
        "o-1": "ok", "o-2": "terminated"}
    assert "has ended" in one_line_error(fusee_cmd("cancel", "o-2", *auth))
    assert "no workflow" in one_line_error(fusee_cmd("signal", "nope", "approve", *auth))

    p = fusee_cmd("runs", url, "--token", token)  # a URL as the target argument
    assert p.returncode == 0 and "o-1" in p.stdout

    p = fusee_cmd("start", "pauser", "p-1", *auth)
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 60
    while status("p-1")["summary"]["paused_steps"] != ["call"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p = fusee_cmd("reset", "p-1", "--before-step", "call", "--by", "ops", *auth)
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 60
    while status("p-1")["summary"]["paused_steps"] != ["call"]:  # the new run's retries run out again
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p = fusee_cmd("resume", "p-1", *auth)
    assert p.returncode == 0, p.stderr

    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"fusee-cli-{os.getpid()}.fjnl"
    try:
        p = fusee_cmd("export", "o-1", str(out), *auth)
        assert p.returncode == 0, p.stderr
        p = fusee_cmd("import", str(out), "--json")
        assert json.loads(p.stdout)["records"][0]["kind"] == "Start"
    finally:
        out.unlink(missing_ok=True)


def test_serve_refuses_a_public_host_without_a_token(tmp_path: Path) -> None:
    env = {"OPS_DIR": str(tmp_path / "never")}
    line = one_line_error(fusee_cmd("serve", "ops_app:make_engine", "--host", "0.0.0.0", cwd=APP_DIR, env=env))
    assert "without a token" in line
    assert not (tmp_path / "never").exists()  # refused before anything was opened


def test_serve_explains_a_bad_factory(tmp_path: Path) -> None:
    line = one_line_error(fusee_cmd("serve", "no_such_module:make", cwd=tmp_path))
    assert "no_such_module" in line
    line = one_line_error(fusee_cmd("serve", "ops_app", cwd=APP_DIR))
    assert "module:function" in line


def test_the_module_form_runs_too() -> None:
    p = subprocess.run([sys.executable, "-m", "fusee.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "runs" in p.stdout
    assert shutil.which(FUSEE) is not None


def test_a_stream_is_followed_live_as_server_sent_events(served: tuple[str, str]) -> None:
    url, token = served
    headers = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{url}/api/runs", json={"workflow": "order", "workflow_id": "o-s", "input": "acme"},
                   headers=headers)
    assert r.status_code == 201
    events: list[str] = []
    with httpx.stream("GET", f"{url}/api/runs/o-s/streams/log", headers=headers, timeout=60) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        block: list[str] = []
        for line in s.iter_lines():
            if line:
                block.append(line)
                continue
            if not block or block[0].startswith(":"):
                block = []
                continue
            events.append("\n".join(block))
            block = []
            if len(events) == 1:
                # The first chunk arrived while the run still waits: approve it now.
                assert events[0] == 'id: 1\nevent: chunk\ndata: "order for acme"'
                r = httpx.post(f"{url}/api/runs/o-s/signal", json={"name": "approve", "value": True},
                               headers=headers)
                assert r.status_code == 200
            if events[-1].startswith("event: end"):
                break
    assert events[1] == 'id: 2\nevent: chunk\ndata: "approved"'
    assert events[2].startswith('event: end\ndata: {"offset": 2, "status": "ok", "run_id": ')


def _failed_run(path: Path) -> None:
    """A directory holding a run that failed with ops_app.LONG_ERROR."""

    async def setup() -> None:
        async with fusee.Engine.open(path, workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20) as engine:
            run = await engine.start(ops_app.broken, "b-1")
            with pytest.raises(fusee.WorkflowFailed):
                await run.result()

    asyncio.run(setup())


def test_show_and_import_print_whole_errors_when_piped(tmp_path: Path) -> None:
    d = tmp_path / "e"
    _failed_run(d)
    p = fusee_cmd("show", str(d), "b-1")
    assert p.returncode == 0, p.stderr
    assert f"error: ConnectionError: {ops_app.LONG_ERROR}" in p.stdout  # on one line, whole
    out = tmp_path / "b-1.fjnl"
    assert fusee_cmd("export", str(d), "b-1", str(out)).returncode == 0
    p = fusee_cmd("import", str(out))
    assert p.returncode == 0, p.stderr
    assert f"error: ConnectionError: {ops_app.LONG_ERROR}" in p.stdout
    assert "…" not in p.stdout


def test_offline_metrics_say_what_only_the_running_engine_knows(tmp_path: Path) -> None:
    d = tmp_path / "e"
    make_directory(d)
    p = fusee_cmd("metrics", str(d))
    assert p.returncode == 0, p.stderr
    figures = {line[:17].strip(): line[17:].strip() for line in p.stdout.splitlines()}
    assert figures["shard 0"].startswith("ok=1 running=1")
    assert "loaded n/a, parked n/a" in figures["shard 0"]
    for counter in ("steps run", "steps executing", "flushes", "records flushed", "flush p50 ms"):
        assert figures[counter] == "n/a", p.stdout
    assert figures["indexed"] == "2"  # known from the log
    m = json.loads(fusee_cmd("metrics", str(d), "--json").stdout)
    assert m["steps_run"] is None and m["flushes"] is None and m["stats"] is None
    assert m["shards"][0]["runs"] == {"ok": 1, "running": 1} and m["shards"][0]["durable_lsn"] > 0


def test_errors_name_no_python_internals(tmp_path: Path) -> None:
    line = one_line_error(fusee_cmd("serve", "ops_app", cwd=APP_DIR))
    assert "ValueError" not in line and "module:function" in line
    d = tmp_path / "e"
    make_directory(d)
    out = tmp_path / "o.fjnl"
    assert fusee_cmd("export", str(d), "o-2", str(out)).returncode == 0
    line = one_line_error(fusee_cmd("import", str(out), "--replay", "no_such_app:WORKFLOWS", cwd=tmp_path))
    assert "ModuleNotFoundError" not in line and "no module named 'no_such_app'" in line
    assert "PYTHONPATH" in line


def test_resume_with_nothing_paused_fails(served: tuple[str, str]) -> None:
    url, token = served
    auth = ("--url", url, "--token", token)
    assert fusee_cmd("start", "order", "o-1", "acme", *auth).returncode == 0
    line = one_line_error(fusee_cmd("resume", "o-1", *auth))
    assert "no paused step" in line


def test_ids_that_look_like_paths_are_reached_by_every_command(served: tuple[str, str], tmp_path: Path) -> None:
    url, token = served
    auth = ("--url", url, "--token", token)
    for wid in ("x/journal", "y/signal", "z/export"):
        p = fusee_cmd("start", "order", wid, "acme", *auth)
        assert p.returncode == 0, p.stderr
        deadline = time.monotonic() + 60
        while True:
            p = fusee_cmd("show", wid, "--json", *auth)
            assert p.returncode == 0, p.stderr
            shown = json.loads(p.stdout)
            assert shown["summary"]["workflow_id"] == wid
            if any(e["kind"] == "wait" for e in shown["timeline"]):
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        p = fusee_cmd("signal", wid, "approve", "true", *auth)
        assert p.returncode == 0, p.stderr
        deadline = time.monotonic() + 60
        while json.loads(fusee_cmd("show", wid, "--json", *auth).stdout)["summary"]["status"] != "ok":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        records = json.loads(fusee_cmd("journal", wid, *auth).stdout)
        assert records[0]["kind"] == "Start" and records[-1]["kind"] == "Done"
        out = tmp_path / "run.fjnl"
        p = fusee_cmd("export", wid, str(out), *auth)
        assert p.returncode == 0, p.stderr
        assert json.loads(fusee_cmd("import", str(out), "--json").stdout)["timeline"][-1]["result"] == "shipped"


def test_fork_from_the_command_line(served: tuple[str, str]) -> None:
    url, token = served
    auth = ("--url", url, "--token", token)
    assert fusee_cmd("start", "order", "o-1", "acme", *auth).returncode == 0
    deadline = time.monotonic() + 60
    while not any(e["kind"] == "wait" for e in json.loads(fusee_cmd("show", "o-1", "--json", *auth).stdout)["timeline"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p = fusee_cmd("fork", "o-1", "o-1-copy", "--before-step", "reserve", "--by", "ops", *auth)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("o-1-copy forked from o-1")
    runs = {s["workflow_id"]: s["status"] for s in json.loads(fusee_cmd("runs", *auth, "--json").stdout)["items"]}
    assert runs == {"o-1": "running", "o-1-copy": "running"}
    line = one_line_error(fusee_cmd("fork", "o-1", "o-1-copy", "--before-step", "reserve", *auth))
    assert "exists" in line or "already" in line


def test_serve_answers_only_its_host_names_and_takes_bodies_up_to_its_limit(tmp_path: Path) -> None:
    with serving(tmp_path, "--allowed-host", "fusee.internal", "--max-body", "2000") as (url, token):
        auth = {"Authorization": f"Bearer {token}"}
        port = url.rsplit(":", 1)[1]
        assert httpx.get(f"{url}/api/runs", headers=auth).status_code == 200
        r = httpx.get(f"{url}/api/runs", headers={**auth, "Host": f"fusee.internal:{port}"})
        assert r.status_code == 200
        r = httpx.get(f"{url}/ui/", headers={**auth, "Host": f"evil.example:{port}"})
        assert r.status_code == 400 and "csrf" not in r.text
        r = httpx.post(f"{url}/api/runs", headers=auth,
                       json={"workflow": "order", "workflow_id": "o-1", "input": "x" * 3000})
        assert r.status_code == 413 and r.json()["error"]["type"] == "RequestTooLarge"
        r = httpx.post(f"{url}/api/runs", headers={**auth, "Origin": "http://evil.example"},
                       json={"workflow": "order", "workflow_id": "o-1", "input": "acme"})
        assert r.status_code == 403
        # The CLI sends JSON, and no Origin: it is let through.
        p = fusee_cmd("start", "order", "o-1", "acme", "--url", url, "--token", token)
        assert p.returncode == 0, p.stderr
        p = fusee_cmd("runs", "--url", f"http://localhost:{port}", "--token", token, "--json")
        assert [s["workflow_id"] for s in json.loads(p.stdout)["items"]] == ["o-1"]


def test_serve_on_every_address_says_which_names_it_answers(tmp_path: Path) -> None:
    p = fusee_cmd("serve", "no_such_module:make", "--host", "0.0.0.0", "--token", "t", cwd=tmp_path)
    assert p.returncode == 1
    assert "--allowed-host" in p.stderr and "127.0.0.1" in p.stderr


def test_serve_with_a_tokens_file_names_each_person_in_the_audit(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\nada = "tok-ada-1"\ngrace = "tok-grace-2"\n')
    os.chmod(tokens, 0o644)
    line = one_line_error(fusee_cmd("serve", "ops_app:make_engine", "--tokens-file", str(tokens), cwd=APP_DIR))
    assert "chmod 600" in line
    os.chmod(tokens, 0o600)
    with serving(tmp_path, "--tokens-file", str(tokens)) as (url, _shared):
        assert fusee_cmd("start", "order", "o-1", "acme", "--url", url, "--token", "tok-ada-1").returncode == 0
        assert "token" in one_line_error(fusee_cmd("runs", "--url", url, "--token", "tok-nobody")).lower()
        p = fusee_cmd("cancel", "o-1", "--url", url, "--token", "tok-grace-2")
        assert p.returncode == 0, p.stderr
        r = httpx.get(f"{url}/api/runs/o-1", headers={"Authorization": "Bearer tok-ada-1"})
        assert [(a["action"], a["by"]) for a in r.json()["audit"]] == [("cancel", "grace")]
