"""A plan: the workflows of a simulated run and the client requests made at set times.

The built-in workload and a user's scenario both produce a :class:`Plan`;
the world carries it out under faults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Start:
    """Start workflow ``workflow`` (a ``fusee.workflow`` definition) as ``id`` with ``input``."""

    id: str
    workflow: Any
    input: Any = None
    #: What kind of job this is (for reports and checks).
    kind: str = ""


@dataclasses.dataclass(frozen=True)
class Signal:
    """Send ``signal`` with ``value`` to ``id`` (once its start was acknowledged)."""

    id: str
    signal: Any
    value: Any = None
    #: The dedup key the client sends it with (every resend uses the same one).
    key: str = ""
    #: The error type the engine must refuse it with ("SerializationError": a value its type
    #: does not take, "UnknownSignal": a name nothing declares), recording nothing; "" for none.
    refusal: str = ""


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Cancel ``id`` (once its start was acknowledged)."""

    id: str


@dataclasses.dataclass(frozen=True)
class Terminate:
    """Terminate ``id`` (once its start was acknowledged)."""

    id: str


@dataclasses.dataclass(frozen=True)
class Update:
    """Send ``update`` with ``value`` to ``id`` under ``update_id`` (resent with the same ID)."""

    id: str
    update: Any
    value: Any
    update_id: str


@dataclasses.dataclass(frozen=True)
class Query:
    """Query ``id``; ``monotonic``: answers are totals that must never go back."""

    id: str
    query: Any
    monotonic: bool = False


@dataclasses.dataclass(frozen=True)
class Complete:
    """Complete the async completion ``id`` awaits: every token handed out so far, in order.

    The tokens come from the mock service (what the token functions handed
    out); stale ones (of an attempt that failed) and ones completed already
    must be refused. ``value`` is the value the current token completes with.
    """

    id: str
    value: int
    #: Fail the await instead (``engine.fail_completion``): it raises ``CompletionFailed``.
    fail: bool = False


@dataclasses.dataclass(frozen=True)
class Reset:
    """Reset ``id`` before the first step named ``before_step``, re-applying later signals."""

    id: str
    before_step: str


@dataclasses.dataclass(frozen=True)
class ObjectCall:
    """Call ``handler`` of the ``acct`` object for ``key`` with call ID ``call_id`` (resent with it)."""

    key: str
    handler: Any
    call_id: str
    #: The jobs' tracker (``fusee.sim.keyed.Tracker``): what the answers are checked against.
    tracker: Any = dataclasses.field(compare=False, repr=False)

    @property
    def id(self) -> str:
        return f"@acct/{self.key}"

    async def request(self, engine: Any) -> Any:
        return await engine.call(self.handler, self.key, self.call_id, call_id=self.call_id)

    def observe(self, status: str, value: Any) -> None:
        if status != "ok":
            self.tracker.problems.append(f"object call {self.call_id} was answered {status} {value!r}")
            return
        self.tracker.calls += 1
        self.tracker.answers.setdefault(self.call_id, []).append(value)
        if self.handler.kind == "exclusive":
            self.tracker.exclusive_keys[self.call_id] = self.key

    def describe(self) -> str:
        return f"call {self.handler.name} {self.key} ({self.call_id})"


@dataclasses.dataclass(frozen=True)
class Call:
    """A scenario's object call: ``engine.call(handler, key, arg, call_id=call_id)``, resent
    with the same call ID until answered (every answer must be the same)."""

    handler: Any
    key: str
    arg: Any
    call_id: str

    @property
    def id(self) -> str:
        return f"@{self.handler.obj.name}/{self.key}"


@dataclasses.dataclass(frozen=True)
class ReadStream:
    """A scenario's stream reader: follows stream ``name`` of ``id`` from offset 0 to its end,
    reconnecting at its offset after every crash (the client remembers what it read)."""

    id: str
    name: str


@dataclasses.dataclass(frozen=True)
class ScheduleAction:
    """Make schedule ``id`` of the flow jobs' ``tick`` (see ``fusee.sim.flowjobs``)."""

    id: str
    every_ms: int
    overlap: str
    catchup_ms: int
    jitter_ms: int
    #: How long each scheduled run works (it may overlap the next time).
    work_ms: int


@dataclasses.dataclass(frozen=True)
class ScheduleControl:
    """``pause``, ``unpause``, ``trigger``, ``backfill`` (the last ``span_ms``) or ``delete`` schedule ``id``."""

    id: str
    op: str
    span_ms: int = 0


@dataclasses.dataclass(frozen=True)
class Enqueue:
    """``engine.enqueue(workflow, key, event, event_id=event_id)``, resent with the same event ID."""

    workflow: str
    key: str
    event: Any
    event_id: str


#: The flow requests (issue 12): the world hands them to ``fusee.sim.flowjobs``.
FLOW_ACTIONS = (ScheduleAction, ScheduleControl, Enqueue)

Action = (Start | Signal | Cancel | Terminate | Update | Query | Complete | Reset | ObjectCall
          | Call | ReadStream | ScheduleAction | ScheduleControl | Enqueue)


@dataclasses.dataclass
class Plan:
    """Everything a world needs besides its configuration."""

    workflows: list[Any]
    #: Client requests: (virtual ms after the start, request), in any order.
    actions: list[tuple[int, Action]] = dataclasses.field(default_factory=list)
    #: Children per parent ID: (child ID, close policy), for the close-policy check.
    children: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    #: Called at every crash, before the restart (e.g. deploy new code).
    on_crash: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    #: The external service's violations (checked after every recovery).
    service_violations: Callable[[], list[str]] = lambda: []
    #: Extra coverage counters the plan keeps (name -> current value).
    counters: Callable[[], dict[str, int]] = lambda: {}
    #: The mock service whose effects the step checkers read (``fusee.sim.service.Service``), if any.
    service: Any = None
    #: More ``Engine.open`` options for every life (a payload codec, say).
    engine_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Called with the world once each life's engine is open (stream readers reconnect).
    on_open: list[Callable[[Any], None]] = dataclasses.field(default_factory=list)
    #: More checks after every recovery and at the end: (world, snapshot, final) -> violations.
    checks: list[Callable[[Any, Any, bool], list[str]]] = dataclasses.field(default_factory=list)
    #: What the plan still waits for besides the workflows' results (the world settles until none).
    unfinished: Callable[[], list[str]] = lambda: []
    #: Step limits the engine opens with (``Engine.open(..., limits=...)``).
    limits: list[Any] = dataclasses.field(default_factory=list)
    #: Checks of keyed objects and limits, run with the others (after every recovery and at the end).
    keyed_checks: list[Callable[[], list[str]]] = dataclasses.field(default_factory=list)
    #: Called with each life's engine and life number once it opened.
    on_engine_open: list[Callable[[Any, int], None]] = dataclasses.field(default_factory=list)
    #: The flow jobs' observer (``fusee.sim.flowjobs.FlowObserver``), if the plan has flow jobs.
    flow: Any = None
