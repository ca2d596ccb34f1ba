"""Bulk actions: ``Engine.bulk`` cancels, terminates, resumes, signals or resets every run a
``where`` query matches, with a dry run that only counts them.

Built on the engine's public calls (``list`` and one action per run), so each
run gets exactly what the single call would give it: the same checks, the same
journaled ``by=`` for the audit, acknowledged once durable. The actions of one
request are made together, so they share group commits.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fusee.definitions import SignalDef
from fusee.engine.query_grammar import parse
from fusee.engine.visibility import MAX_LIMIT, RunPage


class ListedRun(Protocol):
    """What a bulk action reads of a listed run (``fusee.RunSummary``)."""

    @property
    def workflow_id(self) -> str: ...
    @property
    def workflow(self) -> str: ...
    @property
    def status(self) -> str: ...


class BulkEngine(Protocol):
    """The engine's public calls a bulk action is made of (``fusee.Engine``): it takes no more."""

    def list(self, where: str | None = None, limit: int = 100, cursor: str | None = None, *,
             order: str = "oldest") -> RunPage: ...
    async def cancel(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None: ...
    async def terminate(self, workflow_id: str, reason: str = "", *, by: str | None = None) -> None: ...
    async def resume(self, workflow_id: str, *, by: str | None = None) -> None: ...
    async def signal(self, workflow_id: str, signal: SignalDef[Any], value: Any = None, *,
                     dedup_key: str | None = None, by: str | None = None) -> None: ...
    async def reset(self, workflow_id: str, *, before_step: str | None = None,
                    before_position: int | None = None, reapply_signals: bool = True,
                    version: int | None = None, by: str | None = None) -> Any: ...

#: The actions :meth:`Engine.bulk` takes.
ACTIONS = ("cancel", "terminate", "resume", "signal", "reset")
#: The most runs one bulk request acts on; more matching runs are left for the next request
#: (``BulkResult.remaining``), so one request never holds the engine for long.
MAX_BULK = 1000
#: Statuses of runs an action applies to (a run of another status is not counted).
_UNFINISHED = frozenset({"running", "retrying", "paused", "stuck"})
_APPLIES: dict[str, Callable[[ListedRun], bool]] = {
    "cancel": lambda s: s.status in _UNFINISHED,
    "terminate": lambda s: s.status in _UNFINISHED,
    "signal": lambda s: s.status in _UNFINISHED,
    "resume": lambda s: s.status == "paused",
    "reset": lambda s: True,
}


@dataclasses.dataclass(frozen=True)
class BulkResult:
    """What :meth:`Engine.bulk` counted or did.

    ``matched`` counts the runs the query matched that the action applies to
    (unfinished runs for cancel, terminate and signal; paused ones for resume;
    any for reset), at the time of the call. A dry run lists the first
    ``limit`` of them in ``workflow_ids`` and does nothing. Otherwise the
    action was made on those: ``done`` holds the IDs it is durable for,
    ``failed`` the others with the error ("Type: message"; a run that ended
    meanwhile, for example), and ``remaining`` how many matching runs were
    left for another request (past the bound).
    """

    action: str
    where: str
    dry_run: bool
    matched: int
    workflow_ids: tuple[str, ...]
    done: tuple[str, ...] = ()
    failed: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    remaining: int = 0


def _internal(s: ListedRun) -> bool:
    """The run of a schedule, a window or a keyed object: operated through their own calls."""
    return s.workflow.startswith(("fusee:", "fusee."))


def _check(action: str, where: str, limit: int, options: dict[str, Any]) -> None:
    if action not in ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}: use one of {', '.join(ACTIONS)}")
    if not isinstance(where, str) or not where.strip() or parse(where).filter is None:  # none, or only an order by
        raise ValueError("a bulk action needs a where query naming the runs (e.g. \"status = 'paused'\"); "
                         "to act on every run, say so: \"workflow_id != ''\"")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BULK:
        raise ValueError(f"limit must be an int from 1 to {MAX_BULK} (runs acted on per request), got {limit!r}")
    if action == "signal" and not options.get("signal"):
        raise ValueError("a bulk signal needs signal= (a fusee.signal or its name)")
    if action == "reset" and options.get("before_step") is None and options.get("before_position") is None:
        raise ValueError("a bulk reset needs before_step= (a step's name) or before_position=")
    allowed = {"cancel": {"reason"}, "terminate": {"reason"}, "resume": set(), "signal": {"signal", "value"},
               "reset": {"before_step", "before_position", "reapply_signals"}}[action]
    extra = sorted(k for k, v in options.items() if v is not None and k not in allowed)
    if extra:
        raise ValueError(f"bulk {action} takes no {', '.join(extra)}"
                         + (f" (it takes {', '.join(sorted(allowed))})" if allowed else ""))


def matching(engine: BulkEngine, action: str, where: str) -> list[ListedRun]:
    """Every run ``where`` matches that ``action`` applies to, oldest first or in the order of
    its ``order by`` (internal runs left out)."""
    applies = _APPLIES[action]
    out: list[ListedRun] = []
    cursor = None
    while True:
        page = engine.list(where, limit=MAX_LIMIT, cursor=cursor)
        out.extend(s for s in page.items if applies(s) and not _internal(s))
        cursor = page.cursor
        if cursor is None:
            return out


def _call(engine: BulkEngine, action: str, wid: str, by: str | None, options: dict[str, Any]) -> Awaitable[Any]:
    if action == "cancel":
        return engine.cancel(wid, options.get("reason") or "", by=by)
    if action == "terminate":
        return engine.terminate(wid, options.get("reason") or "", by=by)
    if action == "resume":
        return engine.resume(wid, by=by)
    if action == "signal":
        sig = options["signal"]
        definition: SignalDef[Any] = sig if isinstance(sig, SignalDef) else SignalDef(str(sig))
        return engine.signal(wid, definition, options.get("value"), by=by)
    reapply = options.get("reapply_signals")
    return engine.reset(wid, before_step=options.get("before_step"), before_position=options.get("before_position"),
                        reapply_signals=True if reapply is None else bool(reapply), by=by)


async def bulk(engine: BulkEngine, action: str, where: str, *, dry_run: bool, by: str | None, limit: int,
               options: dict[str, Any]) -> BulkResult:
    _check(action, where, limit, options)
    if by is not None and (not isinstance(by, str) or not by):
        raise TypeError(f"by= names who asks: a non-empty str, got {by!r}")
    found = matching(engine, action, where)
    chosen = tuple(s.workflow_id for s in found[:limit])
    if dry_run:
        return BulkResult(action, where, True, len(found), chosen)
    outcomes = await asyncio.gather(*(_call(engine, action, wid, by, options) for wid in chosen),
                                    return_exceptions=True)
    done: list[str] = []
    failed: dict[str, str] = {}
    for wid, outcome in zip(chosen, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome  # a cancellation of the caller, not a run's refusal
            failed[wid] = f"{type(outcome).__name__}: {outcome}"
        else:
            done.append(wid)
    return BulkResult(action, where, False, len(found), chosen, tuple(done), failed, len(found) - len(chosen))
