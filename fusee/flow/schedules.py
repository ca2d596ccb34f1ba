"""Schedules: a built-in durable workflow per schedule that starts runs at set times.

A schedule ``S`` is the run ``fusee:schedule:S``. Its code sleeps durably
(a wait with a timeout, so control requests can wake it) until the next
scheduled time, then starts the scheduled run as a child with the ID
``S@<time>`` (the scheduled time, ISO 8601 UTC). Starting a child is
journaled and deduplicated by workflow ID, so one scheduled time never
fires twice: not after a crash (the journal already holds the start), not
after a clock jump, not when a backfill or a trigger names a time that
already fired. Times are computed from ``ctx.now()`` (recorded), so replay
takes the same decisions.

The run tracks the last run it started (as an attached child whose result
it awaits) to apply the overlap policy, takes control requests as updates
(pause, unpause, trigger, backfill, delete, describe), and continues as new
every ``CONTINUE_EVERY`` turns while no tracked run is running, so its
journal stays bounded. State carried across continue-as-new is the dict
below (``_state``): spec, next time, counters and buffered times.
"""

from __future__ import annotations

import asyncio
import datetime
import zoneinfo
from typing import Any

from fusee import sabotage
from fusee.definitions import QueryDef, SignalDef, UpdateDef, workflow
from fusee.durations import to_ms
from fusee.errors import EngineClosed, FuseeError, InvalidSchedule
from fusee.runtime.context import Ctx

#: The prefix of a schedule's own workflow ID.
PREFIX = "fusee:schedule:"
#: The built-in workflow type of schedules.
TYPE = "fusee:schedule"
OVERLAPS = ("skip", "buffer_one", "buffer_all", "allow_all", "cancel_other", "terminate_other")
#: Loop turns a schedule run takes before it continues as new (when no tracked run runs).
CONTINUE_EVERY = 100
#: Most scheduled times one backfill may name.
MAX_BACKFILL = 10_000

CONTROL: UpdateDef[Any] = UpdateDef("fusee.schedule.control")
DESCRIBE: QueryDef[Any] = QueryDef("fusee.schedule.describe")
#: Never sent: waiting for it with a timeout is a timer that a control request can cut short.
TIMER: SignalDef[Any] = SignalDef("fusee.schedule.timer")


def run_id_of(schedule_id: str, at_ms: int) -> str:
    """The workflow ID of the run scheduled at ``at_ms``: ``{schedule_id}@{ISO 8601 UTC}``."""
    return f"{schedule_id}@{iso(at_ms)}"


def iso(at_ms: int) -> str:
    """``2026-12-01T04:30:00Z``, with milliseconds (``...00.250Z``) when the time has some."""
    t = datetime.datetime.fromtimestamp(at_ms // 1000, tz=datetime.UTC)
    ms = at_ms % 1000
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{ms:03d}Z" if ms else "Z")


def spec_of(
    schedule_id: str, workflow_name: str, input: Any, *, every: Any, cron: str | None, timezone: str,
    jitter: Any, overlap: str, catchup_window: Any,
) -> dict[str, Any]:
    """The schedule's spec as plain JSON, validated (:class:`fusee.InvalidSchedule` says what is wrong)."""
    if (every is None) == (cron is None):
        raise InvalidSchedule(f"schedule {schedule_id!r}: give exactly one of every=... or cron=...")
    every_ms = None
    if every is not None:
        every_ms = to_ms(every)
        if every_ms <= 0:
            raise InvalidSchedule(f"schedule {schedule_id!r}: every= must be positive, got {every!r}")
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as e:
        raise InvalidSchedule(
            f"schedule {schedule_id!r}: unknown timezone {timezone!r} ({e}); use an IANA name such as "
            "'UTC' or 'Europe/Paris'"
        ) from None
    if cron is not None:
        if not isinstance(cron, str):
            raise InvalidSchedule(f"schedule {schedule_id!r}: cron= takes a string, got {cron!r}")
        _cron_next(cron, timezone, 0)  # refuses a bad expression now, before anything is recorded
    if overlap not in OVERLAPS:
        raise InvalidSchedule(f"schedule {schedule_id!r}: overlap must be one of {OVERLAPS}, got {overlap!r}")
    catchup_ms = to_ms(catchup_window)
    jitter_ms = to_ms(jitter) if jitter is not None else 0
    return {
        "id": schedule_id, "workflow": workflow_name, "input": input, "every_ms": every_ms, "cron": cron,
        "timezone": timezone, "jitter_ms": jitter_ms, "overlap": overlap, "catchup_ms": catchup_ms,
    }


def _cron_next(expr: str, tz: str, after_ms: int) -> int:
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        raise InvalidSchedule(
            "cron schedules need the cron extra: pip install 'fusee[cron]' (it installs cronsim)"
        ) from None
    start = datetime.datetime.fromtimestamp(after_ms / 1000, tz=zoneinfo.ZoneInfo(tz))
    try:
        nxt = next(CronSim(expr, start))
    except CronSimError as e:
        raise InvalidSchedule(f"invalid cron expression {expr!r}: {e}") from None
    except StopIteration:
        raise InvalidSchedule(f"cron expression {expr!r} has no time after {start.isoformat()}") from None
    return int(nxt.timestamp() * 1000)


def next_after(spec: dict[str, Any], t_ms: int) -> int:
    """The first scheduled time strictly after ``t_ms``. ``every`` counts from the Unix epoch."""
    every: int | None = spec["every_ms"]
    if every is not None:
        return (t_ms // every + 1) * every
    return _cron_next(str(spec["cron"]), str(spec["timezone"]), t_ms)


def times_between(spec: dict[str, Any], start_ms: int, end_ms: int) -> list[int]:
    """Scheduled times in ``[start_ms, end_ms)``."""
    out: list[int] = []
    t = next_after(spec, start_ms - 1)
    while t < end_ms:
        if len(out) >= MAX_BACKFILL:
            raise InvalidSchedule(f"a backfill may name at most {MAX_BACKFILL} times; split the range")
        out.append(t)
        t = next_after(spec, t)
    return out


def count_between(spec: dict[str, Any], start_ms: int, end_ms: int) -> int:
    """How many scheduled times lie in ``[start_ms, end_ms]`` (arithmetic for ``every``)."""
    every = spec["every_ms"]
    if every is not None:
        first = next_after(spec, start_ms - 1)
        return 0 if first > end_ms else (end_ms - first) // every + 1
    n, t = 0, next_after(spec, start_ms - 1)
    while t <= end_ms:
        n += 1
        t = next_after(spec, t)
    return n


def initial_state(spec: dict[str, Any], paused: bool) -> dict[str, Any]:
    """A new schedule's state (its first turn fills in the times from ``ctx.now()``)."""
    return {
        "spec": spec, "paused": bool(paused), "next_ms": None, "due_ms": None, "first_ms": None,
        "fired": 0, "skipped_overlap": 0, "skipped_catchup": 0, "skipped_paused": 0, "buffered": [], "last_run": None,
        "deleted": False, "last_error": None,
    }


def _ms(ctx: Ctx) -> int:
    return int(ctx.now().timestamp() * 1000)


@workflow(TYPE)
async def schedule_run(ctx: Ctx, state: dict[str, Any]) -> dict[str, Any]:
    """One schedule (see the module docstring). Returns its final state when deleted."""
    s = state
    spec: dict[str, Any] = s["spec"]
    sid: str = spec["id"]
    overlap: str = spec["overlap"]
    rt: Any = ctx._run.rt  # the runtime: registry lookups, and cancels of runs it started
    wake = asyncio.Event()
    tracked: asyncio.Future[Any] | None = None
    stop_asked = False
    #: A due time came while a run ran, under cancel_other/terminate_other: stop that run.
    stop_wanted = False
    triggers: list[int] = []

    def set_next(after_ms: int) -> None:
        s["next_ms"] = nxt = next_after(spec, after_ms)
        jitter = spec["jitter_ms"]
        # Deterministic jitter: the draw is journaled (replay delays the same time the same way).
        s["due_ms"] = nxt + (int(ctx.random() * jitter) if jitter else 0)

    def info() -> dict[str, Any]:
        return {**s, "running": running_id[0] if tracked is not None else None}

    running_id: list[str | None] = [None]

    def on_control(arg: dict[str, Any]) -> dict[str, Any]:
        op = arg.get("op")
        if op == "pause":
            s["paused"] = True
        elif op == "unpause":
            if s["paused"]:
                s["paused"] = False
                now = _ms(ctx)
                if s["next_ms"] is not None:
                    # Times that passed while paused are not caught up: they are counted.
                    s["skipped_paused"] = s.get("skipped_paused", 0) + count_between(spec, s["next_ms"], now)
                set_next(now)
        elif op == "trigger":
            triggers.append(_ms(ctx))
        elif op == "backfill":
            times = times_between(spec, int(arg["start_ms"]), int(arg["end_ms"]))
            if overlap == "allow_all":
                triggers.extend(times)
            else:
                s["buffered"].extend(times)
        elif op == "delete":
            s["deleted"] = True
        wake.set()
        return info()

    ctx.on_update(CONTROL, on_control)
    ctx.on_query(DESCRIBE, info)

    async def follow(aw: Any) -> None:
        try:
            await aw
        except Exception:
            pass

    def fire(t_ms: int) -> None:
        nonlocal tracked, stop_asked, stop_wanted
        wid = run_id_of(sid, t_ms)
        if sabotage.active.schedule_random_id:
            wid += "~" + ctx.uuid4().hex[:8]
        try:
            wdef = rt.check_registered(spec["workflow"])
        except FuseeError as e:
            s["last_error"] = str(e)
            return
        s["fired"] += 1
        s["last_run"] = wid
        if overlap == "allow_all":
            ctx.start_child(wdef, wid, spec["input"], close_policy="abandon")
            return
        tracked = asyncio.ensure_future(follow(ctx.child(wdef, wid, spec["input"], close_policy="abandon")))
        running_id[0] = wid
        stop_asked = stop_wanted = False

    def offer(t_ms: int) -> None:
        nonlocal stop_wanted
        if tracked is None:
            fire(t_ms)
        elif overlap == "skip" or (overlap == "buffer_one" and s["buffered"]):
            s["skipped_overlap"] += 1
        elif overlap in ("buffer_one", "buffer_all"):
            s["buffered"].append(t_ms)
        else:  # cancel_other, terminate_other: the newest time replaces what waited
            s["skipped_overlap"] += len(s["buffered"])
            s["buffered"] = [t_ms]
            stop_wanted = True

    async def stop_tracked() -> None:
        nonlocal stop_asked
        wid = running_id[0]
        assert wid is not None
        stop_asked = True
        how = "cancel" if overlap == "cancel_other" else "terminate"

        async def request() -> None:
            reason = f"schedule {sid}: {overlap}"
            if rt.mail is not None and rt.mail.elsewhere(wid):
                # The run lives on another part: its holder applies it (nothing if it ended).
                kind = "_cancel_quiet" if how == "cancel" else "_terminate_quiet"
                if not await rt.mail.send(kind, (wid, reason)):
                    raise EngineClosed(f"schedule {sid}: this part closed before the {how} of {wid!r} "
                                       "was delivered; its next holder asks again")
                return
            try:
                st = rt.current(wid)
                lsn = (rt.cancel if how == "cancel" else rt.terminate)(wid, reason, None)
                await rt.wait_durable(st.shard, lsn)
            except FuseeError:
                pass  # it ended meanwhile (or never started): nothing to stop

        async def stop() -> None:
            # As an engine task of its own: the request must not run inside this step's
            # own stack (ending the other run wakes tasks that this one would nest).
            await rt.spawn(request())

        await ctx.step(f"{how} {wid}", stop)

    turns = 0
    while True:
        if s["deleted"]:
            return info()
        now = _ms(ctx)
        if tracked is not None and tracked.done():
            tracked = None  # before the due times: one that came due as it ended finds it gone
            running_id[0] = None
        if turns >= CONTINUE_EVERY and tracked is None and not triggers:
            # Before anything new starts (a backlog of buffered times must not keep the
            # journal growing); due times stay due for the next run. The runs it started
            # must have arrived first, and a control accepted meanwhile is handled here.
            await ctx._run.deliveries_settled()
            await asyncio.sleep(0)  # lets update handlers that were accepted finish first
            if not triggers:
                await ctx.continue_as_new(s)
        if s["next_ms"] is None:
            s["first_ms"] = next_after(spec, now - 1)
            set_next(now - 1)
        if s["paused"]:
            pass
        else:
            while s["due_ms"] <= now:
                t = s["next_ms"]
                if now - t > spec["catchup_ms"]:
                    # Older than the catch-up window: skipped and counted, without a record per time.
                    every = spec["every_ms"]
                    oldest = now - spec["catchup_ms"]
                    if every is not None:
                        n = (oldest - t + every - 1) // every
                        s["skipped_catchup"] += n
                        set_next(t + n * every - 1)
                    else:
                        while t < oldest:
                            s["skipped_catchup"] += 1
                            t = next_after(spec, t)
                        set_next(t - 1)
                    continue
                set_next(t)
                offer(t)
        for t in triggers:
            offer(t)
        triggers.clear()
        while tracked is None and s["buffered"]:
            fire(s["buffered"].pop(0))
        if tracked is not None and stop_wanted and not stop_asked:
            await stop_tracked()
        turns += 1
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(wake.wait())]
        if tracked is not None:
            waits.append(tracked)
        timer = None
        if not s["paused"]:
            timer = asyncio.ensure_future(ctx.wait_for(TIMER, timeout=max(0, s["due_ms"] - now) / 1000))
            waits.append(timer)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            if w is not tracked and not w.done():
                w.cancel()
        wake.clear()
