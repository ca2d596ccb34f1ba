"""The SyncEngine operations the other host tests do not use, each called from a plain thread:
complete, reset, resume of a paused step, object calls, enqueue, schedules, bulk."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fusee
from tests.sync.servers import wait_for

TOKENS: list[str] = []
FIXED: set[str] = set()
RAN: list[str] = []


def send_link(info: fusee.StepInfo) -> None:
    assert info.token is not None
    TOKENS.append(info.token)


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx) -> str:
    return str(await ctx.await_completion("manager", send_link, result_type=str))


def _flaky(name: str) -> str:
    RAN.append(name)
    if name not in FIXED:
        raise ConnectionError(f"{name} is down")
    return f"{name} ok"


@fusee.workflow("pausing")
async def pausing(ctx: fusee.Ctx, name: str) -> str:
    return await ctx.step("call", _flaky, name, retry=fusee.Retry(attempts=1, pause_when_exhausted=True))


@fusee.workflow("two_steps")
async def two_steps(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("first", lambda: RAN.append(f"first{n}") or n)
    return await ctx.step("second", lambda: RAN.append(f"second{n}") or a + 1)


@fusee.workflow("digest", debounce=fusee.Debounce(period="10ms"))
async def digest(ctx: fusee.Ctx, events: list[str]) -> str:
    return ",".join(events)


@dataclasses.dataclass
class Cart:
    items: list[str] = dataclasses.field(default_factory=list)


cart = fusee.object("cart", state=Cart)


@cart.exclusive
async def put(ctx: fusee.ObjectCtx[Cart], item: str) -> int:
    state = ctx.state
    state.items.append(item)
    ctx.set_state(state)
    return len(state.items)


WORKFLOWS: list[Any] = [approval, pausing, two_steps, digest, cart]


def test_the_remaining_operations_from_a_plain_thread(tmp_path: Path) -> None:
    with fusee.SyncEngine.open(tmp_path, workflows=WORKFLOWS) as engine, ThreadPoolExecutor(1) as pool:
        def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
            return pool.submit(fn, *args, **kwargs).result(timeout=60)

        # complete: the token handed out by the run's step, reported from a thread.
        run = in_thread(engine.start, approval, "ap-1")
        wait_for("the token handed out", lambda: len(TOKENS) == 1)
        assert in_thread(engine.complete, TOKENS[0], "ann") is True
        assert in_thread(run.result, timeout=60) == "ann"

        # resume: a step that paused when its attempts ran out runs again once fixed.
        in_thread(engine.start, pausing, "p-1", "shipping")
        wait_for("the run pausing", lambda: engine.describe("p-1").status == "paused")
        FIXED.add("shipping")
        in_thread(engine.resume, "p-1", by="ops")
        assert in_thread(engine.get("p-1").result, timeout=60) == "shipping ok"

        # reset: a new run from before the second step; the first step replays, not re-runs.
        assert in_thread(engine.execute, two_steps, "t-1", 1) == 2
        RAN.clear()
        before = engine.describe("t-1").run_id
        again = in_thread(engine.reset, "t-1", before_step="second")
        assert again.workflow_id == "t-1" and again.run_id != before  # a new run of the ID
        assert in_thread(again.result, timeout=60) == 2
        assert RAN == ["second1"]

        # objects, windows, schedules, bulk.
        assert [in_thread(engine.call, put, "c-1", item) for item in ("tea", "jam")] == [1, 2]
        assert in_thread(engine.object_state, cart, "c-1").value == Cart(["tea", "jam"])
        receipt = in_thread(engine.enqueue, digest, "u-1", "liked")
        wait_for("the window's run", lambda: any(s.workflow_id == receipt.window_id for s in engine.runs()))
        assert in_thread(engine.get(receipt.window_id).result, timeout=60) == "liked"
        in_thread(engine.schedule, "hourly", two_steps, 5, every="1h", paused=True)
        assert in_thread(engine.describe_schedule, "hourly").paused is True
        in_thread(engine.trigger_schedule, "hourly")
        wait_for("the triggered run", lambda: any(
            s.workflow == "two_steps" and s.workflow_id.startswith("hourly@") and s.status == "ok"
            for s in engine.runs()))
        in_thread(engine.start, pausing, "p-2", "billing")
        wait_for("the second run pausing", lambda: engine.describe("p-2").status == "paused")
        done = in_thread(engine.bulk, "terminate", "status = 'paused'", by="ops")
        assert list(done.workflow_ids) == ["p-2"] and engine.describe("p-2").status == "terminated"
