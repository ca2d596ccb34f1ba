"""The built-in workload: jobs that cover what the engine offers, and the client's plan.

Every job talks to the mock :class:`~fusee.sim.service.Service` through steps
keyed by the step's idempotency key, so a step that runs again on state a
crash took back shows up as a service violation. The seed decides the mix of
jobs, their inputs and when the client starts, signals, cancels, updates and
queries them.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import fusee
from fusee.sim import flowjobs, keyed
from fusee.sim.config import SimConfig
from fusee.sim.plan import Cancel, Complete, Plan, Query, Reset, Signal, Start, Terminate, Update
from fusee.sim.service import Service, TransientError, stable_hash
from fusee.sim.simcodec import SimCodec
from fusee.sim.streams import Streams, talker_workflow

approve = fusee.signal("approve", int)
close = fusee.signal("close", int)
done = fusee.signal("done", int)
never = fusee.signal("never", int)
nudge = fusee.signal("nudge", int)
#: The same name as an older sender declared it: what it sends, the resettable's wait cannot decode.
nudge_text = fusee.signal("nudge", str)
total_query = fusee.query("total")
add = fusee.update("add", int)

#: Jobs an operator acts on (completions, heartbeats, resets): started on top
#: of ``SimConfig.workflows``, from a random stream of their own.
OPERATE_KINDS = ("approval", "export", "resettable")

#: Close policies the parents cycle through.
POLICIES = ("terminate", "request_cancel", "abandon")


def retry(attempts: int) -> Any:
    """A fast retry policy (simulated milliseconds) allowing ``attempts`` attempts."""
    return fusee.Retry(attempts=attempts, initial="1ms", max_interval="4ms")


class Deployment:
    """Which code is deployed: the patched workflow takes its new branch once ``new_code``."""

    def __init__(self) -> None:
        self.new_code = False

    def deploy(self) -> None:
        self.new_code = True


def build(cfg: SimConfig) -> Plan:
    """The workflows and the client plan of seed ``cfg.seed``."""
    svc = Service(seed=cfg.seed)
    deployment = Deployment()
    counts = {"patched": 0, "continued": 0}

    max_step_s = cfg.max_step_ms / 1000.0

    def is_sync(name: str, value: int) -> bool:
        return stable_hash(cfg.seed, name, value) % 1000 < cfg.sync_steps_per_mille

    def hold_of(name: str, value: int, least: float = 0.0) -> float:
        """Seconds a synchronous function blocks its pool slot (seeded)."""
        return least + (stable_hash(cfg.seed ^ 0x5EED, name, value) % 1001) / 1000.0 * max_step_s

    def call(ctx: Any, name: str, value: int, fail_first: int = 0) -> Any:
        if is_sync(name, value):
            hold = hold_of(name, value)

            def blocking(info: Any) -> int:
                # A blocking call: its effect happens now and it holds its
                # pool slot for ``hold`` simulated seconds.
                svc.next_hold = hold
                return svc.call(info.key, value, fail_first, name=name, hold=hold)

            return ctx.step(name, blocking, retry=retry(fail_first + 2))

        async def fn(info: Any) -> int:
            # The service takes a little simulated time, depending on load; or
            # none, and the function returns without suspending (a cache hit).
            delay = ((svc.total + value) % 3) / 1000.0
            if delay:
                await asyncio.sleep(delay)
            return svc.call(info.key, value, fail_first, name=name)

        return ctx.step(name, fn, retry=retry(fail_first + 2))

    def slow_charge(ctx: Any, value: int) -> Any:
        """A slow charge: a blocking function or a coroutine whose effect comes first."""
        hold = hold_of("charge", value, least=0.005)
        if value % 2 == 0:
            def blocking(info: Any) -> int:
                svc.next_hold = hold
                return svc.call(info.key, value, value % 3 == 0, name="charge", hold=hold)

            return ctx.step("charge", blocking, retry=retry(2))

        async def charge(info: Any) -> int:
            effect = len(svc.effects)
            try:
                v = svc.call(info.key, value, value % 3 == 0, name="charge", hold=hold)
                # The payment provider answers late; a cancel interrupts the wait.
                await asyncio.sleep(hold)
            finally:
                svc.effects[effect].end = svc.clock()  # over now (a failed call at once)
            return v

        return ctx.step("charge", charge, retry=retry(2))

    def read(ctx: Any, name: str, value: int, fail_first: int = 0) -> Any:
        async def fn(info: Any) -> int:
            await asyncio.sleep(((svc.total + value) % 2) / 1000.0)
            return svc.read(info.key, value, fail_first)

        return ctx.step(name, fn, retry=retry(fail_first + 2), read_only=True)

    @fusee.workflow("ship")
    async def ship(ctx: fusee.Ctx, x: int) -> int:
        return int(await call(ctx, "ship", x, 1))

    @fusee.workflow("order")
    async def order(ctx: fusee.Ctx, n: int) -> int:
        try:
            quote = await call(ctx, "quote", n)
            charge = await call(ctx, "charge", quote, 2)
            try:
                await ctx.sleep("cool-off", 0.003)
                approved = await ctx.wait_for(approve, timeout=0.06)
            except fusee.Cancelled:
                svc.saw_cancel(ctx.workflow_id)
                # Compensation runs after a cancellation, then the run ends cancelled.
                await call(ctx, "refund", charge)
                raise
            if approved is None:
                return int(await call(ctx, "refund", charge))
            return int(await ctx.child(ship, f"{ctx.workflow_id}/ship", charge ^ approved))
        except fusee.Cancelled:
            svc.saw_cancel(ctx.workflow_id)
            raise

    @fusee.workflow("saga")
    async def saga(ctx: fusee.Ctx, n: int) -> int:
        # A charge that takes a while, compensated by a refund when cancelled
        # (whether or not the charge's outcome is known).
        try:
            charged = int(await slow_charge(ctx, n))
            await ctx.sleep("settle", 0.002)
            return int(await call(ctx, "confirm", charged))
        except fusee.Cancelled:
            svc.saw_cancel(ctx.workflow_id)
            await call(ctx, "refund", n)
            raise

    @fusee.workflow("fanout")
    async def fanout(ctx: fusee.Ctx, n: int) -> int:
        legs = await asyncio.gather(*(call(ctx, f"leg{i}", i, i % 2) for i in range(n)))
        return int(await call(ctx, "total", sum(legs) % 1_000_003))

    @fusee.workflow("pinger")
    async def pinger(ctx: fusee.Ctx, target: str) -> int:
        v = int(await call(ctx, "prep", 1))
        await ctx.signal_workflow(target, approve, v % 1000)
        return v

    @fusee.workflow("counter")
    async def counter(ctx: fusee.Ctx) -> int:
        state = {"total": 0, "running": 0}
        ctx.on_query(total_query, lambda: state["total"])

        def validate(v: int) -> None:
            if v >= 1000:
                raise ValueError(f"{v} is too large: add takes less than 1000")

        async def apply(v: int) -> int:
            state["running"] += 1
            try:
                r = int(await call(ctx, "apply", v))
            finally:
                state["running"] -= 1
            state["total"] += r % 100
            return state["total"]

        ctx.on_update(add, apply, validator=validate)
        await ctx.wait_for(close, timeout=0.15)
        # Let running handlers finish first: a run that ends under a running
        # step drops the step's outcome (its effect stays: see docs/sim.md).
        while state["running"]:
            await ctx.sleep("drain", 0.001)
        return state["total"]

    @fusee.workflow("looper")
    async def looper(ctx: fusee.Ctx, job: dict[str, int]) -> int:
        left, acc = job["left"], job["acc"]
        v = int(await call(ctx, "loop", acc + left))
        if left == 0:
            return acc ^ v
        counts["continued"] += 1
        await ctx.continue_as_new({"left": left - 1, "acc": acc ^ v})
        raise AssertionError("continue_as_new returned")

    @fusee.workflow("patchy")
    async def patchy(ctx: fusee.Ctx, n: int) -> int:
        a = int(await call(ctx, "a", n))
        await ctx.sleep("gap", 0.005)
        if deployment.new_code and ctx.patched("fix"):
            counts["patched"] += 1
            return int(await call(ctx, "new", a))
        return int(await call(ctx, "old", a))

    @fusee.workflow("kid")
    async def kid(ctx: fusee.Ctx, job: dict[str, Any]) -> int:
        # Kids that the parent's close must reach outlive their parent.
        wait = 0.06 if job["policy"] == "abandon" else 0.4
        await ctx.wait_for(never, timeout=wait)
        return int(await call(ctx, "kid", int(job["k"])))

    @fusee.workflow("parent")
    async def parent(ctx: fusee.Ctx, kids: int) -> int:
        for k in range(kids):
            policy = POLICIES[k % len(POLICIES)]
            await ctx.start_child(kid, f"{ctx.workflow_id}/kid{k}", {"k": k, "policy": policy},
                                  close_policy=policy)
        v = int(await call(ctx, "parent", 1))
        await ctx.wait_for(done, timeout=0.03)
        return v

    @fusee.workflow("reader")
    async def reader(ctx: fusee.Ctx, n: int) -> int:
        # Each read's input comes from the read before it, which may not be
        # durable yet; "store" has effects, so its gate waits for them all.
        a = int(await read(ctx, "fetch", n))
        b = int(await read(ctx, "enrich", a, 1))
        c = int(await call(ctx, "store", b, 1))
        return int(await read(ctx, "verify", c))

    @fusee.workflow("approval")
    async def approval(ctx: fusee.Ctx, n: int) -> int:
        # Waits for an outside approval (engine.complete or fail_completion) and
        # returns its value (-1 when declined). For even inputs the
        # token function fails its first attempt after handing out its token:
        # that token is stale and must be refused.
        quote = int(await call(ctx, "quote", n))
        wid = ctx.workflow_id

        async def hand_out(info: Any) -> None:
            svc.hand_out(wid, info.token)
            if info.attempt == 1 and n % 2 == 0:
                raise TransientError(f"mailer down after sending {info.token}")
            svc.token_returned(info.token)

        assert quote >= 0
        try:
            got = await ctx.await_completion("approve", hand_out, retry=retry(3), result_type=int)
        except fusee.CompletionFailed:
            return -1  # declined (engine.fail_completion)
        return int(got)

    @fusee.workflow("export")
    async def export(ctx: fusee.Ctx, n: int) -> int:
        # A long step that reports progress (items done, in chunks of 10) with
        # heartbeats; for even inputs its first attempt goes silent once half
        # done, the heartbeat timeout fails it, and the next attempt resumes
        # from the progress it sees.
        total = 30 + 10 * (n % 4)

        async def run_export(info: Any) -> int:
            done = info.progress
            svc.began_from(info.key, info.attempt, done)
            done = done or 0
            while done < total:
                if info.attempt == 1 and n % 2 == 0 and done >= total // 2:
                    await asyncio.sleep(1.0)  # silent: no heartbeat, the attempt times out
                await asyncio.sleep(0.001)
                done += 10
                svc.reported(info.key, done)
                info.heartbeat(done)
            return done

        got = int(await ctx.step("export", run_export, heartbeat_timeout=0.01, retry=retry(8)))
        return got + int(await call(ctx, "notify", n))

    @fusee.workflow("resettable")
    async def resettable(ctx: fusee.Ctx, n: int) -> int:
        # The client resets it before "mark": the new run replays "prep" and
        # the first wait, runs "mark" again and gets the nudges that arrived
        # after the cut once more.
        a = int(await ctx.step("prep", lambda: n * 3))
        first = await ctx.wait_for(nudge, timeout=0.005)
        total = a + int(await ctx.step("mark", lambda: a + 1)) + (first or 0)
        while (got := await ctx.wait_for(nudge, timeout=0.15)) is not None:
            total += got
        return total

    @fusee.workflow("mistyped")
    async def mistyped(ctx: fusee.Ctx, target: str) -> None:
        # Journaled in the target as sent (a cross-run signal is typed by its sender): its wait
        # must pass it over and keep waiting, on every replay alike, not fail the run.
        await ctx.signal_workflow(target, nudge_text, "lots")

    talker = talker_workflow(cfg.seed, retry)
    streams = Streams(cfg.seed)
    workflows = [order, ship, fanout, pinger, counter, looper, patchy, kid, parent, reader, saga, approval, export,
                 resettable, talker, mistyped]
    # A third of seeds encrypt payloads at rest, rotating the key at every crash.
    sim_codec = SimCodec() if cfg.seed % 3 == 1 else None
    def check_streams(world: Any, snap: Any, final: bool) -> list[str]:
        return streams.check(snap, world.obs.results, final)

    def check_resettables(world: Any, snap: Any, final: bool) -> list[str]:
        return check_resettable_lives(world, snap, final)

    def check_plaintext(world: Any, snap: Any, final: bool) -> list[str]:
        return check_encrypted(world, final)

    plan = Plan(
        workflows=workflows,
        on_crash=[deployment.deploy] + ([sim_codec.rotate] if sim_codec else []),
        service_violations=lambda: [*svc.violations, *streams.violations],
        service=svc,
        engine_options={"codec": sim_codec} if sim_codec else {},
        on_open=[streams.on_open],
        checks=[check_streams, check_resettables] + ([check_plaintext] if sim_codec else []),
        unfinished=streams.unfinished,
        counters=lambda: {
            **streams.counters(),
            "payloads_encoded": sim_codec.encoded if sim_codec else 0,
            "key_rotations": sim_codec.rotations if sim_codec else 0,
            "reads_rerun": svc.reads_rerun,
            "service_calls": svc.total,
            "transient_failures": svc.failures,
            "patched": counts["patched"],
            "continued": counts["continued"],
            "resumed_exports": sum(1 for _, _, _, p in svc.resumes if p),
        },
    )
    _plan_client(cfg, plan, {
        "order": order, "fanout": fanout, "pinger": pinger, "counter": counter,
        "looper": looper, "patchy": patchy, "parent": parent, "reader": reader,
        "saga": saga, "approval": approval, "export": export,
        "resettable": resettable, "mistyped": mistyped,
    })
    # Talkers and their readers draw from a stream of their own (older jobs keep their plan).
    tr = random.Random(f"streams-{cfg.seed}")
    span = max(1, cfg.duration_ms // 2)
    for k in range(1 + tr.randrange(3)):
        wid, n, t = f"talk-{k}", 3 + tr.randrange(10), tr.randrange(span)
        plan.actions.append((t, Start(wid, talker, n, "talker")))
        streams.plan(wid, n, t)
    keyed.add_jobs(cfg, plan)
    flowjobs.add(cfg, plan)
    return plan


def check_encrypted(world: Any, final: bool) -> list[str]:
    """With a codec, no payload is readable on the disk: a talker's progress chunks are looked for."""
    if not final:
        return []
    from fusee.sim.config import DATA_DIR
    from fusee.storage.seam import read_whole

    disk = world.disk
    out = []
    todo = [DATA_DIR]
    while todo:
        d = todo.pop()
        for name in disk.listdir(d):
            path = f"{d}/{name}"
            if disk.is_dir(path):
                todo.append(path)
            elif b'"generated"' in read_whole(disk, path):
                out.append(f"{path} holds a stream chunk in plaintext although the engine has a codec")
    return out


def check_resettable_lives(world: Any, snap: Any, final: bool) -> list[str]:
    """A resettable job never fails: a nudge its wait cannot decode is passed over."""
    if not final:
        return []
    out = []
    for wid, kind in world.obs.starts.items():
        view = snap.runs.get(wid)
        if kind == "resettable" and view is not None and view.exists and view.status == "failed":
            out.append(f"{wid} (resettable) failed: a journaled signal its wait cannot decode must be "
                       "passed over, and the wait keep waiting")
    return out


def _plan_client(cfg: SimConfig, plan: Plan, defs: dict[str, Any]) -> None:
    """What the client does and when, drawn from the seed."""
    rng = random.Random(f"workload-{cfg.seed}")
    # Actions added later draw from their own stream, so older seeds keep their plans.
    ops = random.Random(f"operate-plan-{cfg.seed}")
    bad = random.Random(f"operate-mistakes-{cfg.seed}")
    kinds = [k for k, w in cfg.mix.items() if k not in OPERATE_KINDS for _ in range(w)]
    span = max(1, cfg.duration_ms // 2)
    orders: list[str] = []
    for i in range(cfg.workflows):
        kind = rng.choice(kinds)
        wid = f"wf-{i}"
        t = rng.randrange(span)
        inp: Any
        if kind == "order":
            orders.append(wid)
            inp = i
        elif kind == "fanout":
            inp = 2 + rng.randrange(5)
        elif kind == "pinger":
            inp = orders[-1] if orders else "nobody"
        elif kind == "counter":
            inp = None
        elif kind == "looper":
            inp = {"left": 1 + rng.randrange(4), "acc": i}
        elif kind == "parent":
            inp = 1 + rng.randrange(4)
            plan.children[wid] = [(f"{wid}/kid{k}", POLICIES[k % len(POLICIES)]) for k in range(inp)]
        else:
            inp = i
        plan.actions.append((t, Start(wid, defs[kind], inp, kind)))
        if kind == "order":
            if rng.random() < 0.5:
                plan.actions.append((t + 1 + rng.randrange(80), Signal(wid, approve, rng.randrange(1000), f"{wid}/approve")))
            if rng.random() < 0.12:
                plan.actions.append((t + rng.randrange(40), Cancel(wid)))
        elif kind == "saga":
            roll = rng.random()
            if roll < 0.4:
                # Cancels and terminates that land while the charge runs.
                plan.actions.append((t + rng.randrange(60), Cancel(wid)))
            elif roll < 0.55:
                plan.actions.append((t + rng.randrange(60), Terminate(wid)))
        elif kind == "parent" and ops.random() < 0.3:
            # A terminated parent: its children follow their close policies.
            plan.actions.append((t + ops.randrange(40), Terminate(wid)))
        elif kind == "counter":
            for u in range(1 + rng.randrange(4)):
                t2 = t + 1 + rng.randrange(120)
                upd = Update(wid, add, rng.randrange(1200), f"{wid}/u{u}")
                plan.actions.append((t2, upd))
                if rng.random() < 0.3:
                    # The same update ID sent again: it must get the same answer.
                    plan.actions.append((t2 + rng.randrange(60), upd))
                # Queries while the update's handler may be running.
                for _ in range(3):
                    plan.actions.append((t2 + 1 + rng.randrange(10), Query(wid, total_query, monotonic=True)))
            for _ in range(2 + rng.randrange(6)):
                plan.actions.append((t + 1 + rng.randrange(150), Query(wid, total_query, monotonic=True)))
    # The operator's jobs come on top (so the older jobs of a seed keep their plan).
    extra = [k for k in OPERATE_KINDS for _ in range(cfg.mix.get(k, 0))]
    for j, kind in enumerate(extra):
        i = cfg.workflows + j
        wid = f"wf-{i}"
        t = ops.randrange(span)
        plan.actions.append((t, Start(wid, defs[kind], i, kind)))
        if kind == "approval":
            # One or more completions: the later ones are duplicates (refused).
            for _ in range(1 + ops.randrange(3)):
                plan.actions.append((t + 1 + ops.randrange(100),
                                     Complete(wid, ops.randrange(1000), fail=ops.random() < 0.2)))
        elif kind == "resettable":
            for k in range(ops.randrange(5)):
                plan.actions.append((t + 1 + ops.randrange(200), Signal(wid, nudge, ops.randrange(100), f"{wid}/n{k}")))
            # An operator's mistakes, sent by name as HTTP and the CLI send them: a value the
            # signal's type does not take, and a misspelled name. Both are refused, unrecorded.
            if bad.random() < 0.6:
                plan.actions.append((t + 1 + bad.randrange(200), Signal(
                    wid, fusee.SignalDef("nudge"), {"not": "a number"}, f"{wid}/bad-value",
                    refusal="SerializationError")))
            if bad.random() < 0.4:
                plan.actions.append((t + 1 + bad.randrange(200), Signal(
                    wid, fusee.SignalDef("nudgee"), 1, f"{wid}/bad-name", refusal="UnknownSignal")))
            if bad.random() < 0.5:
                plan.actions.append((t + 1 + bad.randrange(150), Start(f"{wid}-mistyped", defs["mistyped"], wid,
                                                                       "mistyped")))
            for _ in range(1 + ops.randrange(2)):
                plan.actions.append((t + 10 + ops.randrange(140), Reset(wid, "mark")))
