"""Debounce and batch windows: a built-in coordinator workflow per (workflow, key).

``engine.enqueue(digest, key, event, event_id=...)`` is an update-with-start
of the coordinator ``fusee:window:{workflow}:{key}``. Its update handler puts
the event in the key's open window and answers a :class:`fusee.Receipt`
(the window run's ID and the event's position in its input); the engine
returns that answer once it is durable, and the handler answers a repeated
``event_id`` with the receipt it gave first. When a window closes (its
debounce period passed, its batch filled or its delay passed), the
coordinator starts the window run ``{workflow}:{key}#{n}`` as a child with
the window's events as its input, one window at a time, in order.

Every ``continue_every`` events, once no window run is running, the
coordinator continues as new, carrying the open window, the closed windows
waiting to run, the next window number, and the ``dedup_memory`` most recent
event IDs with their receipts (older IDs are forgotten: a repeat of one of
those would be taken as a new event). So its journal never grows without
bound. Coordinators never end: an idle one waits (parked) for the next event.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fusee import sabotage
from fusee.definitions import SignalDef, UpdateDef, workflow
from fusee.durations import to_ms
from fusee.errors import FuseeError
from fusee.flow.rules import Batch, Debounce
from fusee.runtime.context import Ctx

PREFIX = "fusee:window:"
TYPE = "fusee:window"
EVENT: UpdateDef[Any] = UpdateDef("fusee.window.event")
TIMER: SignalDef[Any] = SignalDef("fusee.window.timer")


def coordinator_id(workflow_name: str, key: str) -> str:
    return f"{PREFIX}{workflow_name}:{key}"


def window_id(workflow_name: str, key: str, n: int) -> str:
    """The workflow ID of window ``n`` (from 0) of ``key``."""
    return f"{workflow_name}:{key}#{n}"


def rule_of(rule: Debounce | Batch) -> dict[str, Any]:
    """The rule as plain JSON (kept in the coordinator's state: replay sees the rule it ran with)."""
    if isinstance(rule, Debounce):
        return {
            "kind": "debounce", "period_ms": to_ms(rule.period),
            "max_wait_ms": to_ms(rule.max_wait) if rule.max_wait is not None else None,
            "continue_every": rule.continue_every, "dedup_memory": rule.dedup_memory,
        }
    return {
        "kind": "batch", "max_size": rule.max_size, "max_delay_ms": to_ms(rule.max_delay),
        "continue_every": rule.continue_every, "dedup_memory": rule.dedup_memory,
    }


def initial_state(workflow_name: str, key: str, rule: Debounce | Batch) -> dict[str, Any]:
    return {
        "workflow": workflow_name, "key": key, "rule": rule_of(rule), "next_n": 0, "open": None,
        "closed": [], "dedup": {},
    }


def _deadline(rule: dict[str, Any], w: dict[str, Any]) -> int:
    if rule["kind"] == "debounce":
        at = int(w["last_ms"]) + int(rule["period_ms"])
        if rule["max_wait_ms"] is not None:
            at = min(at, int(w["first_ms"]) + int(rule["max_wait_ms"]))
        return at
    return int(w["first_ms"]) + int(rule["max_delay_ms"])


def _ms(ctx: Ctx) -> int:
    return int(ctx.now().timestamp() * 1000)


@workflow(TYPE)
async def coordinator(ctx: Ctx, state: dict[str, Any]) -> None:
    """The windows of one key (see the module docstring)."""
    s = state
    rule: dict[str, Any] = s["rule"]
    name: str = s["workflow"]
    key: str = s["key"]
    dedup: dict[str, list[Any]] = s["dedup"]
    rt: Any = ctx._run.rt  # the runtime: registry lookups, and cancels of runs it started
    wake = asyncio.Event()
    running: asyncio.Future[Any] | None = None
    taken = 0

    def on_event(arg: dict[str, Any]) -> dict[str, Any]:
        nonlocal taken
        eid = str(arg["id"])
        seen = dedup.get(eid)
        if seen is not None:
            return {"window_id": seen[0], "position": seen[1]}
        now = _ms(ctx)
        w = s["open"]
        if w is None:
            w = s["open"] = {"n": s["next_n"], "events": [], "first_ms": now, "last_ms": now}
            s["next_n"] += 1
        position = len(w["events"])
        w["events"].append(arg["event"])
        w["last_ms"] = now
        wid = window_id(name, key, w["n"])
        dedup[eid] = [wid, position]
        while len(dedup) > rule["dedup_memory"]:
            del dedup[next(iter(dedup))]  # the oldest ID (dicts keep insertion order, also in JSON)
        if rule["kind"] == "batch" and len(w["events"]) >= rule["max_size"]:
            s["closed"].append(w)
            s["open"] = None
        taken += 1
        wake.set()
        return {"window_id": wid, "position": position}

    ctx.on_update(EVENT, on_event)

    async def follow(aw: Any) -> None:
        try:
            await aw
        except Exception:
            pass

    while True:
        now = _ms(ctx)
        w = s["open"]
        if w is not None and now >= _deadline(rule, w):
            s["closed"].append(w)
            s["open"] = None
        if running is not None and running.done():
            running = None
        if taken >= rule["continue_every"] and running is None:
            # Between two window runs, before the next one starts: a backlog of closed
            # windows must not keep the journal growing.
            await asyncio.sleep(0)  # lets update handlers that were accepted finish first
            if sabotage.active.window_drops_on_continue and s["open"] is not None:
                s["open"]["events"].pop()
            await ctx.continue_as_new(s)
        if running is None and s["closed"]:
            w = s["closed"].pop(0)
            try:
                wdef = rt.check_registered(name)
                running = asyncio.ensure_future(
                    follow(ctx.child(wdef, window_id(name, key, w["n"]), w["events"], close_policy="abandon")))
            except FuseeError:
                pass  # the workflow is no longer registered: its window cannot run
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(wake.wait())]
        if running is not None:
            waits.append(running)
        if s["open"] is not None:
            left = max(0, _deadline(rule, s["open"]) - now)
            waits.append(asyncio.ensure_future(ctx.wait_for(TIMER, timeout=left / 1000)))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for f in waits:
            if f is not running and not f.done():
                f.cancel()
        wake.clear()
