"""Schedules, windows, keyed objects, reset, fork and bulk on a parted directory."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import msgspec
import pytest

import fusee
from fusee.flow import schedules, windows
from fusee.scale.parts import PartedEngine, part_of
from tests.helpers import finish
from tests.scale.test_directory_scale import spawn

RAN: dict[str, int] = {}


@fusee.workflow("pf-tick")
async def tick(ctx: fusee.Ctx, n: int) -> int:
    def once() -> int:
        RAN[ctx.workflow_id] = RAN.get(ctx.workflow_id, 0) + 1
        return n

    return await ctx.step("tick", once)


@fusee.workflow("pf-slow")
async def slow(ctx: fusee.Ctx) -> str:
    await ctx.sleep("nap", "1h")
    return "woke"


@fusee.workflow("pf-window", batch=fusee.Batch(max_size=3, max_delay="50ms"))
async def window(ctx: fusee.Ctx, events: list[str]) -> int:
    return len(events)


class Counter(msgspec.Struct):
    n: int = 0


counter = fusee.object("pf-counter", state=Counter)


@counter.exclusive
async def add(ctx: fusee.ObjectCtx[Counter], k: int) -> int:
    state = ctx.state
    state.n += k
    ctx.set_state(state)
    return state.n


def count(key: str) -> int:
    """A step's effect: how many times it has run for ``key`` (this one included)."""
    RAN[key] = RAN.get(key, 0) + 1
    return RAN[key]


@fusee.workflow("pf-two-steps")
async def two_steps(ctx: fusee.Ctx) -> list[int]:
    a = await ctx.step("a", count, f"{ctx.workflow_id}/a")
    b = await ctx.step("b", count, f"{ctx.workflow_id}/b")
    return [a, b]


note = fusee.signal("pf-note", str)


@fusee.workflow("pf-pipe", version=1)
async def pipe_v1(ctx: fusee.Ctx) -> list[str]:
    out = [str(await ctx.step("extract", count, f"{ctx.workflow_id}/extract"))]
    out.append(await ctx.wait_for(note))
    out.append(str(await ctx.step("load", count, f"{ctx.workflow_id}/load")))
    out.append(await ctx.wait_for(note))
    return out


@fusee.workflow("pf-pipe", version=2)
async def pipe_v2(ctx: fusee.Ctx) -> list[str]:
    out = [str(await ctx.step("extract", count, f"{ctx.workflow_id}/extract"))]
    out.append(await ctx.wait_for(note))
    out.append(str(await ctx.step("load-v2", count, f"{ctx.workflow_id}/load")))
    return [*out, "v2"]


async def result_of(eng: fusee.Engine, workflow_id: str) -> object:
    """The result of a run that may not have started yet (a window starts when it closes)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        try:
            return await eng.get(workflow_id).result()
        except fusee.NotFound:
            assert loop.time() < deadline, f"{workflow_id} never started"
            await asyncio.sleep(0.02)


WORKFLOWS = [tick, slow, window, counter, two_steps, pipe_v1, pipe_v2]
PARTS = 4


def on_part(prefix: str, part: int, parts: int = PARTS, *, wrap: str = "{}") -> str:
    """The first ID ``prefix-i`` whose run (``wrap`` formats it) lives on ``part``."""
    return next(f"{prefix}-{i}" for i in range(10_000) if part_of(wrap.format(f"{prefix}-{i}"), parts) == part)


def test_schedules_windows_objects_reset_fork_and_bulk_on_every_part(tmp_path: Path) -> None:
    d = tmp_path / "data"
    RAN.clear()
    sids = [on_part("s", p, wrap=schedules.PREFIX + "{}") for p in range(PARTS)]
    keys = [on_part("k", p, wrap=counter.workflow_id("{}")) for p in range(PARTS)]
    wkeys = [on_part("w", p, wrap=windows.coordinator_id(window.name, "{}")) for p in range(PARTS)]

    async def first() -> None:
        async with fusee.Engine.open(d, parts=PARTS, workflows=WORKFLOWS) as eng:
            assert isinstance(eng, PartedEngine)
            # A schedule on each part; its runs ({sid}@T) land on any part by their own IDs.
            for sid in sids:
                await eng.schedule(sid, tick, 7, every="50ms", overlap="allow_all")
            assert [i.schedule_id for i in eng.schedules()] == sorted(sids)
            asked = await eng.schedules()
            assert [i.schedule_id for i in asked] == sorted(sids) and asked.unanswered == ()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while min(i.fired for i in eng.schedules()) < 3:
                assert loop.time() < deadline, eng.schedules()
                await asyncio.sleep(0.02)
            for sid in sids:
                info = await eng.delete_schedule(sid)
                assert info.schedule_id == sid and info.fired >= 3
            assert list(eng.schedules()) == []
            with pytest.raises(fusee.ScheduleNotFound):
                await eng.describe_schedule(sids[0])
            # Each scheduled run lives on the part of its own ID (the start went there by the relay).
            fired = {p: [r.workflow_id for r in slot.runs() if r.workflow == "pf-tick"]
                     for p, slot in enumerate(eng._slots)}
            assert all(part_of(w, PARTS) == p for p, ws in fired.items() for w in ws)
            assert any(part_of(w, PARTS) != part_of(schedules.PREFIX + w.partition("@")[0], PARTS)
                       for ws in fired.values() for w in ws), "some runs should live on another part"

            # cancel_other: each new time cancels the run before it, wherever that run lives.
            await eng.schedule("c", slow, every="100ms", overlap="cancel_other")
            while (await eng.describe_schedule("c")).fired < 5:
                assert loop.time() < deadline
                await asyncio.sleep(0.02)
            info = await eng.delete_schedule("c")
            earlier = [r for r in eng.runs() if r.workflow_id.startswith("c@") and r.workflow_id != info.last_run]
            assert len(earlier) >= 4
            assert len({part_of(r.workflow_id, PARTS) for r in earlier}) > 1
            for r in earlier:
                with pytest.raises(fusee.WorkflowCancelled):
                    await eng.get(r.workflow_id).result()
            assert info.last_run is not None
            await eng.terminate(info.last_run)

            # Windows: each key's coordinator on its part, every event in exactly one window.
            receipts = {}
            for wk in wkeys:
                for i in range(7):
                    r = await eng.enqueue(window, wk, f"{wk}-e{i}", event_id=f"{wk}-e{i}")
                    receipts[f"{wk}-e{i}"] = r
                again = await eng.enqueue(window, wk, f"{wk}-e0", event_id=f"{wk}-e0")
                assert again == receipts[f"{wk}-e0"], "an event sent again keeps its receipt"
            for wk in wkeys:
                runs = sorted({r.window_id for k, r in receipts.items() if k.startswith(f"{wk}-")})
                sizes = [await result_of(eng, w) for w in runs]
                assert sum(sizes) == 7 and all(s <= 3 for s in sizes)

            # Keyed objects: one key on each part, calls once each (a call ID sent again is answered again).
            for k in keys:
                assert await eng.call(add, k, 2, call_id=f"{k}-1") == 2
                assert await eng.call(add, k, 3) == 5
                assert await eng.call(add, k, 2, call_id=f"{k}-1") == 2
                assert (await eng.object_state(counter, k)).value.n == 5
                v = await eng.set_object_state(counter, k, Counter(10))
                with pytest.raises(fusee.ObjectVersionConflict):
                    await eng.set_object_state(counter, k, Counter(0), if_version=v - 1)
            with pytest.raises(TypeError):
                await eng.call(tick, keys[0], 1)  # type: ignore[arg-type]

            # Reset and fork, on any part; a fork onto another part is refused, changing nothing.
            for p in range(PARTS):
                wid = on_part("r", p)
                assert await eng.execute(two_steps, wid) == [1, 1]
                h = await eng.reset(wid, before_step="b")
                assert await h.result() == [1, 2], "the reset run ran step b again, not a"
                twin = next(f"{wid}-f{i}" for i in range(1000) if part_of(f"{wid}-f{i}", PARTS) == p)
                assert await (await eng.fork(wid, twin, before_step="b")).result() == [1, 1]
                # A fork onto another part: the journal is imported there, cut before step b.
                elsewhere = next(f"{wid}-g{i}" for i in range(1000) if part_of(f"{wid}-g{i}", PARTS) != p)
                assert await (await eng.fork(wid, elsewhere, before_step="b")).result() == [1, 1]
                assert f"{elsewhere}/a" not in RAN and RAN[f"{elsewhere}/b"] == 1, "a replayed, b ran"
                assert eng.describe(elsewhere).status == "ok"
                assert await eng.get(wid).result() == [1, 2], "the original is left alone"
                # import_journal lands a run on the part of its ID.
                path = tmp_path / f"{wid}.fjnl"
                await eng.export(wid, path)
                imported = next(f"{wid}-i{i}" for i in range(1000) if part_of(f"{wid}-i{i}", PARTS) != p)
                assert await (await eng.import_journal(path, imported, before_step="b")).result() == [1, 1]
                assert f"{imported}/a" not in RAN and RAN[f"{imported}/b"] == 1

            # Bulk: a query across parts, acted on wherever each run lives.
            sleepers = [f"z{i}" for i in range(12)]
            for z in sleepers:
                await eng.start(slow, z)
            dry = await eng.bulk("cancel", "workflow = 'pf-slow'", dry_run=True)
            assert dry.matched == 12 and sorted(dry.workflow_ids) == sorted(sleepers)
            done = await eng.bulk("cancel", "workflow = 'pf-slow'", reason="test")
            assert sorted(done.done) == sorted(sleepers) and not done.failed
            for z in sleepers:
                with pytest.raises(fusee.WorkflowCancelled):
                    await eng.get(z).result()

    asyncio.run(first())
    assert set(RAN[w] for w in RAN if "@" in w) == {1}, "every scheduled run ran its step once"

    async def again() -> None:
        async with fusee.Engine.open(d, workflows=WORKFLOWS) as eng:  # the state survived the reopen
            for k in keys:
                assert (await eng.object_state(counter, k)).value.n == 10
            assert list(await eng.schedules()) == []

    asyncio.run(again())


HOLDER = textwrap.dedent("""
    import asyncio, json, os, sys
    import fusee
    from tests.scale.test_parts_flow import WORKFLOWS

    async def main():
        d = sys.argv[1]
        async with fusee.Engine.open(d, parts=2, workflows=WORKFLOWS, route_timeout=60) as eng:
            print(json.dumps({"opened": os.getpid()}), flush=True)
            while not os.path.exists(os.path.join(d, "release")):
                await asyncio.sleep(0.05)
            for _ in range(1200):  # the other process closed: its part comes back here
                if eng.held_parts == [0, 1]:
                    break
                await asyncio.sleep(0.05)
            print(json.dumps({"held": eng.held_parts}), flush=True)

    asyncio.run(main())
""")


def test_a_fork_onto_another_part_takes_every_option_of_a_fork_on_one(tmp_path: Path) -> None:
    # The reference is the fork of one engine: a twin on the original's own part.
    RAN.clear()

    async def forked(eng: fusee.Engine, original: str, new_id: str, signals: list[str], **options: object) -> object:
        h = await eng.fork(original, new_id, **options)  # type: ignore[arg-type]
        for value in signals:
            await h.signal(note, value)
        return await h.result()

    async def main() -> None:
        async with fusee.Engine.open(tmp_path / "data", parts=PARTS, workflows=WORKFLOWS) as eng:
            original = on_part("o", 0)
            h = await eng.start(pipe_v2, original)  # the newest version
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            # The signal after the first step's record, so that a cut at the wait (position 1) leaves it after.
            while not any(type(r).__name__ == "Step" for r in await eng.journal(original)):
                assert loop.time() < deadline, "the first step never became durable"
                await asyncio.sleep(0.01)
            await h.signal(note, "first")
            assert await h.result() == ["1", "first", "1", "v2"]
            cases: list[tuple[list[str], dict[str, object], list[str]]] = [
                # Before the wait, "first" not delivered again, moved to version 1, by an operator.
                (["second", "third"], {"before_position": 1, "reapply_signals": False, "version": 1, "by": "ops"},
                 ["1", "second", "1", "third"]),
                # Before the wait, "first" delivered again, the journal's version.
                ([], {"before_position": 1}, ["1", "first", "1", "v2"]),
                # Before the step by name (journaled), as before_step= always did.
                ([], {"before_step": "load-v2"}, ["1", "first", "1", "v2"]),
            ]
            for n, (signals, options, expected) in enumerate(cases):
                got = [await forked(eng, original, on_part(f"{prefix}{n}", part), signals, **options)
                       for prefix, part in (("t", 0), ("x", 1))]
                assert got == [expected, expected], (options, got)
            for n in range(len(cases)):
                ids = [on_part(f"t{n}", 0), on_part(f"x{n}", 1)]
                assert [f"{w}/extract" in RAN for w in ids] == [False, False], "extract replayed, never ran"
                assert [RAN[f"{w}/load"] for w in ids] == [1, 1], "the step after the cut ran once"
                starts = [(await eng.journal(w))[0] for w in ids]
                assert [(s.version, s.by, s.parent) for s in starts] == [  # type: ignore[union-attr]
                    (1 if n == 0 else 2, b"ops" if n == 0 else None, None)] * 2
            other = on_part("x0", 1)
            assert [(a.action, a.by) for a in eng.describe(other).audit] == [("reset", "ops")]
            assert await eng.get(original).result() == ["1", "first", "1", "v2"], "the original is left alone"
            # Refusals change nothing: an ID in use, a version not registered, no cut or two.
            with pytest.raises(fusee.AlreadyExists, match="fork into a new ID"):
                await eng.fork(original, other, before_position=1)
            with pytest.raises(fusee.UnknownWorkflow):
                await eng.fork(original, f"{other}-v9", before_position=1, version=9)
            with pytest.raises(ValueError, match="exactly one"):
                await eng.fork(original, f"{other}-none")
            with pytest.raises(ValueError, match="no step named"):
                await eng.fork(original, f"{other}-nope", before_step="nope")
            for refused in (f"{other}-v9", f"{other}-none", f"{other}-nope"):
                with pytest.raises(fusee.NotFound):
                    eng.describe(refused)

    asyncio.run(main())


def test_schedules_and_objects_held_by_another_process(tmp_path: Path) -> None:
    d = tmp_path / "data"
    holder = spawn("-c", HOLDER, str(d))
    assert holder.stdout is not None
    assert "opened" in json.loads(holder.stdout.readline())

    async def main() -> None:
        async with fusee.Engine.open(d, workflows=WORKFLOWS, route_timeout=60) as eng:
            assert isinstance(eng, PartedEngine)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(eng.held_parts) != 1:  # the other process hands one part over
                assert loop.time() < deadline, "no part was handed over"
                await asyncio.sleep(0.02)
            theirs = 1 - eng.held_parts[0]
            sid = on_part("s", theirs, 2, wrap=schedules.PREFIX + "{}")
            mine = on_part("s", eng.held_parts[0], 2, wrap=schedules.PREFIX + "{}")
            await eng.schedule(sid, tick, 1, every="1h", paused=True)
            await eng.schedule(mine, tick, 1, every="1h", paused=True)
            assert [i.schedule_id for i in eng.schedules()] == [mine], "as a list: the parts held here"
            asked = await eng.schedules()
            assert sorted(i.schedule_id for i in asked) == sorted([sid, mine]) and asked.unanswered == ()
            assert (await eng.describe_schedule(sid)).paused
            assert not (await eng.unpause_schedule(sid)).paused
            key = on_part("k", theirs, 2, wrap=counter.workflow_id("{}"))
            assert await eng.call(add, key, 4, call_id="c1") == 4
            assert await eng.call(add, key, 4, call_id="c1") == 4
            assert await eng.call(add, key, 1) == 5
            assert (await eng.object_state(counter, key)).value.n == 5
            wk = on_part("w", theirs, 2, wrap=windows.coordinator_id(window.name, "{}"))
            r = await eng.enqueue(window, wk, "e1")
            assert await result_of(eng, r.window_id) == 1
            # A fork from a run here onto the other process's part (its journal routed there).
            here = on_part("x", eng.held_parts[0], 2)
            assert await eng.execute(two_steps, here) == [1, 1]
            there = on_part("xf", theirs, 2)
            assert await (await eng.fork(here, there, before_step="b")).result() == [1, 1]
            assert [type(x).__name__ for x in await eng.journal(there)][-1] == "Done"
            # With every option of a fork, through the routed call: before the wait, the signal
            # not delivered again, on version 1, by an operator.
            h = await eng.start(pipe_v2, on_part("xp", eng.held_parts[0], 2))
            while not any(type(x).__name__ == "Step" for x in await eng.journal(h.workflow_id)):
                assert loop.time() < deadline + 60, "the first step never became durable"
                await asyncio.sleep(0.01)
            await h.signal(note, "first")
            assert await h.result() == ["1", "first", "1", "v2"]
            f = await eng.fork(h.workflow_id, on_part("xpf", theirs, 2), before_position=1,
                               reapply_signals=False, version=1, by="ops")
            await f.signal(note, "second")
            await f.signal(note, "third")
            assert await f.result() == ["1", "second", "1", "third"]
            start = (await eng.journal(f.workflow_id))[0]
            assert (start.version, start.by) == (1, b"ops")  # type: ignore[union-attr]
        (d / "release").touch()

    try:
        asyncio.run(main())
        held = finish(holder)[-1]["held"]
        assert held == [0, 1], "the holder took this process's part back when it closed"
    finally:
        if holder.poll() is None:
            holder.kill()
