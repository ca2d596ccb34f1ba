"""Fusee demo: an order workflow survives a real crash (SIGKILL) and resumes.

Run it with ``make demo``. It starts a worker process that runs the workflow,
kills that process with SIGKILL in the middle of a durable sleep, starts a new
worker on the same directory, and shows that the run continues where it was:
the steps that already ran are not run again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fusee

DATA = Path(os.environ.get("FUSEE_DEMO_DIR", Path(__file__).resolve().parent.parent / "demo-data"))
LIFE = os.environ.get("FUSEE_DEMO_LIFE", "")

approve = fusee.signal("approve", bool)
stage = fusee.query("stage")


def say(msg: str) -> None:
    print(f"  [worker {LIFE}] {msg}", flush=True)


def quote() -> int:
    say("step 'quote' runs: price is 42")
    return 42


def charge(info: fusee.StepInfo) -> str:
    if info.attempt == 1:
        say(f"step 'charge' attempt {info.attempt}: the card network times out (will retry)")
        raise ConnectionError("card network timeout")
    say(f"step 'charge' attempt {info.attempt}: charged 42 with idempotency key {info.key}")
    return "payment-7"


def ship() -> str:
    say("step 'ship' runs: parcel handed to the carrier")
    return "parcel-99"


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, item: str) -> str:
    current = {"stage": "quoting"}
    ctx.on_query(stage, lambda: current["stage"])
    price = await ctx.step("quote", quote)
    payment = await ctx.step("charge", charge, retry=fusee.Retry(attempts=3, initial="200ms"))
    current["stage"] = "cooling off"
    await ctx.sleep("cool-off", "3s")
    current["stage"] = "awaiting approval"
    ok = await ctx.wait_for(approve, timeout="1h")
    if not ok:
        return f"{item}: not approved, refund {payment}"
    parcel = await ctx.step("ship", ship)
    return f"{item}: price {price}, paid by {payment}, shipped as {parcel}"


async def worker() -> None:
    async with fusee.Engine.open(DATA, workflows=[order]) as engine:
        if LIFE == "1":
            say("starting workflow 'order-42'")
            h = await engine.start(order, "order-42", "teapot")
            while await h.query(stage) != "cooling off":
                await asyncio.sleep(0.01)
            say("the workflow is in its durable 3 s sleep ('cool-off')")
            await asyncio.sleep(3600)  # the demo kills us here
        else:
            h = engine.get("order-42")
            say(f"reopened the directory: the run replayed its journal; stage is '{await h.query(stage)}'")
            while await h.query(stage) != "awaiting approval":
                await asyncio.sleep(0.01)
            say("the sleep finished on its original schedule; sending the approval signal")
            await h.signal(approve, True)
            say(f"result: {await h.result()}")


def make_engine() -> Any:
    """The demo's engine for the operator's tools: ``cd examples && fusee serve demo:make_engine``,
    then open http://127.0.0.1:8233/ui (the runs, their journals, a signal to send)."""
    return fusee.Engine.open(DATA, workflows=[order])


def main() -> None:
    if LIFE:
        asyncio.run(worker())
        return
    shutil.rmtree(DATA, ignore_errors=True)
    print(f"Fusee demo: an order workflow, its engine directory in {DATA}\n")
    env = dict(os.environ, FUSEE_DEMO_LIFE="1")
    p = subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        print(line, end="", flush=True)
        if "durable 3 s sleep" in line:
            break
    time.sleep(0.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    print(f"\n  >>> SIGKILL sent to worker 1 (pid {p.pid}) in the middle of the sleep <<<\n", flush=True)
    env["FUSEE_DEMO_LIFE"] = "2"
    t0 = time.monotonic()
    subprocess.run([sys.executable, __file__], env=env, check=True)
    print(
        f"\nWorker 2 took {time.monotonic() - t0:.1f} s. 'quote' and 'charge' ran once, in worker 1;"
        " worker 2 replayed their recorded results and continued."
    )


if __name__ == "__main__":
    main()
