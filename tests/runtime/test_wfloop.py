"""The per-run workflow loop: asyncio primitives work, replay is exact, nothing leaks out.

The loop's overhead is measured by ``bench/wfloop.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
from asyncio import events
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from fusee.errors import NondeterministicCall
from fusee.runtime.wfloop import WorkflowLoop


class Host:
    """Plays the runtime: hands out named operations and resolves them when told."""

    def __init__(self, loop: WorkflowLoop) -> None:
        self.loop = loop
        self.ops: dict[str, asyncio.Future[Any]] = {}
        self.trace: list[str] = []

    def op(self, name: str) -> asyncio.Future[Any]:
        assert name not in self.ops, name
        fut = self.loop.create_future()
        self.ops[name] = fut
        self.trace.append(f"start {name}")
        return fut

    def resolve(self, name: str, value: Any) -> int:
        self.trace.append(f"resolve {name}")
        self.ops.pop(name).set_result(value)
        return self.loop.run_until_quiescent()


def start(loop: WorkflowLoop, fn: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
    async def main() -> Any:
        return await fn()

    task = loop.create_task(main())
    loop.run_until_quiescent()
    return task


def test_gather_returns_in_argument_order_whatever_the_resolution_order() -> None:
    loop = WorkflowLoop("t")
    host = Host(loop)

    async def branch(i: int) -> int:
        value: int = await host.op(f"op{i}")
        host.trace.append(f"branch {i} got {value}")
        return value * 10

    task = start(loop, lambda: asyncio.gather(*(branch(i) for i in range(4))))
    assert list(host.ops) == ["op0", "op1", "op2", "op3"]
    for i in (2, 0, 3):
        host.resolve(f"op{i}", i)
        assert not task.done()
    host.resolve("op1", 1)
    assert task.result() == [0, 10, 20, 30]
    got = [line for line in host.trace if line.startswith("branch")]
    assert got == ["branch 2 got 2", "branch 0 got 0", "branch 3 got 3", "branch 1 got 1"]


def test_wait_first_completed_and_create_task() -> None:
    loop = WorkflowLoop()
    host = Host(loop)

    async def workflow() -> tuple[str, str]:
        a = asyncio.create_task(_await(host.op("a")))
        b = asyncio.create_task(_await(host.op("b")))
        done, pending = await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and pending
        first = done.pop().result()
        second = await pending.pop()
        return first, second

    task = start(loop, workflow)
    host.resolve("b", "B")
    assert not task.done()
    host.resolve("a", "A")
    assert task.result() == ("B", "A")


async def _await(fut: Awaitable[Any]) -> Any:
    return await fut


def test_event_queue_lock_shield_and_wait_for_without_timeout() -> None:
    loop = WorkflowLoop()
    host = Host(loop)
    log: list[str] = []

    async def producer(queue: asyncio.Queue[int], ready: asyncio.Event) -> None:
        await ready.wait()
        for i in range(3):
            await queue.put(await host.op(f"item{i}"))
        await queue.put(-1)

    async def consumer(queue: asyncio.Queue[int], lock: asyncio.Lock) -> int:
        total = 0
        while (item := await queue.get()) >= 0:
            async with lock:
                log.append(f"consume {item}")
                total += item
        return total

    async def workflow() -> int:
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        ready = asyncio.Event()
        lock = asyncio.Lock()
        prod = asyncio.create_task(producer(queue, ready))
        cons = asyncio.create_task(consumer(queue, lock))
        ready.set()
        await prod
        total = await asyncio.wait_for(cons, timeout=None)
        extra = await asyncio.shield(host.op("extra"))
        return total + extra

    task = start(loop, workflow)
    for i in range(3):
        host.resolve(f"item{i}", i + 1)
    assert log == ["consume 1", "consume 2", "consume 3"]
    host.resolve("extra", 100)
    assert task.result() == 106


def _elaborate(host: Host) -> Callable[[], Awaitable[Any]]:
    """A workflow mixing tasks, sleep(0), events and gather: many orderings are possible."""

    async def worker(i: int, gate: asyncio.Event) -> int:
        host.trace.append(f"w{i} begins")
        await asyncio.sleep(0)
        host.trace.append(f"w{i} after yield")
        value: int = await host.op(f"w{i}")
        if i % 2:
            await gate.wait()
        host.trace.append(f"w{i} ends with {value}")
        return value

    async def workflow() -> list[int]:
        gate = asyncio.Event()
        tasks = [asyncio.create_task(worker(i, gate)) for i in range(5)]
        host.trace.append("spawned")
        await host.op("open")
        gate.set()
        return list(await asyncio.gather(*tasks))

    return workflow


def _replay(order: list[str]) -> list[str]:
    loop = WorkflowLoop()
    host = Host(loop)
    task = start(loop, _elaborate(host))
    for name in order:
        host.resolve(name, len(name) + len(host.trace))
    assert task.done()
    host.trace.append(f"result {task.result()}")
    loop.close()
    return host.trace


def test_identical_runs_produce_identical_traces() -> None:
    order = ["w3", "w0", "open", "w4", "w1", "w2"]
    first = _replay(order)
    assert first == _replay(order)
    assert first.index("spawned") < first.index("w0 begins")
    # Another resolution order is another execution: the trace can tell them apart.
    assert first != _replay(["w0", "w1", "w2", "w3", "w4", "open"])


def test_host_running_loop_is_restored() -> None:
    seen: list[object] = []

    async def host_main() -> None:
        host_loop = asyncio.get_running_loop()
        loop = WorkflowLoop()

        async def workflow() -> None:
            seen.append(asyncio.get_running_loop())
            seen.append(asyncio.current_task())
            await asyncio.sleep(0)
            seen.append(asyncio.get_running_loop())

        task = loop.create_task(workflow())
        assert loop.run_until_quiescent() == 2
        assert asyncio.get_running_loop() is host_loop
        assert seen[0] is loop and seen[1] is task and seen[2] is loop
        assert not loop.is_running()

        def interrupt() -> None:
            raise KeyboardInterrupt

        loop.call_soon(interrupt)
        later = loop.call_soon(seen.append, "later")
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_quiescent()
        assert asyncio.get_running_loop() is host_loop
        assert loop.has_ready() and not loop.is_running()
        assert loop.run_until_quiescent() == 1 and seen[-1] == "later"
        assert later is not None
        await asyncio.sleep(0)  # the host loop still works

    asyncio.run(host_main())
    # With no host loop, none is left behind either.
    loop = WorkflowLoop()
    loop.create_task(_await(asyncio.sleep(0)))
    loop.run_until_quiescent()
    assert events._get_running_loop() is None


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: asyncio.sleep(1), "ctx.sleep"),
        (lambda: asyncio.wait_for(asyncio.get_running_loop().create_future(), timeout=5), "timeout="),
        (lambda: asyncio.to_thread(print), "ctx.step"),
        (lambda: asyncio.get_running_loop().run_in_executor(None, print), "run_in_executor"),
        (lambda: asyncio.get_running_loop().getaddrinfo("example.com", 80), "getaddrinfo"),
        (lambda: asyncio.open_connection("127.0.0.1", 9), "create_connection"),
        (lambda: _await_now(), "ctx.now()"),
        (lambda: _await_timeout(), "timeout="),
    ],
)
def test_clock_timers_and_io_are_refused(call: Callable[[], Awaitable[Any]], needle: str) -> None:
    loop = WorkflowLoop()

    async def workflow() -> None:
        await call()

    task = start(loop, workflow)
    assert task.done()
    error = task.exception()
    assert isinstance(error, NondeterministicCall), error
    assert needle in str(error)
    assert "not allowed inside workflow code" in str(error)
    loop.close()


async def _await_now() -> float:
    return asyncio.get_running_loop().time()


async def _await_timeout() -> None:
    async with asyncio.timeout(5):
        await asyncio.sleep(0)


def test_close_runs_finally_blocks_and_cancels_again_if_needed() -> None:
    loop = WorkflowLoop()
    host = Host(loop)
    log: list[str] = []

    async def stubborn() -> None:
        try:
            await host.op("first")
        finally:
            log.append("stubborn finally 1")
            try:
                await host.op("cleanup")  # awaits again: the next round cancels it
            finally:
                log.append("stubborn finally 2")

    async def plain() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            log.append("plain cancelled")
            raise

    async def workflow() -> None:
        await asyncio.gather(stubborn(), plain())

    task = start(loop, workflow)
    loop.close()
    assert log == ["stubborn finally 1", "plain cancelled", "stubborn finally 2"]
    assert task.cancelled()
    assert loop.is_closed()
    loop.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon(print)
    with pytest.raises(RuntimeError, match="closed"):
        loop.run_until_quiescent()
    coro = _const(1)
    with pytest.raises(RuntimeError, match="closed"):
        loop.create_task(coro)
    assert coro.cr_frame is None  # closed, so no "never awaited" warning


def test_cancelling_a_task_cancels_the_host_future_it_awaits() -> None:
    """The host must check ``future.done()`` before resolving: a cancelled branch cancels it."""
    loop = WorkflowLoop()
    host = Host(loop)

    async def workflow() -> str:
        child = asyncio.create_task(_await(host.op("slow")))
        await asyncio.sleep(0)
        child.cancel()
        try:
            await child
        except asyncio.CancelledError:
            return "compensated"
        return "not cancelled"

    task = start(loop, workflow)
    assert task.result() == "compensated"
    assert host.ops["slow"].cancelled()


def test_unhandled_exceptions_are_collected_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> None:
        raise ValueError("callback boom")

    async def failing() -> None:
        raise LookupError("task boom")

    callback_loop = WorkflowLoop()
    callback_loop.call_soon(broken)
    assert callback_loop.run_until_quiescent() == 1
    [context] = callback_loop.unhandled
    assert isinstance(context["exception"], ValueError)

    task_loop = WorkflowLoop()
    task_loop.create_task(failing())
    assert task_loop.run_until_quiescent() == 1
    task_loop.close()  # drops the loop's reference to the failed task
    gc.collect()
    [context] = task_loop.unhandled
    assert isinstance(context["exception"], LookupError)
    assert "never retrieved" in context["message"]
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_custom_exception_handler_receives_contexts() -> None:
    loop = WorkflowLoop()
    got: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: got.append(context))
    loop.call_soon(lambda: 1 / 0)
    loop.run_until_quiescent()
    assert isinstance(got[0]["exception"], ZeroDivisionError)
    assert loop.unhandled == []
    assert loop.get_exception_handler() is not None


def test_reentrant_drain_is_refused() -> None:
    loop = WorkflowLoop()

    async def workflow() -> str:
        assert asyncio.get_running_loop().is_running()
        try:
            loop.run_until_quiescent()
        except RuntimeError as error:
            return str(error)
        return "no error"

    task = start(loop, workflow)
    assert "already draining" in task.result()


def test_drain_counts_callbacks_and_skips_cancelled_handles() -> None:
    loop = WorkflowLoop()
    ran: list[int] = []
    assert not loop.has_ready()
    assert loop.run_until_quiescent() == 0

    def chain(n: int) -> None:
        ran.append(n)
        if n < 3:
            loop.call_soon(chain, n + 1)

    loop.call_soon(chain, 0)
    skipped = loop.call_soon(ran.append, 99)
    skipped.cancel()
    assert loop.has_ready()
    assert loop.run_until_quiescent() == 4
    assert ran == [0, 1, 2, 3]
    assert not loop.has_ready()


def test_context_variables_are_per_task() -> None:
    loop = WorkflowLoop()
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def child(tag: str) -> str:
        var.set(tag)
        await asyncio.sleep(0)
        return var.get()

    async def workflow() -> list[str]:
        var.set("parent")
        results = await asyncio.gather(child("a"), child("b"))
        return [*results, var.get()]

    assert start(loop, workflow).result() == ["a", "b", "parent"]


def test_abandoned_async_generator_is_closed_on_the_workflow_loop() -> None:
    loop = WorkflowLoop()
    closed_on: list[object] = []

    async def numbers() -> Any:
        try:
            for i in range(10):
                await asyncio.sleep(0)
                yield i
        finally:
            closed_on.append(asyncio.get_running_loop())

    async def workflow() -> int:
        async for i in numbers():
            if i == 2:
                break
        await asyncio.sleep(0)
        return i

    task = start(loop, workflow)
    gc.collect()
    loop.run_until_quiescent()
    assert task.result() == 2
    assert closed_on == [loop]
    assert loop.unhandled == []


def test_many_short_tasks_do_not_accumulate() -> None:
    loop = WorkflowLoop()

    async def workflow() -> int:
        total = 0
        for i in range(1000):
            total += await asyncio.create_task(_await(_const(i)))
        return total

    assert start(loop, workflow).result() == sum(range(1000))
    assert len(loop._tasks) < 200


async def _const(value: int) -> int:
    return value


def test_max_callbacks_bounds_a_drain_of_code_that_never_stops_yielding() -> None:
    loop = WorkflowLoop()
    spins = 0

    async def spinner() -> None:
        nonlocal spins
        while True:
            spins += 1
            await asyncio.sleep(0)

    async def stubborn_spinner() -> None:
        while True:
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pass  # swallows cancellation: close() must still finish

    loop.create_task(spinner())
    assert loop.run_until_quiescent(max_callbacks=100) == 100
    assert spins == 100 and loop.has_ready()
    loop.close()
    assert loop.is_closed()
    stubborn = WorkflowLoop()
    stubborn.create_task(stubborn_spinner())
    stubborn.close()
    assert stubborn.is_closed()
