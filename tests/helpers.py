"""Helpers for engine tests, and for crash tests that drive an app in a subprocess."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


async def until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    """Waits (yielding to the loop) until ``cond()`` holds; fails after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


# --- a user's app in a subprocess, killed with SIGKILL and started again ------------


def finish(p: subprocess.Popen[str], timeout: float = 120) -> list[dict[str, Any]]:
    """Waits for the app to exit successfully; returns the JSON lines it printed."""
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\n{err}"
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def ledger(d: Path) -> list[str]:
    """The lines the app's step functions wrote to ``d/ledger.txt`` (their effects)."""
    f = d / "ledger.txt"
    return f.read_text().splitlines() if f.exists() else []


def wait_for(cond: Callable[[], bool], p: subprocess.Popen[str], timeout: float = 60) -> None:
    """Waits until ``cond()`` holds while the app runs; fails if it exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not cond():
        if p.poll() is not None:
            raise AssertionError(f"the app exited early: {p.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


async def crash_in_process(engine: Any) -> None:
    """What a crash leaves, without killing the test's process: no close, no final checkpoint,
    and the directory let go (its lock, its routing socket, this process's claim on it)."""
    engine._rt.closed = True
    engine._closed = True
    if engine._route_server is not None:
        await engine._route_server.close()
    engine._log.close()
    for released in engine._on_release:
        released()
    release_collector(engine)


def release_collector(engine: Any) -> None:
    """What a crash does to the engine's garbage-collector tuning: a dead process's settings die with it."""
    if engine._gc_release is not None:
        engine._gc_release()
        engine._gc_release = None
