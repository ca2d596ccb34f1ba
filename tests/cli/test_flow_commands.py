"""``fusee schedules`` and ``fusee limits``, run as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

import fusee

sys.path.insert(0, str(Path(__file__).parent))
import ops_app
from test_commands import fusee_cmd, one_line_error, served, tree  # noqa: F401 (the fixture)


def make_scheduled_directory(path: Path) -> None:
    """A closed engine directory with a schedule that ran twice (a trigger and a backfilled time)."""

    async def setup() -> None:
        async with fusee.Engine.open(path, workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20) as engine:
            await engine.schedule("hourly", ops_app.tick, 1, every="1h", paused=True, overlap="allow_all")
            import datetime

            start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
            await engine.backfill_schedule("hourly", start, start + datetime.timedelta(hours=1))
            await engine.trigger_schedule("hourly")
            # Both runs start and end on their own: wait for them (bounded by the test's timeout).
            while sum(r.workflow_id.startswith("hourly@") and r.status == "ok" for r in engine.runs()) < 2:
                await asyncio.sleep(0.005)

    asyncio.run(setup())


def test_schedules_read_offline_change_nothing(tmp_path: Path) -> None:
    d = tmp_path / "e"
    make_scheduled_directory(d)
    before = tree(d)

    p = fusee_cmd("schedules", str(d), "--json")
    assert p.returncode == 0, p.stderr
    [s] = json.loads(p.stdout)["schedules"]
    assert (s["schedule_id"], s["workflow"], s["every"], s["overlap"], s["fired"]) == (
        "hourly", "tick", 3600.0, "allow_all", 2)
    assert s["last_run"].startswith("hourly@") and s["paused"] is None

    p = fusee_cmd("schedules", "list", str(d))
    assert p.returncode == 0, p.stderr
    assert "hourly" in p.stdout and "every 60.0 min" in p.stdout
    assert "--url" in p.stderr  # says what offline cannot know
    assert "\x1b[" not in p.stdout  # no colour off a terminal

    line = one_line_error(fusee_cmd("schedules", "pause", "hourly", str(d)))
    assert "--url" in line
    line = one_line_error(fusee_cmd("limits", str(d)))
    assert "--url" in line and "memory" in line
    assert tree(d) == before


def test_schedules_and_limits_against_fusee_serve(served: tuple[str, str]) -> None:  # noqa: F811
    url, token = served
    auth = ("--url", url, "--token", token)
    r = httpx.post(f"{url}/api/schedules", headers={"Authorization": f"Bearer {token}"},
                   json={"schedule_id": "hourly", "workflow": "tick", "input": 1, "every": "1h", "paused": True})
    assert r.status_code == 201, r.text

    p = fusee_cmd("schedules", *auth, "--json")
    assert p.returncode == 0, p.stderr
    [s] = json.loads(p.stdout)["schedules"]
    assert (s["schedule_id"], s["paused"], s["fired"]) == ("hourly", True, 0)

    p = fusee_cmd("schedules", "unpause", "hourly", *auth)
    assert p.returncode == 0, p.stderr
    assert "paused: no" in p.stdout
    p = fusee_cmd("schedules", "pause", "hourly", *auth, "--json")
    assert json.loads(p.stdout)["paused"] is True
    p = fusee_cmd("schedules", "trigger", "hourly", *auth)
    assert p.returncode == 0, p.stderr
    p = fusee_cmd("schedules", "backfill", "hourly", "2026-01-01T00:00:00Z", "2026-01-01T02:00:00Z", *auth)
    assert p.returncode == 0, p.stderr

    deadline = time.monotonic() + 60
    while True:
        p = fusee_cmd("runs", *auth, "--json", "--where", "status = 'ok'")
        done = {s["workflow_id"] for s in json.loads(p.stdout)["items"] if s["workflow_id"].startswith("hourly@")}
        if len(done) == 3:
            break
        assert time.monotonic() < deadline, done
        time.sleep(0.05)
    assert {"hourly@2026-01-01T00:00:00Z", "hourly@2026-01-01T01:00:00Z"} <= done

    p = fusee_cmd("schedules", *auth)
    assert p.returncode == 0, p.stderr
    assert "hourly" in p.stdout and "yes" in p.stdout
    assert "invalid" in one_line_error(fusee_cmd("schedules", "backfill", "hourly", "then", "now", *auth)).lower() \
        or "start" in one_line_error(fusee_cmd("schedules", "backfill", "hourly", "then", "now", *auth))
    assert "no schedule" in one_line_error(fusee_cmd("schedules", "trigger", "nope", *auth)).lower()

    p = fusee_cmd("schedules", "delete", "hourly", *auth)
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 60
    while json.loads(fusee_cmd("schedules", *auth, "--json").stdout)["schedules"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    p = fusee_cmd("limits", *auth, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"limits": [{"name": "payments", "concurrency": 2, "per_second": 10.0,
                                                "in_use": 0, "waiting": 0}]}
    p = fusee_cmd("limits", "set", "payments", "--concurrency", "7", "--per-second", "2.5", *auth)
    assert p.returncode == 0, p.stderr
    assert "concurrency 7" in p.stdout
    p = fusee_cmd("limits", "list", *auth)
    assert "payments" in p.stdout and "7" in p.stdout and "2.5" in p.stdout
    assert "no limit" in one_line_error(fusee_cmd("limits", "set", "nope", "--concurrency", "1", *auth))
    p = fusee_cmd("limits", "set", "payments", "--concurrency", "0", *auth)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--concurrency" in one_line_error(fusee_cmd("limits", "set", "payments", *auth))
