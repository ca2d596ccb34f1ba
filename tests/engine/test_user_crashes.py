"""Users' programs in their default configuration, killed with SIGKILL and reopened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import finish, ledger, wait_for

APP = Path(__file__).with_name("user_app.py")
ROOT = Path(__file__).resolve().parents[2]


def start(d: Path, mode: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), str(d), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
    )


def test_blocking_steps_do_not_starve_the_flush(tmp_path: Path) -> None:
    """Finished step results become durable while the step pool is saturated."""
    p = start(tmp_path, "etl")
    wait_for(lambda: len(ledger(tmp_path)) >= 200, p)
    finished_early = {line.split()[1] for line in ledger(tmp_path)}
    # Let the pool keep working for a good while (many flush intervals) before the kill.
    target = len(finished_early) + 400
    wait_for(lambda: len(ledger(tmp_path)) >= target, p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    first_life = len(ledger(tmp_path))
    assert first_life < 2000, "the run finished before the kill: make it longer"

    out = finish(start(tmp_path, "etl"))
    assert out[-1]["result"] > 0
    runs: dict[str, int] = {}
    for line in ledger(tmp_path):
        key = line.split()[1]
        runs[key] = runs.get(key, 0) + 1
    assert len(runs) == 2000
    rerun = sorted(k for k in finished_early if runs[k] > 1)
    assert not rerun, f"{len(rerun)} of {len(finished_early)} steps finished long before the crash ran again"


@pytest.mark.parametrize("flush", ["inline", "pipeline", "background"])
def test_cheap_sync_steps_inline_survive_sigkill_in_every_flush_mode(tmp_path: Path, flush: str) -> None:
    """A chain of cheap lambdas (run on the loop's thread once measured) killed mid-way:
    after reopening, no step whose successor had begun runs again, and the sum is right."""
    p = start(tmp_path, "chain", FUSEE_FLUSH=flush)
    wait_for(lambda: len(ledger(tmp_path)) >= 3000, p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    first_life = [int(line.split()[1]) for line in ledger(tmp_path)]
    assert first_life == list(range(len(first_life))), "a chain runs its steps in order, once"
    assert len(first_life) < 20_000, "the run finished before the kill: make it longer"

    out = finish(start(tmp_path, "chain", FUSEE_FLUSH=flush), timeout=300)
    assert out[-1]["result"] == sum(range(20_000))
    stats = out[-1]["stats"]
    # Measured cheap: mostly on the loop's thread (a loaded machine makes some probes look slow).
    assert stats["sync_inline"] > 1000, stats
    if flush == "pipeline":
        assert stats["flush_waits"] > 0, stats
    runs = [int(line.split()[1]) for line in ledger(tmp_path)]
    again = len(runs) - 20_000
    # A step begins only once its predecessor's result is durable: only the last
    # step of the first life (its result perhaps not durable) may run twice.
    assert 0 <= again <= 1, f"{again} steps ran twice"
    if again:
        assert runs[len(first_life)] == first_life[-1]


def test_cancel_then_crash_never_restarts_the_covered_step(tmp_path: Path) -> None:
    """A durable cancel covers the step that was running: after a crash it is not run again;
    the code sees Cancelled there and compensates."""
    p = start(tmp_path, "saga")
    assert p.stdout is not None
    line = p.stdout.readline()
    assert json.loads(line) == {"cancel_acked": True}, p.stderr.read() if p.stderr else ""
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    before = ledger(tmp_path)
    assert [x.split()[0] for x in before] == ["begin"]

    out = finish(start(tmp_path, "saga-resume"))
    assert "cancelled" in out[-1], out
    after = ledger(tmp_path)
    kinds = [x.split()[0] for x in after]
    assert kinds.count("begin") == 1, f"the charge started again after a durable cancel: {after}"
    assert kinds == ["begin", "refund"], after


def test_a_completion_token_survives_sigkill(tmp_path: Path) -> None:
    p = start(tmp_path, "approval")
    assert p.stdout is not None
    line = p.stdout.readline()
    assert json.loads(line) == {"awaiting": True}, p.stderr.read() if p.stderr else ""
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    links = [x.split()[1] for x in ledger(tmp_path) if x.startswith("link ")]
    assert len(links) == 1
    out = finish(start(tmp_path, "approval-complete", TOKEN=links[0]))
    assert out[0] == {"accepted": True, "again": False}
    assert out[-1] == {"result": "250 approved by erin"}
    assert len([x for x in ledger(tmp_path) if x.startswith("link ")]) == 1, "the link went out twice"


def test_a_stream_survives_sigkill_unchanged(tmp_path: Path) -> None:
    p = start(tmp_path, "stream")
    assert p.stdout is not None
    seen: list[str] = []
    while len(seen) < 10:
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.stderr else ""
        seen.append(json.loads(line)["chunk"])
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    out = finish(start(tmp_path, "stream-resume"))
    chunks = [m["chunk"] for m in out if "chunk" in m]
    # Every chunk a reader saw before the crash is still there, unchanged, and none is missing.
    assert chunks == [f"tok-{i}" for i in range(40)]
    assert chunks[: len(seen)] == seen
    assert out[-1] == {"result": 40}


def test_heartbeat_progress_and_a_reset_survive_sigkill(tmp_path: Path) -> None:
    p = start(tmp_path, "export")
    wait_for(lambda: sum(x.startswith("page") for x in ledger(tmp_path)) >= 20, p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    reported = sum(x.startswith("page") for x in ledger(tmp_path))
    out = finish(start(tmp_path, "export"))
    assert out[-1] == {"result": 60}
    resumes = [int(x.split()[1]) for x in ledger(tmp_path) if x.startswith("resume")]
    # The restarted attempt began from durable progress: past the start, not past what was reported.
    assert resumes[0] == 0 and 0 < resumes[1] <= reported

    # An operator resets the finished run; the process dies while the export runs again.
    p = start(tmp_path, "export-reset")
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == {"reset_acked": True}
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    out = finish(start(tmp_path, "export"))
    assert out[-1] == {"result": 60}
    resumes = [int(x.split()[1]) for x in ledger(tmp_path) if x.startswith("resume")]
    assert len(resumes) >= 3 and resumes[2] == 0  # the reset run started the export afresh


def test_update_with_start_and_versions_survive_sigkill(tmp_path: Path) -> None:
    p = start(tmp_path, "cart")
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == {"acked": 1}, p.stderr.read() if p.stderr else ""
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    # The next release registers version 2 beside version 1.
    out = finish(start(tmp_path, "cart-2", CART_V2="1"))
    assert out[-1] == {
        "again": 1,  # the same update ID: the same answer, not applied twice
        "more": 2,
        "one": "v1 ann: tea,cup",  # the open cart goes on with the code it started with
        "two": "v2 bob: POT",  # a new cart takes the newest version
    }
