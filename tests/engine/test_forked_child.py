"""A fusee.Engine opened in a parent and used in a forked child: a typed error at once, never a
hang, and the child keeps neither the directory's lock nor anything else of the parent's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fusee
from tests.engine.fork_app import go, waiter

APP = Path(__file__).with_name("fork_app.py")
ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("mode", ["in-loop", "process"])
def test_a_forked_child_gets_engine_forked_and_leaves_the_directory_free(tmp_path: Path, mode: str) -> None:
    # The fork happens in a program of its own, never in the test process.
    hold_r, hold_w = os.pipe()
    log = tmp_path / "stderr.txt"
    with open(log, "wb") as err:  # a file, not a pipe: the child keeps its copy of the parent's
        p = subprocess.Popen(
            [sys.executable, str(APP), mode, str(tmp_path / "engine"), str(hold_r)],
            stdout=subprocess.PIPE, stderr=err, text=True, pass_fds=(hold_r,),
            env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True,
        )
    os.close(hold_r)
    child = 0
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # the child answered every call (none waited on the parent)
        assert line, log.read_text()
        report = json.loads(line)
        child = report["child_pid"]
        expected = (["start", "signal", "describe", "close"] if mode == "in-loop"
                    else ["run_threadsafe", "start", "describe"])
        assert report["child"] == dict.fromkeys(expected, "EngineForked")
        if mode == "in-loop":
            # The parent closed its engine and exited.
            assert p.wait(timeout=60) == 0, log.read_text()
        else:
            os.kill(p.pid, signal.SIGKILL)  # the parent dies without closing anything
            p.wait(timeout=60)
        assert alive(child)  # the child lives on with its copies of the parent's descriptors...
        # ...yet the directory is free: the child let go of its copy of the lock at the fork.
        with fusee.SyncEngine.open(tmp_path / "engine", workflows=[waiter], exclusive=True) as engine:
            assert engine.is_owner
            with pytest.raises(fusee.NotFound):  # nothing the child tried was recorded
                engine.describe("b")
            engine.signal("a", go, 21)
            assert engine.get("a").result(timeout=60) == 42
    finally:
        os.close(hold_w)  # the child's hold ends: it exits
        p.stdout.close()  # type: ignore[union-attr]
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)
        if child and alive(child):
            os.kill(child, signal.SIGKILL)
