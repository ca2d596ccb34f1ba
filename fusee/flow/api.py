"""The engine's client side of schedules and windows (mixed into :class:`fusee.Engine`).

Every call here goes through the engine's ordinary journaled operations
(start, update, update-with-start), so it is acknowledged only once durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, TypeVar, overload

import msgspec

from fusee import codec
from fusee.definitions import WorkflowDef
from fusee.errors import (
    FuseeError,
    InvalidSchedule,
    NotFound,
    NotWindowed,
    ScheduleExists,
    ScheduleNotFound,
    UpdateFailed,
    WorkflowEnded,
)
from fusee.flow import schedules, windows
from fusee.flow.rules import Receipt

if TYPE_CHECKING:
    from fusee.runtime.runtime import Runtime

In = TypeVar("In")
E = TypeVar("E")

#: The built-in workflows every engine registers.
BUILTINS: tuple[WorkflowDef[Any, Any], ...] = (schedules.schedule_run, windows.coordinator)
#: Times a control request or an event is offered again when it met a coordinator
#: or schedule run in the middle of its continue-as-new.
_ATTEMPTS = 50


def _when(ms: int | None) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


@dataclasses.dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as its run holds it now."""

    schedule_id: str
    workflow: str
    every: datetime.timedelta | None
    cron: str | None
    timezone: str
    overlap: str
    paused: bool
    #: The next scheduled time (UTC) not yet taken.
    next_time: datetime.datetime | None
    #: Runs started (scheduled, triggered or backfilled).
    fired: int
    #: Scheduled times dropped by the overlap policy (``skip``, ``buffer_one``, the ones a
    #: ``cancel_other``/``terminate_other`` replaced).
    skipped_overlap: int
    #: Scheduled times missed by more than ``catchup_window`` (downtime, clock jumps).
    skipped_catchup: int
    #: Scheduled times that passed while the schedule was paused (not run).
    skipped_paused: int
    #: Scheduled times waiting for the running run to end.
    buffered: int
    #: The run it waits for (overlap policies other than ``allow_all``), if one runs.
    running: str | None
    #: The last run it started.
    last_run: str | None
    #: Why the last start failed (an unregistered workflow), if it did.
    last_error: str | None

    @classmethod
    def of(cls, s: dict[str, Any]) -> ScheduleInfo:
        spec = s["spec"]
        return cls(
            schedule_id=spec["id"], workflow=spec["workflow"],
            every=datetime.timedelta(milliseconds=spec["every_ms"]) if spec["every_ms"] else None,
            cron=spec["cron"], timezone=spec["timezone"], overlap=spec["overlap"], paused=s["paused"],
            next_time=_when(s["next_ms"]), fired=s["fired"], skipped_overlap=s["skipped_overlap"],
            skipped_catchup=s["skipped_catchup"], skipped_paused=s.get("skipped_paused", 0), buffered=len(s["buffered"]), running=s.get("running"),
            last_run=s["last_run"], last_error=s["last_error"],
        )


class ScheduleList(list[ScheduleInfo]):
    """The schedules: a list, which may also be awaited (``await engine.schedules()``)."""

    def __await__(self) -> Generator[Any, None, ScheduleList]:
        # One bare yield: a turn of the event loop (as asyncio.sleep(0)), so a caller
        # polling ``await engine.schedules()`` in a loop lets the schedules run.
        yield None
        return self


def _plain(value: Any) -> Any:
    return msgspec.json.decode(value)


def _to_ms(at: datetime.datetime) -> int:
    if not isinstance(at, datetime.datetime):
        raise InvalidSchedule(f"backfill takes datetimes, got {at!r}")
    if at.tzinfo is None:
        raise InvalidSchedule(f"backfill times must be timezone-aware (e.g. tzinfo=datetime.UTC), got {at!r}")
    return int(at.timestamp() * 1000)


class FlowAPI:
    """Schedules and windows, as engine methods."""

    _rt: Runtime

    if TYPE_CHECKING:
        def _check_open(self) -> None: ...

    @property
    def _flow_engine(self) -> Any:
        """This engine, for the methods :class:`fusee.Engine` defines (start, update, ...)."""
        return self

    # --- schedules -------------------------------------------------------------

    @overload
    async def schedule(
        self,
        schedule_id: str,
        workflow: WorkflowDef[In, Any],
        input: In = None,  # type: ignore[assignment]  # None for a workflow without input
        *,
        every: Any = None,
        cron: str | None = None,
        timezone: str = "UTC",
        jitter: Any = None,
        overlap: str = "skip",
        catchup_window: Any = "1h",
        paused: bool = False,
    ) -> None: ...

    @overload
    async def schedule(
        self,
        schedule_id: str,
        workflow: str,
        input: Any = None,
        *,
        every: Any = None,
        cron: str | None = None,
        timezone: str = "UTC",
        jitter: Any = None,
        overlap: str = "skip",
        catchup_window: Any = "1h",
        paused: bool = False,
    ) -> None: ...

    async def schedule(
        self,
        schedule_id: str,
        workflow: WorkflowDef[Any, Any] | str,
        input: Any = None,
        *,
        every: Any = None,
        cron: str | None = None,
        timezone: str = "UTC",
        jitter: Any = None,
        overlap: str = "skip",
        catchup_window: Any = "1h",
        paused: bool = False,
    ) -> None:
        """Makes a schedule that starts ``workflow`` with ``input`` at set times; returns once durable.

        Give ``every`` (a duration, counted from the Unix epoch, so ``every="1h"``
        fires on the hour) or ``cron`` (a cron expression read in ``timezone``;
        needs ``pip install 'fusee[cron]'``). The run for scheduled time T is
        ``{schedule_id}@{T as ISO 8601 UTC}`` (``job@2026-12-01T04:30:00Z``),
        started once per T, across crashes and clock jumps. ``jitter`` delays
        each start by a deterministic random part of it (the ID keeps T).
        ``overlap`` says what a due time does while the previous run runs:
        ``skip``, ``buffer_one``, ``buffer_all``, ``allow_all``, ``cancel_other``
        or ``terminate_other``. Times missed (downtime) by at most
        ``catchup_window`` run late; older ones are skipped and counted.

        Scheduling an existing ID again with the same spec does nothing; with
        another spec it raises :class:`fusee.ScheduleExists` (delete it first).
        A bad spec raises :class:`fusee.InvalidSchedule`.
        """
        self._check_open()
        if not isinstance(schedule_id, str) or not schedule_id:
            raise InvalidSchedule(f"a schedule ID must be a non-empty string, got {schedule_id!r}")
        wdef = self._rt.check_registered(workflow)
        if not wdef.takes_input and input is not None:
            raise TypeError(f"workflow '{wdef.name}' takes no input, got {type(input).__name__}")
        plain = _plain(codec.encode_input(wdef, input))
        spec = schedules.spec_of(
            schedule_id, wdef.name, plain, every=every, cron=cron, timezone=timezone, jitter=jitter,
            overlap=overlap, catchup_window=catchup_window,
        )
        wid = schedules.PREFIX + schedule_id
        st = self._rt.wf.get(wid)
        if st is not None and st.running:
            current = await self._schedule_state(schedule_id, {"op": "describe"})
            if current["spec"] != spec:
                raise ScheduleExists(
                    f"schedule {schedule_id!r} exists with another spec; delete_schedule({schedule_id!r}) "
                    "first to replace it"
                )
            return
        await self._flow_engine.start(schedules.schedule_run, wid, schedules.initial_state(spec, paused),
                         if_running="attach", if_finished="start")

    async def _schedule_state(self, schedule_id: str, request: dict[str, Any]) -> dict[str, Any]:
        self._check_open()
        wid = schedules.PREFIX + schedule_id
        for _ in range(_ATTEMPTS):
            st = self._rt.wf.get(wid)
            if st is None or not st.running:
                raise ScheduleNotFound(f"no schedule {schedule_id!r} exists (never made, or deleted)")
            try:
                answer: dict[str, Any] = await self._flow_engine.update(wid, schedules.CONTROL, request)
                return answer
            except (UpdateFailed, WorkflowEnded) as e:
                if isinstance(e, UpdateFailed) and "ended before" not in str(e):
                    raise
                await asyncio.sleep(0)  # it was continuing as new: the next run takes it
        raise ScheduleNotFound(f"schedule {schedule_id!r} did not take the request; is it being deleted?")

    def schedules(self) -> ScheduleList:
        """Every schedule, by ID (answered from memory; ``await`` it or not)."""
        out = ScheduleList(ScheduleInfo.of(state) for state in self._schedule_states())
        out.sort(key=lambda i: i.schedule_id)
        return out

    def _schedule_states(self) -> list[dict[str, Any]]:
        """The state of every schedule this engine runs, as plain data (:meth:`ScheduleInfo.of`)."""
        self._check_open()
        out = []
        for wid, st in list(self._rt.wf.items()):
            if not wid.startswith(schedules.PREFIX) or not st.running:
                continue
            try:
                run = self._rt.running_run(wid)
            except NotFound:
                continue
            try:
                state = run.answer_query(schedules.DESCRIBE, None)
            except FuseeError:
                continue  # its code has not registered the query yet (it is starting)
            out.append(state)
        return out

    async def describe_schedule(self, schedule_id: str) -> ScheduleInfo:
        """One schedule's state, once durable. Raises :class:`fusee.ScheduleNotFound`."""
        return ScheduleInfo.of(await self._schedule_state(schedule_id, {"op": "describe"}))

    async def pause_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Stops starting runs (running ones go on); durable when it returns."""
        return ScheduleInfo.of(await self._schedule_state(schedule_id, {"op": "pause"}))

    async def unpause_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Starts runs again from the next scheduled time (times that passed while paused are not run)."""
        return ScheduleInfo.of(await self._schedule_state(schedule_id, {"op": "unpause"}))

    async def trigger_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Starts a run now (ID ``{schedule_id}@{now}``), under the overlap policy."""
        return ScheduleInfo.of(await self._schedule_state(schedule_id, {"op": "trigger"}))

    async def backfill_schedule(self, schedule_id: str, start: datetime.datetime, end: datetime.datetime) -> ScheduleInfo:
        """Runs the scheduled times in ``[start, end)`` one after another (all at once with
        ``allow_all``). A time that already fired is not started again (same ID)."""
        start_ms, end_ms = _to_ms(start), _to_ms(end)
        if end_ms > start_ms + 10 * 366 * 86_400_000:
            raise InvalidSchedule("a backfill covers at most ten years; split the range")
        return ScheduleInfo.of(await self._schedule_state(
            schedule_id, {"op": "backfill", "start_ms": start_ms, "end_ms": end_ms}))

    async def delete_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Ends the schedule (its runs go on); returns its final state. The ID may be scheduled again."""
        return ScheduleInfo.of(await self._schedule_state(schedule_id, {"op": "delete"}))

    # --- windows ---------------------------------------------------------------

    @overload
    async def enqueue(
        self, workflow: WorkflowDef[list[E], Any], key: str, event: E, *, event_id: str | None = None,
    ) -> Receipt: ...

    @overload
    async def enqueue(self, workflow: str, key: str, event: Any, *, event_id: str | None = None) -> Receipt: ...

    async def enqueue(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        key: str,
        event: Any,
        *,
        event_id: str | None = None,
    ) -> Receipt:
        """Adds ``event`` to ``key``'s open window of the debounced or batched ``workflow``.

        Returns once the event is durable, with the :class:`fusee.Receipt`
        naming the window run that will get it and its position in that run's
        input. Every acknowledged event lands in exactly one window; the
        windows of one key run one after another, in order. Sending the same
        ``event_id`` again returns the first receipt (while the key remembers
        it: its ``dedup_memory`` most recent IDs). Raises
        :class:`fusee.NotWindowed` for a workflow declared without
        ``debounce=`` or ``batch=``.
        """
        self._check_open()
        wdef = self._rt.check_registered(workflow)
        if wdef.window is None:
            raise NotWindowed(
                f"workflow '{wdef.name}' has no window: declare it with "
                "@fusee.workflow(name, debounce=fusee.Debounce(...)) or batch=fusee.Batch(...)"
            )
        if not isinstance(key, str) or not key:
            raise TypeError(f"a window key must be a non-empty string, got {key!r}")
        if event_id is None:
            event_id = self._rt.env.rng.getrandbits(128).to_bytes(16, "big").hex()
        elif not isinstance(event_id, str) or not event_id:
            raise TypeError(f"event_id must be a non-empty string, got {event_id!r}")
        plain = _plain(codec.encode_input(wdef, [event]))[0]
        cid = windows.coordinator_id(wdef.name, key)
        arg = {"id": event_id, "event": plain}
        for _ in range(_ATTEMPTS):
            try:
                answer = await self._flow_engine.update_with_start(
                    windows.coordinator, cid, windows.initial_state(wdef.name, key, wdef.window),
                    windows.EVENT, arg, update_id="event:" + event_id,
                )
                return Receipt(answer["window_id"], answer["position"])
            except (UpdateFailed, WorkflowEnded) as e:
                if isinstance(e, UpdateFailed) and "ended before" not in str(e):
                    raise
                await asyncio.sleep(0)  # the coordinator was continuing as new: offer it to the next run
        raise UpdateFailed(f"the window coordinator of {wdef.name!r} key {key!r} did not take the event")
