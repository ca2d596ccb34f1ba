"""`fusee workers`: N real worker processes on a parted directory, supervised."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fusee
from fusee.scale.parts import PartedEngine
from fusee.storage.partsfile import read_parts

APP = textwrap.dedent("""
    import os
    import fusee

    @fusee.workflow("wk-double")
    async def double(ctx: fusee.Ctx, n: int) -> list:
        v = await ctx.step("double", lambda: n * 2)
        return [v, os.getpid()]

    def make_engine():
        return fusee.Engine.open(os.path.join(os.path.dirname(__file__), "data"), parts=4,
                                 workflows=[double], route_timeout=60)
""")


class _Lines:
    """The supervisor's stderr, read on a thread so that the test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.proc = proc
        assert proc.stderr is not None
        stream = proc.stderr
        threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True).start()

    def wait(self, pattern: str, count: int = 1, timeout: float = 60) -> list[re.Match[str]]:
        deadline = time.monotonic() + timeout
        while True:
            found = [m for line in list(self.lines) if (m := re.search(pattern, line))]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline and self.proc.poll() is None, \
                f"no {count} lines matching {pattern!r} in {self.lines}"
            time.sleep(0.02)


def _workers(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]), str(tmp_path)]))
    return subprocess.Popen([sys.executable, "-m", "fusee.cli", "workers", *args], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _supervised(tmp_path: Path, *args: str) -> Iterator[_Lines]:
    """A running `fusee workers` and its stderr; stopped with SIGTERM at the end, which must exit 0
    (killed instead when the body failed)."""
    sup = _workers(tmp_path, *args)
    try:
        yield _Lines(sup)
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=60) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_workers_share_the_parts_restart_a_killed_one_and_stop_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "wkapp.py").write_text(APP)
    try:
        with _supervised(tmp_path, "wkapp:make_engine", "-n", "2") as out:
            opened = out.wait(r"worker (\d) \(pid (\d+)\) opened", 2)
            pids = {int(m[2]) for m in opened}
            sys.path.insert(0, str(tmp_path))
            import wkapp  # type: ignore[import-not-found]  # the app's module, from tmp_path

            async def load(first: int) -> set[int]:
                async with fusee.Engine.open(tmp_path / "data", workflows=[wkapp.double], route_timeout=60) as eng:
                    assert isinstance(eng, PartedEngine)
                    got = await asyncio.gather(*(eng.execute(wkapp.double, f"w{i}", i)
                                                 for i in range(first, first + 40)))
                    assert [v for v, _ in got] == [2 * i for i in range(first, first + 40)]
                    return {pid for _, pid in got}

            ran = asyncio.run(load(0))
            assert ran & pids, "the workers ran none of the steps"
            # A worker killed outright is started again, and the work still goes through.
            victim = next(iter(pids))
            os.kill(victim, signal.SIGKILL)
            out.wait(rf"\(pid {victim}\) exited with code -9: starting it again")
            out.wait(r"worker \d \(pid (\d+)\) opened", 3)
            ran = asyncio.run(load(40))
            assert victim not in ran
        assert len(out.wait(r"worker \d \(pid \d+\) closed", 2)) == 2
    finally:
        sys.modules.pop("wkapp", None)
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


def test_a_broken_factory_fails_once_with_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "wkapp2.py").write_text("def make_engine():\n    return 42\n")
    sup = _workers(tmp_path, "wkapp2:nothing", "-n", "2")
    _, err = sup.communicate(timeout=60)
    assert sup.returncode == 1 and "has no 'nothing'" in err
    sup = _workers(tmp_path, "wkapp2:make_engine", "-n", "1")
    _, err = sup.communicate(timeout=120)  # the worker fails at every start: the supervisor gives up
    assert sup.returncode == 1
    assert "must return a fusee.Engine" in err and "right after its start" in err


PLAIN_APP = textwrap.dedent("""
    import os
    import fusee

    @fusee.workflow("wk-pid")
    async def pid(ctx: fusee.Ctx, n: int) -> list:
        v = await ctx.step("pid", lambda: [n, os.getpid()])
        return v

    def make_engine():
        # No parts= here: `fusee workers` decides what a directory created now gets.
        return fusee.Engine.open(os.path.join(os.path.dirname(__file__), "data"), workflows=[pid],
                                 route_timeout=60)
""")


def _run_until_every_worker_ran(tmp_path: Path, module: str, pids: set[int]) -> None:
    """Executes workflows through a front end until each worker pid has run a step (a joining worker
    takes its part a moment after it opened)."""
    sys.path.insert(0, str(tmp_path))
    try:
        app = __import__(module)

        async def load() -> None:
            async with fusee.Engine.open(tmp_path / "data", workflows=[app.pid], front_end=True,
                                         route_timeout=60) as eng:
                seen: set[int] = set()
                deadline = time.monotonic() + 60
                i = 0
                while not pids <= seen:
                    assert time.monotonic() < deadline, f"workers {pids - seen} ran no step"
                    got = await asyncio.gather(*(eng.execute(app.pid, f"p{i + j}", i + j) for j in range(20)))
                    assert [n for n, _ in got] == list(range(i, i + 20))
                    seen |= {p for _, p in got}
                    i += 20
                    await asyncio.sleep(0.05)

        asyncio.run(load())
    finally:
        sys.modules.pop(module, None)
        sys.path.remove(str(tmp_path))


def test_workers_create_a_new_directory_with_a_part_per_worker_or_the_parts_given(tmp_path: Path) -> None:
    for n, extra, want in ((2, (), 2), (2, ("--parts", "3"), 3)):
        d = tmp_path / f"case{want}"
        d.mkdir()
        (d / "wkplain.py").write_text(PLAIN_APP)
        with _supervised(d, "wkplain:make_engine", "-n", str(n), *extra) as out:
            pids = {int(m[2]) for m in out.wait(r"worker (\d) \(pid (\d+)\) opened", n)}
            assert read_parts(str(d / "data")) == want
            _run_until_every_worker_ran(d, "wkplain", pids)
            assert not any("has no parts" in line for line in out.lines)


def test_workers_keep_an_existing_plain_directory_and_say_one_worker_runs_every_step(tmp_path: Path) -> None:
    (tmp_path / "wkplain2.py").write_text(PLAIN_APP)

    async def create() -> None:
        async with fusee.Engine.open(tmp_path / "data"):
            pass

    asyncio.run(create())
    with _supervised(tmp_path, "wkplain2:make_engine", "-n", "2") as out:
        out.wait(r"worker (\d) \(pid (\d+)\) opened", 2)
        out.wait(r"the engine has no parts")
        assert read_parts(str(tmp_path / "data")) is None
