"""Run your own workflows under simulated crashes, torn writes and failed flushes.

A :class:`Scenario` names the workflows, the client requests at simulated
times, and your own checks; ``run(seed)`` plays it on the real engine in the
simulator, with the faults seed ``seed`` chooses, and raises
:class:`~fusee.sim.world.SimFailure` (an ``AssertionError``, so pytest
reports it) with the seed and the trace if any check fails::

    scenario = Scenario([order])
    scenario.start(order, "o-1", 5)
    scenario.signal("o-1", approve, 7, at="20ms")

    @scenario.check
    def paid_once(outcome):
        assert outcome.results["o-1"].status == "ok"

    scenario.run_many(range(50))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from fusee import durations
from fusee.flow.rules import Receipt
from fusee.sim.checkers import Outcome
from fusee.sim.config import SimConfig
from fusee.sim.plan import (
    Action,
    Call,
    Cancel,
    Enqueue,
    Plan,
    Query,
    ReadStream,
    Signal,
    Start,
    Terminate,
    Update,
)
from fusee.sim.report import Report
from fusee.sim.world import SimFailure, World


@dataclasses.dataclass
class ScenarioOutcome:
    """What a scenario's run ended with, as your checks see it."""

    seed: int
    #: How each started workflow ended: status ("ok", "failed", "cancelled",
    #: "terminated", ...) and, for "ok", the result value.
    results: dict[str, Outcome]
    #: The first answer per update ID (status "ok" with the handler's result, or "rejected").
    answers: dict[str, Outcome]
    report: Report
    trace: list[str]
    #: Per enqueued event ID, the receipt the client got: the window run (its workflow ID,
    #: whose result is in ``results`` too) and the event's position in its input.
    receipts: dict[str, Receipt] = dataclasses.field(default_factory=dict)
    #: Per (workflow ID, stream name) read with ``read_stream``: the chunks the reader got,
    #: from offset 0 to the end, across every crash.
    streams: dict[tuple[str, str], list[Any]] = dataclasses.field(default_factory=dict)
    #: How each stream read ended ("ok", "failed", ...), by the same keys as ``streams``.
    stream_ends: dict[tuple[str, str], str | None] = dataclasses.field(default_factory=dict)
    #: Per object call ID, its answer: "ok" with the handler's result, or "failed" with the
    #: handler's error as "Type: message" (the same for every resend).
    calls: dict[str, Outcome] = dataclasses.field(default_factory=dict)

    @property
    def crashes(self) -> int:
        return self.report.crashes


Check = Callable[[ScenarioOutcome], Any]


class Scenario:
    """Your workflows, the client's requests at simulated times, and your checks.

    ``workflows`` is a list of ``fusee.workflow`` definitions, or a function
    of the seed returning one (to give every run fresh state, e.g. a mock
    service). ``duration`` is how long faults last; every workflow must then
    finish within ``settle``.
    """

    def __init__(self, workflows: list[Any] | Callable[[int], list[Any]], *,
                 duration: durations.Duration = "2s", settle: durations.Duration = "60s",
                 crashes: bool = True) -> None:
        self._workflows = workflows
        self._actions: list[tuple[int, Action]] = []
        self._checks: list[Check] = []
        self.duration_ms = durations.to_ms(duration)
        self.settle_ms = durations.to_ms(settle)
        self.crashes = crashes

    # --- requests -------------------------------------------------------------

    def start(self, workflow: Any, workflow_id: str, input: Any = None, *,
              at: durations.Duration = 0) -> Scenario:
        """The client starts ``workflow`` (a definition or its name) as ``workflow_id`` at ``at``."""
        name = workflow if isinstance(workflow, str) else workflow.name
        self._actions.append((durations.to_ms(at), Start(workflow_id, workflow, input, name)))
        return self

    def signal(self, workflow_id: str, signal: Any, value: Any = None, *,
               at: durations.Duration = 0) -> Scenario:
        """The client signals ``workflow_id`` at ``at`` (once its start was acknowledged)."""
        self._actions.append((durations.to_ms(at), Signal(workflow_id, signal, value, f"{workflow_id}/{signal.name}/{len(self._actions)}")))
        return self

    def cancel(self, workflow_id: str, *, at: durations.Duration = 0) -> Scenario:
        """The client cancels ``workflow_id`` at ``at``."""
        self._actions.append((durations.to_ms(at), Cancel(workflow_id)))
        return self

    def update(self, workflow_id: str, update: Any, value: Any, *, update_id: str | None = None,
               at: durations.Duration = 0) -> Scenario:
        """The client sends an update at ``at`` (resent under the same ID until answered)."""
        uid = update_id or f"{workflow_id}/{update.name}/{len(self._actions)}"
        self._actions.append((durations.to_ms(at), Update(workflow_id, update, value, uid)))
        return self

    def query(self, workflow_id: str, query: Any, *, at: durations.Duration = 0) -> Scenario:
        """The client queries ``workflow_id`` at ``at``."""
        self._actions.append((durations.to_ms(at), Query(workflow_id, query)))
        return self

    def terminate(self, workflow_id: str, *, at: durations.Duration = 0) -> Scenario:
        """The client terminates ``workflow_id`` at ``at`` (once its start was acknowledged)."""
        self._actions.append((durations.to_ms(at), Terminate(workflow_id)))
        return self

    def read_stream(self, workflow_id: str, name: str, *, at: durations.Duration = 0) -> Scenario:
        """A client reads stream ``name`` of ``workflow_id`` from ``at`` to its end.

        It reconnects at its offset after every crash; what it read is in
        ``outcome.streams[(workflow_id, name)]``, how the stream ended in
        ``outcome.stream_ends``. On the seeds without history (``keep_history=False``,
        odd seeds) a reader that comes after the run ended gets what it read so far.
        """
        self._actions.append((durations.to_ms(at), ReadStream(workflow_id, name)))
        return self

    def call(self, handler: Any, key: str, arg: Any = None, *, call_id: str | None = None,
             at: durations.Duration = 0) -> Scenario:
        """The client calls object ``handler`` (``@obj.exclusive``/``@obj.shared``) for ``key`` at
        ``at``, resent under one call ID until answered; the answer is in ``outcome.calls``.
        Give the object's definition among the scenario's workflows."""
        cid = call_id or f"{handler.obj.name}/{key}/{handler.name}/{len(self._actions)}"
        self._actions.append((durations.to_ms(at), Call(handler, key, arg, cid)))
        return self

    def enqueue(self, workflow: Any, key: str, event: Any, *, event_id: str | None = None,
                at: durations.Duration = 0) -> Scenario:
        """The client enqueues ``event`` for ``key`` of the debounced or batched ``workflow``
        (a definition or its name) at ``at``, resent under one event ID until acknowledged.
        The receipt is in ``outcome.receipts[event_id]``; the window run it names must
        finish, and its result is in ``outcome.results``."""
        name = workflow if isinstance(workflow, str) else workflow.name
        eid = event_id or f"{name}/{key}/{len(self._actions)}"
        self._actions.append((durations.to_ms(at), Enqueue(name, key, event, eid)))
        return self

    def check(self, fn: Check) -> Check:
        """Adds a check (usable as a decorator): it raises (or returns a message) to fail."""
        self._checks.append(fn)
        return fn

    # --- running --------------------------------------------------------------------

    def config(self, seed: int) -> SimConfig:
        """The faults and engine knobs seed ``seed`` gives this scenario."""
        cfg = SimConfig.for_seed(seed)
        cfg.duration_ms = self.duration_ms
        cfg.settle_ms = self.settle_ms
        if not self.crashes:
            cfg.crash_every_ms = 0
            cfg.crash_after_io_per_mille = 0
        return cfg

    def run(self, seed: int, *, verbose: bool = False) -> ScenarioOutcome:
        """Plays the scenario under seed ``seed``'s faults; raises :class:`SimFailure` on a failed check."""
        wfs = self._workflows(seed) if callable(self._workflows) else list(self._workflows)
        plan = Plan(workflows=wfs, actions=list(self._actions))
        world = World(self.config(seed), plan, scenario=True, verbose=verbose)
        try:
            result = world.run()
        finally:
            world.bury()
        obs = result.observed
        answers = {uid: o for uid, (_, o) in obs.updates.items()}
        outcome = ScenarioOutcome(
            seed, dict(obs.results), answers, result.report, result.trace,
            receipts={eid: Receipt(w, p) for eid, (w, p) in obs.receipts.items()},
            streams={k: list(v) for k, v in obs.streams.items()}, stream_ends=dict(obs.stream_ends),
            calls=dict(obs.calls))
        for check in self._checks:
            try:
                message = check(outcome)
            except Exception as e:
                message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if isinstance(message, str) and message:
                raise SimFailure(seed, f"check {getattr(check, '__name__', check)!r} failed: {message}",
                                 result.trace, scenario=True)
        return outcome

    def run_many(self, seeds: Iterable[int]) -> list[ScenarioOutcome]:
        """Runs every seed in order; raises the first failure."""
        return [self.run(seed) for seed in seeds]
