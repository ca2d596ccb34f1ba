"""A scenario's requests beyond start/signal/cancel/update/query: terminate, read_stream,
object calls and enqueue, with receipts, streams and calls in the outcome (issue 26)."""

from __future__ import annotations

from typing import Any

import fusee
from fusee.sim import Scenario, ScenarioOutcome

go = fusee.signal("go", int)


def workflows(seed: int) -> list[Any]:
    @fusee.workflow("speaker")
    async def speaker(ctx: fusee.Ctx, n: int) -> int:
        words = ctx.stream("words")
        for i in range(n):
            await words.write(i)
            await ctx.sleep(f"pause{i}", "2ms")
        await words.close()
        return n

    @fusee.workflow("waiter")
    async def waiter(ctx: fusee.Ctx, _: int) -> int:
        return int(await ctx.wait_for(go))

    @fusee.workflow("collect", batch=fusee.Batch(max_size=2, max_delay="10ms"))
    async def collect(ctx: fusee.Ctx, events: list[int]) -> int:
        return int(await ctx.step("sum", lambda: sum(events)))

    tally = fusee.object("tally", state=int)

    @tally.exclusive
    async def add(ctx: fusee.ObjectCtx[int], n: int) -> int:
        await ctx.step("work", lambda: n)
        ctx.set_state(ctx.state + n)
        return ctx.state

    return [speaker, waiter, collect, tally]


def _add_handler() -> Any:
    return next(w for w in workflows(0) if isinstance(w, fusee.ObjectDef)).handlers["add"]


def build() -> Scenario:
    scenario = Scenario(workflows, duration="300ms")
    scenario.start("speaker", "s-1", 6, at="1ms")
    scenario.read_stream("s-1", "words", at="0ms")
    scenario.start("waiter", "w-1", 0, at="2ms")
    scenario.terminate("w-1", at="40ms")
    for i in range(4):
        scenario.enqueue("collect", "k", i + 1, event_id=f"e{i}", at=f"{10 + 30 * i}ms")
    add = _add_handler()
    for i in range(3):
        scenario.call(add, "acct-1", 10, call_id=f"c{i}", at=f"{5 + 20 * i}ms")

    @scenario.check
    def everything_arrives_once(outcome: ScenarioOutcome) -> None:
        assert outcome.results["w-1"].status == "terminated", outcome.results["w-1"]
        assert outcome.results["s-1"] == fusee.sim.checkers.Outcome("ok", 6)
        words = outcome.streams[("s-1", "words")]
        if outcome.seed % 2 == 0:  # seeds that keep history read the whole stream
            assert words == list(range(6)) and outcome.stream_ends[("s-1", "words")] == "ok"
        else:  # without history a late reader has a prefix
            assert words == list(range(len(words)))
        # Each event has one receipt, in a window run that finished with it in its input.
        assert sorted(outcome.receipts) == ["e0", "e1", "e2", "e3"]
        windows: dict[str, list[int]] = {}
        for eid in sorted(outcome.receipts):
            r = outcome.receipts[eid]
            windows.setdefault(r.window_id, []).append(r.position)
        for wid, positions in windows.items():
            assert sorted(positions) == list(range(len(positions)))
            assert outcome.results[wid].status == "ok"
        assert sum(outcome.results[w].value for w in windows) == 1 + 2 + 3 + 4
        # Three exclusive calls of one key, each once: 10, 20, 30 in some order.
        assert sorted(o.value for o in outcome.calls.values()) == [10, 20, 30]
        assert all(o.status == "ok" for o in outcome.calls.values())

    return scenario


def test_terminate_read_stream_call_and_enqueue_under_crashes() -> None:
    scenario = build()
    crashed = 0
    for seed in range(8):
        crashed += scenario.run(seed).crashes > 0
    assert crashed  # some of these seeds crash, so the requests were resent across lives
