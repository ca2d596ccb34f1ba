"""The ``where=`` query language of ``Engine.list``, ``counts`` and bulk actions: its grammar
(a ``lark`` LALR grammar, built once at import) and :func:`parse`, which turns a query's text
into a :class:`Query` (a filter :data:`Node` and an ``order by``) or raises
:class:`fusee.errors.InvalidQuery` naming the position of the mistake and what was expected
there. Evaluating a query is ``fusee.engine.visibility``'s; docs/api.md documents the language.

Keywords are case-insensitive; a quote inside a string is doubled (``'it''s'``). Field
names and literal values are checked as the parser reduces them, so every mistake, of
syntax or of sense (``shard = 'one'``, ``status = 'done'``), names its position.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, NamedTuple, NoReturn

import lark

from fusee import durations
from fusee.errors import InvalidDuration, InvalidQuery, UnknownStatus

#: Every status a run may show, as ``RunSummary.status``, ``where status = ...`` and the
#: counts name them: unfinished (``running``; ``retrying``: a step failed and waits for its next
#: attempt; ``paused``: a step's retries ran out and it waits for a resume; ``stuck``), then ended.
STATUSES = ("running", "retrying", "paused", "stuck", "ok", "failed", "cancelled", "timed_out", "terminated")

#: The engine's own fields (besides ``attrs.<key>``).
FIELDS = ("workflow_id", "workflow", "status", "run_id", "shard", "started_at", "ended_at")

#: How deep parentheses and ``not`` may nest in a query: deeper is refused with InvalidQuery
#: (the evaluator recurses; no real filter comes near this).
MAX_DEPTH = 64

# A keyword ends where a name could not go on: "andy" and "attrs.order" are names.
_KW = r"(?![\w.\-])"

GRAMMAR = rf"""
// A query is a filter, an order, or a filter then an order:
//     status = 'failed' and started_at > now() - 1h order by started_at desc
start: [disjunction] [ordering]

// Precedence, loosest first: or, and, not.
?disjunction: conjunction (_OR conjunction)*
?conjunction: negation (_AND negation)*
?negation: NOT negation                        -> negated
         | LPAR disjunction _RPAR              -> group
         | comparison

comparison: field OP value                                  -> compare
          | field _IN LPAR value (_COMMA value)* _RPAR      -> among
          | field NOT _IN LPAR value (_COMMA value)* _RPAR  -> not_among

// workflow_id, workflow, status, run_id, shard, started_at, ended_at or attrs.<key>
field: NAME

?value: STRING                                 -> text
      | NUMBER                                 -> number
      | TRUE                                   -> true
      | FALSE                                  -> false
      | NULL                                   -> null
      | NOW LPAR _RPAR [SIGN NUMBER]           -> now    // now() - 1h: the engine's clock

ordering: ORDER _BY sort_key (_COMMA sort_key)*
sort_key: NAME [ASC | DESC]

OP: "!=" | "<>" | "<=" | ">=" | "=" | "<" | ">"
SIGN: "+" | "-"
// 'text' or "text", the quote doubled inside
STRING: /'(?:[^']|'')*'/ | /"(?:[^"]|"")*"/
// A word starting like a number: 12, -1.5, 1e-3 (a number), or 90s, 1h30m (a duration, after now())
NUMBER: /[-+]?\.?\d(?:[\w.]|(?<=[eE])[-+])*/
// A field: a letter or _ first, then letters, digits, _, . and - (attrs.order-id)
NAME: /[^\W\d][\w.\-]*/

// Keywords win over a name of the same spelling.
_AND.2: /and{_KW}/i
_OR.2: /or{_KW}/i
NOT.2: /not{_KW}/i
_IN.2: /in{_KW}/i
TRUE.2: /true{_KW}/i
FALSE.2: /false{_KW}/i
NULL.2: /null{_KW}/i
NOW.2: /now{_KW}/i
ORDER.2: /order{_KW}/i
_BY.2: /by{_KW}/i
ASC.2: /asc{_KW}/i
DESC.2: /desc{_KW}/i
LPAR: "("
_RPAR: ")"
_COMMA: ","

%ignore /\s+/
"""


@dataclasses.dataclass(frozen=True)
class Now:
    """``now() + offset_ms`` in a query: the engine's clock when the query runs."""

    offset_ms: int


# The parsed filter: ("and", [q...]) | ("or", [q...]) | ("not", q)
#                  | ("cmp", field, op, value) | ("in", field, [values])
Node = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class SortKey:
    """One key of ``order by``: a field, ascending unless ``descending``."""

    field: str
    descending: bool = False

    def __str__(self) -> str:
        return f"{self.field} {'desc' if self.descending else 'asc'}"


@dataclasses.dataclass(frozen=True)
class Query:
    """A parsed ``where=``: the filter (None: every run) and the ``order by`` (empty: none)."""

    filter: Node | None
    order: tuple[SortKey, ...] = ()
    #: Where ``order by`` starts in the text (None without one).
    order_at: int | None = None


class _Mistake(Exception):
    """A mistake of sense found while reducing: ``parse`` adds the query's text."""

    def __init__(self, message: str, pos: int, status: str | None = None) -> None:
        super().__init__(message)
        self.message, self.pos, self.status = message, pos, status


class _Part(NamedTuple):
    """A filter being built: its node, and how deep ``not`` and parentheses nest in it."""

    node: Node
    depth: int


class _Lit(NamedTuple):
    """A literal being built: its value (a ``Now`` for ``now()``) and position."""

    value: Any
    pos: int


_FIELD_LIST = "workflow_id, workflow, status, run_id, shard, started_at, ended_at or attrs.<key>"
_TIMES = ("started_at", "ended_at")


class _Build(lark.Transformer[lark.Token, Query]):
    """Builds the :class:`Query` as the LALR parser reduces (no tree, no recursion)."""

    def start(self, c: list[Any]) -> Query:
        part, order = c
        node = part.node if part is not None else None
        if order is None:
            return Query(node)
        at, keys = order
        return Query(node, keys, at)

    def disjunction(self, c: list[_Part]) -> _Part:
        return _Part(("or", [p.node for p in c]), max(p.depth for p in c))

    def conjunction(self, c: list[_Part]) -> _Part:
        return _Part(("and", [p.node for p in c]), max(p.depth for p in c))

    @staticmethod
    def _nested(opening: lark.Token, node: Node, depth: int) -> _Part:
        if depth > MAX_DEPTH:
            raise _Mistake(f"the query nests parentheses and 'not' deeper than {MAX_DEPTH} levels: "
                           "write it flatter (a and b and c needs no parentheses)", _pos(opening))
        return _Part(node, depth)

    def negated(self, c: list[Any]) -> _Part:
        opening, inner = c
        return self._nested(opening, ("not", inner.node), inner.depth + 1)

    def group(self, c: list[Any]) -> _Part:
        opening, inner = c
        return self._nested(opening, inner.node, inner.depth + 1)

    def compare(self, c: list[Any]) -> _Part:
        field, op, lit = c
        value = _check(field, lit)
        return _Part(("cmp", field, "!=" if op == "<>" else str(op), value), 0)

    def among(self, c: list[Any]) -> _Part:
        field, _lpar, *lits = c
        return _Part(("in", field, [_check(field, lit) for lit in lits]), 0)

    def not_among(self, c: list[Any]) -> _Part:
        field, _not, _lpar, *lits = c
        return _Part(("not", ("in", field, [_check(field, lit) for lit in lits])), 0)

    def field(self, c: list[lark.Token]) -> str:
        return _field(c[0])

    def text(self, c: list[lark.Token]) -> _Lit:
        (t,) = c
        quote = t[0]
        return _Lit(t[1:-1].replace(quote * 2, quote), _pos(t))

    def number(self, c: list[lark.Token]) -> _Lit:
        (t,) = c
        word = str(t)
        try:
            return _Lit(int(word), _pos(t))
        except ValueError:
            pass
        try:
            return _Lit(float(word), _pos(t))
        except ValueError:
            pass
        _duration(t)  # a duration: refused here, but with the right advice
        raise _Mistake(f"a duration is compared only as now() - {word.lstrip('+-')} "
                       "(with started_at or ended_at)", _pos(t))

    def true(self, c: list[lark.Token]) -> _Lit:
        return _Lit(True, _pos(c[0]))

    def false(self, c: list[lark.Token]) -> _Lit:
        return _Lit(False, _pos(c[0]))

    def null(self, c: list[lark.Token]) -> _Lit:
        return _Lit(None, _pos(c[0]))

    def now(self, c: list[Any]) -> _Lit:
        t, _lpar, sign, amount = c
        if sign is None:
            return _Lit(Now(0), _pos(t))
        if amount[0] in "+-":
            raise _Mistake("write one sign: now() - 1h", _pos(amount))
        ms = _duration(amount)
        return _Lit(Now(-ms if sign == "-" else ms), _pos(t))

    def ordering(self, c: list[Any]) -> tuple[int, tuple[SortKey, ...]]:
        t, *keys = c
        seen: set[str] = set()
        for key, at in keys:
            if key.field in seen:
                raise _Mistake(f"order by names {key.field} twice", at)
            seen.add(key.field)
        return _pos(t), tuple(key for key, _ in keys)

    def sort_key(self, c: list[Any]) -> tuple[SortKey, int]:
        name, direction = c
        return SortKey(_field(name), direction is not None and direction.type == "DESC"), _pos(name)


def _pos(t: lark.Token) -> int:
    return t.start_pos or 0


def _field(t: lark.Token) -> str:
    name = str(t)
    if name[:6].lower() == "attrs.":
        if len(name) == len("attrs."):
            raise _Mistake("attrs. needs a key: attrs.<key>", _pos(t))
        return "attrs." + name[6:]  # keys are case-sensitive, the prefix is not
    low = name.lower()
    if low not in FIELDS:
        raise _Mistake(f"unknown field {name!r}: use {_FIELD_LIST}", _pos(t))
    return low


def _duration(t: lark.Token) -> int:
    """A duration word (``1h``, ``90s``) in milliseconds."""
    try:
        return durations.parse(str(t))
    except InvalidDuration:
        raise _Mistake(f"{str(t)!r} is not a number nor a duration such as 90s, 15m, 1h30m or 2d",
                       _pos(t)) from None


def _check(field: str, lit: _Lit) -> Any:
    """The literal as ``field`` compares with it (times as UTC milliseconds), or a mistake."""
    value, pos = lit
    if isinstance(value, Now):
        if field not in _TIMES:
            raise _Mistake("now() compares only with started_at or ended_at", pos)
        return value
    if value is None or field.startswith("attrs."):
        return value
    if field in _TIMES:
        if not isinstance(value, str):
            raise _Mistake(f"{field} compares with an ISO time such as '2026-11-01T00:00:00Z' "
                           "or with now() - 1h", pos)
        try:
            t = datetime.datetime.fromisoformat(value)
            return int((t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)).timestamp() * 1000)
        except (ValueError, OverflowError):
            raise _Mistake(f"{value!r} is not an ISO 8601 time such as '2026-11-01T00:00:00Z'", pos) from None
    if field in ("run_id", "shard"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Mistake(f"{field} compares with a whole number", pos)
        return value
    if not isinstance(value, str):
        raise _Mistake(f"{field} compares with text in quotes", pos)
    if field == "status":
        if value.lower() not in STATUSES:
            raise _Mistake("", pos, status=value)
        return value.lower()
    return value


_PARSER = lark.Lark(GRAMMAR, parser="lalr", lexer="contextual", transformer=_Build(),
                    maybe_placeholders=True)

# What each terminal stands for in "expected ..." (in this order; terminals sharing one say it once).
_COMPARISON = "a comparison (=, !=, <, <=, >, >=, in, not in)"
_VALUE = "a value ('text', a number, true, false, null or now())"
_EXPECTED = {
    "NAME": f"a field ({_FIELD_LIST})", "NOT": "'not'", "LPAR": "'('", "OP": _COMPARISON, "_IN": _COMPARISON,
    **dict.fromkeys(("STRING", "NUMBER", "TRUE", "FALSE", "NULL", "NOW"), _VALUE),
    "_RPAR": "')'", "_COMMA": "','", "SIGN": "'-' or '+' and a duration", "ASC": "asc or desc", "DESC": "asc or desc",
    "_AND": "'and'", "_OR": "'or'", "ORDER": "'order by'", "_BY": "'by'", "$END": "the end of the query",
}


def _expected(names: set[str], after: str) -> str:
    if names == {"NUMBER"} and after in ("+", "-"):
        return "a duration after now() " + after + " (such as 15m, 1h or 2d)"
    if names == {"_RPAR"} and after == "(":
        return "')': now() takes nothing"
    if "ORDER" in names:  # the filter is whole here, so it may go on too (LALR reduced it already)
        names |= {"_AND", "_OR"}
    if "OP" in names:  # after a field 'not' starts 'not in'
        names.discard("NOT")
    said: list[str] = []
    for name, what in _EXPECTED.items():
        if name in names and what not in said:
            said.append(what)
    if not said:
        return "something else"
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " or " + said[-1]


def _refuse(text: str, e: lark.exceptions.UnexpectedInput) -> NoReturn:
    pos = e.pos_in_stream if e.pos_in_stream is not None else len(text)
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        char = text[pos]
        if char in "'\"":
            raise InvalidQuery("unterminated string: close it with " + char, text, pos) from None
        message = f"unexpected character {char!r}"
        if e.allowed:
            message += ": expected " + _expected(set(e.allowed), "")
        raise InvalidQuery(message, text, pos) from None
    assert isinstance(e, lark.exceptions.UnexpectedToken)
    token = e.token
    at_end = token.type == "$END"
    if at_end:
        pos = len(text)
    try:
        # What may come here, from a copy of the parser fed each terminal (the table's own
        # ``expected`` may be from a state the lookahead already reduced to).
        names = set(e.interactive_parser.accepts())  # type: ignore[no-untyped-call]
    except Exception:  # the copy could not be fed: fall back on the table's view
        names = set(e.expected)
    before = text[:pos].rstrip()
    found = "the end of the query" if at_end else repr(text[pos:pos + 20])
    raise InvalidQuery(f"expected {_expected(names, before[-1:])}, found {found}", text, pos) from None


def parse(where: str) -> Query:
    """Parses a ``where=`` query; raises :class:`InvalidQuery` naming the position of a mistake."""
    if not isinstance(where, str):
        raise TypeError(f"where= takes a query string (or None), got {where!r}")
    if not where.strip():
        raise InvalidQuery("the query is empty: pass where=None to list every run", where, 0)
    try:
        query: Any = _PARSER.parse(where)  # the transformer builds a Query, not a tree
    except _Mistake as m:
        if m.status is not None:
            raise UnknownStatus(m.status, STATUSES, where, m.pos) from None
        raise InvalidQuery(m.message, where, m.pos) from None
    except lark.exceptions.UnexpectedInput as e:
        _refuse(where, e)
    assert isinstance(query, Query)
    return query


def split_order(where: str) -> tuple[str, str]:
    """``where`` as the text of its filter and of its ``order by`` ("" for either it lacks), for
    a caller that adds terms to the filter: ``f"({filter}) and status = 'ok' {order}"``. A
    query that does not parse comes back whole as the filter (its mistake shows when it runs)."""
    try:
        at = parse(where).order_at
    except InvalidQuery:
        return where, ""
    return (where, "") if at is None else (where[:at].rstrip(), where[at:])
