"""Keyed objects and step limits in a real process, SIGKILLed by tests/engine/test_objects_crash.py.

Usage: python objects_app.py DIR MODE

Step functions append lines to DIR/ledger.txt (the page cache survives a
process kill); every life writes ``life`` first, so the test can tell which
executions a kill ended.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import fusee

DIR = sys.argv[1]
MODE = sys.argv[2]
LEDGER = os.path.join(DIR, "ledger.txt")


def ledger(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


# --- an account object ----------------------------------------------------------------

account = fusee.object("account", state=int, calls_per_run=4)


@account.exclusive
async def deposit(ctx: fusee.ObjectCtx[int], amount: int) -> int:
    def book(info: fusee.StepInfo) -> int:
        ledger(f"book {ctx.key} {amount}")
        if amount == 99 and MODE == "deposit":
            time.sleep(3600)  # a slow booking: the test kills the process while it runs
        return amount

    booked = await ctx.step("book", book)
    ctx.set_state(ctx.state + booked)
    return ctx.state


@account.shared
async def balance(ctx: fusee.ObjectCtx[int]) -> int:
    return ctx.state


# --- limited steps --------------------------------------------------------------------


def work(info: fusee.StepInfo) -> int:
    ledger(f"start {info.key}")
    time.sleep(0.05)
    ledger(f"end {info.key}")
    return 1


@fusee.workflow("batch")
async def batch(ctx: fusee.Ctx, n: int) -> int:
    done = await asyncio.gather(
        *(ctx.step(f"work-{i}", work, limit="svc", fairness_key=f"t{i % 3}") for i in range(n))
    )
    return sum(done)


async def main() -> None:
    ledger("life")
    limits = [fusee.Limit("svc", concurrency=2)]
    data = os.path.join(DIR, "data")
    async with fusee.Engine.open(data, workflows=[account, batch], limits=limits) as engine:
        if MODE == "deposit":
            for i in range(6):  # past calls_per_run: the account's run continued as new
                emit(answer=await engine.call(deposit, "acct-1", 10 + i, call_id=f"c{i}"))
            # Acknowledged above; now one slow call in flight when the test kills us.
            task = asyncio.ensure_future(engine.call(deposit, "acct-1", 99, call_id="slow"))
            emit(acked=True)
            await task
        elif MODE == "deposit-again":
            again = [await engine.call(deposit, "acct-1", 10 + i, call_id=f"c{i}") for i in range(6)]
            state = await engine.object_state(account, "acct-1")
            emit(again=again, state=state.value, version=state.version,
                 shared=await engine.call(balance, "acct-1"))
        elif MODE == "limit":
            await engine.start(batch, "b-1", 24, if_running="attach", if_finished="attach")
            await engine.start(batch, "b-2", 24, if_running="attach", if_finished="attach")
            emit(results=[await engine.get("b-1").result(), await engine.get("b-2").result()],
                 limits={n: [s.in_use, s.waiting] for n, s in engine.limits().items()})
        else:
            raise SystemExit(f"unknown mode {MODE}")


if __name__ == "__main__":
    asyncio.run(main())
