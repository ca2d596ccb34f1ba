"""Workflows and a server for the web UI's browser tests and the docs' screenshots.

``Served`` runs an engine and uvicorn on one event loop in a background thread
(the UI calls the engine on its own loop, as under ``fusee serve``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

import fusee
import fusee.http
import fusee.ui
from fusee.core import records as rec
from fusee.ui.app import on_engine

approve = fusee.signal("approve", bool)
_flaky_calls: dict[str, int] = {}


def charge(info: fusee.StepInfo) -> str:
    # The first attempt of every charge fails: the timeline shows a retry.
    _flaky_calls[info.key] = _flaky_calls.get(info.key, 0) + 1
    if _flaky_calls[info.key] == 1:
        raise ConnectionError("payment gateway timed out")
    return f"pay-{info.key[-6:]}"


@fusee.workflow("invoice")
async def invoice(ctx: fusee.Ctx, order: str) -> str:
    return await ctx.step("render-pdf", lambda: f"invoice for {order}")


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, customer: str) -> str:
    ctx.set_attributes({"customer": customer, "region": "eu" if customer < "m" else "us"})
    notes: list[str] = []
    ctx.on_query(fusee.query("notes"), lambda: {"customer": customer, "notes": notes})

    def add_note(text: str) -> int:
        notes.append(text)
        return len(notes)

    def non_empty(text: str) -> None:
        if not text.strip():
            raise ValueError("a note needs some text")

    ctx.on_update(fusee.update("note", str), add_note, validator=non_empty)
    price = await ctx.step("quote", lambda: 42)
    log = ctx.stream("log")
    await log.write(f"quoted {price} for {customer}")
    payment = await ctx.step("charge", charge, retry=fusee.Retry(attempts=3, initial="10ms"))
    await log.write(f"charged: {payment}")
    await ctx.sleep("cool-off", "10ms")
    if not await ctx.wait_for(approve, timeout="1d"):
        await log.close()
        return "refunded"
    bill, label = await asyncio.gather(
        ctx.child(invoice, f"{ctx.workflow_id}-invoice", customer),
        ctx.step("label", lambda: f"label for {customer}"),
    )
    await ctx.step("ship", lambda: "shipped")
    await log.write("shipped")
    await log.close()
    return f"{customer}: {bill}, {label}"


def explode() -> int:
    raise ValueError("inventory service returned 500")


@fusee.workflow("restock")
async def restock(ctx: fusee.Ctx, sku: str) -> int:
    ctx.set_attributes({"sku": sku})
    await ctx.step("count", lambda: 7)
    return await ctx.step("reserve", explode, retry=fusee.Retry(attempts=2, initial="5ms"))


def sync_stock() -> int:
    raise RuntimeError("warehouse API unreachable")


@fusee.workflow("sync")
async def sync(ctx: fusee.Ctx, warehouse: str) -> int:
    ctx.set_attributes({"warehouse": warehouse})
    return await ctx.step("pull", sync_stock, retry=fusee.Retry(attempts=2, initial="5ms", pause_when_exhausted=True))


@fusee.workflow("report")
async def report(ctx: fusee.Ctx, name: str) -> str:
    """What the schedules of the Schedules page run."""
    return await ctx.step("build", lambda: f"report {name}")


@fusee.workflow("charges")
async def charges(ctx: fusee.Ctx, n: int) -> int:
    """Steps under the "payments" limit (the Limits page shows them in use and waiting)."""
    done = await asyncio.gather(*(ctx.step(f"pay-{i}", hold, i, limit="payments") for i in range(n)))
    return sum(done)


_released: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}


def released() -> asyncio.Event:
    """Set it (on the server's loop) to let the "payments" steps finish: they hold their permits
    until then."""
    return _released.setdefault(asyncio.get_running_loop(), asyncio.Event())


async def hold(i: int) -> int:
    await released().wait()
    return i


cart = fusee.object("cart", state=dict[str, int], initial={})


@cart.exclusive
async def add(obj: fusee.ObjectCtx[dict[str, int]], sku: str) -> int:
    state = obj.state
    state[sku] = state.get(sku, 0) + 1
    obj.set_state(state)
    return state[sku]


async def pause(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


_fetches: dict[str, int] = {}


async def fetch(info: fusee.StepInfo) -> str:
    # Takes about 50 ms; the first attempt of each run fails: the waterfall shows two bars.
    await asyncio.sleep(0.05)
    _fetches[info.key] = _fetches.get(info.key, 0) + 1
    if _fetches[info.key] == 1:
        raise ConnectionError("upstream reset the connection")
    return "fetched"


@fusee.workflow("timed")
async def timed(ctx: fusee.Ctx, n: int) -> str:
    """Steps that take time, a sleep, a retry and steps queueing for the "payments" permits
    (two at a time): what the run page's waterfall draws."""
    await ctx.step("load", pause, 0.12)
    await ctx.sleep("backoff", "300ms")
    await ctx.step("fetch", fetch, retry=fusee.Retry(initial="40ms"))
    await asyncio.gather(*(ctx.step(f"pay-{i}", pause, 0.1, limit="payments") for i in range(n)))
    return "done"


async def populate_timed(engine: fusee.Engine) -> None:
    await engine.execute(timed, "timed-1", 3)


WORKFLOWS: list[Any] = [order, invoice, restock, sync, report, charges, timed, cart]
LIMITS = [fusee.Limit("payments", concurrency=2, per_second=50.0), fusee.Limit("email", per_second=5.0)]


class Served:
    """An engine and the UI mounted at /ui, served on 127.0.0.1 from a background thread; with
    ``full``, in ``fusee.http.app`` (as ``fusee serve`` serves it: Host and Origin checked); with
    ``parts``, on a new parted directory at ``path``."""

    def __init__(self, setup: Callable[[fusee.Engine], Awaitable[Any]], path: str | None = None,
                 full: bool = False, parts: int | None = None) -> None:
        self.setup = setup
        self.path = path
        self.parts = parts
        self.full = full
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/ui"
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self.server: uvicorn.Server | None = None
        self.engine: fusee.Engine | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        if not self.ready.wait(60) or self.failure is not None:
            raise RuntimeError(f"the UI server did not start: {self.failure!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(60)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs an engine call (sync or async) on the server's loop from the test's thread."""
        assert self.engine is not None and self.loop is not None
        return asyncio.run_coroutine_threadsafe(on_engine(self.engine, fn, *args, **kwargs), self.loop).result(30)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported to __enter__
            self.failure = e
            self.ready.set()

    async def _main(self) -> None:
        # On parts, each limit's concurrency must cover every part (see docs/scale-out.md).
        limits = LIMITS if self.parts is None else []
        async with fusee.Engine.open(self.path, workflows=WORKFLOWS, limits=limits, parts=self.parts) as engine:
            self.engine = engine
            self.loop = asyncio.get_running_loop()
            await self.setup(engine)
            app: Any = (fusee.http.app(engine) if self.full
                        else Starlette(routes=[Mount("/ui", routes=fusee.ui.routes(engine))]))
            config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
            self.server = uvicorn.Server(config)
            self.sock.listen(64)
            serving = asyncio.ensure_future(self.server.serve(sockets=[self.sock]))
            while not self.server.started:
                if serving.done():
                    serving.result()
                await asyncio.sleep(0.01)
            self.ready.set()
            await serving


async def populate(engine: fusee.Engine) -> None:
    """A few runs in every state: waiting for approval, done, failed."""
    for i, customer in enumerate(["acme", "bolt", "zenith", "orbit"]):
        await engine.start(order, f"order-{i + 1}", customer)
    await engine.start(restock, "restock-1", "sku-17")
    await engine.signal("order-2", approve, True, by="alice")
    await engine.get("order-2").result()
    for wid in ("order-1", "order-3", "order-4"):
        await waiting_for_signal(engine, wid)
    try:
        await engine.get("restock-1").result()
    except fusee.WorkflowFailed:
        pass
    await engine.start(sync, "sync-1", "berlin")
    await paused(engine, "sync-1")


async def paused(engine: fusee.Engine, wid: str, timeout: float = 30.0) -> None:
    """Returns once the run has a step paused (its retries ran out)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not engine.describe(wid).paused_steps:
        if loop.time() > deadline:
            raise AssertionError(f"{wid} never paused")
        await asyncio.sleep(0.005)


async def waiting_for_signal(engine: fusee.Engine, wid: str, timeout: float = 30.0) -> None:
    """Returns once the run's durable journal shows it waiting for a signal."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(isinstance(r, rec.Wait) for r in await engine.journal(wid)):
        if loop.time() > deadline:
            raise AssertionError(f"{wid} never waited for a signal")
        await asyncio.sleep(0.005)

