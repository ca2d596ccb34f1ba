"""A ``fusee.SyncEngine`` on a PostgreSQL DSN opened before a fork (gunicorn ``--preload`` style).

Usage: python pg_fork_app.py DSN HOLD_FD

The parent opens the engine, starts ``a`` and forks twice. The first child tries the
parent's engine (each call must raise ``EngineForked``), opens an engine of its own on
the DSN (a follower of the parent's, over TCP) and starts ``from-child`` through it,
then exits normally, finalizers and all. The second child only lives on, with its
copies of the parent's descriptors, until HOLD_FD (a pipe the test holds) ends. The
parent then uses its engine (its sessions must still work), prints one JSON line and
waits to be killed.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import fusee

go = fusee.signal("go", int)


@fusee.workflow("pg_waiter")
async def waiter(ctx: fusee.Ctx) -> int:
    return 2 * await ctx.wait_for(go)


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except fusee.EngineForked as e:
        return "EngineForked" if "after the fork" in str(e) else f"EngineForked without advice: {e}"
    except BaseException as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def first_child(engine: fusee.SyncEngine, dsn: str) -> dict[str, Any]:
    got: dict[str, Any] = {
        "start": outcome(lambda: engine.start(waiter, "b")),
        "signal": outcome(lambda: engine.signal("a", go, 1)),
        "describe": outcome(lambda: engine.describe("a")),
        "close": outcome(engine.close),
    }
    with fusee.SyncEngine.open(dsn, workflows=[waiter], lease_ttl=1) as own:
        got["own_is_owner"] = own.is_owner
        got["own_start"] = outcome(lambda: own.start(waiter, "from-child"))
    return got


def main(dsn: str, hold: int) -> None:
    engine = fusee.SyncEngine.open(dsn, workflows=[waiter], lease_ttl=1)
    engine.start(waiter, "a")
    r, w = os.pipe()
    first = os.fork()
    if first == 0:
        os.close(r)
        report = first_child(engine, dsn)
        os.write(w, json.dumps(report).encode())
        os.close(w)
        del engine
        gc.collect()
        sys.exit(0)  # a normal exit: whatever psycopg does with the copied sessions, it does now
    os.close(w)
    with os.fdopen(r) as pipe:
        report = json.loads(pipe.read())
    _, status = os.waitpid(first, 0)
    second = os.fork()
    if second == 0:
        while os.read(hold, 1):
            pass
        os._exit(0)
    engine.signal("a", go, 21)  # the parent's sessions were neither used nor ended by the child
    print(json.dumps({
        "child": report, "first_exit": os.waitstatus_to_exitcode(status), "second_pid": second,
        "a": engine.get("a").result(timeout=60), "from_child": engine.describe("from-child").status,
    }), flush=True)
    while os.read(hold, 1):  # the test kills this process with SIGKILL
        pass


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
