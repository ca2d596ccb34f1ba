"""``keep_history=False``: a run that ended keeps only what the engine still needs of it.

That is its ``Start`` (type, input, parent), its ending (``Done``: status and
result) and what it owes other workflows (``Child``, ``ChildDone`` and ``Send``
records, which recovery redoes if a crash lost them on the way). Everything
else (steps, timers, signals, ...) leaves memory, and leaves the log at the next
checkpoint. What needs the whole journal (a query answered from a replay, a
reset or a fork of the ended run) raises :class:`fusee.HistoryUnavailable`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fusee.core import records as rec
from fusee.errors import HistoryUnavailable
from fusee.runtime.snapshot import pack, unpack

if TYPE_CHECKING:
    from fusee.runtime.sealing import Sealer
    from fusee.runtime.table import WorkflowState


class HistoryHost(Protocol):
    """What trimming and checking history ask of the runtime (``Runtime`` provides it)."""

    @property
    def sealer(self) -> Sealer: ...
    @property
    def keep_history(self) -> bool: ...

#: Records an ended run keeps without history.
_KEPT = (rec.Start, rec.Child, rec.ChildDone, rec.Send, rec.Done)


def trim(rt: HistoryHost, st: WorkflowState) -> None:
    """Drops the ended run's records that nothing needs any more (see the module's doc)."""
    if st.packed is not None:
        journal, lsns = unpack(st.packed, rt.sealer)
    else:
        journal, lsns = st.journal, st.lsns
    keep = [i for i, r in enumerate(journal) if type(r) in _KEPT]
    if len(keep) == len(journal):
        return
    journal = [journal[i] for i in keep]
    lsns = [lsns[i] for i in keep]
    if st.packed is not None:
        st.packed = pack(journal, lsns, rt.sealer)
    else:
        st.journal, st.lsns = journal, lsns


def check(rt: HistoryHost, st: WorkflowState, action: str) -> None:
    """Raises :class:`HistoryUnavailable` if ``action`` needs the ended run's whole journal."""
    if not rt.keep_history and not st.running:
        raise HistoryUnavailable(
            f"{action} of workflow '{st.id}' needs the journal of its run, which ended: the engine "
            "was opened with keep_history=False and keeps only the start and the ending of ended runs. "
            "Open it with keep_history=True to keep the journals of runs that end from then on"
        )
