"""The public API on the embedded engine: what users rely on, end to end."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from typing import Any, TypedDict

import msgspec
import pydantic
import pytest

import fusee
from fusee.core import records as rec
from tests.helpers import until

approve = fusee.signal("approve", int)
status_q = fusee.query("status")
add = fusee.update("add", int)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@dataclasses.dataclass
class Order:
    item: str
    qty: int


@dataclasses.dataclass
class Receipt:
    item: str
    total: int


CALLS: list[str] = []


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, o: Order) -> Receipt:
    price = await ctx.step("quote", lambda: 7)
    total = await ctx.step("charge", lambda: price * o.qty)
    return Receipt(o.item, total)


def test_execute_returns_typed_result() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[order]) as engine:
            r = await engine.execute(order, "o-1", Order("tea", 3))
            assert r == Receipt("tea", 21)
            h = engine.get("o-1")
            assert await h.result() == Receipt("tea", 21)
            assert engine.describe("o-1").status == "ok"

    run(main())


@fusee.workflow("keys")
async def keys_wf(ctx: fusee.Ctx) -> list[Any]:
    seen: list[Any] = []

    def flaky(info: fusee.StepInfo) -> str:
        seen.append((info.key, info.attempt))
        if info.attempt < 3:
            raise ConnectionError("try again")
        return info.key

    key = await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=5, initial="1ms", jitter=0))
    return [key, [list(s) for s in seen]]


def test_retries_keep_one_idempotency_key() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[keys_wf]) as engine:
            key, seen = await engine.execute(keys_wf, "k-1")
            assert [a for _, a in seen] == [1, 2, 3]
            assert {k for k, _ in seen} == {key}
            h2 = await engine.start(keys_wf, "k-2")
            key2, _ = await h2.result()
            assert key2 != key

    run(main())


@fusee.workflow("fails")
async def fails_wf(ctx: fusee.Ctx) -> None:
    def boom() -> None:
        raise ValueError("bad card")

    await ctx.step("charge", boom, retry=fusee.Retry(attempts=2, initial="1ms"))


def test_step_failure_fails_the_workflow_with_its_cause() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[fails_wf]) as engine:
            with pytest.raises(fusee.WorkflowFailed, match="bad card") as ei:
                await engine.execute(fails_wf, "f-1")
            assert ei.value.status == "failed"
            assert engine.describe("f-1").status == "failed"

    run(main())


@fusee.workflow("non-retryable")
async def non_retryable_wf(ctx: fusee.Ctx) -> int:
    attempts: list[int] = []

    def boom(info: fusee.StepInfo) -> None:
        attempts.append(info.attempt)
        raise KeyError("nope")

    try:
        await ctx.step("x", boom, retry=fusee.Retry(attempts=5, initial="1ms", non_retryable=(KeyError,)))
    except fusee.StepFailed:
        return len(attempts)
    return -1


def test_non_retryable_errors_fail_at_once_and_can_be_caught() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[non_retryable_wf]) as engine:
            assert await engine.execute(non_retryable_wf, "n-1") == 1

    run(main())


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx, timeout: float) -> Any:
    phase = {"phase": "waiting"}
    ctx.on_query(status_q, lambda: dict(phase))
    v = await ctx.wait_for(approve, timeout=timeout)
    phase["phase"] = "done"
    return v


def test_signal_wakes_a_waiting_workflow_and_query_sees_state() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[approval]) as engine:
            h = await engine.start(approval, "a-1", 60.0)
            assert await h.query(status_q) == {"phase": "waiting"}
            await h.signal(approve, 7)
            assert await h.result() == 7

    run(main())


def test_wait_times_out_with_none() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[approval]) as engine:
            assert await engine.execute(approval, "a-2", 0.01) is None

    run(main())


@fusee.workflow("collect")
async def collect(ctx: fusee.Ctx, n: int) -> list[int]:
    out = []
    await ctx.sleep("let signals arrive", "20ms")
    for _ in range(n):
        out.append(await ctx.wait_for(approve))
    return out


def test_signals_are_buffered_in_order_and_deduplicated() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[collect]) as engine:
            h = await engine.start(collect, "c-1", 3)
            await engine.signal("c-1", approve, 1, dedup_key="one")
            await engine.signal("c-1", approve, 1, dedup_key="one")
            await engine.signal("c-1", approve, 2)
            await engine.signal("c-1", approve, 3)
            assert await h.result() == [1, 2, 3]

    run(main())


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx) -> int:
    total = 0
    done = asyncio.Event()

    def validate(n: int) -> None:
        if n < 0:
            raise ValueError("only positive amounts")

    async def handle(n: int) -> int:
        nonlocal total
        await ctx.step("record", lambda: n)
        total += n
        if total >= 10:
            done.set()
        return total

    ctx.on_update(add, handle, validator=validate)
    ctx.on_query(status_q, lambda: total)
    await done.wait()
    return total


def test_updates_validate_run_once_per_id_and_return_results() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[counter]) as engine:
            h = await engine.start(counter, "n-1")
            assert await h.update(add, 3, update_id="u1") == 3
            assert await h.update(add, 3, update_id="u1") == 3  # same id: same answer, not run again
            with pytest.raises(ValueError, match="only positive"):
                await h.update(add, -1)
            assert await h.query(status_q) == 3
            assert await h.update(add, 7) == 10
            assert await h.result() == 10
            j = await engine.journal("n-1")
            assert sum(1 for r in j if isinstance(r, rec.Update)) == 2

    run(main())


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, item: str) -> str:
    return await ctx.step("label", lambda: f"label:{item}")


@fusee.workflow("parent")
async def parent(ctx: fusee.Ctx) -> list[str]:
    a, b = await asyncio.gather(
        ctx.child(ship, f"{ctx.workflow_id}-ship-a", "a"),
        ctx.child(ship, f"{ctx.workflow_id}-ship-b", "b"),
    )
    h = await ctx.start_child(ship, f"{ctx.workflow_id}-ship-c", "c")
    return [a, b, h.workflow_id]


def test_children_return_results_and_detached_children_run() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[parent, ship], shards=1) as engine:
            assert await engine.execute(parent, "p-1") == ["label:a", "label:b", "p-1-ship-c"]
            assert await engine.get("p-1-ship-c").result() == "label:c"

    run(main())


@fusee.workflow("compensate")
async def compensate(ctx: fusee.Ctx) -> str:
    await ctx.step("reserve", lambda: "r")
    try:
        await ctx.wait_for(approve)
    except fusee.Cancelled:
        await ctx.step("release", lambda: "undone")
        raise
    return "approved"


def test_cancel_runs_compensation_and_result_raises_cancelled() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[compensate]) as engine:
            h = await engine.start(compensate, "x-1")
            await until(lambda: any(isinstance(r, rec.Wait) for r in engine._rt.wf["x-1"].journal))
            await h.cancel("customer changed their mind")
            with pytest.raises(fusee.Cancelled):
                await h.result()
            with pytest.raises(fusee.WorkflowFailed) as ei:
                await h.result()
            assert ei.value.status == "cancelled"
            steps = [r.name for r in await engine.journal("x-1") if isinstance(r, rec.Step)]
            assert steps == ["reserve", "release"]

    run(main())


def test_terminate_ends_a_run_without_its_code() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[approval]) as engine:
            h = await engine.start(approval, "t-1", 3600.0)
            await h.terminate("ops")
            with pytest.raises(fusee.WorkflowTerminated):
                await h.result()
            assert engine.describe("t-1").status == "terminated"
            with pytest.raises(fusee.WorkflowEnded):
                await h.signal(approve, 1)

    run(main())


@fusee.workflow("looper")
async def looper(ctx: fusee.Ctx, n: int) -> int:
    await ctx.step("tick", lambda: n)
    if n < 3:
        await ctx.continue_as_new(n + 1)
    return n * 100


def test_continue_as_new_result_follows_the_chain() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[looper]) as engine:
            h = await engine.start(looper, "l-1", 0)
            first = h.run_id
            assert await h.result() == 300
            assert engine.describe("l-1").run_id != first

    run(main())


@fusee.workflow("values")
async def values(ctx: fusee.Ctx) -> list[Any]:
    now = ctx.now()
    r = ctx.random()
    u = ctx.uuid4()
    assert isinstance(now, datetime.datetime) and now.tzinfo is not None
    assert 0 <= r < 1 and isinstance(u, uuid.UUID) and u.version == 4
    return [now.isoformat(), r, str(u)]


def test_recorded_values() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[values]) as engine:
            _now, _r, _u = await engine.execute(values, "v-1")
            j = await engine.journal("v-1")
            kinds = [x.kind for x in j if isinstance(x, rec.Value)]
            assert kinds == [rec.ValueKind.NOW, rec.ValueKind.RANDOM, rec.ValueKind.UUID]

    run(main())


@fusee.workflow("gather")
async def gather_wf(ctx: fusee.Ctx, n: int) -> list[int]:
    async def one(i: int) -> int:
        await ctx.sleep(f"s{i}", f"{(n - i) * 2}ms")
        return await ctx.step(f"step{i}", lambda: i * i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def test_concurrent_branches_with_gather() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[gather_wf]) as engine:
            assert await engine.execute(gather_wf, "g-1", 5) == [0, 1, 4, 9, 16]

    run(main())


def test_bad_input_gives_clear_errors() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[order, approval]) as engine:
            with pytest.raises(fusee.UnknownWorkflow, match="registered: approval, order"):
                await engine.start(ship, "s-1", "x")
            with pytest.raises(fusee.UnknownWorkflow):
                await engine.start("nope", "s-1")
            with pytest.raises(TypeError, match="non-empty string"):
                await engine.start(order, 42, Order("a", 1))  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await engine.start(order, "bad-input", object())
            with pytest.raises(fusee.NotFound):
                engine.get("missing")
            with pytest.raises(fusee.NotFound):
                await engine.signal("missing", approve, 1)
            await engine.start(approval, "dup", 3600.0)
            with pytest.raises(fusee.AlreadyExists, match="already running"):
                await engine.start(approval, "dup", 1.0)
            same = await engine.start(approval, "dup", 1.0, if_running="attach")
            assert same.workflow_id == "dup"
            with pytest.raises(TypeError, match=r"fusee\.signal"):
                await engine.signal("dup", "approve", 1)  # type: ignore[arg-type]
        with pytest.raises(fusee.EngineClosed):
            await engine.start(approval, "late", 1.0)

    run(main())


def test_finished_ids_follow_the_finished_policy() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[order]) as engine:
            assert await engine.execute(order, "o", Order("a", 1)) == Receipt("a", 7)
            with pytest.raises(fusee.AlreadyExists, match="already ran"):
                await engine.start(order, "o", Order("a", 2))
            assert await engine.execute(order, "o", Order("b", 9), if_finished="attach") == Receipt("a", 7)
            assert await engine.execute(order, "o", Order("b", 2), if_finished="start") == Receipt("b", 14)

    run(main())


def test_ctx_outside_workflow_code_is_refused() -> None:
    leaked: list[fusee.Ctx] = []

    @fusee.workflow("leak")
    async def leak(ctx: fusee.Ctx) -> None:
        leaked.append(ctx)

    async def main() -> None:
        async with fusee.Engine.open(workflows=[leak]) as engine:
            await engine.execute(leak, "leak-1")
            with pytest.raises(RuntimeError, match=r"ended|workflow's own code"):
                await leaked[0].step("x", lambda: 1)

    run(main())


def test_sleep_inside_workflow_must_be_durable() -> None:
    @fusee.workflow("bad-sleep")
    async def bad_sleep(ctx: fusee.Ctx) -> None:
        await asyncio.sleep(0.01)

    async def main() -> None:
        async with fusee.Engine.open(workflows=[bad_sleep]) as engine:
            await engine.start(bad_sleep, "bs-1")
            await until(lambda: "bs-1" in engine.stuck())
            assert "ctx.sleep" in engine.stuck()["bs-1"]

    run(main())


def test_reopen_uses_the_directorys_shard_count_and_refuses_another(tmp_path: Any) -> None:
    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[order], shards=3) as engine:
            await engine.execute(order, "o-1", Order("a", 1))
        async with fusee.Engine.open(tmp_path, workflows=[order]) as engine:
            assert await engine.get("o-1").result() == Receipt("a", 7)
        from fusee.errors import ShardCountMismatch

        with pytest.raises(ShardCountMismatch, match="shards=3"):
            await fusee.Engine.open(tmp_path, workflows=[order], shards=2)

    run(main())


def test_second_engine_on_one_directory_is_refused(tmp_path: Any) -> None:
    from fusee.errors import DirectoryLocked

    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[order]):
            with pytest.raises(DirectoryLocked, match="in use"):
                await fusee.Engine.open(tmp_path, workflows=[order])

    run(main())


def test_determinism_error_stops_only_that_run_and_fixed_code_replays(tmp_path: Any) -> None:
    gate = fusee.signal("gate")

    def make(second_step: str) -> fusee.WorkflowDef[Any, Any]:
        @fusee.workflow("evolving")
        async def evolving(ctx: fusee.Ctx) -> str:
            await ctx.step("one", lambda: 1)
            await ctx.step(second_step, lambda: 2)
            await ctx.wait_for(gate)
            return "done"

        return evolving

    good, bad = make("two"), make("renamed")

    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[good, order]) as engine:
            await engine.start(good, "ev-1")
            await until(lambda: any(isinstance(r, rec.Wait) for r in engine._rt.wf["ev-1"].journal))
        async with fusee.Engine.open(tmp_path, workflows=[bad, order]) as engine:
            # The run was parked at close; the signal wakes it and its replay diverges.
            await engine.signal("ev-1", gate)
            await until(lambda: "ev-1" in engine.stuck())
            msg = engine.stuck()["ev-1"]
            assert "position 1" in msg and "'two'" in msg and "'renamed'" in msg
            assert engine.describe("ev-1").status == "stuck"
            # Other workflows are unaffected.
            assert await engine.execute(order, "o-2", Order("b", 2)) == Receipt("b", 14)
        async with fusee.Engine.open(tmp_path, workflows=[good, order]) as engine:
            assert engine.stuck() == {}
            assert await engine.get("ev-1").result() == "done"

    run(main())


@fusee.workflow("pauser")
async def pauser(ctx: fusee.Ctx) -> str:
    def flaky(info: fusee.StepInfo) -> str:
        if info.attempt < 3 and "fixed" not in FIXED:
            raise ConnectionError("down")
        return f"ok after attempt {info.attempt}"

    return await ctx.step(
        "call", flaky, retry=fusee.Retry(attempts=2, initial="1ms", pause_when_exhausted=True)
    )


FIXED: set[str] = set()


def test_exhausted_retries_pause_until_resumed() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[pauser]) as engine:
            h = await engine.start(pauser, "pz-1")
            await until(lambda: any(isinstance(r, rec.Attempt) and r.retry_at_ms == rec.PAUSED
                                    for r in engine._rt.wf["pz-1"].journal))
            assert engine.describe("pz-1").status == "paused"  # not "running": its retries ran out
            FIXED.add("fixed")
            await h.resume()
            assert await h.result() == "ok after attempt 1"

    run(main())


@fusee.workflow("child-forever")
async def child_forever(ctx: fusee.Ctx) -> None:
    await ctx.wait_for(approve)


@fusee.workflow("short-parent")
async def short_parent(ctx: fusee.Ctx, policy: str) -> str:
    await ctx.start_child(child_forever, f"kid-{policy}", close_policy=policy)
    return "bye"


def test_parent_close_policy_applies_to_children() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[short_parent, child_forever], shards=4) as engine:
            for policy in ("terminate", "request_cancel", "abandon"):
                assert await engine.execute(short_parent, f"sp-{policy}", policy) == "bye"
            await until(lambda: engine.describe("kid-terminate").status == "terminated")
            await until(lambda: engine.describe("kid-request_cancel").status == "cancelled")
            assert engine.describe("kid-abandon").status == "running"

    run(main())


@fusee.workflow("heartbeats")
async def heartbeats(ctx: fusee.Ctx) -> list[Any]:
    def export(info: fusee.StepInfo) -> list[Any]:
        start = info.progress or 0
        info.heartbeat(start + 5)
        if info.attempt == 1:
            raise ConnectionError("lost the connection at page 5")
        return [start, info.attempt]

    return await ctx.step("export", export, retry=fusee.Retry(attempts=3, initial="1ms"))


def test_heartbeat_progress_reaches_the_next_attempt() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[heartbeats]) as engine:
            assert await engine.execute(heartbeats, "hb-1") == [5, 2]

    run(main())


@fusee.workflow("slow-step")
async def slow_step(ctx: fusee.Ctx) -> str:
    async def slow() -> str:
        await asyncio.sleep(30)
        return "late"

    try:
        return await ctx.step("slow", slow, timeout="50ms", retry=fusee.Retry(attempts=2, initial="1ms"))
    except fusee.StepFailed as e:
        return f"gave up: {e.error_type}"


def test_step_timeout_counts_as_a_failed_attempt() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[slow_step]) as engine:
            assert (await engine.execute(slow_step, "ss-1")).startswith("gave up: ")
            attempts = [r for r in await engine.journal("ss-1") if isinstance(r, rec.Attempt)]
            assert len(attempts) == 1

    run(main())


@fusee.workflow("race")
async def race(ctx: fusee.Ctx) -> list[str]:
    out = []
    for round_ in range(2):
        sig = asyncio.ensure_future(ctx.wait_for(approve))
        nap = asyncio.ensure_future(ctx.sleep(f"nap{round_}", "20ms"))
        done, pending = await asyncio.wait({sig, nap}, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        out.append("signal" if sig in done else "timer")
    await ctx.wait_for(approve)
    return out


def test_races_with_asyncio_wait_replay_identically(tmp_path: Any) -> None:
    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[race]) as engine:
            await engine.start(race, "r-1")
            await until(lambda: sum(isinstance(r, rec.Waited) for r in engine._rt.journal_of(engine._rt.wf["r-1"])[0]) >= 2)
            abandoned = [r for r in engine._rt.journal_of(engine._rt.wf["r-1"])[0]
                         if isinstance(r, rec.Waited) and r.outcome == rec.WaitOutcome.ABANDONED]
            assert len(abandoned) == 2  # both lost races recorded
        async with fusee.Engine.open(tmp_path, workflows=[race]) as engine:
            await engine.signal("r-1", approve, 1)
            assert await engine.get("r-1").result() == ["timer", "timer"]
            assert engine.stuck() == {}

    run(main())


ping = fusee.signal("ping", str)


@fusee.workflow("pinger")
async def pinger(ctx: fusee.Ctx, target: str) -> str:
    await ctx.signal_workflow(target, ping, f"from {ctx.workflow_id}")
    return "sent"


@fusee.workflow("ponger")
async def ponger(ctx: fusee.Ctx) -> str | None:
    return await ctx.wait_for(ping)


def test_signal_workflow_delivers_once_across_shards() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[pinger, ponger], shards=4) as engine:
            h = await engine.start(ponger, "pong")
            assert await engine.execute(pinger, "ping-1", "pong") == "sent"
            assert await h.result() == "from ping-1"
            signals = [r for r in await engine.journal("pong") if isinstance(r, rec.Signal)]
            assert len(signals) == 1 and signals[0].dedup != 0

    run(main())


def test_patched_new_runs_take_the_new_branch_old_runs_replay_the_old(tmp_path: Any) -> None:
    gate = fusee.signal("gate")

    @fusee.workflow("patchy")
    async def v1(ctx: fusee.Ctx) -> list[str]:
        a = await ctx.step("a", lambda: "a")
        await ctx.wait_for(gate)
        return [a]

    @fusee.workflow("patchy")
    async def v2(ctx: fusee.Ctx) -> list[str]:
        a = await ctx.step("a", lambda: "a")
        extra = []
        if ctx.patched("audit"):
            extra.append(await ctx.step("audit", lambda: "audited"))
        await ctx.wait_for(gate)
        return [a, *extra]

    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[v1]) as engine:
            await engine.start(v1, "old")
            await until(lambda: any(isinstance(r, rec.Wait) for r in engine._rt.journal_of(engine._rt.wf["old"])[0]))
        async with fusee.Engine.open(tmp_path, workflows=[v2]) as engine:
            await engine.start(v2, "new")
            await engine.signal("old", gate)
            await engine.signal("new", gate)
            assert await engine.get("old").result() == ["a"]
            assert await engine.get("new").result() == ["a", "audited"]
            assert engine.stuck() == {}

    run(main())


@fusee.workflow("reader")
async def reader(ctx: fusee.Ctx) -> list[Any]:
    seen: list[Any] = []

    def read(info: fusee.StepInfo) -> int:
        # Read-only: it may run before the records before it are durable.
        seen.append(engine_durable(ctx.workflow_id))
        return 5

    n = await ctx.step("read", read, read_only=True)
    total = await ctx.step("write", lambda: n * 2)
    return [total, seen]


DURABLE_PROBE: dict[str, Any] = {}


def engine_durable(wid: str) -> bool:
    eng = DURABLE_PROBE["engine"]
    st = eng._rt.wf[wid]
    return bool(st.lsns[-1] <= eng._rt.durable(st.shard))


def test_read_only_steps_run_ahead_of_the_disk() -> None:
    async def main() -> None:
        async with fusee.Engine.open(workflows=[reader]) as engine:
            DURABLE_PROBE["engine"] = engine
            st_lsn = []
            h = await engine.start(reader, "rd-1")
            total, seen = await h.result()
            assert total == 10
            assert seen == [True] or seen == [False]
            st_lsn.append(seen)

    run(main())


class Item(msgspec.Struct):
    sku: str
    qty: int


class Quote(pydantic.BaseModel):
    sku: str
    total: int


class Opts(TypedDict):
    discount: int


@fusee.workflow("typed")
async def typed_wf(ctx: fusee.Ctx, item: Item) -> Quote:
    def price(info: fusee.StepInfo) -> Quote:
        return Quote(sku=item.sku, total=item.qty * 3)

    q = await ctx.step("price", price)
    assert isinstance(q, Quote)  # the step's annotation converts its recorded result back
    opts: Opts = await ctx.step("opts", lambda: {"discount": 1})
    return Quote(sku=q.sku, total=q.total - opts["discount"])


def test_inputs_and_results_convert_by_annotations(tmp_path: Any) -> None:
    async def main() -> None:
        async with fusee.Engine.open(tmp_path, workflows=[typed_wf]) as engine:
            r = await engine.execute(typed_wf, "t-1", Item("tea", 4))
            assert r == Quote(sku="tea", total=11)
        async with fusee.Engine.open(tmp_path, workflows=[typed_wf]) as engine:
            assert await engine.get("t-1").result() == Quote(sku="tea", total=11)

    run(main())


@fusee.workflow("long-chain")
async def long_chain(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step("add", (lambda v: lambda: v)(i))
    return total


def test_a_long_chain_leaves_the_loop_to_other_tasks(tmp_path: Any) -> None:
    async def main() -> None:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        async with fusee.Engine.open(tmp_path, workflows=[long_chain], inline_sync_steps=True) as engine:
            t = asyncio.ensure_future(ticker())
            assert await engine.execute(long_chain, "lc", 400) == sum(range(400))
            done = True
            await t
        # Steps start in bounded streaks: other tasks get turns all along the chain.
        assert ticks >= 400 // 32

    run(main())
