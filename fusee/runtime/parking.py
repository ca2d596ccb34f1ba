"""Parking: suspended runs leave memory and come back when something arrives for them.

A run that stayed suspended (sleeping, waiting for a signal) for
``park_after`` keeps only its packed journal; whatever arrives for it later
(a signal, a timer, a query) replays it first. Above ``max_loaded`` runs or
``memory_budget`` bytes in memory, suspended runs park at once (``fusee.runtime.budget``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fusee.core import records as rec
from fusee.errors import LogFailed
from fusee.runtime import budget
from fusee.runtime.snapshot import pack
from fusee.runtime.table import NO_LSNS, NO_RECORDS, WorkflowState, has_outbox
from fusee.runtime.timers import PARK

if TYPE_CHECKING:
    from fusee.limits import Limiter
    from fusee.runtime.env import Env
    from fusee.runtime.run import Run
    from fusee.runtime.sealing import Sealer
    from fusee.runtime.timers import TimerQueue


class _PermitWaits(Protocol):
    limited: bool  # a limited step ever ran (else none waits for a permit)

    def waits_for_permit(self, run: Run, seq: int) -> bool: ...


class ParkingHost(budget.BudgetHost, Protocol):
    """What parking asks of the runtime (``Runtime`` provides it)."""

    @property
    def steps(self) -> _PermitWaits: ...
    @property
    def park_after_ms(self) -> int | None: ...
    @property
    def env(self) -> Env: ...
    @property
    def timers(self) -> TimerQueue: ...
    @property
    def limiter(self) -> Limiter: ...
    @property
    def wf(self) -> dict[str, WorkflowState]: ...
    @property
    def sealer(self) -> Sealer: ...

    def loaded(self, st: WorkflowState) -> Run | None: ...


def permit_waits(rt: ParkingHost, run: Run) -> list[int]:
    """The run's steps that wait only for a limit's permit (they hold nothing: it may park)."""
    if not run.steps or not rt.steps.limited:
        return _NO_STEPS
    return [seq for seq in run.steps if rt.steps.waits_for_permit(run, seq)]


_NO_STEPS: list[int] = []


def after_pump(rt: ParkingHost, run: Run) -> None:
    """A run went quiet: park it once it has stayed suspended for ``park_after``, or at
    the next sweep while the loaded runs are over the budget."""
    if rt.park_after_ms is None and not budget.limited(rt):
        return
    if not run.machine.is_suspended(permit_waits(rt, run)):
        return
    if budget.limited(rt):
        budget.went_quiet(rt, run)
    if rt.park_after_ms is None:
        return
    now = rt.env.now_ms()
    run.quiet_since = now
    if run.park_queued:
        return  # one queued check per run: it looks again at when the run went quiet
    run.park_queued = True
    rt.timers.push(now + park_delay(rt), PARK, run.workflow_id, run.run_id)


def park_delay(rt: ParkingHost) -> int:
    assert rt.park_after_ms is not None
    return rt.park_after_ms


def parkable(rt: ParkingHost, run: Run) -> bool:
    return (
        not run.dead
        and not run.finished
        and run.stuck is None
        and not run.pumping
        and run.machine.is_suspended(permit_waits(rt, run))
        and not run.loop.has_ready()
        and not run.update_waiters
        and not run.update_by_ordinal
        and all(c.not_before == rec.PAUSED or rt.steps.waits_for_permit(run, seq)
                for seq, c in run.steps.items())
    )


def wake_time(rt: ParkingHost, run: Run) -> int:
    """When a parked run must come back by itself: its earliest timer or deadline (0: never);
    at once (1) if a step waits for a permit."""
    if permit_waits(rt, run):
        # Permits live in memory: after a restart (from a checkpoint too) the run must
        # come back at once to wait again, or nothing would ever wake it.
        return 1
    due = [run.timer_at[s] for s, op in run.ops.items() if op.kind == 1 and s in run.timer_at]
    due += [
        run.wait_deadline[s]
        for s, op in run.ops.items()
        if op.kind == 2 and run.wait_deadline.get(s, 0) > 0
    ]
    due += [
        run.children[s].deadline_ms
        for s, op in run.ops.items()
        if op.kind == 3 and s in run.children and run.children[s].deadline_ms > 0
    ]
    if run.machine.info.deadline_ms:
        due.append(run.machine.info.deadline_ms)
    return min(due) if due else 0


def park(rt: ParkingHost, st: WorkflowState) -> None:
    """Takes a suspended run's code out of memory; what arrives for it later replays it."""
    run = st.run
    assert run is not None and parkable(rt, run)
    st.wake_ms = wake_time(rt, run)
    waiting = permit_waits(rt, run)
    for seq in waiting:
        rt.limiter.park((run, seq), lambda ident: wake_for_permit(rt, ident))
    pack_state(rt, st)
    st.run = None
    budget.counted_out(rt, run)
    rt.stats["parked"] += 1
    run.kill()


def park_all(rt: ParkingHost) -> None:
    for st in rt.wf.values():
        if st.run is not None and parkable(rt, st.run):
            park(rt, st)


def pack_state(rt: ParkingHost, st: WorkflowState) -> None:
    """Keeps the journal encoded (the run's code is not in memory)."""
    st.outbox = has_outbox(st)
    st.packed = pack(st.journal, st.lsns, rt.sealer)
    # Shared and never appended to while packed: a parked run costs no lists.
    st.journal, st.lsns = NO_RECORDS, NO_LSNS


def on_park_check(rt: ParkingHost, st: WorkflowState) -> None:
    """A queued park check came due: park the run if it stayed quiet long enough, else look again later."""
    run = st.run
    if run is None:
        return
    run.park_queued = False
    if not parkable(rt, run):
        return  # busy again: its next quiet moment queues a new check
    due = run.quiet_since + park_delay(rt)
    if due <= rt.env.now_ms():
        park(rt, st)
    else:
        run.park_queued = True
        rt.timers.push(due, PARK, st.id, st.run_id)


#: How long a permit granted to a parked run's step waits for the woken step to claim it.
_CLAIM_S = 5.0


def wake_for_permit(rt: ParkingHost, ident: tuple[str, int, int]) -> None:
    """A parked run's step got its permit: wake the run (its replay asks for the permit again and
    gets it at once); a permit nobody can claim goes back."""
    wid, run_id, _ = ident
    st = rt.wf.get(wid)
    try:
        gone = rt.closed or st is None or st.run_id != run_id or st.status is not None or rt.loaded(st) is None
    except LogFailed:
        gone = True  # the log failed: nothing wakes until the reopen
    if gone:
        rt.limiter.drop_reservation(ident)
        return
    # Claimed within a few turns of the loop, unless the step can no longer start (a cancel came).
    rt.loop.call_later(_CLAIM_S, rt.limiter.drop_reservation, ident)
