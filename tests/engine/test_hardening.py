"""What users hit in the default configuration: cancels during steps, closes with
steps in flight, calls from other threads, timeouts, step functions as users write them."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.core import records as rec
from tests.helpers import until

# --- the flush and acknowledgements never wait for step work -----------------------


async def test_acknowledgements_do_not_queue_behind_a_saturated_step_pool() -> None:
    release = threading.Event()
    go = fusee.signal("go", int)

    def blocked(info: fusee.StepInfo) -> str:
        release.wait(30)
        return info.key

    @fusee.workflow("busy")
    async def busy(ctx: fusee.Ctx) -> list[str]:
        return list(await asyncio.gather(*(ctx.step(f"b{i}", blocked) for i in range(4))))

    @fusee.workflow("listener")
    async def listener(ctx: fusee.Ctx) -> int:
        return int(await ctx.wait_for(go) or 0)

    async with fusee.Engine.open(workflows=[busy, listener], step_threads=2) as engine:
        h = await engine.start(busy, "busy-1")
        await engine.start(listener, "l-1")
        # Every step thread is blocked; starts and signals are still acknowledged at once.
        for i in range(20):
            await asyncio.wait_for(engine.start(listener, f"l-{i + 2}"), 5)
        await asyncio.wait_for(engine.signal("l-1", go, 7), 5)
        assert await asyncio.wait_for(engine.get("l-1").result(), 5) == 7
        release.set()
        assert len(await h.result()) == 4


# --- cancellation waits for running steps ---------------------------------------------


async def test_cancel_during_a_sync_step_compensates_after_the_effect() -> None:
    events: list[str] = []
    release = threading.Event()
    saw_cancel: list[bool] = []

    def charge(info: fusee.StepInfo) -> str:
        events.append("begin charge")
        release.wait(30)
        saw_cancel.append(info.cancel_requested)
        events.append("charged")
        return "receipt-1"

    def refund() -> str:
        events.append("refund")
        return "refunded"

    @fusee.workflow("saga")
    async def saga(ctx: fusee.Ctx) -> str:
        receipt = None
        try:
            receipt = await ctx.step("charge", charge)
            await ctx.sleep("ship", "1h")
            return "shipped"
        except fusee.Cancelled:
            events.append(f"compensating {receipt}")
            await ctx.step("refund", refund)
            raise

    async with fusee.Engine.open(workflows=[saga]) as engine:
        h = await engine.start(saga, "saga-1")
        await until(lambda: events == ["begin charge"])
        await engine.cancel("saga-1", "changed my mind")  # durable when it returns
        await asyncio.sleep(0.05)
        assert events == ["begin charge"], "compensation ran before the effect it compensates"
        release.set()
        with pytest.raises(fusee.WorkflowCancelled):
            await h.result()
        # The charge's result reached the code before Cancelled: it compensates knowingly.
        assert events == ["begin charge", "charged", "compensating receipt-1", "refund"]
        assert saw_cancel == [True]
        kinds = [type(r).__name__ for r in await engine.journal("saga-1")]
        assert kinds.index("CancelRequest") < kinds.index("Step") < kinds.index("Cancel")


async def test_cancel_interrupts_an_async_step_and_journals_it_cancelled() -> None:
    began = asyncio.Event()

    async def slow() -> str:
        began.set()
        await asyncio.sleep(3600)
        return "never"

    async def polite() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "stopped cleanly"  # the function may finish its effect and return
        return "never"

    seen: list[Any] = []

    @fusee.workflow("interrupted")
    async def interrupted(ctx: fusee.Ctx) -> str:
        try:
            await ctx.step("slow", slow)
        except fusee.Cancelled:
            seen.append("slow cancelled")
            raise
        return "done"

    @fusee.workflow("polite_wf")
    async def polite_wf(ctx: fusee.Ctx) -> str:
        v = await ctx.step("polite", polite)
        seen.append(v)
        await ctx.sleep("after", "1h")  # the cancel lands here
        return str(v)

    async with fusee.Engine.open(workflows=[interrupted, polite_wf]) as engine:
        h = await engine.start(interrupted, "i-1")
        await began.wait()
        await engine.cancel("i-1")
        with pytest.raises(fusee.WorkflowCancelled):
            await h.result()
        assert seen == ["slow cancelled"]
        steps = [r for r in await engine.journal("i-1") if isinstance(r, rec.Step)]
        assert [s.status for s in steps] == [rec.Status.CANCELLED]

        h2 = await engine.start(polite_wf, "p-1")
        await until(lambda: engine._rt.wf["p-1"].run is not None and bool(engine._rt.wf["p-1"].run.executing))
        await engine.cancel("p-1")
        with pytest.raises(fusee.WorkflowCancelled):
            await h2.result()
        assert seen[-1] == "stopped cleanly"


async def test_steps_not_yet_started_never_start_after_a_cancel() -> None:
    started: list[str] = []
    release = threading.Event()

    def work(info: fusee.StepInfo) -> str:
        started.append(info.name)
        release.wait(30)
        return info.name

    @fusee.workflow("fan")
    async def fan(ctx: fusee.Ctx) -> list[str]:
        try:
            return list(await asyncio.gather(*(ctx.step(f"w{i}", work) for i in range(10))))
        except fusee.Cancelled:
            return ["cancelled"]

    async with fusee.Engine.open(workflows=[fan], step_threads=2) as engine:
        h = await engine.start(fan, "fan-1")
        await until(lambda: len(started) == 2)
        await engine.cancel("fan-1")
        release.set()
        assert await h.result() == ["cancelled"]
        # Only the two functions that held a thread ran; eight queued ones never began.
        assert sorted(started) == ["w0", "w1"]


# --- close waits for running steps -------------------------------------------------------


async def test_close_waits_for_running_steps_and_records_them(tmp_path: Path) -> None:
    calls: list[str] = []

    def slow(info: fusee.StepInfo) -> str:
        calls.append(info.key)
        time.sleep(0.3)
        return "made"

    @fusee.workflow("slowpoke")
    async def slowpoke(ctx: fusee.Ctx) -> str:
        v = await ctx.step("slow", slow)
        await ctx.sleep("rest", "50ms")
        return str(v)

    engine = await fusee.Engine.open(tmp_path, workflows=[slowpoke])
    await engine.start(slowpoke, "s-1")
    await until(lambda: len(calls) == 1)
    closing = asyncio.ensure_future(engine.close())
    await asyncio.sleep(0)
    with pytest.raises(fusee.EngineClosed):
        await engine.start(slowpoke, "s-2")  # calls during close are refused
    await closing
    async with fusee.Engine.open(tmp_path, workflows=[slowpoke]) as engine:
        assert await engine.get("s-1").result() == "made"
    assert len(calls) == 1, "a step finished during close ran again at the next open"


async def test_close_grace_bounds_the_wait(tmp_path: Path) -> None:
    release = threading.Event()
    returned: list[str] = []

    def stuck() -> str:
        release.wait(30)
        returned.append("late")
        return "late"

    @fusee.workflow("long_step")
    async def long_step(ctx: fusee.Ctx) -> str:
        return str(await ctx.step("stuck", stuck))

    engine = await fusee.Engine.open(tmp_path, workflows=[long_step])
    await engine.start(long_step, "l-1")
    await asyncio.sleep(0.05)
    # The step is released only after close returns: a close that waited for it would have
    # seen it return (after its 30 s wait) first.
    await engine.close(grace=0.1)
    assert returned == []
    release.set()


# --- calls from other threads ----------------------------------------------------------------


async def test_a_call_from_another_threads_loop_is_refused_before_anything_is_recorded() -> None:
    go = fusee.signal("go", int)

    @fusee.workflow("waiter")
    async def waiter(ctx: fusee.Ctx) -> int:
        return int(await ctx.wait_for(go) or 0)

    async with fusee.Engine.open(workflows=[waiter]) as engine:
        h = await engine.start(waiter, "w-1")
        before = len(await engine.journal("w-1"))
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                asyncio.run(engine.signal("w-1", go, 1))
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=other_thread)
        t.start()
        await asyncio.get_running_loop().run_in_executor(None, t.join)
        assert len(errors) == 1 and isinstance(errors[0], fusee.WrongEventLoop)
        assert "run_threadsafe" in str(errors[0])
        assert len(await engine.journal("w-1")) == before

        # The documented way works and the run goes on.
        def signal_properly() -> None:
            engine.run_threadsafe(engine.signal, "w-1", go, 5, timeout=10)

        await asyncio.get_running_loop().run_in_executor(None, signal_properly)
        assert await h.result() == 5
        with pytest.raises(fusee.WrongEventLoop):
            engine.run_threadsafe(engine.signal, "w-1", go, 5)


# --- timeouts ------------------------------------------------------------------------------------


async def test_a_sync_steps_timeout_never_overlaps_attempts() -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def slow() -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.15)
        with lock:
            running -= 1
        return "late"

    @fusee.workflow("timed")
    async def timed(ctx: fusee.Ctx) -> str:
        try:
            return str(await ctx.step("slow", slow, timeout="50ms",
                                      retry=fusee.Retry(attempts=4, initial="1ms")))
        except fusee.StepFailed as e:
            return f"failed: {e}"

    async with fusee.Engine.open(workflows=[timed]) as engine:
        out = await engine.execute(timed, "t-1")
    assert out.startswith("failed") and "StepTimeout" in out
    assert most == 1, f"{most} executions of one step ran at once"


async def test_child_timeout_is_enforced_and_the_close_policy_applies() -> None:
    never = fusee.signal("never", int)

    @fusee.workflow("slow_child")
    async def slow_child(ctx: fusee.Ctx) -> int:
        return int(await ctx.wait_for(never) or 0)

    @fusee.workflow("impatient")
    async def impatient(ctx: fusee.Ctx) -> str:
        try:
            await ctx.child(slow_child, "kid-1", timeout="50ms")
        except fusee.WorkflowTimedOut as e:
            return f"gave up: {e}"
        return "got it"

    async with fusee.Engine.open(workflows=[impatient, slow_child]) as engine:
        out = await engine.execute(impatient, "parent-1")  # the child waits forever: only its timeout ends it
        assert out.startswith("gave up")
        with pytest.raises(fusee.WorkflowTerminated):
            await engine.get("kid-1").result()


async def test_child_timeout_survives_a_reopen(tmp_path: Path) -> None:
    never = fusee.signal("never", int)

    @fusee.workflow("slow_child")
    async def slow_child(ctx: fusee.Ctx) -> int:
        return int(await ctx.wait_for(never) or 0)

    @fusee.workflow("impatient")
    async def impatient(ctx: fusee.Ctx) -> str:
        try:
            await ctx.child(slow_child, "kid-1", timeout="300ms", close_policy="request_cancel")
        except fusee.WorkflowTimedOut:
            return "gave up"
        return "got it"

    async with fusee.Engine.open(tmp_path, workflows=[impatient, slow_child]) as engine:
        await engine.start(impatient, "parent-1")
        await until(lambda: any(r.workflow_id == "kid-1" for r in engine.runs()))
    await asyncio.sleep(0.4)  # the deadline passes while no engine runs
    async with fusee.Engine.open(tmp_path, workflows=[impatient, slow_child]) as engine:
        assert await engine.get("parent-1").result() == "gave up"
        with pytest.raises(fusee.WorkflowCancelled):
            await engine.get("kid-1").result()


async def test_run_timeout_ends_the_run_timed_out(tmp_path: Path) -> None:
    never = fusee.signal("never", int)

    @fusee.workflow("forever")
    async def forever(ctx: fusee.Ctx) -> int:
        return int(await ctx.wait_for(never) or 0)

    async with fusee.Engine.open(tmp_path, workflows=[forever]) as engine:
        with pytest.raises(fusee.WorkflowTimedOut):
            await engine.execute(forever, "f-1", timeout="50ms")
        await engine.start(forever, "f-2", timeout="300ms")
    await asyncio.sleep(0.35)
    async with fusee.Engine.open(tmp_path, workflows=[forever]) as engine:
        with pytest.raises(fusee.WorkflowTimedOut):
            await engine.get("f-2").result()
        assert engine.describe("f-2").status == "timed_out"


# --- step functions as users write them ----------------------------------------------------------


async def test_a_defaulted_parameter_is_left_to_its_default() -> None:
    async def fetch(i: int) -> int:
        await asyncio.sleep(0)
        return i * 10

    @fusee.workflow("captures")
    async def captures(ctx: fusee.Ctx) -> list[int]:
        out = []
        for i in range(3):
            out.append(await ctx.step(f"double-{i}", lambda i=i: i * 2))
        # A sync callable returning an awaitable is awaited, in the default mode too.
        out.append(await ctx.step("fetch", lambda: fetch(4)))
        info_key = await ctx.step("info", lambda info: info.key)
        out.append(int(len(info_key) > 0))
        return out

    async with fusee.Engine.open(workflows=[captures]) as engine:
        assert await engine.execute(captures, "c-1") == [0, 2, 4, 40, 1]


# --- stuck runs -------------------------------------------------------------------------------------


async def test_waiters_of_a_stuck_run_get_its_error_at_once() -> None:
    @fusee.workflow("naughty")
    async def naughty(ctx: fusee.Ctx) -> int:
        await ctx.step("a", lambda: 1)
        await asyncio.sleep(0.01)  # not allowed in workflow code: the run is stuck
        return 2

    async with fusee.Engine.open(workflows=[naughty]) as engine:
        with pytest.raises(fusee.FuseeError) as e:
            await asyncio.wait_for(engine.execute(naughty, "n-1"), 10)
        assert "n-1" in engine.stuck()
        assert str(e.value) == engine.stuck()["n-1"]
        with pytest.raises(fusee.FuseeError):
            await asyncio.wait_for(engine.get("n-1").result(), 10)


# --- heartbeats and describe ------------------------------------------------------------------------


async def test_heartbeats_from_a_thread_coalesce_and_the_latest_survives() -> None:
    attempts: list[Any] = []

    def crunch(info: fusee.StepInfo) -> int:
        attempts.append(info.progress)
        start = info.progress or 0
        for i in range(start, 2000):
            info.heartbeat(i)
        if len(attempts) == 1:
            time.sleep(0.05)  # let the last heartbeat reach the journal
            raise RuntimeError("worker lost")
        return 2000

    @fusee.workflow("cruncher")
    async def cruncher(ctx: fusee.Ctx) -> int:
        return int(await ctx.step("crunch", crunch, retry=fusee.Retry(attempts=2, initial="1ms")))

    async with fusee.Engine.open(workflows=[cruncher]) as engine:
        assert await engine.execute(cruncher, "c-1") == 2000
        beats = [r for r in await engine.journal("c-1") if isinstance(r, rec.Heartbeat)]
    assert attempts[0] is None and attempts[1] == 1999
    assert 1 <= len(beats) < 1000, f"{len(beats)} heartbeat records for 2000 calls"


async def test_describe_shows_retries_and_paused_steps(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="fusee")
    fail = {"flaky": True}

    def flaky() -> str:
        if fail["flaky"]:
            raise ConnectionError("service down")
        return "ok"

    @fusee.workflow("retrier")
    async def retrier(ctx: fusee.Ctx) -> str:
        return str(await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=None, initial="20ms",
                                                                  max_interval="20ms")))

    @fusee.workflow("pauser")
    async def pauser(ctx: fusee.Ctx) -> str:
        return str(await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=2, initial="1ms",
                                                                  pause_when_exhausted=True)))

    async with fusee.Engine.open(workflows=[retrier, pauser]) as engine:
        await engine.start(retrier, "r-1")
        await until(lambda: engine.describe("r-1").attempt >= 2)
        d = engine.describe("r-1")
        assert d.status == "retrying"
        assert d.last_error == "ConnectionError: service down"
        assert d.next_retry is not None and d.paused_steps == ()
        attempts = [r for r in await engine.journal("r-1") if isinstance(r, rec.Attempt)]
        assert attempts and all(b"Traceback" not in a.error for a in attempts)

        await engine.start(pauser, "p-1")
        await until(lambda: engine.describe("p-1").paused_steps == ("flaky",))
        assert engine.describe("p-1").status == "paused"
        assert engine.describe("p-1").next_retry is None
        fail["flaky"] = False
        await engine.resume("p-1")
        assert await engine.get("p-1").result() == "ok"
        assert engine.describe("p-1").paused_steps == ()
        assert await engine.get("r-1").result() == "ok"
    messages = [r.getMessage() for r in caplog.records if r.name == "fusee"]
    assert any("retrying" in m for m in messages)
    assert any("paused" in m for m in messages)
    assert any(m.startswith("opened ") for m in messages)


async def test_changed_code_is_found_at_open_for_parked_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="fusee")
    go = fusee.signal("go", int)

    def make(swapped: bool) -> fusee.WorkflowDef[Any, Any]:
        # Two versions of the source: the second runs its steps in the other order.
        if not swapped:
            @fusee.workflow("twostep")
            async def twostep(ctx: fusee.Ctx) -> int:
                await ctx.step("a", lambda: 1)
                await ctx.step("b", lambda: 2)
                return int(await ctx.wait_for(go) or 0)
        else:
            @fusee.workflow("twostep")
            async def twostep(ctx: fusee.Ctx) -> int:
                await ctx.step("b", lambda: 2)
                await ctx.step("a", lambda: 1)
                return int(await ctx.wait_for(go) or 0)

        return twostep

    v1 = make(False)
    async with fusee.Engine.open(tmp_path, workflows=[v1], park_after=0) as engine:
        await engine.start(v1, "t-1")
        await until(lambda: engine.stats["parked"] >= 1)
    # The same code: nothing to check, the run stays parked.
    async with fusee.Engine.open(tmp_path, workflows=[make(False)]) as engine:
        await asyncio.sleep(0.05)
        assert engine.stuck() == {}
        assert not any("checking" in r.getMessage() for r in caplog.records)
    # Steps swapped: found at open, without a signal waking the run.
    async with fusee.Engine.open(tmp_path, workflows=[make(True)]) as engine:
        await until(lambda: "t-1" in engine.stuck())
        assert "determinism" in engine.stuck()["t-1"]
        with pytest.raises(fusee.DeterminismError):
            await asyncio.wait_for(engine.get("t-1").result(), 10)


async def test_heartbeat_timeout_fails_a_silent_attempt_and_the_next_resumes_from_progress() -> None:
    seen: list[Any] = []

    async def export(info: fusee.StepInfo) -> int:
        seen.append(info.progress)
        start = info.progress or 0
        for page in range(start, 10):
            info.heartbeat(page)
            await asyncio.sleep(0.005)
            if page == 4 and info.attempt == 1:
                await asyncio.sleep(3600)  # the worker hangs: no more heartbeats
        return 10

    def sync_export(info: fusee.StepInfo) -> int:
        seen.append(info.progress)
        info.heartbeat(7)
        if info.attempt == 1:
            time.sleep(1.0)  # silent for longer than the heartbeat timeout
        return 7

    @fusee.workflow("exporter")
    async def exporter(ctx: fusee.Ctx) -> list[int]:
        a = await ctx.step("export", export, heartbeat_timeout="400ms",
                           retry=fusee.Retry(attempts=3, initial="1ms"))
        b = await ctx.step("sync-export", sync_export, heartbeat_timeout="400ms",
                           retry=fusee.Retry(attempts=3, initial="1ms"))
        return [int(a), int(b)]

    async with fusee.Engine.open(workflows=[exporter]) as engine:
        assert await asyncio.wait_for(engine.execute(exporter, "e-1"), 20) == [10, 7]
        attempts = [r for r in await engine.journal("e-1") if isinstance(r, rec.Attempt)]
    assert seen == [None, 4, None, 7]
    assert len(attempts) == 2 and all(b"heartbeat" in a.error for a in attempts)


async def test_who_asked_is_journaled_and_shown() -> None:
    go = fusee.signal("go", int)

    @fusee.workflow("audited")
    async def audited(ctx: fusee.Ctx) -> int:
        try:
            await ctx.wait_for(go)
            await ctx.wait_for(go)
        except fusee.Cancelled:
            return -1
        return 0

    async with fusee.Engine.open(workflows=[audited]) as engine:
        h = await engine.start(audited, "a-1")
        await h.signal(go, 1, by="alice")
        await engine.cancel("a-1", "fraud suspected", by="bob")
        assert await h.result() == -1
        audit = engine.describe("a-1").audit
        assert audit == (fusee.AuditEntry("signal", "alice", "go"),
                         fusee.AuditEntry("cancel", "bob", "fraud suspected"))
        by = [r.by for r in await engine.journal("a-1") if isinstance(r, (rec.Signal, rec.CancelRequest))]
        assert by == [b"alice", b"bob"]
        await engine.start(audited, "a-2")
        await engine.terminate("a-2", "cleanup", by="carol")
        assert engine.describe("a-2").audit == (fusee.AuditEntry("terminate", "carol", "cleanup"),)
        with pytest.raises(TypeError):
            await engine.signal("a-2", go, 1, by="")


async def test_versions_run_side_by_side(tmp_path: Path) -> None:
    go = fusee.signal("go", int)

    @fusee.workflow("order", version=1)
    async def order_v1(ctx: fusee.Ctx) -> str:
        await ctx.step("charge", lambda: 1)
        await ctx.wait_for(go)
        return "v1"

    @fusee.workflow("order", version=2)
    async def order_v2(ctx: fusee.Ctx) -> str:
        await ctx.step("reserve", lambda: 1)  # a different first step: v1 journals would not replay
        await ctx.step("charge", lambda: 2)
        await ctx.wait_for(go)
        return "v2"

    async with fusee.Engine.open(tmp_path, workflows=[order_v1]) as engine:
        await engine.start(order_v1, "old")
    # Only v2 registered: the old run waits, stuck, saying what it needs.
    async with fusee.Engine.open(tmp_path, workflows=[order_v2]) as engine:
        await until(lambda: "old" in engine.stuck())
        assert "version 1 is not registered" in engine.stuck()["old"]
    async with fusee.Engine.open(tmp_path, workflows=[order_v1, order_v2]) as engine:
        await engine.start("order", "new")  # new starts take the newest version
        await engine.signal("old", go, 1)
        await engine.signal("new", go, 1)
        assert await engine.get("old").result() == "v1"
        assert await engine.get("new").result() == "v2"
        with pytest.raises(ValueError, match="version"):
            await fusee.Engine.open(workflows=[order_v1, fusee.workflow("order", version=1)(order_v1.fn)])


async def test_a_run_ends_only_after_its_running_steps_are_journaled() -> None:
    release = threading.Event()
    go = fusee.signal("go", int)
    add = fusee.update("add", int, result_type=int)

    def slow_apply(n: int) -> int:
        release.wait(30)
        return n * 2

    @fusee.workflow("handler_outlives_main")
    async def handler_outlives_main(ctx: fusee.Ctx) -> str:
        async def apply(n: int) -> int:
            return int(await ctx.step("apply", slow_apply, n))

        ctx.on_update(add, apply)
        await ctx.wait_for(go)
        return "main returned"

    async with fusee.Engine.open(workflows=[handler_outlives_main]) as engine:
        h = await engine.start(handler_outlives_main, "h-1")
        update = asyncio.ensure_future(engine.update("h-1", add, 21))
        await until(lambda: engine._rt.steps.executing == 1)
        await h.signal(go, 1)  # the main code returns while the handler's step runs
        await asyncio.sleep(0.05)
        assert engine.describe("h-1").status == "running"
        release.set()
        assert await update == 42
        assert await h.result() == "main returned"
        kinds = [type(r).__name__ for r in await engine.journal("h-1")]
        assert kinds.index("Step") < kinds.index("Done")
