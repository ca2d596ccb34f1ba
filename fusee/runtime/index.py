"""The attribute index: every workflow's latest search attributes, and who has which value.

``ctx.set_attributes({...})`` journals an ``Attributes`` record; the index
keeps the merged attributes of each workflow's *current* run (a new run of the
ID, by continue-as-new or reset, starts without any) and, for scalar values,
an inverted map ``key -> value -> workflow IDs`` so that ``attrs.k = v`` finds
its runs without looking at the others. It is rebuilt at open from checkpoint
entries (which carry the merged attributes, so no journal is unpacked) and from
the ``Attributes`` records of the log after the checkpoint.

Memory: nothing for a workflow without attributes; for one with them, its
decoded dict and one entry per scalar value.
"""

from __future__ import annotations

import itertools
from typing import Any

from fusee import codec
from fusee.core import records as rec
from fusee.errors import FuseeError

#: Index key of a value: JSON kinds kept apart (``True`` is not ``1``, ``"1"`` is not ``1``).
ValueKey = tuple[int, Any]

_NULL, _BOOL, _NUM, _STR = 0, 1, 2, 3

#: First-seen order of workflow states (see ``WorkflowState.seen``): one counter per
#: process is enough, only the order of one engine's states matters.
seen_counter = itertools.count(1)


def value_key(value: Any) -> ValueKey | None:
    """The index key of a scalar JSON value; None for lists and objects (not indexed)."""
    if value is None:
        return (_NULL, None)
    if value is True or value is False:
        return (_BOOL, value)
    if isinstance(value, int | float):
        return (_NUM, value)
    if isinstance(value, str):
        return (_STR, value)
    return None


def decode_attributes(payload: bytes) -> dict[str, Any]:
    """The JSON object an ``Attributes`` record or a checkpoint entry holds ({} if not one)."""
    if not payload:
        return {}
    try:
        value = codec.decode(payload)
    except FuseeError:
        return {}
    return value if isinstance(value, dict) else {}


class AttributeIndex:
    """Latest attributes per workflow ID, and an inverted map for equality lookups."""

    __slots__ = ("_attrs", "_postings")

    def __init__(self) -> None:
        #: Only the current run's: a new run's ``Start`` (live or read back, always
        #: before its ``Attributes``) forgets the previous run's.
        self._attrs: dict[str, dict[str, Any]] = {}
        self._postings: dict[str, dict[ValueKey, dict[str, None]]] = {}

    def __len__(self) -> int:
        return len(self._attrs)

    def get(self, wid: str) -> dict[str, Any] | None:
        """The workflow's current attributes (do not modify), or None if it has none."""
        return self._attrs.get(wid)

    def merge(self, wid: str, attributes: dict[str, Any]) -> None:
        """The current run of ``wid`` set ``attributes``: merged over what it set before."""
        old = self._attrs.get(wid)
        merged = dict(old) if old else {}
        merged.update(attributes)
        self.replace(wid, merged)

    def replace(self, wid: str, attributes: dict[str, Any]) -> None:
        """Sets the workflow's attributes to exactly ``attributes`` ({} removes them)."""
        old = self._attrs.get(wid)
        if old is not None:
            self._unpost(wid, old)
        if not attributes:
            self._attrs.pop(wid, None)
            return
        self._attrs[wid] = attributes
        postings = self._postings
        for k, v in attributes.items():
            vk = value_key(v)
            if vk is None:
                continue
            by_value = postings.get(k)
            if by_value is None:
                by_value = postings[k] = {}
            wids = by_value.get(vk)
            if wids is None:
                wids = by_value[vk] = {}
            wids[wid] = None

    def forget(self, wid: str) -> None:
        """The workflow left the table, or a new run of it started: its attributes go."""
        old = self._attrs.pop(wid, None)
        if old is not None:
            self._unpost(wid, old)

    def _unpost(self, wid: str, attributes: dict[str, Any]) -> None:
        postings = self._postings
        for k, v in attributes.items():
            vk = value_key(v)
            by_value = postings.get(k) if vk is not None else None
            if by_value is None:
                continue
            wids = by_value.get(vk)  # type: ignore[arg-type]
            if wids is None:
                continue
            wids.pop(wid, None)
            if not wids:
                del by_value[vk]  # type: ignore[arg-type]
                if not by_value:
                    del postings[k]

    def lookup(self, key: str, value: Any) -> dict[str, None]:
        """Workflow IDs whose attribute ``key`` equals the scalar ``value`` (do not modify)."""
        vk = value_key(value)
        by_value = self._postings.get(key) if vk is not None else None
        if by_value is None:
            return {}
        return by_value.get(vk, {})  # type: ignore[arg-type]

    def on_record(self, wid: str, r: rec.Record) -> None:
        """A record of ``wid``'s current run was journaled (live or read back at open)."""
        if type(r) is rec.Start:
            assert isinstance(r, rec.Start)
            if wid in self._attrs:
                self.forget(wid)
        elif type(r) is rec.Attributes:
            assert isinstance(r, rec.Attributes)
            self.merge(wid, decode_attributes(r.payload))

    def encoded(self, wid: str) -> bytes:
        """The workflow's attributes as a checkpoint entry keeps them (b"": none)."""
        attrs = self._attrs.get(wid)
        return codec.encode(attrs) if attrs else b""


def on_append(rt: Any, r: rec.Record) -> None:
    """A Start or Attributes record is being appended: its run is in ``rt.by_run`` already."""
    st = rt.by_run.get(r.run)
    if st is not None:
        rt.index.on_record(st.id, r)
