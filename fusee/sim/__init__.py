"""Deterministic simulation testing: the real engine under seeded crashes and faults.

``python -m fusee.sim --seed N`` reproduces one seed; :class:`Scenario` runs
your own workflows under the same faults (see ``docs/sim.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fusee.sim.config import SimConfig
    from fusee.sim.loop import SimLoop
    from fusee.sim.scenario import Scenario, ScenarioOutcome
    from fusee.sim.world import Result, SimFailure, run_seed

__all__ = ["Result", "Scenario", "ScenarioOutcome", "SimConfig", "SimFailure", "SimLoop", "run_seed"]

_WHERE = {
    "SimConfig": "fusee.sim.config",
    "SimLoop": "fusee.sim.loop",
    "Scenario": "fusee.sim.scenario",
    "ScenarioOutcome": "fusee.sim.scenario",
    "Result": "fusee.sim.world",
    "SimFailure": "fusee.sim.world",
    "run_seed": "fusee.sim.world",
}


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the loop and the checkers load without
    # the whole engine (and the engine without the simulator).
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module 'fusee.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
