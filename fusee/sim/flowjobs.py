"""Simulator jobs for schedules and debounce/batch windows (issue 12).

A seed may run one schedule of ``tick`` (a short interval, one of the six
overlap policies, a catch-up window short enough for clock jumps and crashes
to make it skip times) with a trigger, a backfill over times that already
fired, a pause and unpause, and a delete; and a window workflow ``echo``
(debounce or batch, continuing as new every few events) fed by the client's
``Enqueue`` requests, some sent twice with one event ID.

Both jobs record what ran in :class:`FlowObserver` from a step (the record
of what really executed); the checkers in :mod:`fusee.sim.checkers` compare
it with the schedule's own accounting and with the receipts the client got.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import re
from typing import Any

import fusee
from fusee.flow import schedules
from fusee.sim.plan import Enqueue, Plan, ScheduleAction, ScheduleControl

#: The schedule the workload makes.
SCHEDULE_ID = "tick-s"


@dataclasses.dataclass
class FlowObserver:
    """What the flow jobs did, as their steps saw it, and what the client was told."""

    #: Tick runs: workflow ID -> run IDs its step ran in.
    ticks: dict[str, set[int]] = dataclasses.field(default_factory=dict)
    #: Window runs: workflow ID -> the events its step got.
    windows: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    #: Per key, window numbers in the order their steps first ran.
    order: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: Acknowledged receipts: event ID -> (window ID, position).
    receipts: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    #: Schedules the client made (acknowledged), and the spec each was made with.
    schedules: dict[str, ScheduleAction] = dataclasses.field(default_factory=dict)
    deleted: set[str] = dataclasses.field(default_factory=set)
    #: Scheduled runs the engine holds (started, whether or not their step ran).
    started: set[str] = dataclasses.field(default_factory=set)
    #: Scheduled times the deleted schedules counted as skipped.
    skipped: int = 0
    violations: list[str] = dataclasses.field(default_factory=list)


def add(cfg: Any, plan: Plan) -> None:
    """Adds the seed's flow jobs to ``plan`` (from a random stream of their own)."""
    rng = random.Random(f"flow-{cfg.seed}")
    obs = FlowObserver()
    plan.flow = obs
    use_schedule = rng.random() < 0.35
    use_windows = rng.random() < 0.35

    @fusee.workflow("tick")
    async def tick(ctx: fusee.Ctx, work_ms: int) -> int:
        wid, run = ctx.workflow_id, ctx.run_id

        def record() -> int:
            obs.ticks.setdefault(wid, set()).add(run)
            return work_ms

        await ctx.step("tick", record)
        await ctx.sleep("work", f"{work_ms}ms")  # long enough, now and then, to overlap the next time
        return work_ms

    rule: Any
    if rng.random() < 0.5:
        rule = {"batch": fusee.Batch(max_size=1 + rng.randrange(5), max_delay=f"{5 + rng.randrange(40)}ms",
                                     continue_every=2 + rng.randrange(5), dedup_memory=200)}
    else:
        rule = {"debounce": fusee.Debounce(period=f"{5 + rng.randrange(30)}ms", max_wait="60ms",
                                           continue_every=2 + rng.randrange(5), dedup_memory=200)}

    @fusee.workflow("echo", **rule)
    async def echo(ctx: fusee.Ctx, events: list[dict[str, Any]]) -> int:
        wid = ctx.workflow_id

        def record() -> int:
            if wid not in obs.windows:
                obs.windows[wid] = list(events)
                key, n = wid[len("echo:"):].rsplit("#", 1)
                obs.order.setdefault(key, []).append(int(n))
            return len(events)

        return int(await ctx.step("record", record))

    plan.workflows += [tick, echo]
    counters = plan.counters
    plan.counters = lambda: {
        **counters(), "scheduled": len(obs.ticks), "schedule_skips": obs.skipped,
        "events_queued": len(obs.receipts), "windows_run": len(obs.windows),
    }
    if use_schedule:
        overlap = rng.choice(schedules.OVERLAPS)
        every = rng.choice([50, 80, 120])
        spec = ScheduleAction(
            SCHEDULE_ID, every, overlap, catchup_ms=rng.choice([100, 60_000]),
            jitter_ms=rng.choice([0, 0, 5]), work_ms=rng.choice([1, 20, 60, 150]),
        )
        t0 = rng.randrange(200)
        plan.actions.append((t0, spec))
        plan.actions.append((t0 + 300 + rng.randrange(300), ScheduleControl(SCHEDULE_ID, "trigger")))
        # Backfill times that most likely fired already: the same IDs must not start again.
        plan.actions.append((t0 + 500 + rng.randrange(500), ScheduleControl(SCHEDULE_ID, "backfill", 400)))
        if rng.random() < 0.5:
            tp = t0 + 200 + rng.randrange(800)
            plan.actions.append((tp, ScheduleControl(SCHEDULE_ID, "pause")))
            plan.actions.append((tp + 50 + rng.randrange(200), ScheduleControl(SCHEDULE_ID, "unpause")))
        plan.actions.append((1_600 + rng.randrange(300), ScheduleControl(SCHEDULE_ID, "delete")))
    if use_windows:
        keys = [f"k{i}" for i in range(1 + rng.randrange(2))]
        n = 0
        for key in keys:
            for _ in range(5 + rng.randrange(12)):
                t = rng.randrange(1_800)
                eid = f"ev{n}"
                n += 1
                act = Enqueue("echo", key, {"id": eid, "v": rng.randrange(1000)}, eid)
                plan.actions.append((t, act))
                if rng.random() < 0.15:
                    plan.actions.append((t + rng.randrange(100), act))  # the same event ID again


async def request(world: Any, engine: Any, action: Any) -> tuple[str, Any]:
    """Carries out one flow request (the world retries it after crashes)."""
    obs: FlowObserver = world.plan.flow
    if isinstance(action, ScheduleAction):
        await engine.schedule(
            action.id, "tick", action.work_ms, every=f"{action.every_ms}ms", overlap=action.overlap,
            catchup_window=f"{action.catchup_ms}ms", jitter=f"{action.jitter_ms}ms" if action.jitter_ms else None,
        )
        return ("ok", None)
    if isinstance(action, ScheduleControl):
        if action.op == "backfill":
            now = engine._env.now_ms()
            end = datetime.datetime.fromtimestamp(now / 1000, tz=datetime.UTC)
            info = await engine.backfill_schedule(
                action.id, end - datetime.timedelta(milliseconds=action.span_ms), end)
        else:
            info = await getattr(engine, f"{action.op}_schedule")(action.id)
        return ("ok", info.fired)
    assert isinstance(action, Enqueue)
    r = await engine.enqueue(action.workflow, action.key, action.event, event_id=action.event_id)
    del obs  # answers are recorded by observe()
    return ("ok", (r.window_id, r.position))


def ready(world: Any, action: Any) -> bool:
    """Whether the client may send ``action`` now (controls go to a schedule it made)."""
    obs: FlowObserver = world.plan.flow
    if isinstance(action, ScheduleControl):
        return action.id in obs.schedules and action.id not in obs.deleted
    return True


def observe(world: Any, action: Any, answer: tuple[str, Any]) -> None:
    obs: FlowObserver | None = world.plan.flow
    status, value = answer
    if isinstance(action, Enqueue) and status == "ok":
        world.obs.receipt(action.event_id, (str(value[0]), int(value[1])))
    if obs is None:
        return  # a scenario's enqueue: its receipt is all there is to note
    if isinstance(action, ScheduleAction):
        obs.schedules[action.id] = action
    elif isinstance(action, ScheduleControl):
        if action.op == "delete":
            obs.deleted.add(action.id)
    elif isinstance(action, Enqueue) and status == "ok":
        receipt = (str(value[0]), int(value[1]))
        prev = obs.receipts.setdefault(action.event_id, receipt)
        if prev != receipt:
            obs.violations.append(
                f"event {action.event_id} got receipt {prev} and later {receipt}: one event ID, two receipts")


def settled(world: Any) -> bool:
    """Every scheduled run ended and every acknowledged event's window ran."""
    obs: FlowObserver | None = world.plan.flow
    if obs is None or world.engine is None:
        return True
    if any(s.workflow == "tick" and s.status == "running" for s in world.engine.runs()):
        return False
    return all(wid in obs.windows for wid, _ in obs.receipts.values())


async def final_states(engine: Any, obs: FlowObserver) -> dict[str, dict[str, Any]]:
    """The final state of every deleted schedule (its run's result); notes the scheduled runs that exist."""
    out: dict[str, dict[str, Any]] = {}
    obs.started = {r.workflow_id for r in engine.runs() if r.workflow == "tick"}
    for sid in obs.deleted:
        out[sid] = await engine.get(schedules.PREFIX + sid).result()
    obs.skipped = sum(s["skipped_overlap"] + s["skipped_catchup"] + s.get("skipped_paused", 0)
                      for s in out.values())
    return out


_FIRED = re.compile(r"^(?P<sid>.*)@(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?Z)")


def fired_time(workflow_id: str) -> tuple[str, int] | None:
    """(schedule ID, scheduled time in ms) a scheduled run's ID names."""
    m = _FIRED.match(workflow_id)
    if m is None:
        return None
    t = datetime.datetime.fromisoformat(m["time"].replace("Z", "+00:00"))
    return m["sid"], int(t.timestamp() * 1000)
