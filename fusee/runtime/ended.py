"""Queries of ended runs: a read-only replay of the journal rebuilds the handlers' state.

A run's code leaves memory when it ends, and with it the state its query
handlers read. Rather than keep every ended run's objects alive for its whole
retention (and lose them at a restart anyway), a query of an ended run replays
the journal without its ``Done`` record on a throw-away run that can act on
nothing: no record is appended, no step, timer, child or message is started.
The code runs to where it ended, its handlers registered as they were, and the
query is answered from there. The last few replayed runs are kept (their state
cannot change any more), so repeated queries of one ended run replay it once.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

from fusee.core import journal as jm
from fusee.core import records as rec
from fusee.declarations import QueryDef
from fusee.errors import DeterminismError, QueryFailed
from fusee.retry import Retry
from fusee.runtime.run import Run

if TYPE_CHECKING:
    from fusee.declarations import WorkflowDef
    from fusee.runtime.env import Env
    from fusee.runtime.table import WorkflowState


class ReplayHost(Protocol):
    """What a read-only replay asks of the runtime (``Runtime`` provides it): its settings,
    registry and journals. Anything else a replayed run reads of it goes through
    ``_ReadOnlyRuntime``, which lets plain values by and turns actions into no-ops."""

    @property
    def env(self) -> Env: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def tracebacks(self) -> bool: ...
    @property
    def default_retry(self) -> Retry: ...
    @property
    def workflows(self) -> dict[str, WorkflowDef[Any, Any]]: ...
    @property
    def versions(self) -> dict[tuple[str, int], WorkflowDef[Any, Any]]: ...
    @property
    def limiter(self) -> Any: ...

    def check_registered(self, wdef: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]: ...
    def definition(self, wtype: str, version: int) -> WorkflowDef[Any, Any] | None: ...
    def journal_of(self, st: WorkflowState) -> tuple[list[rec.Record], list[int]]: ...


def _ignored(*args: Any, **kwargs: Any) -> None:
    return None


class _ReadOnlyEnv:
    """The Env with randomness of its own: a replay must not draw from the engine's generator."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.rng = random.Random(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class _ReadOnlyRuntime:
    """The runtime as a read-only replay sees it: its clock and settings, and no way to act.

    Whatever else a run asks of the runtime (append, run a step, arm a timer,
    start a child, send a message, report an ending) does nothing.
    """

    def __init__(self, rt: ReplayHost) -> None:
        self._rt = rt
        self.env = _ReadOnlyEnv(rt.env)
        self.loop: asyncio.AbstractEventLoop = rt.loop
        self.tracebacks: bool = rt.tracebacks
        self.default_retry: Retry = rt.default_retry
        self.workflows: dict[str, Any] = rt.workflows
        self.versions: dict[tuple[str, int], Any] = rt.versions

    def check_registered(self, workflow: Any) -> Any:
        return self._rt.check_registered(workflow)

    @property
    def limiter(self) -> Any:
        # ``ctx.step(..., limit=...)`` checks its options against the engine's limits
        # (pure); taking a permit is acting, and no step runs here anyway.
        return _ReadOnlyLimiter(self._rt.limiter)

    def __getattr__(self, name: str) -> Any:
        # Plain settings and flags read through; anything that could act (a
        # method, an object with methods) is replaced by a no-op.
        value = getattr(self._rt, name, None)
        if value is None or isinstance(value, bool | int | float | str):
            return value
        return _ignored


class _ReadOnlyLimiter:
    """The engine's limits as a replay sees them: a step's limit options are checked, nothing is taken."""

    def __init__(self, limiter: Any) -> None:
        self.request = limiter.request

    def __getattr__(self, name: str) -> Any:
        return _ignored


class _ReplayRun(Run):
    """A run replaying a finished journal: nothing it does is recorded or acted upon."""

    def append(self, r: rec.Record) -> int:
        # Past its journal (a terminated run was cut short) the code just waits
        # for operations that never complete: the state is the one it ended with.
        return self.machine.gate

    def deliver_cancel_if_settled(self) -> None:
        # A cancel requested but never delivered must not run compensation code here:
        # the state to answer from is the one the run ended with.
        return

    def _finish(self, task: asyncio.Task[Any]) -> None:
        self.finished = True
        if not task.cancelled():
            task.exception()  # retrieved: how it ended is already recorded


#: Replayed ended runs kept per runtime, most recently queried last: a dashboard
#: polling a finished run replays it once, not at every poll.
REPLAYS_KEPT = 16
_KEPT_ATTR = "_ended_replays"


def answer_query(rt: ReplayHost, st: WorkflowState, query: QueryDef[Any], arg: Any) -> Any:
    """The answer of ``query`` for the ended run ``st``, from a read-only replay of its journal.

    Raises :class:`QueryFailed` when its workflow type is not registered,
    when the code no longer matches the journal, or when no handler answers.
    """
    # Kept on the runtime itself, so they go with it.
    kept: OrderedDict[tuple[str, int], _ReplayRun] | None = getattr(rt, _KEPT_ATTR, None)
    if kept is None:
        kept = OrderedDict()
        setattr(rt, _KEPT_ATTR, kept)
    key = (st.id, st.run_id)
    run = kept.get(key)
    if run is None:
        run = _replay(rt, st)
        kept[key] = run
        while len(kept) > REPLAYS_KEPT:
            _, old = kept.popitem(last=False)
            old.kill()
    kept.move_to_end(key)
    return run.answer_query(query, arg)


def _replay(rt: ReplayHost, st: WorkflowState) -> _ReplayRun:
    wdef = rt.definition(st.wtype, st.version)
    if wdef is None:
        raise QueryFailed(
            f"workflow '{st.id}' ended and its type '{st.wtype}' is not registered: open the engine "
            "with it in workflows=[...] to query it (its state is rebuilt by replaying its journal)"
        )
    journal, lsns = rt.journal_of(st)
    journal, lsns = list(journal), list(lsns)
    if journal and type(journal[-1]) is rec.Done:
        journal.pop()
        lsns.pop()
    try:
        machine = jm.RunMachine.from_journal(journal, lsns[-1] if lsns else 0)
    except DeterminismError as e:
        raise QueryFailed(f"workflow '{st.id}' ended; its journal cannot be replayed to answer: {e}") from e
    run = _ReplayRun(_ReadOnlyRuntime(rt), st.shard, wdef, machine, journal, lsns)  # type: ignore[arg-type]
    run.start()
    if run.stuck is not None:
        run.kill()
        raise QueryFailed(
            f"workflow '{st.id}' ended; replaying its journal to answer the query failed: {run.stuck}"
        )
    return run


def replay_read_only(
    rt: ReplayHost, st: WorkflowState, wdef: Any, machine: jm.RunMachine,
    journal: list[rec.Record], lsns: list[int],
) -> Run:
    """Replays ``st``'s journal on a throw-away run that can act on nothing.

    The caller reads ``run.stuck`` (None: the code matches the journal) and
    must ``kill()`` the run when done with it.
    """
    run = _ReplayRun(_ReadOnlyRuntime(rt), st.shard, wdef, machine, list(journal), list(lsns))  # type: ignore[arg-type]
    run.start()
    return run


class _VerifyRun(_ReplayRun):
    """A read-only replay that also checks how a finished run ends.

    When the code raised where the journal recorded something else, the
    exception it raised is the finding (``raised``), not the divergence it
    causes: a bug, or an engine option the replay lacks, is reported as itself.
    """

    raised: BaseException | None = None

    def _code_raised(self) -> BaseException | None:
        task = self.task
        if task is None or not task.done() or task.cancelled():
            return None
        exc = task.exception()
        if exc is None or isinstance(exc, DeterminismError) or type(exc).__name__ == "ContinueAsNew":
            return None
        return exc

    def _fail_determinism(self, err: Any) -> None:
        # The code stopped early (it raised) while the journal still holds deliveries.
        if self.raised is None and self.stuck is None:
            self.raised = self._code_raised()
        super()._fail_determinism(err)

    def _finish(self, task: asyncio.Task[Any]) -> None:
        self.finished = True
        recorded = self.machine.recorded_done()
        try:
            self.machine.check_end()
        except DeterminismError as e:
            self.raised = self._code_raised()
            self.stuck = e
            return
        if recorded is None:
            return
        if task.cancelled():
            status = rec.Status.CANCELLED
        else:
            exc = task.exception()
            if exc is None:
                status = rec.Status.OK
            elif type(exc).__name__ == "ContinueAsNew":
                status = rec.Status.CONTINUED
            elif isinstance(exc, DeterminismError):
                self.stuck = exc
                return
            else:
                status = rec.Status.FAILED
        if recorded[0] in (rec.Status.TERMINATED, rec.Status.TIMED_OUT):
            return  # ended from outside: the code had no say
        if status != recorded[0] and not (recorded[0] == rec.Status.CANCELLED and status == rec.Status.FAILED):
            if status == rec.Status.FAILED:
                self.raised = self._code_raised()
            self.stuck = DeterminismError(
                f"the run ended {recorded[0].name.lower()} but the code now ends {status.name.lower()}"
            )


def replay_verifying(
    rt: ReplayHost, st: WorkflowState, wdef: Any, machine: jm.RunMachine, journal: list[rec.Record]
) -> BaseException | None:
    """Replays ``journal`` read-only; None if the code matches it. Else the exception the
    code raised where the journal recorded something else (a note says where), or the
    :class:`DeterminismError` it met."""
    lsns = list(range(1, len(journal) + 1))
    run = _VerifyRun(_ReadOnlyRuntime(rt), st.shard, wdef, machine, list(journal), lsns)  # type: ignore[arg-type]
    run.start()
    err, raised = run.stuck, run.raised
    run.kill()
    if err is None:
        return None
    if raised is not None:
        raised.add_note(f"raised by the code of workflow '{st.id}' while replaying its journal, "
                        f"which recorded otherwise ({err})")
        return raised
    return err if isinstance(err, DeterminismError) else DeterminismError(str(err))
