"""Simulator jobs for keyed objects and step limits (issue 12), and what they observe.

Objects: an ``acct`` object whose exclusive handler adds one to the key's
count and whose shared handler reads it; each handler's first and last steps
report entering and leaving, and a step in between takes simulated time, so
handlers that should take turns would overlap if they did not. The client
calls with call IDs, some sent twice (and every unacknowledged one again
after a crash). Checks: one answer per call ID, distinct counts for distinct
exclusive calls, handlers never overlapping wrongly.

Limits: a ``svc`` limit (concurrency 1 to 3, sometimes a rate, key ``t0`` of
weight 2) and ``limited`` workflows whose steps take its permits with
priorities and fairness keys. Checks: never more executions running than
the concurrency in any life (also right after a recovery), priority first,
fairness within the bound of :mod:`fusee.limits`.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import fusee
from fusee.sim import checkers
from fusee.sim.config import SimConfig
from fusee.sim.plan import ObjectCall, Plan, Start
from fusee.sim.service import stable_hash

#: The fairness weights of the simulated limit.
WEIGHTS = {"t0": 2}


class Tracker:
    """What the jobs' step functions saw, in order, per process life."""

    def __init__(self, life: Any) -> None:
        self.life = life
        self.handler_events: list[tuple[int, str, str, str, str]] = []
        self.limit_events: list[tuple[int, str, str]] = []
        self.grants: list[tuple[int, Any]] = []
        self.answers: dict[str, list[Any]] = {}
        self.exclusive_keys: dict[str, str] = {}
        self.problems: list[str] = []
        self.concurrency = 1
        self.calls = 0

    def handler(self, what: str, key: str, kind: str, tag: str) -> None:
        self.handler_events.append((self.life(), what, key, kind, tag))

    def limited(self, what: str, key: str) -> None:
        self.limit_events.append((self.life(), what, key))

    def on_open(self, engine: Any, life: int) -> None:
        """A new life's engine: keep the grants its limiter hands out."""
        grants: list[Any] = []
        engine._rt.limiter.grants = grants
        self._life_grants = (life, grants)
        self._all_grants.append((life, grants))

    _all_grants: list[tuple[int, list[Any]]]

    def check(self) -> list[str]:
        grants = [(life, g) for life, gs in self._all_grants for g in gs]
        return (list(self.problems)
                + checkers.check_object_answers(self.answers, self.exclusive_keys)
                + checkers.check_object_exclusive(self.handler_events)
                + checkers.check_limit_concurrency(self.limit_events, self.concurrency)
                + checkers.check_limit_fairness(grants, WEIGHTS))

    def counters(self) -> dict[str, int]:
        return {"object_calls": self.calls,
                "limited_steps": sum(1 for e in self.limit_events if e[1] == "b")}


def add_jobs(cfg: SimConfig, plan: Plan) -> None:
    """Adds the object and limit jobs to ``plan`` (from a random stream of their own)."""
    rng = random.Random(f"keyed-{cfg.seed}")
    svc = plan.service
    tracker = Tracker(lambda: svc.life())  # the world sets svc.life after the plan is built
    tracker._all_grants = []
    seed = cfg.seed

    def hold(name: str, n: int) -> float:
        return (1 + stable_hash(seed ^ 0x0B1, name, n) % 30) / 10_000.0  # 0.1 to 3 ms

    acct: fusee.ObjectDef[int] = fusee.object("acct", state=int, calls_per_run=1 + rng.randrange(4))

    async def enter(key: str, kind: str, tag: str) -> None:
        tracker.handler("in", key, kind, tag)

    async def leave(key: str, kind: str, tag: str) -> None:
        tracker.handler("out", key, kind, tag)

    async def work(tag: str) -> None:
        await asyncio.sleep(hold(tag, 0))

    @acct.exclusive
    async def bump(ctx: fusee.ObjectCtx[int], tag: str) -> int:
        await ctx.step("in", enter, ctx.key, "x", tag)
        await ctx.step("work", work, tag)
        ctx.set_state(ctx.state + 1)
        await ctx.step("out", leave, ctx.key, "x", tag)
        return ctx.state

    @acct.shared
    async def peek(ctx: fusee.ObjectCtx[int], tag: str) -> int:
        await ctx.step("in", enter, ctx.key, "s", tag)
        await ctx.step("work", work, tag)
        seen = ctx.state
        await ctx.step("out", leave, ctx.key, "s", tag)
        return seen

    async def limited_fn(info: fusee.StepInfo, i: int) -> int:
        tracker.limited("b", info.key)
        try:
            # Long enough (1 to 12 ms) that crashes often find permits out and steps waiting.
            await asyncio.sleep(0.001 + 4 * hold(info.key, i))
        finally:
            tracker.limited("e", info.key)
        return i

    prio_mode = rng.random() < 0.5

    @fusee.workflow("limited")
    async def limited(ctx: fusee.Ctx, n: int) -> int:
        done = await asyncio.gather(*(
            ctx.step(f"l{i}", limited_fn, i, limit="svc", priority=(i % 2) if prio_mode else 0,
                     fairness_key=f"t{i % 3}")
            for i in range(n)
        ))
        return sum(done)

    tracker.concurrency = 1 + rng.randrange(3)
    per_second = rng.choice([None, None, 2000.0])
    plan.workflows += [acct, limited]
    plan.limits = [fusee.Limit("svc", concurrency=tracker.concurrency, per_second=per_second, weights=WEIGHTS)]
    plan.keyed_checks.append(tracker.check)
    plan.on_engine_open.append(tracker.on_open)
    counters = plan.counters
    plan.counters = lambda: {**counters(), **tracker.counters()}

    span = max(1, cfg.duration_ms // 2)
    keys = [f"k{i}" for i in range(rng.choice([0, 1, 1, 2]))]
    for key in keys:
        t = rng.randrange(span)
        for c in range(3 + rng.randrange(5)):
            handler = bump if rng.random() < 0.7 else peek
            call = ObjectCall(key, handler, f"{key}-c{c}", tracker)
            t2 = t + rng.randrange(20)  # close together: they contend for the key
            plan.actions.append((t2, call))
            if rng.random() < 0.3:
                plan.actions.append((t2 + rng.randrange(100), call))  # the same call ID again
    for j in range(rng.choice([1, 1, 2])):
        plan.actions.append((rng.randrange(span), Start(f"lim-{j}", limited, 3 + rng.randrange(6), "limited")))
