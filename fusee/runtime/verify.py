"""Parked runs checked against changed code, at open, without waking them.

Parked runs are not replayed at open (that is what makes a million of them
cheap to reopen), so a change of workflow code that breaks their journals
would only show when each run wakes, perhaps days later. Instead each parked
run remembers a fingerprint of the code that last replayed it; at open, runs
whose workflow's code changed are replayed read-only in the background, a few
at a time, and any that no longer match are marked stuck at once (logged,
their waiters told). Runs whose code did not change cost nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import types
from typing import TYPE_CHECKING, Any, Protocol

from fusee.core import journal as jm
from fusee.errors import DeterminismError, FuseeError
from fusee.runtime.ended import ReplayHost, replay_read_only

if TYPE_CHECKING:
    from fusee.declarations import WorkflowDef
    from fusee.runtime.table import WorkflowState


class VerifyHost(ReplayHost, Protocol):
    """What checking parked runs asks of the runtime (``Runtime`` provides it)."""

    @property
    def closed(self) -> bool: ...
    @property
    def stuck(self) -> dict[str, str]: ...

    def mark_stuck(self, wid: str, err: FuseeError) -> None: ...
    def code_of(self, wtype: str, version: int) -> int: ...

#: Parked runs replayed per turn of the loop while checking.
BATCH = 64


def code_fingerprint(wdef: WorkflowDef[Any, Any]) -> int:
    """A stable, non-zero 63-bit hash of a workflow function's code (nested functions included).

    It changes when the function's body changes (operations added, removed,
    reordered), not when code it calls elsewhere does; it is the same in
    every process running the same source on the same Python.
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(wdef.name.encode())

    def walk(code: types.CodeType) -> None:
        h.update(code.co_code)
        h.update("\0".join(code.co_names).encode())
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                walk(c)
            elif isinstance(c, frozenset):
                h.update(repr(sorted(map(repr, c))).encode())  # a set's order varies per process
            else:
                h.update(repr(c).encode())

    fn = getattr(wdef.fn, "__wrapped__", wdef.fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        walk(code)
    return (int.from_bytes(h.digest(), "little") >> 1) or 1


async def check_parked(rt: VerifyHost, stale: list[WorkflowState]) -> None:
    """Replays each parked run in ``stale`` read-only; marks stuck those that diverge."""
    checked = 0
    for st in stale:
        if rt.closed:
            return
        if st.packed is None or st.status is not None or st.id in rt.stuck:
            continue  # woken, ended or stuck meanwhile: checked the ordinary way
        wdef = rt.definition(st.wtype, st.version)
        if wdef is None:
            continue
        journal, lsns = rt.journal_of(st)
        try:
            machine = jm.RunMachine.from_journal(journal, lsns[-1])
            run = replay_read_only(rt, st, wdef, machine, journal, lsns)
        except DeterminismError as e:
            rt.mark_stuck(st.id, e)
        else:
            if run.stuck is not None:
                rt.mark_stuck(st.id, run.stuck)
            else:
                st.code = rt.code_of(st.wtype, st.version)
            run.kill()
        checked += 1
        if checked % BATCH == 0:
            await asyncio.sleep(0)
