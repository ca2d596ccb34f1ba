"""Hypothesis strategies for the ``where=`` language: well-formed queries as the parser's own
nodes, their text (with random case, spacing, quotes and redundant parentheses), and a direct
evaluation of a node on a ``RunSummary`` that the engine's answers are checked against."""

from __future__ import annotations

import datetime
import math
from typing import Any

from hypothesis import strategies as st

from fusee.engine.query_grammar import FIELDS, STATUSES, Node, Now, Query, SortKey

#: Attribute keys and values the strategies draw from (few, so that queries match something).
KEYS = ("n", "s", "f", "order-id", "a.b", "Mixed_Case")
TEXTS = ("a", "b", "acme", "", "it's", 'say "hi"', "ünï", "1", "and", "order by")
TIMES = ("started_at", "ended_at")
_OPS = ("=", "!=", "<", "<=", ">", ">=")

texts = st.one_of(st.sampled_from(TEXTS), st.text(max_size=8))
numbers = st.one_of(
    st.integers(-5, 5), st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False, width=64).filter(lambda f: not math.isinf(f)),
)
attr_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from((0.5, -1.25, 2.0)),
                        st.sampled_from(TEXTS[:4]))
#: Whole seconds, 1970 to 2100: an ISO time reads back to the same millisecond.
epoch_ms = st.integers(0, 4_102_444_800).map(lambda s: s * 1000)
offsets = st.one_of(st.integers(-(10**10), 10**10), st.integers(-(10**7), 10**7)).map(Now)


def fields() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(FIELDS), st.sampled_from(KEYS).map(lambda k: "attrs." + k))


def values_for(field: str) -> st.SearchStrategy[Any]:
    """Values a comparison with ``field`` takes, as the parser hands them over."""
    if field in TIMES:
        return st.one_of(st.none(), epoch_ms, offsets)
    if field in ("run_id", "shard"):
        return st.one_of(st.none(), st.integers(-3, 10))
    if field == "status":
        return st.sampled_from(STATUSES)
    if field in ("workflow_id", "workflow"):
        return st.one_of(st.none(), texts, st.sampled_from(("t-1", "t-2", "alpha", "beta")))
    return st.one_of(attr_values, st.booleans(), texts, numbers)


@st.composite
def comparisons(draw: st.DrawFn) -> Node:
    field = draw(fields())
    if draw(st.booleans()):
        values = draw(st.lists(values_for(field), min_size=1, max_size=4))
        node: Node = ("in", field, values)
        return ("not", node) if draw(st.booleans()) else node
    return ("cmp", field, draw(st.sampled_from(_OPS)), draw(values_for(field)))


def filters() -> st.SearchStrategy[Node]:
    return st.recursive(
        comparisons(),
        lambda inner: st.one_of(
            st.tuples(st.just("not"), inner),
            st.tuples(st.sampled_from(("and", "or")), st.lists(inner, min_size=2, max_size=4)),
        ),
        max_leaves=12,
    )


sort_keys = st.lists(st.builds(SortKey, fields(), st.booleans()), max_size=3,
                     unique_by=lambda k: k.field).map(tuple)


@st.composite
def queries(draw: st.DrawFn) -> Query:
    node = draw(st.one_of(st.none(), filters())) if draw(st.booleans()) else draw(filters())
    order = draw(sort_keys)
    if node is None and not order:
        order = (SortKey("workflow_id"),)
    return Query(node, order, None)


# --- rendering ----------------------------------------------------------------


def _kw(draw: st.DrawFn, word: str) -> str:
    return draw(st.sampled_from((word, word.upper(), word.capitalize())))


def _sp(draw: st.DrawFn) -> str:
    return draw(st.sampled_from((" ", "  ", "\n", "\t ")))


def _text(draw: st.DrawFn, value: str) -> str:
    q = draw(st.sampled_from(("'", '"')))
    return q + value.replace(q, q * 2) + q


def _duration(ms: int) -> str:
    out = ""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out or "0s"


def _value(draw: st.DrawFn, field: str, value: Any) -> str:
    if isinstance(value, Now):
        now = _kw(draw, "now") + draw(st.sampled_from(("()", "( )")))
        if value.offset_ms == 0 and draw(st.booleans()):
            return now
        sign = "-" if value.offset_ms < 0 else "+"
        return now + draw(st.sampled_from(("", " "))) + sign + draw(st.sampled_from(("", " "))) + _duration(
            abs(value.offset_ms))
    if value is None:
        return _kw(draw, "null")
    if value is True or value is False:
        return _kw(draw, str(value).lower())
    if field in TIMES:
        iso = datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
        return _text(draw, draw(st.sampled_from((iso.isoformat(), iso.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                                 iso.replace(tzinfo=None).isoformat()))))
    if isinstance(value, str):
        return _text(draw, value.upper() if field == "status" and draw(st.booleans()) else value)
    return repr(value)


def _field(draw: st.DrawFn, field: str) -> str:
    if field.startswith("attrs."):
        return draw(st.sampled_from(("attrs.", "ATTRS.", "Attrs."))) + field[6:]
    return _kw(draw, field)


def _render(draw: st.DrawFn, node: Node, parent: str | None) -> str:
    kind = node[0]
    if kind == "cmp":
        _, field, op, value = node
        op = "<>" if op == "!=" and draw(st.booleans()) else op
        return _field(draw, field) + _sp(draw) + op + draw(st.sampled_from(("", " "))) + _value(draw, field, value)
    if kind == "in":
        _, field, values = node
        inside = ("," + _sp(draw)).join(_value(draw, field, v) for v in values)
        negate = parent == "not in"
        return (_field(draw, field) + _sp(draw) + (_kw(draw, "not") + " " if negate else "") + _kw(draw, "in")
                + _sp(draw) + "(" + inside + ")")
    if kind == "not":
        inner = node[1]
        if inner[0] == "in" and draw(st.booleans()):
            return _render(draw, inner, "not in")  # field not in (...)
        return _kw(draw, "not") + " " + _render(draw, inner, "not")
    joined = (_sp(draw) + _kw(draw, kind) + _sp(draw)).join(_render(draw, n, kind) for n in node[1])
    # A part of the same kind, and anything compound under not or and, needs parentheses to
    # parse as this node; an and under an or may have them or not.
    needed = parent == kind or parent == "not" or (parent == "and" and kind == "or")
    if needed or (parent is not None and draw(st.booleans())):
        return "(" + joined + ")"
    return joined


@st.composite
def rendered(draw: st.DrawFn, query: Query) -> str:
    """A text of ``query``."""
    text = _render(draw, query.filter, None) if query.filter is not None else ""
    if query.order:
        keys = []
        for k in query.order:
            direction = (" " + _kw(draw, "desc")) if k.descending else draw(
                st.sampled_from(("", " " + _kw(draw, "asc"))))
            keys.append(_field(draw, k.field) + direction)
        text += (_sp(draw) if text else "") + _kw(draw, "order") + " " + _kw(draw, "by") + " " + ", ".join(keys)
    return draw(st.sampled_from(("", " "))) + text + draw(st.sampled_from(("", " ")))


# --- direct evaluation ----------------------------------------------------------


def _kind(v: Any) -> int | None:
    if v is None:
        return 0
    if isinstance(v, bool):
        return 1
    if isinstance(v, int | float):
        return 2
    if isinstance(v, str):
        return 3
    return None


def field_of(run: Any, field: str) -> Any:
    """The value of ``field`` for a ``RunSummary``."""
    if field.startswith("attrs."):
        return run.attributes.get(field[6:])
    if field in TIMES:
        t = getattr(run, field)
        return None if t is None else round(t.timestamp() * 1000)
    return getattr(run, field)


def evaluate(node: Node, run: Any, now_ms: int) -> bool:
    """Whether ``run`` matches ``node``, as the language defines it (docs/api.md)."""
    kind = node[0]
    if kind == "and":
        return all(evaluate(n, run, now_ms) for n in node[1])
    if kind == "or":
        return any(evaluate(n, run, now_ms) for n in node[1])
    if kind == "not":
        return not evaluate(node[1], run, now_ms)

    def resolve(v: Any) -> Any:
        return now_ms + v.offset_ms if isinstance(v, Now) else v

    def same(a: Any, b: Any) -> bool:
        return _kind(a) is not None and _kind(a) == _kind(b) and a == b

    got = field_of(run, node[1])
    if kind == "in":
        return any(same(got, resolve(v)) for v in node[2])
    op, want = node[2], resolve(node[3])
    if op == "=":
        return same(got, want)
    if op == "!=":
        return not same(got, want)
    if _kind(got) != _kind(want) or _kind(got) not in (2, 3):
        return False
    return {"<": got < want, "<=": got <= want, ">": got > want, ">=": got >= want}[op]


def sort(runs: list[Any], order: tuple[SortKey, ...]) -> list[Any]:
    """``runs`` (in first-seen order) sorted by ``order``: nulls last either way, values of one
    kind by value, kinds as null < bool < number < text, ties first seen first."""
    out = list(runs)
    for k in reversed(order):  # stable sorts, the last key first
        def value(r: Any, f: str = k.field) -> Any:
            return field_of(r, f)
        valued = [r for r in out if _kind(value(r)) not in (None, 0)]
        valued.sort(key=lambda r: (_kind(value(r)), value(r)), reverse=k.descending)
        out = valued + [r for r in out if _kind(value(r)) in (None, 0)]
    return out
