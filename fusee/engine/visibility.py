"""Visibility: ``Engine.list`` with its ``where=`` query language, and ``Engine.metrics``.

The language (its grammar and parser: ``fusee.engine.query_grammar``; documented in
docs/api.md) filters on ``workflow_id``, ``workflow``, ``status``, ``run_id``, ``shard``,
``started_at``, ``ended_at`` and ``attrs.<key>`` with ``=``, ``!=``, ``<``... ``in (...)``,
``and``, ``or``, ``not`` and parentheses, and may end with ``order by <field> [asc|desc], ...``.
An absent attribute (or ``ended_at`` of a running run) is ``null``: ``= null`` matches it,
``!= 'x'`` matches it, ``<``/``>`` never do. Ordering comparisons hold only between values
of one kind (numbers with numbers, text with text). ``now()`` is the engine's clock
(``rt.env.now_ms()``, virtual under ``fusee.testing`` and the simulator) when the query runs.

Plan: an ``and`` of the whole query with ``attrs.k = <scalar>``, ``attrs.k in
(...)`` or ``workflow_id = '...'`` looks up the attribute index (the smallest
candidate set wins) and checks the rest of the query on those candidates only;
any other query reads every workflow (``started_at``/``ended_at`` read each
candidate's journal, so combine them with an indexed term at scale; telling
``paused`` and ``retrying`` from ``running`` reads an unfinished run's journal
once, then a cache keyed by the journal's version answers). An ``order by`` sorts
what matches (a page costs a walk of the matches: the order has no index).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import functools
import heapq
import itertools
import json
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from fusee.backup.uploader import BackupStatus
from fusee.core import records as rec
from fusee.engine.query_grammar import MAX_DEPTH as MAX_DEPTH
from fusee.engine.query_grammar import STATUSES as STATUSES
from fusee.engine.query_grammar import Node, Now, Query, SortKey
from fusee.engine.query_grammar import parse as parse
from fusee.errors import InvalidQuery
from fusee.runtime import sealing
from fusee.runtime.index import value_key

if TYPE_CHECKING:
    from fusee.runtime.runtime import Runtime
    from fusee.runtime.table import WorkflowState

#: The most runs one page of :meth:`Engine.list` may hold.
MAX_LIMIT = 10_000

#: The orders :meth:`Engine.list` pages in: first seen first, or last seen first.
ORDERS = ("oldest", "newest")



@dataclasses.dataclass(frozen=True)
class RunPage:
    """One page of :meth:`Engine.list`: its runs, and the cursor of the next page.

    ``cursor`` is None when no run after this page matches (at the time of
    the call); else pass it back as ``list(..., cursor=page.cursor)`` with the
    same ``where``. Pages follow the order the engine first saw the
    workflows, so a run appears at most once across the pages of one walk
    (a workflow started meanwhile shows up on a later page).
    """

    items: list[Any]
    cursor: str | None


@dataclasses.dataclass(frozen=True)
class ShardMetrics:
    """What one shard holds right now."""

    shard: int
    #: Workflows by status (of :data:`STATUSES`: "running", "retrying", "paused", "stuck", "ok", ...;
    #: a status no workflow has is left out).
    runs: dict[str, int]
    #: Unfinished runs whose code is out of memory (they replay when something arrives).
    parked: int
    #: Runs whose code is in memory.
    loaded: int
    #: The shard's last durable log position.
    durable_lsn: int


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A snapshot of the engine's counters and queues (see docs/operations.md)."""

    shards: tuple[ShardMetrics, ...]
    #: Step functions run to an outcome since the open.
    steps_run: int
    #: Step functions running right now.
    steps_executing: int
    #: Steps whose gate (their run's latest record) is not durable yet.
    steps_gated: int
    #: Timers, deadlines and park checks waiting in the timer queue.
    timers_pending: int
    #: Log flushes completed since the open (of them, run inline on the loop's thread).
    flushes: int
    inline_flushes: int
    #: Records those flushes made durable.
    records_flushed: int
    #: Records appended and not yet flushed.
    records_pending: int
    #: Time of the latest flushes (up to 1,024: write plus fdatasync), p50 and p99 in
    #: milliseconds; 0.0 before the first.
    flush_p50_ms: float
    flush_p99_ms: float
    #: Workflows with search attributes in the index.
    indexed: int
    #: The runtime's counters (runs started, replays, parks, wakes, checkpoints, ...).
    stats: dict[str, int]
    #: What the loaded runs are counted as holding, in bytes: per run a constant plus, per
    #: journal record, a constant and its encoded size (see ``fusee.runtime.budget``).
    loaded_bytes: int = 0
    #: ``Engine.open(memory_budget=...)`` in bytes (None: no budget).
    memory_budget: int | None = None
    #: Unfinished runs recovery has still to load (they load in batches after the open).
    runs_to_load: int = 0
    #: The continuous backup's position, lag and failures (None without ``backup=``).
    backup: BackupStatus | None = None


# --- evaluation -------------------------------------------------------------


def status_of(rt: Runtime, st: WorkflowState) -> str:
    """The status ``RunSummary`` shows: one of :data:`STATUSES`."""
    if st.id in rt.stuck:
        return "stuck"
    if st.status is None or st.status == rec.Status.CONTINUED:
        return _unfinished(rt, st)
    return st.status.name.lower()


#: Record tags that open or close a failed attempt: Step, Attempt, Resume, Awaiting, Completed.
_ATTEMPT_TAGS = frozenset({1, 2, 3, 18, 19})
#: Per runtime: workflow ID -> (the journal's version, its status), so that a listing or the
#: metrics read an unfinished run's journal once, not at every call.
_halts: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, str]]] = weakref.WeakKeyDictionary()


def _unfinished(rt: Runtime, st: WorkflowState) -> str:
    """"running", "retrying" or "paused", from the run's attempts that no result or resume closed."""
    # A packed journal is replaced, never changed, and a loaded one only grows: either names its version.
    version: Any = st.packed if st.packed is not None else (st.run_id, len(st.journal))
    cache = _halts.get(rt)
    if cache is None:
        cache = _halts[rt] = {}
    elif len(cache) > 2 * len(rt.wf) + 1024:
        # Runs that ended or left the table since: drop them (amortised over many calls).
        wf = rt.wf
        cache = _halts[rt] = {k: v for k, v in cache.items() if (x := wf.get(k)) is not None and x.running}
    found = cache.get(st.id)
    if found is not None and (found[0] is version or found[0] == version):
        return found[1]
    status = _halt(_attempt_records(st))
    cache[st.id] = (version, status)
    return status


def _attempt_records(st: WorkflowState) -> Iterable[rec.Record]:
    if st.packed is None:
        return st.journal
    items = msgspec.msgpack.decode(st.packed, type=list[tuple[int, bytes]])
    # Only attempt-related kinds are decoded: bytes 1 and 2 are the array header and the tag.
    return (sealing.peek(data) for _, data in items
            if len(data) < 3 or not 0x90 <= data[1] <= 0x9F or data[2] in _ATTEMPT_TAGS)


def _halt(records: Iterable[rec.Record]) -> str:
    open_: dict[int, bool] = {}  # position -> paused
    for r in records:
        t = type(r)
        if t is rec.Attempt:
            assert isinstance(r, rec.Attempt)
            open_[r.seq] = r.retry_at_ms == rec.PAUSED
        elif t is rec.Step or t is rec.Resume or t is rec.Awaiting or t is rec.Completed:
            open_.pop(r.seq, None)  # type: ignore[union-attr]
    if not open_:
        return "running"
    return "paused" if any(open_.values()) else "retrying"


def times_of(rt: Runtime, st: WorkflowState) -> tuple[int | None, int | None]:
    """When the current run started and ended (UTC ms; None: unknown or still running)."""
    if st.packed is not None:
        # Only the first and the last record are needed: the others stay encoded.
        items = msgspec.msgpack.decode(st.packed, type=list[tuple[int, bytes]])
        # Times stay readable in sealed records: no payload is decrypted for them.
        first = sealing.peek(items[0][1]) if items else None
        last = sealing.peek(items[-1][1]) if items else None
    else:
        first = st.journal[0] if st.journal else None
        last = st.journal[-1] if st.journal else None
    started = first.started_ms if isinstance(first, rec.Start) else None
    ended = last.finished_ms if isinstance(last, rec.Done) and not st.running else None
    return started, ended


def ms_to_datetime(ms: int | None) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


Getter = Callable[["WorkflowState"], Any]


def _getter(rt: Runtime, field: str) -> Getter:
    if field == "workflow_id":
        return lambda st: st.id
    if field == "workflow":
        return lambda st: st.wtype
    if field == "status":
        return lambda st: status_of(rt, st)
    if field == "run_id":
        return lambda st: st.run_id
    if field == "shard":
        return lambda st: st.shard
    if field == "started_at":
        return lambda st: times_of(rt, st)[0]
    if field == "ended_at":
        return lambda st: times_of(rt, st)[1]
    key = field[len("attrs."):]
    index = rt.index

    def attr(st: WorkflowState) -> Any:
        attrs = index.get(st.id)
        return None if attrs is None else attrs.get(key)

    return attr


def _same(a: Any, b: Any) -> bool:
    ka = value_key(a)
    return ka is not None and ka == value_key(b)


def _ordered(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` may be ordered: both numbers or both text."""
    ka, kb = value_key(a), value_key(b)
    return ka is not None and kb is not None and ka[0] == kb[0] and ka[0] >= 2


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "=": _same,
    "!=": lambda a, b: not _same(a, b),
    "<": lambda a, b: _ordered(a, b) and a < b,
    "<=": lambda a, b: _ordered(a, b) and a <= b,
    ">": lambda a, b: _ordered(a, b) and a > b,
    ">=": lambda a, b: _ordered(a, b) and a >= b,
}

Pred = Callable[["WorkflowState"], bool]


def compile_query(rt: Runtime, node: Node) -> Pred:
    kind = node[0]
    if kind == "and":
        parts = [compile_query(rt, n) for n in node[1]]
        return lambda st: all(p(st) for p in parts)
    if kind == "or":
        parts = [compile_query(rt, n) for n in node[1]]
        return lambda st: any(p(st) for p in parts)
    if kind == "not":
        inner = compile_query(rt, node[1])
        return lambda st: not inner(st)
    get = _getter(rt, node[1])
    if kind == "in":
        values = [_resolve(rt, v) for v in node[2]]
        return lambda st: any(_same(get(st), v) for v in values)
    op, value = _CMP[node[2]], _resolve(rt, node[3])
    return lambda st: op(get(st), value)


def _resolve(rt: Runtime, value: Any) -> Any:
    """A literal's value when the query runs: ``now()`` reads the engine's clock once."""
    return rt.env.now_ms() + value.offset_ms if isinstance(value, Now) else value


def _candidates(rt: Runtime, node: Node) -> Iterable[str] | None:
    """Workflow IDs that may match, from the index (None: no indexed term, read them all)."""
    terms = node[1] if node[0] == "and" else [node]
    best: Iterable[str] | None = None
    best_len = -1
    for t in terms:
        found: Iterable[str] | None = None
        if t[0] == "cmp" and t[2] == "=" and t[3] is not None:
            if t[1] == "workflow_id":
                found = (t[3],)
            elif t[1].startswith("attrs."):
                found = rt.index.lookup(t[1][len("attrs."):], t[3])
        elif t[0] == "in" and t[1].startswith("attrs.") and None not in t[2]:
            key = t[1][len("attrs."):]
            union: dict[str, None] = {}
            for v in t[2]:
                union.update(rt.index.lookup(key, v))
            found = union
        if found is not None:
            size = len(found)  # type: ignore[arg-type]
            if best is None or size < best_len:
                best, best_len = found, size
    return best


# --- listing ----------------------------------------------------------------


def _parse_cursor(cursor: str, order: str) -> tuple[int, int]:
    if isinstance(cursor, str) and cursor.startswith("s"):
        raise InvalidQuery("this cursor continues a listing with an 'order by': pass the same where with it, "
                           "or start again without a cursor", cursor, 0)
    newest = isinstance(cursor, str) and cursor.startswith("n")
    try:
        seen, pos = (cursor[1:] if newest else cursor).split(".")
        parsed = int(seen), int(pos)
    except (AttributeError, ValueError):
        raise InvalidQuery("not a cursor of Engine.list: pass page.cursor as it was returned",
                           str(cursor), 0) from None
    if newest != (order == "newest"):
        raise InvalidQuery(f"this cursor continues a listing in the other order: pass order={'newest' if newest else 'oldest'!r} "
                           "with it, or start again without a cursor", cursor, 0)
    return parsed


def _after(rt: Runtime, seen: int, pos: int) -> Iterator[tuple[int, WorkflowState]]:
    """The table's states after the one first seen as ``seen`` (``pos`` is where it was)."""
    values = rt.wf.values()
    if seen == 0:
        return enumerate(values)
    if pos > 0:
        # Fast path: nothing before it left the table since, so it is still at ``pos - 1``.
        it = itertools.islice(values, pos - 1, None)
        first = next(it, None)
        if first is not None and first.seen == seen:
            return enumerate(it, pos)
    # Something left the table: walk it (states are in ``seen`` order).
    return ((i, st) for i, st in enumerate(values) if st.seen > seen)


def _before(rt: Runtime, seen: int, pos: int) -> Iterator[tuple[int, WorkflowState]]:
    """The table's states before the one first seen as ``seen``, newest first (``pos`` is where
    it was, counted from the newest)."""
    values = reversed(rt.wf.values())
    if seen == 0:
        return enumerate(values)
    if pos > 0:
        # Fast path: nothing was added since, so it is still ``pos - 1`` from the end.
        it = itertools.islice(values, pos - 1, None)
        first = next(it, None)
        if first is not None and first.seen == seen:
            return enumerate(it, pos)
    return ((i, st) for i, st in enumerate(reversed(rt.wf.values())) if st.seen < seen)


def check_order(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be 'oldest' (first seen first) or 'newest', got {order!r}")
    return order


def _states(rt: Runtime, node: Node | None) -> list[WorkflowState]:
    """The states ``node`` may match, in first-seen order (the index answers where it can)."""
    candidates = _candidates(rt, node) if node is not None else None
    if candidates is None:
        return list(rt.wf.values())
    states = [st for wid in candidates if (st := rt.wf.get(wid)) is not None]
    states.sort(key=lambda s: s.seen)
    return states


def matching(rt: Runtime, where: str | None) -> Iterator[WorkflowState]:
    """Every state matching ``where``'s filter, in first-seen order (its ``order by`` aside)."""
    node = parse(where).filter if where is not None else None
    pred = compile_query(rt, node) if node is not None else None
    return (st for st in _states(rt, node) if pred is None or pred(st))


def counts(rt: Runtime, where: str | None) -> dict[str, int]:
    """How many runs match ``where``, by status (every status of :data:`STATUSES`, zeros too)."""
    out = dict.fromkeys(STATUSES, 0)
    for st in matching(rt, where):
        out[status_of(rt, st)] += 1
    return out


def select(
    rt: Runtime, where: str | None, limit: int, cursor: str | None, order: str = "oldest"
) -> tuple[list[WorkflowState], str | None]:
    """The states of one page, in first-seen order (``order="newest"``: last seen first; an
    ``order by`` in ``where``: its order), and the next page's cursor."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    newest = check_order(order) == "newest"
    query = parse(where) if where is not None else Query(None)
    if query.order:
        if newest:
            assert where is not None and query.order_at is not None
            raise InvalidQuery("order='newest' and an 'order by' both set the order: drop one "
                               "(the order by decides; ties go first seen first)", where, query.order_at)
        return _sorted_page(rt, query, limit, cursor)
    mark = "n" if newest else ""
    node = query.filter
    pred = compile_query(rt, node) if node is not None else None
    seen, pos = _parse_cursor(cursor, order) if cursor is not None else (0, 0)
    out: list[WorkflowState] = []
    last_pos = 0
    candidates = _candidates(rt, node) if node is not None else None
    if candidates is not None:
        states = [st for wid in candidates if (st := rt.wf.get(wid)) is not None
                  and (seen == 0 or (st.seen < seen if newest else st.seen > seen))]
        states.sort(key=lambda s: s.seen, reverse=newest)
        more = False
        for st in states:
            if pred is None or pred(st):
                if len(out) == limit:
                    more = True
                    break
                out.append(st)
        # Candidates carry no table position: the next page starts from the index again.
        return out, (f"{mark}{out[-1].seen}.0" if more else None)
    for i, st in (_before if newest else _after)(rt, seen, pos):
        if pred is None or pred(st):
            if len(out) == limit:
                return out, f"{mark}{out[-1].seen}.{last_pos + 1}"
            out.append(st)
            last_pos = i
    return out, None


# --- order by ---------------------------------------------------------------
#
# A run's place is its sort key: per ``order by`` key, (0, value_key) for a value (nulls,
# lists and objects: (1,), last in either direction), then its first-seen number (ties go first
# seen first). A page is the ``limit`` smallest keys after the cursor's, so a cursor is a key:
# a run whose sorted field changes between pages may move across it.


@functools.total_ordering
class _Desc:
    """A value that sorts in reverse."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.v == other.v

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.v < self.v)

    def __hash__(self) -> int:
        return hash(self.v)


def _key(values: list[Any], order: tuple[SortKey, ...], seen: int) -> tuple[Any, ...]:
    """The sort key of a run from its ``value_key`` of each sorted field (None: null)."""
    parts: list[Any] = []
    for vk, k in zip(values, order, strict=True):
        if vk is None or vk[1] is None:
            parts.append((1,))
        else:
            vk = tuple(vk)
            parts.append((0, _Desc(vk) if k.descending else vk))
    parts.append(seen)
    return tuple(parts)


def _sorted_page(rt: Runtime, query: Query, limit: int,
                 cursor: str | None) -> tuple[list[WorkflowState], str | None]:
    spec = ",".join(map(str, query.order))
    after = _parse_sorted_cursor(cursor, spec, query.order) if cursor is not None else None
    node = query.filter
    pred = compile_query(rt, node) if node is not None else None
    getters = [_getter(rt, k.field) for k in query.order]
    keyed: list[tuple[tuple[Any, ...], list[Any], WorkflowState]] = []
    for st in _states(rt, node):
        if pred is None or pred(st):
            values = [value_key(get(st)) for get in getters]
            key = _key(values, query.order, st.seen)
            if after is None or key > after:
                keyed.append((key, values, st))
    page = heapq.nsmallest(limit + 1, keyed, key=lambda t: t[0])
    if len(page) <= limit:
        return [st for _, _, st in page], None
    _, values, last = page[limit - 1]
    raw = json.dumps([spec, [None if v is None or v[1] is None else list(v) for v in values], last.seen])
    return [st for _, _, st in page[:limit]], "s" + base64.urlsafe_b64encode(raw.encode()).decode()


def _parse_sorted_cursor(cursor: str, spec: str, order: tuple[SortKey, ...]) -> tuple[Any, ...]:
    if not isinstance(cursor, str) or not cursor.startswith("s"):
        raise InvalidQuery("this cursor continues a listing without an 'order by': pass the same where "
                           "with it, or start again without a cursor", str(cursor), 0)
    try:
        was, values, seen = json.loads(base64.urlsafe_b64decode(cursor[1:].encode()))
        if not isinstance(seen, int) or not isinstance(values, list) or len(values) != len(order) or not all(
                v is None or (isinstance(v, list) and len(v) == 2 and value_key(v[1]) == tuple(v)) for v in values):
            raise ValueError
        key = _key(values, order, seen) if was == spec else None
    except (ValueError, TypeError):
        raise InvalidQuery("not a cursor of Engine.list: pass page.cursor as it was returned", cursor, 0) from None
    if key is None:
        raise InvalidQuery(f"this cursor continues a listing ordered by {was!s}: pass the same "
                           "order by with it, or start again without a cursor", cursor, 0)
    return key


def metrics(rt: Runtime, committer: Any, backup: BackupStatus | None = None) -> Metrics:
    """Counts every workflow by shard (a walk of the table: O(workflows))."""
    n = rt.shards
    runs: list[dict[str, int]] = [{} for _ in range(n)]
    parked = [0] * n
    loaded = [0] * n
    stuck = rt.stuck
    for st in rt.wf.values():
        s = st.shard
        if st.id in stuck:
            status = "stuck"
        elif st.status is None or st.status == rec.Status.CONTINUED:
            status = _unfinished(rt, st)
            if st.run is not None:
                loaded[s] += 1
            elif st.packed is not None:
                parked[s] += 1
        else:
            status = st.status.name.lower()
        by = runs[s]
        by[status] = by.get(status, 0) + 1
    log = rt.log
    shards = tuple(
        ShardMetrics(s, dict(sorted(runs[s].items())), parked[s], loaded[s], log.durable(s)) for s in range(n)
    )
    return Metrics(
        shards=shards,
        steps_run=rt.stats.get("steps", 0),
        steps_executing=rt.steps.executing,
        steps_gated=len(rt.steps._gated),
        timers_pending=len(rt.timers),
        flushes=committer.flushes,
        inline_flushes=committer.inline_flushes,
        records_flushed=committer.records_flushed,
        records_pending=getattr(log, "pending_records", 0),
        flush_p50_ms=_percentile(list(log.flush_seconds), 0.50) * 1000,
        flush_p99_ms=_percentile(list(log.flush_seconds), 0.99) * 1000,
        indexed=len(rt.index),
        stats=dict(rt.stats),
        loaded_bytes=rt.loaded_bytes,
        memory_budget=rt.memory_budget,
        runs_to_load=len(rt.to_load),
        backup=backup,
    )


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    samples.sort()
    return samples[min(len(samples) - 1, int(q * len(samples)))]
