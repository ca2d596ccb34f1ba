"""The codec: every supported kind round-trips by annotation; failures say what and where."""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.util
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple, TypedDict

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusee.codec import (
    Codec,
    ErrorInfo,
    decode,
    decode_error,
    encode,
    encode_error,
    type_hints_of,
)
from fusee.errors import RecordedError, SerializationError, StepFailed, WorkflowFailed


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Line:
    sku: str
    qty: int
    price: Decimal


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    lines: list[Line]
    placed: datetime
    color: Color = Color.RED
    note: str | None = None


class Address(TypedDict):
    street: str
    zip: int


class Point(NamedTuple):
    x: float
    y: float


class Receipt(msgspec.Struct, frozen=True):
    order: uuid.UUID
    total: Decimal
    tags: frozenset[str] = frozenset()
    level: Level = Level.LOW


ORDER = Order(
    id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    lines=[Line("a", 2, Decimal("9.99")), Line("b", 1, Decimal("0.01"))],
    placed=datetime(2024, 5, 17, 12, 30, 15, 250_000, tzinfo=UTC),
    color=Color.BLUE,
)


@pytest.mark.parametrize(
    ("value", "tp"),
    [
        (None, type(None)),
        (True, bool),
        (42, int),
        (-1.25, float),
        ("héllo", str),
        ([1, 2, 3], list[int]),
        ({"a": [1.5, None]}, dict[str, list[float | None]]),
        ((1, "x"), tuple[int, str]),
        ({3, 1, 2}, set[int]),
        (b"\x00\xffbytes", bytes),
        (ORDER, Order),
        ([ORDER, ORDER], list[Order]),
        ({"street": "Main", "zip": 1000}, Address),
        (Point(1.0, 2.5), Point),
        (Receipt(ORDER.id, Decimal("10.00"), frozenset({"x"}), Level.HIGH), Receipt),
        (Color.RED, Color),
        (Level.HIGH, Level),
        (datetime(2024, 1, 2, 3, 4, 5), datetime),
        (date(2024, 2, 29), date),
        (timedelta(hours=1, microseconds=5), timedelta),
        (uuid.UUID(int=7), uuid.UUID),
        (Decimal("3.14159"), Decimal),
        (ORDER, Order | None),
        (None, Order | None),
    ],
)
def test_round_trip_by_annotation(value: object, tp: object) -> None:
    data = encode(value)
    assert isinstance(data, bytes)
    back = decode(data, tp)
    assert back == value
    assert type(back) is type(value)


def test_untyped_decode_gives_plain_json() -> None:
    assert decode(encode(ORDER)) == {
        "id": "12345678-1234-5678-1234-567812345678",
        "lines": [{"sku": "a", "qty": 2, "price": "9.99"}, {"sku": "b", "qty": 1, "price": "0.01"}],
        "placed": "2024-05-17T12:30:15.250000Z",
        "color": "blue",
        "note": None,
    }
    assert decode(memoryview(encode([1])), Any) == [1]
    assert decode(bytearray(b"[1]"), list[int]) == [1]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_json_values_round_trip(value: object) -> None:
    assert decode(encode(value)) == value


class Opaque:
    pass


def test_unsupported_values_are_refused_naming_the_type() -> None:
    for bad in (Opaque(), {"nested": [Opaque()]}, lambda: 1, 1 + 2j):
        with pytest.raises(SerializationError) as caught:
            encode(bad)
        message = str(caught.value)
        assert "cannot encode a value of type" in message
        assert "dataclasses" in message  # says what is supported
    assert isinstance(caught.value, TypeError)


@pytest.mark.parametrize(
    ("data", "tp", "needles"),
    [
        (b'"x"', int, ["int", "Expected `int`, got `str`"]),
        (b'{"sku": "a", "qty": "two", "price": "1"}', Line, ["Line", "$.qty"]),
        (b'{"id": "not-a-uuid", "lines": [], "placed": "2024-01-01T00:00:00Z"}', Order, ["Order", "$.id"]),
        (b'[{"street": "Main"}]', list[Address], ["Address", "zip", "$[0]"]),
        (b'"green"', Color, ["Color", "green"]),
        (b"{not json", dict[str, int], ["JSON"]),
        (b"{not json", Any, ["JSON"]),
        (b"{}", Opaque, ["Opaque", "not a supported type"]),
    ],
)
def test_wrong_shapes_name_the_type_and_field(data: bytes, tp: object, needles: list[str]) -> None:
    with pytest.raises(SerializationError) as caught:
        decode(data, tp)
    for needle in needles:
        assert needle in str(caught.value)


def test_unsupported_annotation_is_refused() -> None:
    with pytest.raises(SerializationError, match="cannot decode values of type"):
        decode(b"1", "int")


def test_codec_instances_cache_decoders() -> None:
    codec = Codec()
    assert codec.decode(codec.encode(ORDER), Order) == ORDER
    assert codec.decode(codec.encode(ORDER), Order) == ORDER
    assert list(codec._decoders) == [Order]


# --- annotations ----------------------------------------------------------------


async def checkout(ctx: object, order: Order, rush: bool = False, *, note: str = "") -> Receipt:
    raise NotImplementedError


def untyped(a, b):  # type: ignore[no-untyped-def]
    return a


class Pricing:
    def quote(self, order: Order) -> Decimal:
        raise NotImplementedError

    def __call__(self, line: Line) -> None:
        raise NotImplementedError


def unresolvable(x: Missing) -> int:  # type: ignore[name-defined]  # noqa: F821
    return 0


def test_type_hints_resolve_string_annotations() -> None:
    assert type_hints_of(checkout) == ([object, Order, bool], Receipt)
    assert type_hints_of(untyped) == ([Any, Any], Any)
    assert type_hints_of(Pricing().quote) == ([Order], Decimal)
    assert type_hints_of(Pricing()) == ([Line], type(None))
    assert type_hints_of(functools.partial(checkout, None)) == ([Order, bool], Receipt)
    assert type_hints_of(lambda: 1) == ([], Any)
    with pytest.raises(SerializationError, match="Missing"):
        type_hints_of(unresolvable)


def test_hints_drive_decoding() -> None:
    params, result = type_hints_of(checkout)
    assert decode(encode(ORDER), params[1]) == ORDER
    receipt = Receipt(ORDER.id, Decimal("10"))
    assert decode(encode(receipt), result) == receipt


# --- errors -----------------------------------------------------------------------


class PaymentDeclined(Exception):
    pass


def _raise_declined() -> None:
    raise PaymentDeclined("card 4242 declined")


def test_errors_are_recorded_as_data() -> None:
    try:
        _raise_declined()
    except PaymentDeclined as exc:
        data = encode_error(exc)
        bare = encode_error(exc, traceback=False)
    info = decode_error(data)
    assert info.type == "PaymentDeclined"
    assert info.module == __name__
    assert info.message == "card 4242 declined"
    assert info.traceback is not None and "_raise_declined" in info.traceback
    assert decode_error(bare).traceback is None
    assert info.summary == f"{__name__}.PaymentDeclined: card 4242 declined"
    assert decode_error(encode_error(ValueError("x"))).summary == "ValueError: x"


def test_recorded_errors_become_step_and_workflow_failures() -> None:
    info = ErrorInfo(type="KeyError", module="builtins", message="'sku'", traceback="Traceback ...\nKeyError: 'sku'")
    step = info.step_failed("charge")
    assert isinstance(step, StepFailed)
    assert step.step == "charge" and step.error_type == "KeyError"
    assert str(step) == "step 'charge' failed: KeyError: 'sku'"
    cause = step.__cause__
    assert isinstance(cause, RecordedError) and cause.type_name == "KeyError"
    assert "Recorded traceback" in str(cause)
    failed = info.workflow_failed("order-1")
    assert isinstance(failed, WorkflowFailed)
    assert failed.cause == info and failed.status == "failed"
    assert str(failed) == "workflow 'order-1' failed: KeyError: 'sku'"


def test_long_tracebacks_are_truncated_and_bad_bytes_refused() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("bottom")
        deep(n - 1)

    try:
        deep(300)
    except RuntimeError as exc:
        info = ErrorInfo.from_exception(exc)
    assert info.traceback is not None and len(info.traceback) <= 16_010
    assert info.traceback.rstrip().endswith("RuntimeError: bottom")
    with pytest.raises(SerializationError, match="recorded error"):
        decode_error(b'{"type": 1}')


if importlib.util.find_spec("pydantic") is not None:
    import pydantic

    # Module level: string annotations resolve against module globals.
    class Item(pydantic.BaseModel):
        name: str
        qty: int = 1

    @dataclasses.dataclass
    class Cart:
        items: list[Item]
        when: datetime


def test_pydantic_models_round_trip() -> None:
    pytest.importorskip("pydantic")
    value = Item(name="pen", qty=3)
    assert decode(encode(value), Item) == value
    cart = Cart([value, Item(name="ink")], ORDER.placed)
    assert decode(encode(cart), Cart) == cart
    assert decode(encode([value]), list[Item]) == [value]
    with pytest.raises(SerializationError, match=r"qty[\s\S]*\$\.items\[0\]"):
        decode(b'{"items": [{"name": "pen", "qty": "many"}], "when": "2024-01-01T00:00:00Z"}', Cart)


# --- convert: checked before recording ------------------------------------------


def test_convert_checks_against_the_declared_type() -> None:
    from fusee.codec import convert

    assert decode(convert(ORDER, Order, what="v", declare="{type}"), Order) == ORDER
    assert convert(3, float, what="v", declare="{type}") == b"3"
    for value, tp in (("5", int), (True, int), ({"sku": "a"}, Line), (1, type(None))):
        with pytest.raises(SerializationError, match=r"the value does not convert to its declared type"):
            convert(value, tp, what="the value", declare="{type}")


@pytest.mark.parametrize(
    "value",
    [None, True, 1, 2**70, -0.5, "s", [1, [2, {"a": None}]], {"k": {"n": [1.5, "x"]}}],
)
def test_convert_accepts_plain_json_where_nothing_is_declared(value: object) -> None:
    from fusee.codec import convert

    data = convert(value, Any, what="v", declare="{type}")
    assert decode(data) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"x", "is bytes, which would come back as str: .*declare bytes"),
        ((1,), "is tuple, which would come back as list"),
        ({1, 2}, "is set, which would come back as list"),
        (frozenset(), "is frozenset"),
        (Color.RED, "is tests.test_codec.Color|Color, which would come back as str"),
        (Level.LOW, "Level, which would come back as int"),
        (ORDER, "Order, which would come back as dict"),
        (Point(1, 2), "Point, which would come back as list"),
        (Decimal("1"), "Decimal, which would come back as str"),
        ([1, {"a": uuid.UUID(int=1)}], r"holds uuid.UUID at \[1\]\['a'\].*declare list\[\.\.\.\]"),
        ({1: "a"}, r"holds int at \[1\] \(a key\), which would come back as str"),
        (float("nan"), "JSON has no NaN"),
        ([float("inf")], r"cannot encode inf"),
    ],
)
def test_convert_refuses_untyped_values_that_would_change_type(value: object, message: str) -> None:
    from fusee.codec import convert

    with pytest.raises(SerializationError, match=message):
        convert(value, Any, what="the value", declare="declare {type}")


class _Priced:
    def __call__(self, info: NotImported) -> Decimal:  # type: ignore[name-defined] # noqa: F821
        return Decimal(1)

    def method(self, x: int) -> Point:
        return Point(x, x)


def _quote(info: NotImported, n: int) -> Line:  # type: ignore[name-defined] # noqa: F821
    return Line("a", n, Decimal(1))


def test_return_type_of_sees_through_wrappers_and_unresolvable_parameters() -> None:
    from fusee.codec import return_type_of

    assert return_type_of(_quote) is Line  # the parameter's annotation does not resolve
    assert return_type_of(functools.partial(_quote, None)) is Line
    assert return_type_of(_Priced()) is Decimal
    assert return_type_of(_Priced().method) is Point
    assert return_type_of(lambda: 1) is Any
    assert return_type_of(Point) is Any
