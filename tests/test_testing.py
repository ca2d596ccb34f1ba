"""The testing kit: an in-memory engine whose clock skips idle time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fusee
from fusee import testing
from fusee.core import records as rec
from fusee.testing import TestEngine

go = fusee.signal("go", int)


@fusee.workflow("subscription")
async def subscription(ctx: fusee.Ctx, months: int) -> list[str]:
    bills = []
    for m in range(months):
        bills.append(await ctx.step(f"bill-{m}", lambda m=m: f"month {m}"))
        await ctx.sleep(f"wait-{m}", "30d")
    return bills


@fusee.workflow("reminder")
async def reminder(ctx: fusee.Ctx) -> str:
    got = await ctx.wait_for(go, timeout="7d")
    return "answered" if got is not None else "reminded"


async def test_a_year_of_sleeps_takes_milliseconds() -> None:
    async with TestEngine(workflows=[subscription]) as env:
        start = env.now()
        out = await asyncio.wait_for(env.execute(subscription, "sub-1", 12), 10)
        assert out == [f"month {m}" for m in range(12)]
        assert (env.now() - start).days >= 360


async def test_timeouts_fire_and_skip_moves_time_by_hand() -> None:
    async with TestEngine(workflows=[reminder], skip_time=False) as env:
        h = await env.start(reminder, "r-1")
        await env.skip("6d")
        assert env.describe("r-1").status == "running"
        await env.skip("1d")
        assert await asyncio.wait_for(h.result(), 10) == "reminded"
        h2 = await env.start(reminder, "r-2")
        await env.signal("r-2", go, 1)
        assert await h2.result() == "answered"


async def test_it_opens_without_touching_a_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Why it opens in about a millisecond: memory storage, no directory, no sync.
    import os

    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd))
    monkeypatch.chdir(tmp_path)
    async with TestEngine(workflows=[reminder]) as env:
        assert await env.execute(reminder, "r-1") is not None
    assert synced == []
    assert list(tmp_path.iterdir()) == []


# --- recorded histories against new code ---------------------------------------------------


@fusee.workflow("checkout", version=1)
async def checkout_v1(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("price", lambda: n * 10)
    await ctx.sleep("hold", "1h")
    return int(await ctx.step("charge", lambda: a + 1))


@fusee.workflow("checkout", version=1)
async def checkout_renamed(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("quote", lambda: n * 10)  # renamed without ctx.patched: breaks old runs
    await ctx.sleep("hold", "1h")
    return int(await ctx.step("charge", lambda: a + 1))


@fusee.workflow("checkout", version=1)
async def checkout_patched(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("price", lambda: n * 10)
    await ctx.sleep("hold", "1h")
    if ctx.patched("loyalty"):
        a -= 1
    return int(await ctx.step("charge", lambda: a + 1))


async def test_export_and_replay_against_new_code(tmp_path: Path) -> None:
    async with TestEngine(workflows=[checkout_v1]) as env:
        assert await env.execute(checkout_v1, "c-1", 4) == 41
        await env.start(checkout_v1, "c-2", 5)  # still sleeping: exported mid-way
        await asyncio.sleep(0)
        assert await env.export("c-1", tmp_path / "c-1.fjnl") == len(await env.journal("c-1"))
        await env.export("c-2", tmp_path / "c-2.fjnl")
    journal = testing.load_journal(tmp_path / "c-1.fjnl")
    assert isinstance(journal[0], rec.Start) and journal[0].id == "c-1"
    await testing.replay(tmp_path / "c-1.fjnl", [checkout_v1])
    await testing.replay(journal, [checkout_patched])  # a patched change replays old runs fine
    assert await testing.replay_dir(tmp_path, [checkout_v1]) == 2
    with pytest.raises(fusee.DeterminismError, match="position 0"):
        await testing.replay(tmp_path / "c-1.fjnl", [checkout_renamed])
    with pytest.raises(fusee.DeterminismError, match=r"c-1\.fjnl"):
        await testing.replay_dir(tmp_path, [checkout_renamed])


async def test_journal_json_is_the_same_for_equivalent_runs(tmp_path: Path) -> None:
    async with TestEngine(workflows=[checkout_v1]) as env:
        await env.execute(checkout_v1, "a", 4)
        await env.execute(checkout_v1, "b", 4)
        ja = testing.journal_json(await env.journal("a"))
        jb = testing.journal_json(await env.journal("b"))
    strip = [{k: v for k, v in r.items() if k != "id"} for r in ja]
    assert strip == [{k: v for k, v in r.items() if k != "id"} for r in jb]
    assert ja[0]["kind"] == "Start" and ja[-1] == {"kind": "Done", "status": "ok", "payload": 41, "by": None}


def test_a_damaged_journal_file_is_refused(tmp_path: Path) -> None:
    from fusee import journal_file

    start = rec.Start(1, "w", "t", 1, 0, 0, 0, None, 0, None, b"null")
    data = bytearray(journal_file.dumps([start]))
    assert journal_file.loads(bytes(data)) == [start]
    data[12] ^= 1
    with pytest.raises(fusee.CorruptRecord, match="checksum"):
        journal_file.loads(bytes(data))
    (tmp_path / "x.fjnl").write_bytes(b"not a journal")
    with pytest.raises(fusee.CorruptRecord, match="not a Fusee journal"):
        testing.load_journal(tmp_path / "x.fjnl")


@fusee.workflow("durable_sum")
async def durable_sum(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(f"add-{i}", lambda i=i: i)
        await ctx.sleep(f"pause-{i}", "1h")
    return total


LEAKED = {"total": 0}


def leaky_add(i: int) -> int:
    LEAKED["total"] += i  # state outside the journal: a restart sees a different total
    return LEAKED["total"]


@fusee.workflow("leaky_sum")
async def leaky_sum(ctx: fusee.Ctx, n: int) -> int:
    last = 0
    for i in range(n):
        last = await ctx.step(f"add-{i}", lambda i=i: leaky_add(i))
    return int(last + LEAKED["total"] * 0 + (1 if LEAKED["total"] > 10 else 0))


async def test_crash_everywhere_passes_a_durable_workflow() -> None:
    cuts = await testing.crash_everywhere(durable_sum, 4)
    assert cuts >= 8  # a cut after every record but the last


async def test_crash_everywhere_finds_state_kept_outside_the_journal() -> None:
    LEAKED["total"] = 0
    with pytest.raises(testing.CrashCheckFailed, match="crash at record"):
        await testing.crash_everywhere(leaky_sum, 4)


# --- the engine's options in the replay helpers (issue 22, finding 6) ------------------------

API = [fusee.Limit("api", concurrency=1)]
phase_q = fusee.query("phase", str)


@fusee.workflow("limited")
async def limited(ctx: fusee.Ctx, n: int) -> int:
    phase = "pricing"
    ctx.on_query(phase_q, lambda _: phase)
    a = await ctx.step("price", lambda: n * 10, limit="api")
    await ctx.sleep("hold", "1h")
    phase = "charged"
    return int(await ctx.step("charge", lambda: a + 1, limit="api"))


@fusee.workflow("limited")
async def limited_with_a_bug(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("price", lambda: n * 10, limit="api")
    await ctx.sleep("hold", "1h")
    return {"a": a}["total"]  # a KeyError the recorded run never raised


async def test_replay_takes_the_engine_options(tmp_path: Path) -> None:
    async with TestEngine(workflows=[limited], limits=API) as env:
        assert await env.execute(limited, "l-1", 4) == 41
        await env.export("l-1", tmp_path / "l-1.fjnl")
    # Unchanged code, replayed with the limits it is opened with: it matches.
    await testing.replay(tmp_path / "l-1.fjnl", [limited], limits=API)
    assert await testing.replay_dir(tmp_path, [limited], limits=API) == 1
    # Without them the code meets an engine it was not written for: said as such, not as a divergence.
    with pytest.raises(fusee.UnknownLimit, match="'api'"):
        await testing.replay(tmp_path / "l-1.fjnl", [limited])


async def test_replay_reports_an_exception_of_the_code_as_itself(tmp_path: Path) -> None:
    async with TestEngine(workflows=[limited], limits=API) as env:
        await env.execute(limited, "l-1", 4)
        await env.export("l-1", tmp_path / "l-1.fjnl")
    with pytest.raises(KeyError, match="total") as got:
        await testing.replay(tmp_path / "l-1.fjnl", [limited_with_a_bug], limits=API)
    assert any("while replaying its journal" in n for n in got.value.__notes__)
    with pytest.raises(KeyError) as got:
        await testing.replay_dir(tmp_path, [limited_with_a_bug], limits=API)
    assert any("l-1.fjnl" in n for n in got.value.__notes__)


async def test_crash_everywhere_takes_the_engine_options_and_refuses_to_check_nothing() -> None:
    assert await testing.crash_everywhere(limited, 4, limits=API) >= 4
    # Without the limit the run fails at its first step: no cut to check, and it says so.
    with pytest.raises(testing.CrashCheckFailed, match=r"nothing to check.*UnknownLimit"):
        await testing.crash_everywhere(limited, 4)


async def test_an_ended_run_that_used_a_limit_answers_queries() -> None:
    async with TestEngine(workflows=[limited], limits=API) as env:
        h = await env.start(limited, "l-1", 4)
        assert await h.result() == 41
        assert await h.query(phase_q) == "charged"  # from a read-only replay of its journal


def test_engine_options_are_options_of_engine_open() -> None:
    import inspect
    import typing

    params = inspect.signature(fusee.Engine.open).parameters
    hints = typing.get_type_hints(fusee.Engine.open)
    for name, hint in typing.get_type_hints(testing.EngineOptions).items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert hints[name] == hint, name


def test_fusee_import_replays_with_the_engine_options(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "limited_app.py").write_text(
        "import fusee\n"
        "@fusee.workflow('limited')\n"
        "async def limited(ctx: fusee.Ctx, n: int) -> int:\n"
        "    a = await ctx.step('price', lambda: n * 10, limit='api')\n"
        "    await ctx.sleep('hold', '1h')\n"
        "    return int(await ctx.step('charge', lambda: a + 1, limit='api'))\n"
        "WORKFLOWS = [limited]\n"
        "OPTIONS = {'limits': [fusee.Limit('api', concurrency=1)]}\n"
    )

    async def record() -> None:
        async with TestEngine(workflows=[limited], limits=API) as env:
            await env.execute(limited, "l-1", 4)
            await env.export("l-1", tmp_path / "l-1.fjnl")

    asyncio.run(record())
    fusee_bin = str(Path(sys.executable).parent / "fusee")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([fusee_bin, "import", str(tmp_path / "l-1.fjnl"), *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)

    p = run("--replay", "limited_app:WORKFLOWS", "--options", "limited_app:OPTIONS")
    assert p.returncode == 0, p.stderr
    assert "replays its" in p.stdout
    p = run("--replay", "limited_app:WORKFLOWS")
    assert p.returncode == 1 and "limit 'api'" in p.stderr and "determinism" not in p.stderr


# --- the clock skips only while the test waits too (issue 22, finding 7) ---------------------

stop = fusee.signal("stop")
LEDGER: list[str] = []


@fusee.workflow("watchdog")
async def watchdog(ctx: fusee.Ctx) -> str:
    await ctx.step("work", lambda: LEDGER.append("worked"))
    got = await ctx.wait_for(stop, timeout="1h")
    return "stopped" if got is not None else "timed out"


async def test_the_clock_holds_while_the_test_polls_on_its_own() -> None:
    LEDGER.clear()
    async with TestEngine(workflows=[watchdog]) as env:
        start = env.now()
        h = await env.start(watchdog, "w-1")
        # The test is busy (it polls every 10 ms on the real clock): the run's hour must not pass meanwhile.
        polls = 0
        while not LEDGER or polls < 5:
            await asyncio.sleep(0.01)
            polls += 1 if LEDGER else 0
        assert env.describe("w-1").status == "running"
        await h.cancel("the test decided")
        with pytest.raises(fusee.WorkflowCancelled):
            await asyncio.wait_for(h.result(), 10)
        assert (env.now() - start).total_seconds() < 3600


async def test_the_clock_skips_while_the_test_awaits_the_engine_or_env_until() -> None:
    LEDGER.clear()
    async with TestEngine(workflows=[watchdog]) as env:
        start = env.now()
        assert await asyncio.wait_for(env.execute(watchdog, "w-1"), 10) == "timed out"
        assert (env.now() - start).total_seconds() >= 3600
        await env.start(watchdog, "w-2")
        await env.until(lambda: env.describe("w-2").status == "ok", timeout=10)
        assert (env.now() - start).total_seconds() >= 7200
