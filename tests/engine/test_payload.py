"""Payload types, ended runs and periodic checkpoints, through the public API (issue 9)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import uuid
from typing import Any

import pydantic
import pytest

import fusee
from tests.helpers import until


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@fusee.workflow("count-steps")
async def count_steps(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step("add", (lambda v: lambda: v)(i))
    return total


# --- checkpoint_interval ------------------------------------------------------


def test_checkpoint_interval_checkpoints_on_a_timer(tmp_path: Any) -> None:
    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[count_steps], checkpoint_interval=0.01) as engine:
            assert engine.stats["checkpoints"] == 0
            assert await engine.execute(count_steps, "c-1", 5) == 10
            # No checkpoint_every was reached and nobody asked: the timer wrote it.
            await until(lambda: engine.stats["checkpoints"] >= 1)

    run(main())


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1s", True])
def test_checkpoint_interval_must_be_positive_seconds(bad: Any) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="checkpoint_interval"):
            await fusee.Engine.open(workflows=[count_steps], checkpoint_interval=bad)

    run(main())


def test_every_engine_knob_of_the_simulator_is_an_engine_option() -> None:
    import inspect

    from fusee.sim.config import SimConfig

    # The world hands Engine.open only the options it accepts: a knob it does
    # not know would be dropped silently (as checkpoint_interval_ms once was).
    accepted = set(inspect.signature(fusee.Engine.open).parameters)
    assert set(SimConfig.for_seed(0).engine_options()) <= accepted


def test_the_simulators_checkpoint_interval_reaches_the_engine() -> None:
    from fusee.sim.config import SimConfig
    from fusee.sim.world import run_seed

    cfg = dataclasses.replace(SimConfig.for_seed(4), checkpoint_every=1_000_000, checkpoint_interval_ms=20)
    assert run_seed(cfg.seed, config=cfg).report.checkpoints > 0


# --- typed payloads are checked before anything is recorded (finding 4) --------

go = fusee.signal("go", int)
bump = fusee.update("bump", int)


@fusee.workflow("typed-waiter")
async def typed_waiter(ctx: fusee.Ctx, start: int) -> int:
    total = start

    def add(n: int) -> int:
        nonlocal total
        total += n
        return total

    ctx.on_update(bump, add)
    got = await ctx.wait_for(go)
    assert isinstance(got, int)
    return total + got


async def _records(engine: fusee.Engine, wid: str) -> int:
    return len(await engine.journal(wid))


def test_wrongly_typed_signal_is_refused_and_the_run_lives_on() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[typed_waiter]) as engine:
            h = await engine.start(typed_waiter, "tw-1", 1)
            before = await _records(engine, "tw-1")
            with pytest.raises(fusee.SerializationError, match=r"signal 'go'.*int") as caught:
                await engine.signal("tw-1", go, "x")
            assert isinstance(caught.value, TypeError)
            with pytest.raises(TypeError):
                await h.signal(go, True)  # a bool is not an int either (strict conversion)
            assert await _records(engine, "tw-1") == before  # nothing was recorded
            assert engine.describe("tw-1").status == "running"
            await h.signal(go, 41)
            assert await h.result() == 42

    run(main())


def test_wrongly_typed_start_input_is_refused_before_recording() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[typed_waiter]) as engine:
            with pytest.raises(fusee.SerializationError, match=r"input of workflow 'typed-waiter'.*int"):
                await engine.start(typed_waiter, "tw-2", "five")
            with pytest.raises(fusee.NotFound):
                engine.get("tw-2")  # no run was recorded under the ID
            h = await engine.start(typed_waiter, "tw-2", 5)
            await h.signal(go, 1)
            assert await h.result() == 6

    run(main())


def test_wrongly_typed_update_argument_is_refused_before_recording() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[typed_waiter]) as engine:
            h = await engine.start(typed_waiter, "tw-3", 0)
            before = await _records(engine, "tw-3")
            with pytest.raises(fusee.SerializationError, match=r"argument of update 'bump'.*int"):
                await h.update(bump, "ten")
            assert await _records(engine, "tw-3") == before
            assert await h.update(bump, 10) == 10
            await h.signal(go, 1)
            assert await h.result() == 11

    run(main())


@fusee.workflow("typed-child")
async def typed_child(ctx: fusee.Ctx, n: int) -> int:
    return n * 2


@fusee.workflow("typed-parent")
async def typed_parent(ctx: fusee.Ctx, target: str) -> list[str]:
    refused: list[str] = []
    try:
        await ctx.signal_workflow(target, go, "not an int")
    except fusee.SerializationError as e:
        refused.append(str(e))
    try:
        await ctx.child(typed_child, "tc-bad", "not an int")
    except fusee.SerializationError as e:
        refused.append(str(e))
    refused.append(str(await ctx.child(typed_child, "tc-good", 21)))
    await ctx.signal_workflow(target, go, 2)
    return refused


def test_workflow_code_sending_wrong_types_is_refused_at_the_call() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[typed_waiter, typed_parent, typed_child]) as engine:
            target = await engine.start(typed_waiter, "tw-4", 1)
            refused = await engine.execute(typed_parent, "tp-1", "tw-4")
            assert "signal 'go'" in refused[0] and "input of workflow 'typed-child'" in refused[1]
            assert refused[2] == "42"
            with pytest.raises(fusee.NotFound):
                engine.get("tc-bad")  # the refused child never started
            assert await target.result() == 3  # only the good signal arrived

    run(main())


# --- values keep their type, live and on replay (finding 11) ------------------


class Money(pydantic.BaseModel):
    currency: str
    cents: int


@dataclasses.dataclass
class Parcel:
    weight: decimal.Decimal
    sent: datetime.datetime


#: (replaying?, step name, type of the value the code got), across engine lives.
SEEN: list[tuple[bool, str, type]] = []
release = fusee.signal("release")

TYPED_STEPS: list[tuple[str, Any, Any]] = [
    ("bytes", lambda: b"\x00\xff", bytes),
    ("tuple", lambda: (1, "a"), tuple[int, str]),
    ("datetime", lambda: datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC), datetime.datetime),
    ("uuid", lambda: uuid.UUID(int=7), uuid.UUID),
    ("decimal", lambda: decimal.Decimal("1.10"), decimal.Decimal),
    ("set", lambda: {3, 1}, set[int]),
    ("pydantic", lambda: Money(currency="EUR", cents=5), Money),
    ("dataclass", lambda: Parcel(decimal.Decimal("2.5"), datetime.datetime(2026, 1, 1)), Parcel),
]


MONEY_CALLS: list[int] = []


def _money() -> Money:
    MONEY_CALLS.append(1)
    return Money(currency="USD", cents=1)


@fusee.workflow("typed-values")
async def typed_values(ctx: fusee.Ctx) -> list[str]:
    values = []
    for name, fn, tp in TYPED_STEPS:
        values.append(await ctx.step(name, fn, result_type=tp))
    values.append(await ctx.step("annotated", _money))  # the function's annotation types it
    for (name, _, _), v in zip([*TYPED_STEPS, ("annotated", None, None)], values, strict=True):
        SEEN.append((ctx.is_replaying, name, type(v)))
    await ctx.wait_for(release)
    return [repr(v) for v in values]


def test_values_keep_their_type_live_and_after_a_reopen(tmp_path: Any) -> None:
    SEEN.clear()
    MONEY_CALLS.clear()

    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[typed_values]) as engine:
            await engine.start(typed_values, "tv-1")
            await until(lambda: len(SEEN) == len(TYPED_STEPS) + 1)
        live = list(SEEN)
        assert not any(replaying for replaying, _, _ in live)
        SEEN.clear()
        async with fusee.Engine.open(tmp_path, workflows=[typed_values]) as engine:
            await engine.signal("tv-1", release)  # wakes the run: its code replays the journal
            result = await engine.get("tv-1").result()
        replayed = list(SEEN)
        assert [(name, tp) for _, name, tp in replayed] == [(name, tp) for _, name, tp in live]
        assert dict((name, tp) for _, name, tp in live) == {
            "bytes": bytes, "tuple": tuple, "datetime": datetime.datetime, "uuid": uuid.UUID,
            "decimal": decimal.Decimal, "set": set, "pydantic": Money, "dataclass": Parcel,
            "annotated": Money,
        }
        assert result[0] == repr(b"\x00\xff") and result[1] == repr((1, "a"))
        assert len(MONEY_CALLS) == 1  # the second life replayed the recorded values

    run(main())


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (b"raw", "bytes, which would come back as str"),
        ((1, 2), "tuple, which would come back as list"),
        (Money(currency="EUR", cents=1), "Money, which would come back as dict"),
        (Parcel(decimal.Decimal(1), datetime.datetime(2026, 1, 1)), "Parcel, which would come back as dict"),
        ({"when": uuid.UUID(int=1)}, "holds uuid.UUID at ['when'], which would come back as str"),
    ],
)
def test_an_untyped_step_result_that_would_change_type_says_to_declare_it(value: Any, shown: str) -> None:
    @fusee.workflow("untyped-step")
    async def untyped_step(ctx: fusee.Ctx) -> str:
        try:
            await ctx.step("fetch", lambda: value)
        except fusee.StepFailed as e:
            return str(e)
        return "no error"

    async def main() -> None:
        async with fusee.Engine.open(workflows=[untyped_step]) as engine:
            message = await engine.execute(untyped_step, "us-1")
            assert shown in message and "result_type=" in message and "step 'fetch'" in message

    run(main())


def test_an_untyped_workflow_result_that_would_change_type_fails_the_run_clearly() -> None:
    @fusee.workflow("untyped-result")
    async def untyped_result(ctx):  # type: ignore[no-untyped-def]
        return (1, 2)

    async def main() -> None:
        async with fusee.Engine.open(workflows=[untyped_result]) as engine:
            with pytest.raises(fusee.WorkflowFailed, match=r"result of workflow 'untyped-result' is tuple.*-> tuple"):
                await engine.execute(untyped_result, "ur-1")

    run(main())


def test_untyped_signals_carry_only_plain_json() -> None:
    note = fusee.signal("note")

    @fusee.workflow("noted")
    async def noted(ctx: fusee.Ctx) -> Any:
        return await ctx.wait_for(note)

    async def main() -> None:
        async with fusee.Engine.open(workflows=[noted]) as engine:
            h = await engine.start(noted, "n-1")
            with pytest.raises(fusee.SerializationError, match=r"fusee\.signal\('note', bytes\)"):
                await h.signal(note, b"x")
            await h.signal(note, {"plain": [1, "json"]})
            assert await h.result() == {"plain": [1, "json"]}

    run(main())


# --- ended runs: WorkflowEnded, and queries answered during retention ----------

progress_q = fusee.query("progress")
finish = fusee.signal("finish", int)
STEP_CALLS: list[str] = []


@fusee.workflow("tracked")
async def tracked(ctx: fusee.Ctx, n: int) -> int:
    done: list[int] = []
    ctx.on_query(progress_q, lambda: {"done": list(done), "at": len(done)})
    for i in range(n):
        done.append(await ctx.step("work", (lambda v: lambda: STEP_CALLS.append(f"work-{v}") or v)(i)))
    extra = await ctx.wait_for(finish)
    done.append(extra or 0)
    return sum(done)


def test_ended_runs_refuse_signals_updates_cancels_with_workflow_ended() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[tracked, typed_waiter]) as engine:
            h = await engine.start(tracked, "e-1", 2)
            await h.signal(finish, 5)
            assert await h.result() == 6
            for call in (
                lambda: engine.signal("e-1", finish, 1),
                lambda: engine.cancel("e-1"),
                lambda: engine.terminate("e-1"),
                lambda: engine.resume("e-1"),
                lambda: engine.update("e-1", bump, 1),
            ):
                with pytest.raises(fusee.WorkflowEnded, match=r"'e-1' has ended \(ok\)") as caught:
                    await call()
                assert caught.value.status == "ok" and caught.value.workflow_id == "e-1"
                assert not isinstance(caught.value, fusee.NotFound)
            with pytest.raises(fusee.NotFound):
                await engine.signal("never-started", finish, 1)

    run(main())


def test_queries_of_ended_runs_replay_read_only_during_retention(tmp_path: Any) -> None:
    STEP_CALLS.clear()

    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[tracked]) as engine:
            h = await engine.start(tracked, "q-1", 3)
            await until(lambda: len(STEP_CALLS) == 3)
            await h.signal(finish, 10)
            assert await h.result() == 13
            records = await engine.journal("q-1")
            assert await h.query(progress_q) == {"done": [0, 1, 2, 10], "at": 4}
            assert await engine.journal("q-1") == records  # nothing was appended
            assert STEP_CALLS == ["work-0", "work-1", "work-2"]  # no step ran again
            # A cancelled or terminated run answers with the state it ended in.
            t = await engine.start(tracked, "q-2", 1)
            while (await t.query(progress_q))["at"] < 1:  # its step's result is recorded
                await asyncio.sleep(0.001)
            await t.terminate("ops")
            assert await t.query(progress_q) == {"done": [0], "at": 1}
        # After a restart (the code was never loaded in this process) too.
        async with fusee.Engine.open(tmp_path, workflows=[tracked]) as engine:
            assert await engine.query("q-1", progress_q) == {"done": [0, 1, 2, 10], "at": 4}
            with pytest.raises(fusee.QueryFailed, match="no handler for query 'nope'"):
                await engine.query("q-1", fusee.query("nope"))
        assert len(STEP_CALLS) == 4

    run(main())


def test_retention_ends_ended_queries_with_not_found() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[tracked], retention=0.05) as engine:
            h = await engine.start(tracked, "r-1", 0)
            await h.signal(finish, 1)
            assert await h.result() == 1
            assert await h.query(progress_q) == {"done": [1], "at": 1}

            async def gone() -> bool:
                try:
                    await h.query(progress_q)
                except fusee.NotFound:
                    return True
                return False

            deadline = asyncio.get_running_loop().time() + 10
            while not await gone():
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.005)

    run(main())


# --- update results and query answers keep their declared type --------------

add_money = fusee.update("add-money", int, result_type=Money)
balance_q = fusee.query("balance", result_type=tuple[str, decimal.Decimal])
untyped_q = fusee.query("untyped")
pair_u = fusee.update("pair")


@fusee.workflow("wallet")
async def wallet(ctx: fusee.Ctx) -> int:
    cents = 0

    def add_cents(n: int) -> Money:
        nonlocal cents
        cents += n
        return Money(currency="EUR", cents=cents)

    ctx.on_update(add_money, add_cents)
    ctx.on_update(pair_u, lambda _: (1, 2))
    ctx.on_query(balance_q, lambda: ("EUR", decimal.Decimal(cents) / 100))
    ctx.on_query(untyped_q, lambda: {"raw": b"x"})
    await ctx.wait_for(finish)
    return cents


def test_update_results_and_query_answers_convert_to_their_declared_types() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[wallet]) as engine:
            h = await engine.start(wallet, "w-1")
            assert await h.update(add_money, 150) == Money(currency="EUR", cents=150)
            again = await h.update(add_money, 150, update_id="u-2")
            assert isinstance(again, Money) and again.cents == 300
            cached = await h.update(add_money, 999, update_id="u-2")  # answered before: same answer
            assert isinstance(cached, Money) and cached.cents == 300
            assert await h.query(balance_q) == ("EUR", decimal.Decimal("3"))
            with pytest.raises(fusee.SerializationError, match=r"query 'untyped' holds bytes at \['raw'\]"):
                await h.query(untyped_q)
            with pytest.raises(fusee.UpdateFailed, match=r"result of update 'pair' is tuple.*result_type=tuple"):
                await h.update(pair_u, None)
            await h.signal(finish, 0)
            assert await h.result() == 300
            # Ended: the read-only replay answers with the declared type too.
            assert await h.query(balance_q) == ("EUR", decimal.Decimal("3"))

    run(main())


def test_values_keep_their_type_after_sigkill_and_replay(tmp_path: Any) -> None:
    import json
    import os
    import pathlib
    import signal
    import subprocess
    import sys

    app = pathlib.Path(__file__).with_name("typed_app.py")
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2]))

    def start(mode: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(app), str(tmp_path), mode],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    p = start("live")
    assert p.stdout is not None
    live = json.loads(p.stdout.readline())["seen"]
    assert json.loads(p.stdout.readline()) == {"durable": True}
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    out, err = start("replay").communicate(timeout=120)
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0] == {"seen": live}, err
    assert live == {"bytes": "bytes", "tuple": "tuple", "datetime": "datetime", "uuid": "UUID",
                    "decimal": "Decimal", "frozenset": "frozenset", "pydantic": "Money",
                    "dataclass": "Parcel"}
    assert lines[1]["result"].startswith("[b'\\x00\\xff', (1, 'a'), datetime.datetime(2026, 1, 2")
    assert lines[1]["steps_run"] == 0  # every value came from the journal


def test_repeated_queries_of_an_ended_run_replay_it_once() -> None:
    replays: list[int] = []
    ask = fusee.query("ask")

    @fusee.workflow("replayed-once")
    async def replayed_once(ctx: fusee.Ctx) -> int:
        replays.append(1)  # runs at every replay of the code
        ctx.on_query(ask, lambda: len(replays))
        return await ctx.step("one", lambda: 1)

    async def main() -> None:
        async with fusee.Engine.open(workflows=[replayed_once]) as engine:
            assert await engine.execute(replayed_once, "ro-1") == 1
            answers = [await engine.query("ro-1", ask) for _ in range(5)]
            assert answers == [2, 2, 2, 2, 2]  # the live run, then one read-only replay

    run(main())


def test_ended_queries_after_cancel_failure_and_a_terminate_during_a_step(tmp_path: Any) -> None:
    seen_q = fusee.query("seen")
    slow_calls: list[int] = []
    forever = asyncio.Event()

    async def slow_step() -> int:
        slow_calls.append(1)
        await forever.wait()
        return 2

    @fusee.workflow("ends")
    async def ends(ctx: fusee.Ctx, how: str) -> int:
        seen: list[str] = []
        ctx.on_query(seen_q, lambda: list(seen))
        seen.append(str(await ctx.step("fast", lambda: 1)))
        try:
            if how == "fail":
                await ctx.step("boom", lambda: 1 / 0, retry=fusee.Retry(attempts=1))
            elif how == "slow":
                await ctx.step("slow", slow_step)
            else:
                await ctx.wait_for(finish)
        except fusee.Cancelled:
            seen.append("compensated")
            raise
        except fusee.StepFailed:
            seen.append("failed")
            raise
        return 0

    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[ends]) as engine:
            c = await engine.start(ends, "end-cancel", "cancel")
            while (await c.query(seen_q)) != ["1"]:
                await asyncio.sleep(0.001)
            await c.cancel()
            with pytest.raises(fusee.WorkflowCancelled):
                await c.result()
            assert await c.query(seen_q) == ["1", "compensated"]

            f = await engine.start(ends, "end-fail", "fail")
            with pytest.raises(fusee.WorkflowFailed):
                await f.result()
            assert await f.query(seen_q) == ["1", "failed"]

            s = await engine.start(ends, "end-slow", "slow")
            await until(lambda: len(slow_calls) == 1)
            await s.terminate("stop")
            assert await s.query(seen_q) == ["1"]  # as it ended: inside the slow step
            assert len(slow_calls) == 1  # the replay ran no step
        # An engine that does not know the workflow type cannot replay it.
        async with fusee.Engine.open(tmp_path, workflows=[]) as engine:
            with pytest.raises(fusee.QueryFailed, match="type 'ends' is not registered"):
                await engine.query("end-fail", seen_q)

    run(main())


def test_workflow_annotations_that_do_not_resolve_are_an_error_not_any() -> None:
    @dataclasses.dataclass
    class Local:  # not at module level: the module's annotations cannot see it
        n: int

    with pytest.raises(fusee.SerializationError, match=r"'Local' of its input 'x' does not resolve"):

        @fusee.workflow("local-typed")
        async def local_typed(ctx: fusee.Ctx, x: Local) -> int:
            return x.n

    # Only the input and result annotations type values: an unresolvable ctx one is fine.
    @fusee.workflow("ctx-unresolved")
    async def ctx_unresolved(ctx: NotImported, n: int) -> list[int]:  # type: ignore[name-defined] # noqa: F821
        return [n]

    assert ctx_unresolved.input_type is int and ctx_unresolved.result_type == list[int]


def _priced(info: NotImported) -> Money:  # type: ignore[name-defined] # noqa: F821
    return Money(currency="EUR", cents=3)


@fusee.workflow("priced")
async def priced(ctx: fusee.Ctx) -> str:
    money = await ctx.step("price", _priced)
    return type(money).__name__


def test_a_step_functions_return_annotation_types_it_even_if_a_parameter_annotation_does_not_resolve() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[priced]) as engine:
            assert await engine.execute(priced, "p-1") == "Money"

    run(main())


@fusee.workflow("relay")
async def relay(ctx: fusee.Ctx, n: int) -> str:
    if n == 0:
        try:
            await ctx.continue_as_new("one")
        except fusee.SerializationError as e:
            assert "input of workflow 'relay'" in str(e)
        await ctx.continue_as_new(1)
    return f"run {n}"


def test_continue_as_new_input_is_checked_at_the_call() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[relay]) as engine:
            assert await engine.execute(relay, "relay-1", 0) == "run 1"

    run(main())
