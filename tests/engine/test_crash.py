"""Crash and recover for real: run a process, SIGKILL it, reopen, compare."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

APP = Path(__file__).with_name("crash_app.py")
ROOT = Path(__file__).resolve().parents[2]


def start(d: Path, mode: str, *args: str, kill_at: str = "") -> subprocess.Popen[str]:
    env = dict(os.environ, KILL_AT=kill_at, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, str(APP), str(d), mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(p: subprocess.Popen[str], timeout: float = 120) -> list[dict[str, Any]]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\n{err}"
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def effects(d: Path) -> list[tuple[str, str, str]]:
    f = d / "effects.txt"
    if not f.exists():
        return []
    return [tuple(line.split("\t")) for line in f.read_text().splitlines()]  # type: ignore[misc]


def check_no_step_ran_on_a_taken_back_input(d: Path) -> None:
    """A key called with two different inputs means a step re-ran after a crash took back its input."""
    inputs: dict[str, set[str]] = defaultdict(set)
    for key, inp, _ in effects(d):
        inputs[key].add(inp)
    bad = {k: v for k, v in inputs.items() if len(v) > 1}
    assert not bad, f"steps ran again on different inputs: {bad}"


def test_kill_between_a_steps_effect_and_its_record(tmp_path: Path) -> None:
    p = start(tmp_path, "chain", kill_at="after-effect:s1")
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL
    before = effects(tmp_path)
    assert [e[0].rsplit("/", 1)[1] for e in before] == ["0", "1"]
    out = finish(start(tmp_path, "chain"))
    after = effects(tmp_path)
    # s0's result was recorded: it never runs again. s1 runs again with the same key and input.
    keys = [k for k, _, _ in after]
    assert keys.count(before[0][0]) == 1
    assert keys.count(before[1][0]) == 2
    assert len(after) == 4
    assert out[-1]["result"] == after[-1][2]
    check_no_step_ran_on_a_taken_back_input(tmp_path)
    # The result never changes afterwards.
    again = finish(start(tmp_path, "chain"))
    assert again[-1]["result"] == out[-1]["result"]
    assert len(effects(tmp_path)) == 4


def test_kill_during_a_durable_sleep(tmp_path: Path) -> None:
    p = start(tmp_path, "sleeper", kill_at="in-sleep")
    assert p.stdout is not None
    line = p.stdout.readline()
    assert json.loads(line) == {"sleeping": True}
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    out = finish(start(tmp_path, "sleeper"))
    result = out[-1]["result"]
    # The sleep kept its recorded deadline across the crash: at least 1.5 s in all.
    assert result["slept"] >= 1.5
    names = [k.rsplit("/", 1)[1] for k, _, _ in effects(tmp_path)]
    assert names == ["0", "4"], "the step before the sleep ran again"
    check_no_step_ran_on_a_taken_back_input(tmp_path)


def test_kill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    n = 40
    p = start(tmp_path, "load", str(n))
    assert p.stdout is not None
    acked_starts: set[str] = set()
    acked_signals: dict[str, list[int]] = defaultdict(list)
    # Kill once some acknowledgements are out, in the middle of the work.
    while len(acked_starts) < n // 2:
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.stderr else ""
        msg = json.loads(line)
        if "ack_start" in msg:
            acked_starts.add(msg["ack_start"])
    p.send_signal(signal.SIGKILL)
    rest, _ = p.communicate(timeout=60)
    for line in rest.splitlines():
        msg = json.loads(line)
        if "ack_start" in msg:
            acked_starts.add(msg["ack_start"])
        if "ack_signal" in msg:
            acked_signals[msg["ack_signal"]].append(msg["value"])
    out = finish(start(tmp_path, "load", str(n)))
    results = out[-1]["results"]
    for wid in acked_starts:
        assert wid in results
    for i in range(n):
        assert results[f"wait-{i}"] == [0, 1]
    check_no_step_ran_on_a_taken_back_input(tmp_path)
    # Reported results never change.
    again = finish(start(tmp_path, "load", str(n)))
    assert again[-1]["results"] == results
