"""Visibility: ``Engine.list`` with its ``where=`` query language, and ``Engine.metrics``.

The query language (documented in docs/api.md)::

    query      := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | "(" query ")" | comparison
    comparison := field op literal | field ["not"] "in" "(" literal ("," literal)* ")"
    op         := "=" | "!=" | "<>" | "<" | "<=" | ">" | ">="
    field      := workflow_id | workflow | status | run_id | shard
                | started_at | ended_at | attrs.<key>
    literal    := 'text' | "text" | number | true | false | null
                | now() [("-" | "+") duration]          (started_at, ended_at only)

Keywords are case-insensitive; a quote inside a string is doubled (``'it''s'``).
An absent attribute (or ``ended_at`` of a running run) is ``null``: ``= null``
matches it, ``!= 'x'`` matches it, ``<``/``>`` never do. Ordering comparisons
hold only between values of one kind (numbers with numbers, text with text).
``started_at``/``ended_at`` take an ISO 8601 time (``'2026-11-01T00:00:00Z'``;
no zone means UTC) or a time relative to the engine's clock when the query
runs (``now() - 1h``; a duration as in ``fusee.durations``: ``90s``, ``1h30m``).
``status`` takes one of :data:`STATUSES`; another value raises
:class:`fusee.errors.UnknownStatus` naming them.

Plan: an ``and`` of the whole query with ``attrs.k = <scalar>``, ``attrs.k in
(...)`` or ``workflow_id = '...'`` looks up the attribute index (the smallest
candidate set wins) and checks the rest of the query on those candidates only;
any other query reads every workflow (``started_at``/``ended_at`` read each
candidate's journal, so combine them with an indexed term at scale; telling
``paused`` and ``retrying`` from ``running`` reads an unfinished run's journal
once, then a cache keyed by the journal's version answers).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from fusee import durations
from fusee.backup.uploader import BackupStatus
from fusee.core import records as rec
from fusee.errors import InvalidDuration, InvalidQuery, UnknownStatus
from fusee.runtime import sealing
from fusee.runtime.index import value_key

if TYPE_CHECKING:
    from fusee.runtime.runtime import Runtime
    from fusee.runtime.table import WorkflowState

#: The most runs one page of :meth:`Engine.list` may hold.
MAX_LIMIT = 10_000

#: Every status a run may show, as ``RunSummary.status``, ``where status = ...`` and the
#: counts name them: unfinished (``running``; ``retrying``: a step failed and waits for its next
#: attempt; ``paused``: a step's retries ran out and it waits for a resume; ``stuck``), then ended.
STATUSES = ("running", "retrying", "paused", "stuck", "ok", "failed", "cancelled", "timed_out", "terminated")
#: The orders :meth:`Engine.list` pages in: first seen first, or last seen first.
ORDERS = ("oldest", "newest")

_KEYWORDS = ("and", "or", "not", "in", "true", "false", "null")
_OPS = ("!=", "<>", "<=", ">=", "=", "<", ">")
_FIELDS = ("workflow_id", "workflow", "status", "run_id", "shard", "started_at", "ended_at")


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


# --- the query language -----------------------------------------------------


@dataclasses.dataclass
class _Tok:
    kind: str  # "name", "str", "num", "op", "(", ")", ",", "end", or a keyword
    value: Any
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "(),":
            toks.append(_Tok(c, c, i))
            i += 1
        elif c in "'\"":
            j, out = i + 1, []
            while True:
                if j >= n:
                    raise InvalidQuery("unterminated string: close it with " + c, text, i)
                if text[j] == c:
                    if j + 1 < n and text[j + 1] == c:
                        out.append(c)
                        j += 2
                        continue
                    break
                out.append(text[j])
                j += 1
            toks.append(_Tok("str", "".join(out), i))
            i = j + 1
        elif c.isdigit() or (c in "-+." and i + 1 < n and (text[i + 1].isdigit() or text[i + 1] == ".")):
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in ".+-_") and not (
                text[j] in "+-" and text[j - 1] not in "eE"
            ):
                j += 1
            word = text[i:j]
            try:
                num: int | float = int(word)
            except ValueError:
                try:
                    num = float(word)
                except ValueError:
                    toks.append(_Tok("dur", _duration(word, text, i), i))
                    i = j
                    continue
            toks.append(_Tok("num", num, i))
            i = j
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "_.-"):
                j += 1
            word = text[i:j]
            low = word.lower()
            toks.append(_Tok(low, low, i) if low in _KEYWORDS else _Tok("name", word, i))
            i = j
        elif c in "+-":
            toks.append(_Tok("sign", c, i))  # of a duration after now(): now() - 1h
            i += 1
        else:
            for op in _OPS:
                if text.startswith(op, i):
                    toks.append(_Tok("op", "!=" if op == "<>" else op, i))
                    i += len(op)
                    break
            else:
                raise InvalidQuery(f"unexpected character {c!r}", text, i)
    toks.append(_Tok("end", None, n))
    return toks


def _duration(word: str, text: str, pos: int) -> int:
    """A signed duration token (``1h``, ``-90s``) in milliseconds."""
    body = word.lstrip("+-")
    if not body or (not body[0].isdigit() and body[0] != "."):
        raise InvalidQuery(f"{word!r} is not a number", text, pos)
    try:
        ms = durations.parse(body)
    except InvalidDuration:
        raise InvalidQuery(f"{word!r} is not a number nor a duration such as 90s, 15m, 1h30m or 2d",
                           text, pos) from None
    return -ms if word.startswith("-") else ms


@dataclasses.dataclass(frozen=True)
class Now:
    """``now() + offset_ms`` in a query: the engine's clock when the query runs."""

    offset_ms: int


# The parsed query: ("and", [q...]) | ("or", [q...]) | ("not", q)
#                 | ("cmp", field, op, value) | ("in", field, [values])
Node = tuple[Any, ...]


#: How deep parentheses and ``not`` may nest in a query: deeper is refused with InvalidQuery
#: (the parser and the evaluator recurse; no real filter comes near this).
MAX_DEPTH = 64


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self, kind: str, what: str) -> _Tok:
        t = self.toks[self.i]
        if t.kind != kind:
            found = "the end of the query" if t.kind == "end" else repr(self.text[t.pos:t.pos + 20])
            raise InvalidQuery(f"expected {what}, found {found}", self.text, t.pos)
        self.i += 1
        return t

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise InvalidQuery("the query is empty: pass where=None to list every run", self.text, 0)
        node = self.or_()
        self.take("end", "'and', 'or' or the end of the query")
        return node

    def or_(self) -> Node:
        parts = [self.and_()]
        while self.peek().kind == "or":
            self.i += 1
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else ("or", parts)

    def and_(self) -> Node:
        parts = [self.not_()]
        while self.peek().kind == "and":
            self.i += 1
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else ("and", parts)

    def not_(self) -> Node:
        t = self.peek()
        if t.kind != "not" and t.kind != "(":
            return self.comparison()
        if self.depth == MAX_DEPTH:
            raise InvalidQuery(f"the query nests parentheses and 'not' deeper than {MAX_DEPTH} levels: "
                               "write it flatter (a and b and c needs no parentheses)", self.text, t.pos)
        self.depth += 1
        self.i += 1
        if t.kind == "not":
            node: Node = ("not", self.not_())
        else:
            node = self.or_()
            self.take(")", "')'")
        self.depth -= 1
        return node

    def comparison(self) -> Node:
        ft = self.take("name", "a field (workflow_id, workflow, status, run_id, shard, "
                               "started_at, ended_at or attrs.<key>)")
        field = self.field(ft)
        t = self.peek()
        negate = False
        if t.kind == "not":
            self.i += 1
            negate = True
            t = self.peek()
            if t.kind != "in":
                raise InvalidQuery("expected 'in' after 'not'", self.text, t.pos)
        if t.kind == "in":
            self.i += 1
            self.take("(", "'(' opening the list of values")
            values = [self.literal(field)]
            while self.peek().kind == ",":
                self.i += 1
                values.append(self.literal(field))
            self.take(")", "',' or ')' closing the list of values")
            node: Node = ("in", field, values)
            return ("not", node) if negate else node
        op = self.take("op", "a comparison (=, !=, <, <=, >, >=, in)").value
        return ("cmp", field, op, self.literal(field))

    def field(self, t: _Tok) -> str:
        name: str = t.value
        if name[:6].lower() == "attrs.":
            if len(name) == len("attrs."):
                raise InvalidQuery("attrs. needs a key: attrs.<key>", self.text, t.pos)
            return "attrs." + name[6:]  # keys are case-sensitive, the prefix is not
        low = name.lower()
        if low not in _FIELDS:
            raise InvalidQuery(
                f"unknown field {name!r}: use workflow_id, workflow, status, run_id, shard, "
                "started_at, ended_at or attrs.<key>", self.text, t.pos)
        return low

    def now(self, field: str) -> Now:
        self.i += 1
        self.take("(", "'(' after now")
        self.take(")", "')': now() takes nothing")
        t = self.peek()
        if t.kind == "sign":
            self.i += 1
            d = self.take("dur", "a duration after now() " + t.value + " (such as 15m, 1h or 2d)")
            if d.value < 0 or self.text[d.pos] in "+-":
                raise InvalidQuery("write one sign: now() - 1h", self.text, d.pos)
            return Now(-d.value if t.value == "-" else d.value)
        if t.kind == "dur" and self.text[t.pos] in "+-":  # now()-1h: the sign went with the number
            self.i += 1
            return Now(t.value)
        return Now(0)

    def literal(self, field: str) -> Any:
        t = self.peek()
        if t.kind == "name" and t.value.lower() == "now" and field in ("started_at", "ended_at"):
            return self.now(field)
        if t.kind == "dur":
            raise InvalidQuery(f"a duration is compared only as now() - {self.text[t.pos:].split()[0].lstrip('+-')} "
                               "(with started_at or ended_at)", self.text, t.pos)
        if t.kind == "str" or t.kind == "num":
            value: Any = t.value
        elif t.kind in ("true", "false", "null"):
            value = {"true": True, "false": False, "null": None}[t.kind]
        else:
            found = "the end of the query" if t.kind == "end" else repr(self.text[t.pos:t.pos + 20])
            raise InvalidQuery(f"expected a value ('text', a number, true, false or null), found {found}",
                               self.text, t.pos)
        self.i += 1
        if value is None or field.startswith("attrs."):
            return value
        if field in ("started_at", "ended_at"):
            if not isinstance(value, str):
                raise InvalidQuery(f"{field} compares with an ISO time such as '2026-11-01T00:00:00Z' "
                                   "or with now() - 1h", self.text, t.pos)
            return _parse_time(value, self.text, t.pos)
        if field in ("run_id", "shard"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidQuery(f"{field} compares with a whole number", self.text, t.pos)
            return value
        if not isinstance(value, str):
            raise InvalidQuery(f"{field} compares with text in quotes", self.text, t.pos)
        if field == "status":
            if value.lower() not in STATUSES:
                raise UnknownStatus(value, STATUSES, self.text, t.pos)
            return value.lower()
        return value


def _parse_time(text: str, query: str, pos: int) -> int:
    """An ISO 8601 time as UTC milliseconds."""
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidQuery(f"{text!r} is not an ISO 8601 time such as '2026-11-01T00:00:00Z'",
                           query, pos) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return int(t.timestamp() * 1000)


def parse(where: str) -> Node:
    """Parses a ``where=`` query; raises :class:`InvalidQuery` naming the position of a mistake."""
    if not isinstance(where, str):
        raise TypeError(f"where= takes a query string (or None), got {where!r}")
    return _Parser(where).parse()


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


def matching(rt: Runtime, where: str | None) -> Iterator[WorkflowState]:
    """Every state matching ``where``, in first-seen order (the index answers where it can)."""
    node = parse(where) if where is not None else None
    pred = compile_query(rt, node) if node is not None else None
    candidates = _candidates(rt, node) if node is not None else None
    if candidates is not None:
        states = [st for wid in candidates if (st := rt.wf.get(wid)) is not None]
        states.sort(key=lambda s: s.seen)
    else:
        states = list(rt.wf.values())
    return (st for st in states if pred is None or pred(st))


def counts(rt: Runtime, where: str | None) -> dict[str, int]:
    """How many runs match ``where``, by status (every status of :data:`STATUSES`, zeros too)."""
    out = dict.fromkeys(STATUSES, 0)
    for st in matching(rt, where):
        out[status_of(rt, st)] += 1
    return out


def select(
    rt: Runtime, where: str | None, limit: int, cursor: str | None, order: str = "oldest"
) -> tuple[list[WorkflowState], str | None]:
    """The states of one page, in first-seen order (``order="newest"``: last seen first), and
    the next page's cursor."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    newest = check_order(order) == "newest"
    mark = "n" if newest else ""
    node = parse(where) if where is not None else None
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
