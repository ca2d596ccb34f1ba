"""Values JSON cannot carry faithfully are refused when encoded: NaN and infinities, and deep nesting."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

import fusee
from fusee import codec
from fusee.errors import SerializationError


def nest(depth: int) -> list[object]:
    top: list[object] = []
    cur = top
    for _ in range(depth - 1):
        nxt: list[object] = []
        cur.append(nxt)
        cur = nxt
    return top


@dataclasses.dataclass
class Reading:
    value: float


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1.0, {"a": math.nan}], Reading(math.inf),
                                   float("1e400")])
def test_non_finite_floats_are_refused_not_turned_into_none(value: object) -> None:
    with pytest.raises(SerializationError, match="no NaN or infinity"):
        codec.encode(value)


def test_none_and_finite_floats_still_round_trip() -> None:
    for value in (None, [None, 1.5, -0.0], {"x": None, "y": 1e308}):
        assert codec.decode(codec.encode(value)) == value


def test_nesting_is_limited_at_encode_so_every_recorded_value_decodes() -> None:
    assert codec.decode(codec.encode(nest(codec.MAX_DEPTH))) == nest(codec.MAX_DEPTH)
    for depth in (codec.MAX_DEPTH + 1, 980, 5000):
        with pytest.raises(SerializationError, match="nested deeper"):
            codec.encode(nest(depth))
    # Brackets inside strings are not nesting.
    assert codec.encode({"s": "[{" * 1000}).startswith(b'{"s":')


def test_decoding_deep_bytes_is_a_serialization_error() -> None:
    with pytest.raises(SerializationError):
        codec.decode(b"[" * 5000 + b"]" * 5000)


@fusee.workflow("echo")
async def echo(ctx: fusee.Ctx, value: object) -> object:
    return value


def test_the_engine_refuses_such_inputs_before_recording_anything() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[echo]) as engine:
            for bad in (math.nan, nest(1000)):
                with pytest.raises(SerializationError):
                    await engine.start(echo, "e", bad)
                assert engine.runs() == []
            assert await engine.execute(echo, "e", [1.5]) == [1.5]

    asyncio.run(main())
