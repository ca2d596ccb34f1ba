"""Keyed objects and step limits across a real SIGKILL (tests/engine/objects_app.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import finish, ledger, wait_for

APP = Path(__file__).with_name("objects_app.py")
ROOT = Path(__file__).resolve().parents[2]


def start(d: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), str(d), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def test_an_acknowledged_call_keeps_its_state_and_answer_after_sigkill(tmp_path: Path) -> None:
    p = start(tmp_path, "deposit")
    assert p.stdout is not None
    answers = []
    for _ in range(6):
        answers.append(json.loads(p.stdout.readline())["answer"])
    assert answers == [10, 21, 33, 46, 60, 75]
    assert json.loads(p.stdout.readline()) == {"acked": True}
    wait_for(lambda: "book acct-1 99" in ledger(tmp_path), p)  # the slow call's handler runs
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)

    out = finish(start(tmp_path, "deposit-again"))[-1]
    # Every acknowledged call id answers the same, without its handler running again...
    assert out["again"] == answers
    books = [line for line in ledger(tmp_path) if line.startswith("book")]
    assert sorted(b for b in books if b != "book acct-1 99") == sorted(f"book acct-1 {10 + i}" for i in range(6))
    # ...the call in flight at the kill was accepted durably: it ran again after the reopen
    # (its step had no recorded result) and finished before the calls that came after it...
    assert books.count("book acct-1 99") == 2
    # ...and the state holds every write exactly once.
    assert out["state"] == 75 + 99 and out["shared"] == 75 + 99
    assert out["version"] == 7


def _max_in_flight(lines: list[str]) -> int:
    """The most executions running at once within one life (a kill ends those of its life)."""
    running: set[str] = set()
    most = 0
    for line in lines:
        if line == "life":
            running.clear()
            continue
        kind, key = line.split(" ", 1)
        if kind == "start":
            assert key not in running, f"{key} started twice at once"
            running.add(key)
            most = max(most, len(running))
        elif kind == "end":
            running.discard(key)
    return most


def test_a_limit_of_two_is_never_exceeded_across_sigkill(tmp_path: Path) -> None:
    p = start(tmp_path, "limit")

    def in_flight() -> bool:
        lines = ledger(tmp_path)
        starts = sum(1 for x in lines if x.startswith("start"))
        ends = sum(1 for x in lines if x.startswith("end"))
        return starts >= 10 and starts > ends

    wait_for(in_flight, p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    before = ledger(tmp_path)
    assert sum(1 for x in before if x.startswith("end")) < 48, "finished before the kill"

    out = finish(start(tmp_path, "limit"))[-1]
    assert out["results"] == [24, 24]
    assert out["limits"] == {"svc": [0, 0]}
    lines = ledger(tmp_path)
    assert lines.count("life") == 2
    assert _max_in_flight(lines) == 2  # reached, never exceeded, in both lives
    after = lines[len(before):]
    assert _max_in_flight(after) <= 2
    ended = {x.split(" ", 1)[1] for x in lines if x.startswith("end")}
    assert len(ended) == 48
