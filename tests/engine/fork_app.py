"""An asyncio program with a ``fusee.Engine`` open that forks: the forked-child tests run it.

Usage: python fork_app.py MODE DIR HOLD_FD

MODE ``in-loop``: ``os.fork()`` inside a coroutine, the child goes on in the parent's loop.
MODE ``process``: a ``multiprocessing`` child with the ``fork`` start method (the default on
Linux before Python 3.14), given the engine. Either child tries the engine's calls and reports
what each raised on a pipe; the parent prints ``{"child_pid": ..., "child": {...}}``. The child
then lives until HOLD_FD (a pipe the test holds the other end of) reaches its end. The parent, in
``in-loop`` mode, closes its engine and exits; in ``process`` mode it waits to be killed.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import fusee

go = fusee.signal("go", int)


@fusee.workflow("waiter")
async def waiter(ctx: fusee.Ctx) -> int:
    return 2 * await ctx.wait_for(go)


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except fusee.EngineForked as e:
        return "EngineForked" if "after the fork" in str(e) else f"EngineForked without advice: {e}"
    except BaseException as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


async def outcome_async(call: Callable[[], Awaitable[Any]]) -> str:
    try:
        await call()
    except fusee.EngineForked as e:
        return "EngineForked" if "after the fork" in str(e) else f"EngineForked without advice: {e}"
    except BaseException as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


async def in_the_loop(engine: fusee.Engine) -> dict[str, str]:
    """The child of an os.fork() made in a coroutine: it runs on (its copy of) the same loop."""
    return {
        "start": await outcome_async(lambda: engine.start(waiter, "b")),
        "signal": await outcome_async(lambda: engine.signal("a", go, 1)),
        "describe": outcome(lambda: engine.describe("a")),
        "close": await outcome_async(engine.close),
    }


def in_a_process(engine: fusee.Engine, report: int, hold: int) -> None:
    """A multiprocessing child: no loop runs here, so run_threadsafe would wait forever."""
    got = {
        "run_threadsafe": outcome(lambda: engine.run_threadsafe(engine.signal, "a", go, 1)),
        "start": outcome(lambda: asyncio.run(engine.start(waiter, "b"))),
        "describe": outcome(lambda: engine.describe("a")),
    }
    os.write(report, json.dumps(got).encode())
    os.close(report)
    while os.read(hold, 1):  # live on until the test lets go
        pass


async def main(mode: str, path: str, hold: int) -> None:
    engine = await fusee.Engine.open(path, workflows=[waiter])
    await engine.start(waiter, "a")
    r, w = os.pipe()
    if mode == "in-loop":
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, json.dumps(await in_the_loop(engine)).encode())
            os.close(w)
            while os.read(hold, 1):
                pass
            os._exit(0)
    else:
        child = multiprocessing.get_context("fork").Process(target=in_a_process, args=(engine, w, hold))
        child.start()
        assert child.pid is not None
        pid = child.pid
    os.close(w)
    with os.fdopen(r) as report:
        got = json.loads(report.read())
    print(json.dumps({"child_pid": pid, "child": got}), flush=True)
    if mode == "in-loop":
        await engine.close()  # the parent's engine is untouched: it closes cleanly
        return
    while os.read(hold, 1):  # the test kills this process with SIGKILL
        pass


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
