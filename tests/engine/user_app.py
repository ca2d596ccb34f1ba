"""Programs written the way users write them, run as real processes and SIGKILLed.

Usage: python user_app.py DIR MODE

Step functions append lines to DIR/ledger.txt (the page cache survives a
process kill), so the test sees which functions began and ended, and in what
order, across lives. Engines run with their default options.
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
    # O_APPEND writes of one line each: lines from pool threads never interleave.
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


# --- an ETL fan-out with blocking steps ----------------------------------------


def extract(info: fusee.StepInfo) -> int:
    time.sleep(0.01)  # a blocking call, as in a requests/DB-API client
    ledger(f"done {info.key}")
    return len(info.key)


# --- a chain of cheap synchronous steps, as users write them ------------------------


_CHAIN_FD: list[int] = []


def note(line: str) -> None:
    """One write(2) to a file kept open: cheap enough for the loop's thread."""
    if not _CHAIN_FD:
        _CHAIN_FD.append(os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    os.write(_CHAIN_FD[0], (line + "\n").encode())


@fusee.workflow("chain")
async def chain(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    for i in range(n):
        # A fresh lambda per step; cheap: the engine runs it on the loop's thread once measured.
        total = await ctx.step(f"add-{i}", lambda i=i, total=total: (note(f"add {i}"), total + i)[1])
    return total


@fusee.workflow("etl")
async def etl(ctx: fusee.Ctx, n: int) -> int:
    parts = await asyncio.gather(*(ctx.step(f"extract-{i}", extract) for i in range(n)))
    return sum(parts)


# --- a saga whose charge is slow --------------------------------------------------


def charge(info: fusee.StepInfo) -> str:
    ledger(f"begin charge {info.key}")
    # Slow payment provider: the test kills the process while it waits.
    for _ in range(600):
        if info.cancel_requested and os.environ.get("STOP_EARLY"):
            break
        time.sleep(0.05)
    ledger(f"charged {info.key}")
    return "receipt"


def refund(info: fusee.StepInfo) -> str:
    ledger(f"refund {info.key}")
    return "refunded"


@fusee.workflow("saga")
async def saga(ctx: fusee.Ctx) -> str:
    try:
        receipt = await ctx.step("charge", charge)
        await ctx.sleep("ship", "1h")
        return str(receipt)
    except fusee.Cancelled:
        await ctx.step("refund", refund)
        raise


# --- an approval link ---------------------------------------------------------------


def send_link(info: fusee.StepInfo) -> None:
    ledger(f"link {info.token}")


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx, amount: int) -> str:
    who = await ctx.await_completion("manager", send_link, result_type=str)
    return f"{amount} approved by {who}"


# --- a talker streaming tokens ------------------------------------------------------------


def talk(info: fusee.StepInfo) -> int:
    out = info.stream("tokens")
    for i in range(40):
        out.write(f"tok-{i}")
        time.sleep(0.01)  # a slow model
    return 40


@fusee.workflow("talker")
async def talker(ctx: fusee.Ctx) -> int:
    return int(await ctx.step("talk", talk))


# --- a long export with heartbeats, reset by an operator -------------------------------------


def export_pages(info: fusee.StepInfo) -> int:
    start = info.progress or 0
    ledger(f"resume {start}")
    for page in range(start, 60):
        ledger(f"page {page}")
        info.heartbeat(page + 1)  # pages done so far
        time.sleep(0.01)
    return 60


@fusee.workflow("exporter")
async def exporter(ctx: fusee.Ctx) -> int:
    return int(await ctx.step("export", export_pages, heartbeat_timeout="10s"))


# --- a cart started by its first update, code versions across a restart -------------------------

add_item = fusee.update("add_item", str, result_type=int)
checkout = fusee.signal("checkout", bool)


@fusee.workflow("cart", version=1)
async def cart_v1(ctx: fusee.Ctx, owner: str) -> str:
    items: list[str] = []

    def add(item: str) -> int:
        items.append(item)
        return len(items)

    ctx.on_update(add_item, add)
    await ctx.wait_for(checkout)
    return f"v1 {owner}: {','.join(items)}"


@fusee.workflow("cart", version=2)
async def cart_v2(ctx: fusee.Ctx, owner: str) -> str:
    items: list[str] = []

    def add(item: str) -> int:
        items.append(item.upper())
        return len(items)

    ctx.on_update(add_item, add)
    await ctx.step("reserve", lambda: "ok")
    await ctx.wait_for(checkout)
    return f"v2 {owner}: {','.join(items)}"


CARTS = [cart_v1, cart_v2] if os.environ.get("CART_V2") else [cart_v1]


async def main() -> None:
    async with fusee.Engine.open(DIR, workflows=[etl, saga, approval, talker, exporter, chain, *CARTS]) as engine:
        if MODE == "chain":
            h = await engine.start(chain, "chain-1", 20_000, if_running="attach", if_finished="attach")
            emit(result=await h.result(), stats=engine.stats)
        elif MODE == "etl":
            h = await engine.start(etl, "etl-1", 2000, if_running="attach", if_finished="attach")
            emit(started=True)
            emit(result=await h.result())
        elif MODE == "saga":
            await engine.start(saga, "saga-1", if_running="attach", if_finished="attach")
            while "begin charge" not in _read(LEDGER):
                await asyncio.sleep(0.005)
            await engine.cancel("saga-1", "customer changed their mind")
            emit(cancel_acked=True)
            await asyncio.sleep(3600)  # the test kills us while the charge still runs
        elif MODE == "saga-resume":
            h = engine.get("saga-1")
            try:
                emit(result=await h.result())
            except fusee.WorkflowCancelled as e:
                emit(cancelled=str(e))
        elif MODE == "approval":
            await engine.start(approval, "ap-1", 250)
            while not any(type(r).__name__ == "Awaiting" for r in await engine.journal("ap-1")):
                await asyncio.sleep(0.005)
            emit(awaiting=True)
            await asyncio.sleep(3600)  # the test kills us while the run waits
        elif MODE == "approval-complete":
            token = os.environ["TOKEN"]
            emit(accepted=await engine.complete(token, "erin"), again=await engine.complete(token, "x"))
            emit(result=await engine.get("ap-1").result())
        elif MODE in ("stream", "stream-resume"):
            if MODE == "stream":
                await engine.start(talker, "talk-1")
            async for chunk in engine.read_stream("talk-1", "tokens"):
                emit(chunk=chunk)
            emit(result=await engine.get("talk-1").result())
        elif MODE == "export":
            await engine.start(exporter, "exp-1", if_running="attach", if_finished="attach")
            emit(result=await engine.get("exp-1").result())
        elif MODE == "export-reset":
            await engine.reset("exp-1", before_step="export", by="ops:kim")
            emit(reset_acked=True)
            await asyncio.sleep(3600)  # the test kills us while the export runs again
        elif MODE == "cart":
            n = await engine.update_with_start("cart", "cart-1", "ann", add_item, "tea", update_id="u1")
            emit(acked=n)
            await asyncio.sleep(3600)  # the test kills us with the cart open
        elif MODE == "cart-2":
            again = await engine.update_with_start("cart", "cart-1", "ann", add_item, "tea", update_id="u1")
            more = await engine.update("cart-1", add_item, "cup", update_id="u2")
            await engine.start("cart", "cart-2", "bob")  # a new start takes the newest version
            await engine.update("cart-2", add_item, "pot")
            await engine.signal("cart-1", checkout, True)
            await engine.signal("cart-2", checkout, True)
            emit(again=again, more=more, one=await engine.get("cart-1").result(),
                 two=await engine.get("cart-2").result())
        else:
            raise SystemExit(f"unknown mode {MODE}")


if __name__ == "__main__":
    asyncio.run(main())
