"""The memory budget: what a loaded run is counted as holding, and the sweep that parks runs over it.

A loaded run counts as ``fusee.runtime.footprint`` says. Parking a run frees
about its count less its journal's encoded size (a parked run keeps its
journal packed).

Once the loaded runs pass ``memory_budget`` bytes (or ``max_loaded`` runs),
a sweep parks the runs that went quiet longest ago, oldest first, until they
are under it again; a run that is busy (a step running, an update waiting) is
passed over and comes back to the sweep's list the next time it goes quiet.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fusee.runtime.run import Run
    from fusee.runtime.table import WorkflowState

class BudgetHost(Protocol):
    """What the budget asks of the runtime (``Runtime`` provides it)."""

    loaded_runs: int
    loaded_bytes: int
    #: Suspended runs, the one that went quiet longest ago first (the sweep's candidates).
    quiet: dict[Run, None]
    sweep_scheduled: bool

    @property
    def memory_budget(self) -> int | None: ...
    @property
    def max_loaded(self) -> int | None: ...
    @property
    def by_run(self) -> dict[int, WorkflowState]: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def parkable(self, run: Run) -> bool: ...
    def park(self, st: WorkflowState) -> None: ...


def counted_in(rt: BudgetHost, run: Run) -> None:
    """A run was loaded: its bytes count from now on."""
    rt.loaded_runs += 1
    rt.loaded_bytes += run.held_bytes
    run.counted = True


def counted_out(rt: BudgetHost, run: Run) -> None:
    """A run left memory (parked or ended): its bytes no longer count."""
    rt.loaded_runs -= 1
    if run.counted:
        rt.loaded_bytes -= run.held_bytes
        run.counted = False
    rt.quiet.pop(run, None)


def limited(rt: BudgetHost) -> bool:
    return rt.memory_budget is not None or rt.max_loaded is not None


def over(rt: BudgetHost) -> bool:
    """Whether the loaded runs pass the budget in bytes or in runs."""
    budget = rt.memory_budget
    if budget is not None and rt.loaded_bytes > budget:
        return True
    most = rt.max_loaded
    return most is not None and rt.loaded_runs > most


def went_quiet(rt: BudgetHost, run: Run) -> None:
    """A run is suspended: it becomes the newest candidate of the sweep, which runs soon if over."""
    quiet = rt.quiet
    quiet.pop(run, None)
    quiet[run] = None
    if not rt.sweep_scheduled and over(rt):
        rt.sweep_scheduled = True
        rt.loop.call_soon(sweep, rt)


def sweep(rt: BudgetHost) -> None:
    """Parks the runs that went quiet longest ago until the loaded runs are under the budget."""
    rt.sweep_scheduled = False
    if rt.closed:
        return
    quiet = rt.quiet
    while quiet and over(rt):
        run = next(iter(quiet))
        del quiet[run]
        st = rt.by_run.get(run.run_id)
        if st is None or st.run is not run or not rt.parkable(run):
            continue  # busy again (or gone): its next quiet moment lists it again
        rt.park(st)
        rt.stats["budget_parks"] += 1


def settle(rt: BudgetHost) -> None:
    """Sweeps now if the loaded runs are over the budget (a batch of recovered runs was loaded)."""
    if limited(rt) and over(rt) and not rt.sweep_scheduled:
        sweep(rt)
