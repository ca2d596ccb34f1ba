"""Reset and fork: a new run from a prefix of an existing run's journal.

The prefix holds the records of the operations before the cut position, in
journal order, so it replays as the original did up to there and the code
runs live from the cut. Signals that arrived
after the cut may be delivered again to the new run.
"""

from __future__ import annotations

import msgspec

from fusee.core import records as rec

#: Records that take no position of their own (kept wherever they fall before the cut).
_UNPOSITIONED = (rec.Signal, rec.Update, rec.Cancel, rec.CancelRequest, rec.Start, rec.Done)


def find_cut(journal: list[rec.Record], before_step: str | None, before_position: int | None,
             live_steps: dict[int, str] | None = None) -> int:
    """The position to cut at: ``before_position``, or the first step named ``before_step``.

    ``live_steps`` (position -> name) names steps started but not yet
    journaled, for a run in memory. Raises ``ValueError`` when there is none.
    """
    if (before_step is None) == (before_position is None):
        raise ValueError("give exactly one of before_step= and before_position=")
    if before_position is not None:
        if not isinstance(before_position, int) or isinstance(before_position, bool) or before_position < 0:
            raise ValueError(f"before_position must be a position (an int >= 0), got {before_position!r}")
        return before_position
    found = [
        r.seq for r in journal
        if isinstance(r, rec.Step | rec.Attempt | rec.Awaiting) and r.name == before_step
    ]
    found += [seq for seq, name in (live_steps or {}).items() if name == before_step]
    if not found:
        raise ValueError(f"the run has no step named {before_step!r} (journaled or running) to reset before")
    return min(found)


def _position(r: rec.Record) -> int | None:
    if isinstance(r, _UNPOSITIONED):
        return None
    if isinstance(r, rec.Patch):
        return r.at
    if isinstance(r, rec.Chunk | rec.StreamEnd) and r.seq == rec.WORKFLOW:
        return None
    return getattr(r, "seq", None)


def split(journal: list[rec.Record], cut: int) -> tuple[list[rec.Record], list[rec.Signal]]:
    """(the records to keep, start included; the signals that arrived after the cut).

    The prefix ends with the last record of an operation before the cut:
    what arrived later (a signal while the cut step ran, say) came after the
    cut. Records of operations at or after the cut are dropped wherever they
    fall (in a ``gather``, a later branch may have finished first).
    """
    end = 1
    for i, r in enumerate(journal):
        pos = _position(r)
        if pos is not None and pos < cut:
            end = i + 1
    kept = [journal[0]]
    for r in journal[1:end]:
        pos = _position(r)
        if not isinstance(r, rec.Done) and (pos is None or pos < cut):
            kept.append(r)
    later = [r for r in journal[end:] if isinstance(r, rec.Signal)]
    return kept, later


def renumber(records: list[rec.Record], run: int) -> list[rec.Record]:
    """The records as the new run's (every record names its run)."""
    return [msgspec.structs.replace(r, run=run) for r in records]
