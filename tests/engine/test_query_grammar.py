"""The ``where=`` grammar on its own: every well-formed query parses back to the node it was
written from, anything else is an ``InvalidQuery`` naming a position, and its messages say
what was expected there."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusee
from fusee.engine import query_grammar
from fusee.engine.query_grammar import MAX_DEPTH, Now, Query, SortKey, parse, split_order
from tests.engine.query_strategies import queries, rendered


@settings(max_examples=600, deadline=None)
@given(queries(), st.data())
def test_a_written_query_parses_back_to_its_node(query: Query, data: st.DataObject) -> None:
    text = data.draw(rendered(query), label="text")
    parsed = parse(text)
    assert parsed.filter == query.filter
    assert parsed.order == query.order
    if query.order:
        assert parsed.order_at is not None and text[parsed.order_at:].lower().startswith("order")
        where, order_by = split_order(text)
        assert text.endswith(order_by) and where == text[:parsed.order_at].rstrip()
        assert parse(order_by).order == query.order
        if where:
            assert parse(where).filter == query.filter
    else:
        assert parsed.order_at is None and split_order(text) == (text, "")


#: Pieces of queries, for garbage that gets past the lexer more often than random text does.
PIECES = ["workflow", "status", "attrs.x", "started_at", "ended_at", "shard", "(", ")", ",", "=", "!=", "<",
          ">=", "<>", "in", "not", "and", "or", "order", "by", "asc", "desc", "now", "()", "now()", "-", "+",
          "1h", "-1h", "1y", "'ok'", "'done'", "'x", '"a""b"', "12", "-1.5", "1e", "true", "null", "~", "é",
          "'2026-11-01'", "", " "]


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(st.sampled_from(PIECES), max_size=14).map(" ".join),
                 st.lists(st.sampled_from(PIECES), max_size=14).map("".join)))
def test_garbage_is_an_invalid_query_naming_a_position_or_a_query(text: str) -> None:
    try:
        query = parse(text)
    except fusee.InvalidQuery as e:
        assert 0 <= e.position <= len(text)
        assert f"at position {e.position} " in str(e) and e.query == text
        return
    assert isinstance(query, Query) and (query.filter is not None or query.order)


def test_forms_parse_to_nodes() -> None:
    assert parse("status in ('Running', 'ok') and not attrs.x = 1 or shard = 0").filter == (
        "or", [("and", [("in", "status", ["running", "ok"]), ("not", ("cmp", "attrs.x", "=", 1))]),
               ("cmp", "shard", "=", 0)])
    assert parse("attrs.x NOT IN (1, 'a', true, null, -1.5, 1e-3, 1_000)").filter == (
        "not", ("in", "attrs.x", [1, "a", True, None, -1.5, 0.001, 1000]))
    assert parse("ATTRS.k <> 'it''s' And Workflow = \"a\"\"b\"").filter == (
        "and", [("cmp", "attrs.k", "!=", "it's"), ("cmp", "workflow", "=", 'a"b')])
    assert parse("attrs.order-id = 1 and attrs.andy = 2").filter == (
        "and", [("cmp", "attrs.order-id", "=", 1), ("cmp", "attrs.andy", "=", 2)])
    assert parse("started_at >= '2026-11-01T01:00:00+01:00'").filter == (
        "cmp", "started_at", ">=", 1_793_491_200_000)
    assert parse("((workflow = 'a'))").filter == ("cmp", "workflow", "=", "a")


def test_now_takes_a_signed_duration() -> None:
    assert parse("started_at > now() - 1h").filter == ("cmp", "started_at", ">", Now(-3_600_000))
    assert parse("started_at > now()-30m").filter == ("cmp", "started_at", ">", Now(-1_800_000))
    assert parse("ended_at < NOW() + 2d").filter == ("cmp", "ended_at", "<", Now(2 * 86_400_000))
    assert parse("ended_at < now()").filter == ("cmp", "ended_at", "<", Now(0))
    assert parse("started_at in (now(), now() - 1h30m)").filter == (
        "in", "started_at", [Now(0), Now(-5_400_000)])


def test_order_by_ends_a_query() -> None:
    q = parse("status = 'failed' order by started_at desc")
    assert q.filter == ("cmp", "status", "=", "failed")
    assert q.order == (SortKey("started_at", descending=True),) and q.order_at == 18
    q = parse("ORDER BY attrs.Tier DESC, Workflow asc, workflow_id")
    assert q.filter is None and q.order_at == 0
    assert q.order == (SortKey("attrs.Tier", True), SortKey("workflow"), SortKey("workflow_id"))
    assert split_order("shard = 1 or shard = 2 order by run_id") == ("shard = 1 or shard = 2", "order by run_id")
    assert split_order("attrs.order = 1") == ("attrs.order = 1", "")
    assert split_order("nonsense (") == ("nonsense (", "")


@pytest.mark.parametrize(("where", "position", "says"), [
    ("workflow = ", 11, "expected a value ('text', a number, true, false, null or now()), found the end"),
    ("workflow = 'a' and", 18, "expected a field (workflow_id, workflow, status"),
    ("status in ('running' 'ok')", 21, "expected ')' or ',', found \"'ok')\""),
    ("workflow = 'a')", 14, "expected 'and', 'or', 'order by' or the end of the query, found ')'"),
    ("(workflow = 'a'", 15, "expected ')', found the end of the query"),
    ("workflow ~ 'a'", 9, "unexpected character '~': expected a comparison (=, !=, <, <=, >, >=, in, not in)"),
    ("attrs.x = 'open", 10, "unterminated string: close it with '"),
    ("colour = 'red'", 0, "unknown field 'colour': use workflow_id, workflow, status, run_id, shard, "
                          "started_at, ended_at or attrs.<key>"),
    ("attrs. = 1", 0, "attrs. needs a key"),
    ("shard = 'one'", 8, "shard compares with a whole number"),
    ("workflow = 1", 11, "workflow compares with text in quotes"),
    ("started_at > 3", 13, "started_at compares with an ISO time"),
    ("started_at > 'yesterday'", 13, "'yesterday' is not an ISO 8601 time"),
    ("started_at > now() 1h", 19, "expected '-' or '+' and a duration"),
    ("started_at > now() - 'x'", 21, "expected a duration after now() - (such as 15m, 1h or 2d)"),
    ("started_at > now() - -1h", 21, "write one sign: now() - 1h"),
    ("started_at > now() - 1y", 21, "'1y' is not a number nor a duration"),
    ("started_at > now(1)", 17, "expected ')': now() takes nothing"),
    ("started_at > 1h", 13, "a duration is compared only as now() - 1h"),
    ("workflow = now()", 11, "now() compares only with started_at or ended_at"),
    ("status = 'ok' order", 19, "expected 'by'"),
    ("status = 'ok' order by", 22, "expected a field"),
    ("order by status up", 16, "expected ',', asc or desc or the end of the query, found 'up'"),
    ("order by status, status", 17, "order by names status twice"),
    ("order by colour", 9, "unknown field 'colour'"),
    ("order by shard and shard = 1", 15, "expected ',', asc or desc or the end of the query"),
    ("", 0, "the query is empty: pass where=None"),
    ("  ", 0, "the query is empty"),
])
def test_mistakes_name_their_position_and_what_was_expected(where: str, position: int, says: str) -> None:
    with pytest.raises(fusee.InvalidQuery) as e:
        parse(where)
    assert e.value.position == position, str(e.value)
    assert says in str(e.value)
    assert str(e.value).startswith(f"invalid query at position {position} ")


def test_an_unknown_status_names_the_known_ones() -> None:
    with pytest.raises(fusee.UnknownStatus) as e:
        parse("status in ('ok', 'Paused', 'done')")
    assert e.value.status == "done" and e.value.position == 27 and e.value.known == query_grammar.STATUSES
    assert "use one of running, retrying, paused, stuck, ok, failed, cancelled, timed_out, terminated" in str(e.value)


def test_nesting_is_bounded_without_recursion() -> None:
    parse("(" * MAX_DEPTH + "workflow = 'a'" + ")" * MAX_DEPTH)
    parse("not " * MAX_DEPTH + "workflow = 'a'")
    for deep in ("(" * 5000 + "workflow = 'a'" + ")" * 5000, "not " * 5000 + "workflow = 'a'"):
        with pytest.raises(fusee.InvalidQuery, match=f"deeper than {MAX_DEPTH}") as e:
            parse(deep)
        assert 0 < e.value.position < len(deep)


def test_where_must_be_text() -> None:
    with pytest.raises(TypeError, match="where= takes a query string"):
        parse(b"status = 'ok'")  # type: ignore[arg-type]
