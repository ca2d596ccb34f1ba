"""Keyed objects: exclusive and shared handlers, call IDs answered once, operators' edits."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import fusee


@dataclasses.dataclass
class Cart:
    items: list[str] = dataclasses.field(default_factory=list)


cart = fusee.object("cart", state=Cart, calls_per_run=3)
#: What handlers' step functions saw, in order: ("in"/"out", kind, call) per handler.
TRACE: list[tuple[str, str, str]] = []
#: Shared handlers wait here until the test lets them go (proves they run together).
GATE: dict[str, asyncio.Event] = {}
RAN: list[str] = []


async def mark(what: str, kind: str, tag: str) -> None:
    TRACE.append((what, kind, tag))
    ev = GATE.get(tag)
    if ev is not None and what == "in":
        await ev.wait()


@cart.exclusive
async def add(ctx: fusee.ObjectCtx[Cart], item: str) -> int:
    await ctx.step("in", mark, "in", "x", item)
    RAN.append(item)
    state = ctx.state
    state.items.append(item)
    ctx.set_state(state)
    await ctx.step("out", mark, "out", "x", item)
    return len(state.items)


@cart.shared
async def peek(ctx: fusee.ObjectCtx[Cart], tag: str) -> list[str]:
    await ctx.step("in", mark, "in", "s", tag)
    seen = ctx.state.items
    await ctx.step("out", mark, "out", "s", tag)
    return seen


@cart.shared
async def sneaky(ctx: fusee.ObjectCtx[Cart]) -> None:
    ctx.set_state(Cart(["stolen"]))


@cart.exclusive
async def boom(ctx: fusee.ObjectCtx[Cart], n: int) -> int:
    RAN.append(f"boom{n}")
    ctx.set_state(Cart(["half-done"]))
    raise ValueError(f"no {n}")


@pytest.fixture(autouse=True)
def _clean() -> None:
    TRACE.clear()
    GATE.clear()
    RAN.clear()


def check_discipline(trace: list[tuple[str, str, str]]) -> None:
    """Exclusive handlers alone; shared ones only beside shared ones."""
    inside: dict[str, str] = {}
    for what, kind, tag in trace:
        if what == "in":
            if kind == "x":
                assert not inside, f"exclusive {tag} entered beside {inside}"
            else:
                assert "x" not in inside.values(), f"shared {tag} entered beside {inside}"
            inside[tag] = kind
        else:
            del inside[tag]


async def test_exclusive_in_arrival_order_shared_together_never_beside_exclusive() -> None:
    async with fusee.Engine.open(workflows=[cart]) as engine:
        for t in ("s1", "s2", "s3"):
            GATE[t] = asyncio.Event()
        calls = [
            engine.call(add, "k", "a"),
            engine.call(peek, "k", "s1"),
            engine.call(peek, "k", "s2"),
            engine.call(peek, "k", "s3"),
            engine.call(add, "k", "b"),
            engine.call(add, "k", "c"),
        ]
        tasks = [asyncio.ensure_future(c) for c in calls]
        # All three shared handlers are inside at once (each waits for the test).
        while sum(1 for w, k, _ in TRACE if w == "in" and k == "s") < 3:
            await asyncio.sleep(0.001)
        assert not tasks[4].done()
        for ev in GATE.values():
            ev.set()
        results = await asyncio.gather(*tasks)
        assert results == [1, ["a"], ["a"], ["a"], 2, 3]
        assert RAN == ["a", "b", "c"]
        check_discipline(TRACE)
        got = await engine.object_state(cart, "k")
        assert got.value == Cart(["a", "b", "c"]) and got.version == 3


async def test_a_call_id_is_answered_once_also_after_continue_as_new(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[cart]) as engine:
        first = await engine.call(add, "k", "a", call_id="c-a")
        for i in range(7):  # calls_per_run=3: the key's run continues as new twice
            await engine.call(add, "k", f"x{i}", call_id=f"c-{i}")
        assert await engine.call(add, "k", "a", call_id="c-a") == first == 1
        assert await engine.call(add, "k", "x0", call_id="c-0") == 2
        assert RAN.count("a") == 1 and RAN.count("x0") == 1
        with pytest.raises(fusee.ObjectCallFailed) as e:
            await engine.call(boom, "k", 1, call_id="b-1")
        assert e.value.type_name == "ValueError" and e.value.error_message == "no 1"
        with pytest.raises(fusee.ObjectCallFailed):
            await engine.call(boom, "k", 1, call_id="b-1")
        assert RAN.count("boom1") == 1
        # A handler that raised left the state as it found it.
        assert (await engine.object_state(cart, "k")).version == 8
    RAN.clear()
    # Reopened: the same answers, no handler runs again, the state is kept.
    async with fusee.Engine.open(tmp_path, workflows=[cart]) as engine:
        assert await engine.call(add, "k", "a", call_id="c-a") == 1
        assert await engine.call(add, "k", "x6", call_id="c-6") == 8
        with pytest.raises(fusee.ObjectCallFailed):
            await engine.call(boom, "k", 1, call_id="b-1")
        assert RAN == []
        state = await engine.object_state(cart, "k")
        assert state.value.items == ["a", *(f"x{i}" for i in range(7))]
        assert state.version == 8
        assert engine.describe("@cart/k").status == "running"


async def test_shared_handlers_cannot_write_and_bad_input_is_refused() -> None:
    async with fusee.Engine.open(workflows=[cart]) as engine:
        with pytest.raises(fusee.ObjectCallFailed) as e:
            await engine.call(sneaky, "k")
        assert e.value.type_name == "ObjectStateReadOnly"
        assert (await engine.object_state(cart, "k")).value == Cart()
        with pytest.raises(fusee.SerializationError):
            await engine.call(add, "k", 5)  # the handler takes a str: nothing recorded
        with pytest.raises(TypeError):
            await engine.call(add, "", "a")
        with pytest.raises(TypeError):
            await engine.call(sneaky, "k", "unexpected")
        other = fusee.object("other")

        @other.exclusive
        async def noop(ctx: fusee.ObjectCtx[Any]) -> None:
            return None

        with pytest.raises(fusee.UnknownWorkflow, match="not registered"):
            await engine.call(noop, "k")
        with pytest.raises(TypeError):
            add(None, "a")


async def test_operators_read_set_clear_and_patch_with_versions() -> None:
    async with fusee.Engine.open(workflows=[cart]) as engine:
        fresh = await engine.object_state(cart, "nobody")
        assert fresh == fusee.ObjectState(Cart(), 0)
        await engine.call(add, "k", "a")
        state = await engine.object_state(cart, "k")
        assert state.version == 1
        assert await engine.set_object_state(cart, "k", Cart(["z"]), if_version=1) == 2
        with pytest.raises(fusee.ObjectVersionConflict) as conflict:
            await engine.set_object_state(cart, "k", Cart(["y"]), if_version=1)
        assert conflict.value.expected == 1 and conflict.value.actual == 2
        v = await engine.patch_object_state(cart, "k", [{"op": "add", "path": "/items/-", "value": "q"}], if_version=2)
        assert v == 3
        assert (await engine.object_state(cart, "k")).value == Cart(["z", "q"])
        # A patch that does not apply, or leaves no Cart, changes nothing.
        with pytest.raises(fusee.ObjectCallFailed):
            await engine.patch_object_state(cart, "k", [{"op": "remove", "path": "/missing"}])
        with pytest.raises(fusee.ObjectCallFailed):
            await engine.patch_object_state(cart, "k", [{"op": "replace", "path": "/items", "value": 7}])
        with pytest.raises(ValueError, match="JSON Patch"):
            await engine.patch_object_state(cart, "k", [{"op": "frobnicate"}])
        with pytest.raises(fusee.SerializationError):
            await engine.set_object_state(cart, "k", {"items": 3})  # type: ignore[arg-type]
        assert await engine.object_state(cart, "k") == fusee.ObjectState(Cart(["z", "q"]), 3)
        assert await engine.clear_object_state(cart, "k") == 4
        assert await engine.object_state(cart, "k") == fusee.ObjectState(Cart(), 4)
        # Handlers see what operators wrote.
        assert await engine.call(add, "k", "b") == 1


async def test_generic_alias_states_start_from_their_origin_type() -> None:
    # Declared here, not at import: before the fix the declaration itself raised (issue 22, finding 5).
    tags = fusee.object("tags", state=list[str])
    counts = fusee.object("counts", state=dict[str, int])

    @tags.exclusive
    async def tag(ctx: fusee.ObjectCtx[list[str]], t: str) -> list[str]:
        ctx.set_state([*ctx.state, t])
        return ctx.state

    @counts.exclusive
    async def bump(ctx: fusee.ObjectCtx[dict[str, int]], k: str) -> int:
        state = dict(ctx.state)
        state[k] = state.get(k, 0) + 1
        ctx.set_state(state)
        return state[k]

    async with fusee.Engine.open(None, workflows=[tags, counts]) as engine:
        assert (await engine.object_state(tags, "a")).value == []
        assert await engine.call(tag, "a", "red") == ["red"]
        assert await engine.call(tag, "a", "blue") == ["red", "blue"]
        assert (await engine.object_state(counts, "a")).value == {}
        assert await engine.call(bump, "a", "x") == 1
        assert await engine.call(bump, "a", "x") == 2
    # A generic alias whose origin cannot be called (an abstract type) starts from None, as before.
    import collections.abc

    seq = fusee.object("seq", state=collections.abc.Sequence[str] | None)
    assert seq.initial_json is None
