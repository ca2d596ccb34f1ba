"""The benchmark workloads on Fusee, through its public API only.

    .venv/bin/python bench/workloads_fusee.py WORKLOAD [--quick] [sizes...]

WORKLOAD is one of chain, fanout, start, signals, timers, due, scale, recovery, or
all (every one in this process, for a smoke run). ``run_all.py`` runs each in
a fresh process so one workload's memory never colours another's figures.
Each prints one marked JSON line (see ``common.emit_result``).

The engine runs with its defaults (every acknowledged start, signal and step
result is in the shared log and ``fdatasync``ed first). The step functions are
the same as on the DBOS side: async functions that stamp the clock and return
a small value.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import inspect
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

import fusee

#: perf_counter() each time a stamped step function ran.
STAMPS: list[float] = []
#: Per workflow id: when its marking steps ran.
MARKS: dict[str, list[float]] = {}
#: The Engine.open options actually applied (reported with each result).
APPLIED_OPTIONS: dict[str, Any] = {}

go = fusee.signal("go", int)


async def bump(value: int) -> int:
    """The benchmark's step: note the time, return a small value."""
    STAMPS.append(time.perf_counter())
    return value + 1


async def mark(key: str) -> int:
    """A step that notes when it ran for workflow ``key``."""
    MARKS.setdefault(key, []).append(time.perf_counter())
    return len(MARKS[key])


@fusee.workflow("bench_chain")
async def chain(ctx: fusee.Ctx, steps: int) -> int:
    """Workload 2: ``steps`` sequential steps."""
    total = 0
    for _ in range(steps):
        total = await ctx.step("bump", functools.partial(bump, total))
    return total


@fusee.workflow("bench_fan")
async def fan(ctx: fusee.Ctx, steps: int) -> int:
    """Workload 3: one of many concurrent workflows of ``steps`` steps."""
    total = 0
    for _ in range(steps):
        total = await ctx.step("bump", functools.partial(bump, total))
    return total


def stamp(value: int) -> int:
    """A synchronous step body as users write one: note the time, return a small value."""
    STAMPS.append(time.perf_counter())
    return value + 1


@fusee.workflow("bench_users_chain")
async def users_chain(ctx: fusee.Ctx, steps: int) -> int:
    """Workload 2 as users write it: a fresh lambda per step around a synchronous function."""
    total = 0
    for _ in range(steps):
        total = await ctx.step("bump", lambda total=total: stamp(total))
    return total


@fusee.workflow("bench_users_fan")
async def users_fan(ctx: fusee.Ctx, steps: int) -> int:
    """Workload 3 as users write it: a closure defined per step."""
    total = 0
    for _ in range(steps):
        def bump_it(total: int = total) -> int:
            return stamp(total)
        total = await ctx.step("bump", bump_it)
    return total


@fusee.workflow("bench_one_step")
async def one_step(ctx: fusee.Ctx, value: int) -> int:
    """Workload 4: a workflow of one step, executed start to result."""
    return int(await ctx.step("bump", functools.partial(bump, value)))


@fusee.workflow("bench_waiter")
async def waiter(ctx: fusee.Ctx, key: str) -> int | None:
    """Workload 5a: notes it is ready, waits for a signal, notes it resumed."""
    await ctx.step("ready", functools.partial(mark, key))
    value = await ctx.wait_for(go)
    await ctx.step("resumed", functools.partial(mark, key))
    return value


@fusee.workflow("bench_sleeper")
async def sleeper(ctx: fusee.Ctx, key: str) -> int:
    """Workload 5b: notes the time, sleeps 1 s durably, notes the time again."""
    await ctx.step("before", functools.partial(mark, key))
    await ctx.sleep("nap", 1.0)
    return int(await ctx.step("after", functools.partial(mark, key)))


def mark_wall(key: str) -> int:
    """A step that notes the wall-clock time it ran for workflow ``key`` (to compare with a due time)."""
    MARKS.setdefault(key, []).append(time.time())
    return len(MARKS[key])


@fusee.workflow("bench_due_sleeper")
async def due_sleeper(ctx: fusee.Ctx, due: float) -> int:
    """Workload 5c: sleeps durably until the wall-clock time ``due`` (shared by every run), then marks."""
    await ctx.sleep("nap", max(0.0, due - ctx.now().timestamp()))
    return int(await ctx.step("after", functools.partial(mark_wall, ctx.workflow_id)))


@fusee.workflow("bench_parked")
async def parked(ctx: fusee.Ctx, steps: int) -> int:
    """Workloads 6 and 7: a few steps, then asleep for a day (parked)."""
    total = 0
    for _ in range(steps):
        total = await ctx.step("bump", functools.partial(bump, total))
    await ctx.sleep("park", "1d")
    return total


@fusee.workflow("bench_tagged")
async def tagged(ctx: fusee.Ctx, i: int) -> int:
    """The list workload: search attributes (one customer in 10,000), then asleep (parked)."""
    ctx.set_attributes({"customer": f"c-{i % 10_000}", "region": ("eu", "us", "ap")[i % 3]})
    await ctx.sleep("park", "1d")
    return i


WRITTEN: dict[int, float] = {}


async def talk(info: fusee.StepInfo, chunks: int) -> int:
    """Writes ``chunks`` chunks, each stamped with its write time (an async step function)."""
    out = info.stream("tokens")
    for i in range(chunks):
        WRITTEN[i] = time.perf_counter()
        out.write(i)
        if i % 64 == 63:
            await asyncio.sleep(0)  # a model yields between tokens now and then
    return chunks


@fusee.workflow("bench_streamer")
async def streamer(ctx: fusee.Ctx, chunks: int) -> int:
    return int(await ctx.step("talk", talk, chunks))


WORKFLOWS = [chain, fan, users_chain, users_fan, one_step, waiter, sleeper, due_sleeper, parked, tagged, streamer]


#: Data directories made by this process, removed once its workload is done.
SCRATCH: list[Path] = []


def scratch(name: str) -> Path:
    """A fresh data directory on the bench disk, removed when the workload ends."""
    path = common.scratch_dir(name)
    SCRATCH.append(path)
    return path


async def open_engine(path: Path, options: dict[str, Any]) -> Any:
    """Opens an engine on ``path`` with every workload registered.

    Options the engine's ``open`` does not take are dropped with a note, so a
    size or tuning flag never stops a run (the result says what was applied).
    """
    accepted = inspect.signature(fusee.Engine.open).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    applied = {k: v for k, v in options.items() if takes_any or k in accepted}
    for key in sorted(options.keys() - applied.keys()):
        print(f"note: Engine.open takes no {key!r}; ignored", file=sys.stderr)
    APPLIED_OPTIONS.update(applied)
    return await fusee.Engine.open(str(path), workflows=WORKFLOWS, **applied)


async def gather_limited(coros: Any, limit: int) -> list[Any]:
    """Awaits every coroutine of the iterable, at most ``limit`` at a time, in order."""
    results: list[Any] = []
    batch: list[Any] = []
    for coro in coros:
        batch.append(coro)
        if len(batch) >= limit:
            results.extend(await asyncio.gather(*batch))
            batch = []
    results.extend(await asyncio.gather(*batch))
    return results


def dir_bytes(path: Path) -> int:
    """Total size of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# --- workloads ---------------------------------------------------------------


async def run_chain(args: argparse.Namespace) -> dict[str, Any]:
    """One workflow of ``args.chain`` sequential steps: µs per step and its distribution."""
    steps = args.chain
    STAMPS.clear()
    engine = await open_engine(scratch("fusee-chain"), args.engine_options)
    try:
        with common.measured() as m:
            result = await engine.execute(chain, "chain", steps)
    finally:
        await engine.close()
    assert result == steps, result
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    return {
        "workload": "chain", "steps": steps, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"], **common.gc_figures(m),
        "us_per_step": m["wall_s"] / steps * 1e6, **common.latency_summary(gaps),
        "samples_us": [g * 1e6 for g in gaps],
    }


async def run_fanout(args: argparse.Namespace) -> dict[str, Any]:
    """``args.fanout`` workflows of ``args.fanout_steps`` steps started at once."""
    workflows, steps = args.fanout, args.fanout_steps
    STAMPS.clear()
    latencies: list[float] = []
    engine = await open_engine(scratch("fusee-fanout"), args.engine_options)

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        handle = await engine.start(fan, f"fan-{i}", steps)
        assert await handle.result() == steps
        latencies.append(time.perf_counter() - t0)

    try:
        with common.measured() as m:
            await asyncio.gather(*(one(i) for i in range(workflows)))
    finally:
        await engine.close()
    total_steps = workflows * steps
    assert len(STAMPS) == total_steps, len(STAMPS)
    return {
        "workload": "fanout", "workflows": workflows, "steps_per_workflow": steps,
        "wall_s": m["wall_s"], "cpu_s": m["cpu_s"], **common.gc_figures(m),
        "steps_per_s": total_steps / m["wall_s"], "workflows_per_s": workflows / m["wall_s"],
        "cpu_s_per_1000_steps": m["cpu_s"] / total_steps * 1000,
        **common.latency_summary(latencies),
    }


async def run_users(args: argparse.Namespace) -> dict[str, Any]:
    """Chain and fan-out as users write them: sync lambdas and closures, the engine's
    default options, fan-out starts awaited one at a time."""
    steps = args.chain
    STAMPS.clear()
    engine = await open_engine(scratch("fusee-users-chain"), args.engine_options)
    try:
        with common.measured() as chain_m:
            assert await engine.execute(users_chain, "users-chain", steps) == steps
        chain_stats = engine.stats
    finally:
        await engine.close()
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    workflows, fan_steps = args.fanout, args.fanout_steps
    STAMPS.clear()
    engine = await open_engine(scratch("fusee-users-fan"), args.engine_options)
    try:
        with common.measured() as fan_m:
            handles = [await engine.start(users_fan, f"users-fan-{i}", fan_steps) for i in range(workflows)]
            for h in handles:
                assert await h.result() == fan_steps
        fan_stats = engine.stats
    finally:
        await engine.close()
    total = workflows * fan_steps
    assert len(STAMPS) == total
    return {
        "workload": "users", "steps": steps, "us_per_step": chain_m["wall_s"] / steps * 1e6,
        "chain_cpu_us_per_step": chain_m["cpu_s"] / steps * 1e6, **common.latency_summary(gaps),
        "fanout_workflows": workflows, "fanout_steps_per_s": total / fan_m["wall_s"],
        "fanout_cpu_us_per_step": fan_m["cpu_s"] / total * 1e6,
        "sync_inline": chain_stats["sync_inline"] + fan_stats["sync_inline"],
        "sync_pooled": chain_stats["sync_pooled"] + fan_stats["sync_pooled"],
        "wall_s": chain_m["wall_s"] + fan_m["wall_s"], "cpu_s": chain_m["cpu_s"] + fan_m["cpu_s"],
    }


async def run_start(args: argparse.Namespace) -> dict[str, Any]:
    """``args.starts`` one-step workflows executed one after another (start + result)."""
    count = args.starts
    latencies: list[float] = []
    engine = await open_engine(scratch("fusee-start"), args.engine_options)
    try:
        with common.measured() as m:
            for i in range(count):
                t0 = time.perf_counter()
                assert await engine.execute(one_step, f"start-{i}", i) == i + 1
                latencies.append(time.perf_counter() - t0)
    finally:
        await engine.close()
    return {
        "workload": "start", "count": count, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "per_s": count / m["wall_s"], **common.latency_summary(latencies),
    }


async def run_signals(args: argparse.Namespace) -> dict[str, Any]:
    """``args.signals`` workflows wait for a signal, then each is signalled in turn.

    Latency: from just before ``engine.signal`` to the waiter's next step running.
    """
    count = args.signals
    MARKS.clear()
    keys = [f"sig-{i}" for i in range(count)]
    engine = await open_engine(scratch("fusee-signals"), args.engine_options)
    try:
        handles = await gather_limited((engine.start(waiter, k, k) for k in keys), 1000)
        while any(len(MARKS.get(k, ())) < 1 for k in keys):
            await asyncio.sleep(0.01)
        # The "ready" step has run; let each waiter reach wait_for before signalling.
        await asyncio.sleep(0.5)
        sent: dict[str, float] = {}
        with common.measured() as m:
            for key in keys:
                sent[key] = time.perf_counter()
                await engine.signal(key, go, 1)
            results = await asyncio.gather(*(h.result() for h in handles))
    finally:
        await engine.close()
    assert results == [1] * count
    latencies = [MARKS[k][1] - sent[k] for k in keys]
    return {
        "workload": "signals", "count": count, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"], **common.gc_figures(m),
        "per_s": count / m["wall_s"], **common.latency_summary(latencies),
    }


async def run_wakes(args: argparse.Namespace) -> dict[str, Any]:
    """``args.wakes`` parked workflows, each woken by one signal: wakes per second.

    The runs wait for a signal and leave memory (``park_after`` 0.2 s unless
    told otherwise); then every one is signalled, 1,000 signals in flight at a
    time. A wake counts once the run's next step ran (its code replayed from
    the journal and went on).
    """
    count = args.wakes
    MARKS.clear()
    keys = [f"wake-{i}" for i in range(count)]
    options = {"park_after": 0.2, **args.engine_options}
    engine = await open_engine(scratch("fusee-wakes"), options)
    try:
        handles = await gather_limited((engine.start(waiter, k, k) for k in keys), 1000)
        while any(len(MARKS.get(k, ())) < 1 for k in keys):
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 120
        while sum(s.parked for s in engine.metrics().shards) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        parked = sum(s.parked for s in engine.metrics().shards)
        with common.measured() as m:
            await gather_limited((engine.signal(k, go, 1) for k in keys), 1000)
            results = await asyncio.gather(*(h.result() for h in handles))
    finally:
        await engine.close()
    assert results == [1] * count
    return {
        "workload": "wakes", "count": count, "parked_before": parked, "wall_s": m["wall_s"],
        "cpu_s": m["cpu_s"], **common.gc_figures(m), "wakes_per_s": count / m["wall_s"],
    }


async def run_soak(args: argparse.Namespace) -> dict[str, Any]:
    """Continuous fan-out for ``args.soak_s`` seconds: RSS growth after the first tenth.

    Rounds of 200 workflows x 10 steps run back to back; RSS is sampled after
    each round (after a garbage collection). Growth is the last sample over
    the first one taken once a tenth of the time has passed (warm caches).
    """
    duration = args.soak_s
    engine = await open_engine(scratch("fusee-soak"), args.engine_options)
    samples: list[tuple[float, int]] = []
    rounds = 0
    try:
        t0 = time.perf_counter()
        with common.measured() as m:
            while time.perf_counter() - t0 < duration:
                STAMPS.clear()
                await asyncio.gather(*(engine.execute(fan, f"soak-{rounds}-{i}", 10) for i in range(200)))
                rounds += 1
                gc.collect()
                samples.append((time.perf_counter() - t0, common.rss_bytes()))
    finally:
        await engine.close()
    warm = [rss for t, rss in samples if t >= duration / 10] or [samples[-1][1]]
    return {
        "workload": "soak", "seconds": duration, "rounds": rounds, "steps": rounds * 2000,
        "wall_s": m["wall_s"], "cpu_s": m["cpu_s"], "rss_start": warm[0], "rss_end": warm[-1],
        "rss_growth_pct": (warm[-1] - warm[0]) / warm[0] * 100,
    }


async def run_timers(args: argparse.Namespace) -> dict[str, Any]:
    """``args.timers`` workflows sleep 1 s: time from due to resumed.

    The due time is taken as the "before" step's stamp plus 1 s, so the figure
    also holds the durable write between that step and the sleep.
    """
    count = args.timers
    MARKS.clear()
    engine = await open_engine(scratch("fusee-timers"), args.engine_options)
    try:
        with common.measured() as m:
            handles = await gather_limited(
                (engine.start(sleeper, f"timer-{i}", f"timer-{i}") for i in range(count)), 1000)
            await asyncio.gather(*(h.result() for h in handles))
    finally:
        await engine.close()
    lateness = [v[1] - v[0] - 1.0 for v in MARKS.values()]
    assert len(lateness) == count
    return {
        "workload": "timers", "count": count, "sleep_s": 1.0, "wall_s": m["wall_s"],
        "cpu_s": m["cpu_s"], **common.gc_figures(m), **common.latency_summary(lateness),
    }


async def run_due(args: argparse.Namespace) -> dict[str, Any]:
    """``args.due`` workflows all sleep until one wall-clock instant: how late each resumed.

    The instant is set far enough ahead that every run has started and is asleep
    before it (checked: the result says how many had not). Lateness is from the
    instant to the step after the sleep, so it holds the durable write of the
    wake-up besides the timer; ``resumed_per_s`` is the runs resumed over the
    time from the instant to the last one.
    """
    count = args.due
    MARKS.clear()
    engine = await open_engine(scratch("fusee-due"), args.engine_options)
    try:
        due = time.time() + 1.0 + count / 2000
        with common.measured() as m:
            handles = await gather_limited(
                (engine.start(due_sleeper, f"due-{i}", due) for i in range(count)), 1000)
            started_late = int(time.time() > due)
            results = await asyncio.gather(*(h.result() for h in handles))
    finally:
        await engine.close()
    assert results == [1] * count
    lateness = [v[0] - due for v in MARKS.values()]
    return {
        "workload": "due", "count": count, "all_started_before_due": not started_late,
        "wall_s": m["wall_s"], "cpu_s": m["cpu_s"], **common.gc_figures(m),
        "resumed_per_s": count / max(lateness), **common.latency_summary(lateness),
    }


async def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    """``args.scale`` workflows started and left asleep: start rate, RSS each, reopen time.

    Starting stops early if the process's RSS passes ``args.max_rss_gib`` (the
    machine is shared; the result then says how many runs were started).
    """
    wanted, limit = args.scale, args.max_rss_gib * (1 << 30)
    path = scratch("fusee-scale")
    gc.collect()
    rss0 = common.rss_bytes()
    engine = await open_engine(path, args.engine_options)
    count, stopped = 0, False
    try:
        t_start = time.perf_counter()
        with common.measured() as m:
            while count < wanted and not stopped:
                batch = min(1000, wanted - count)
                await asyncio.gather(*(engine.start(parked, f"p-{count + i}", 0)
                                       for i in range(batch)))
                count += batch
                if count % max(1, wanted // 10) < batch:
                    print(f"scale: {count:,} started, {count / (time.perf_counter() - t_start):,.0f}/s, "
                          f"RSS {common.rss_bytes() / (1 << 20):,.0f} MiB", file=sys.stderr)
                stopped = common.rss_bytes() > limit
        # Runs park once suspended for the engine's park_after; give them that long.
        await asyncio.sleep(args.park_wait)
        gc.collect()
        rss1 = common.rss_bytes()
    finally:
        t0 = time.perf_counter()
        await engine.close()
        close_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine = await open_engine(path, args.engine_options)
    reopen_s = time.perf_counter() - t0
    engine.get(f"p-{count - 1}")  # the last run is there again
    await engine.close()
    return {
        "workload": "scale", "count": count, "requested": wanted,
        "stopped_at_rss_limit": stopped, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "starts_per_s": count / m["wall_s"], "rss_bytes_per_run": (rss1 - rss0) / count,
        "rss_bytes": rss1, "close_s": close_s, "reopen_s": reopen_s,
        "dir_bytes": dir_bytes(path),
    }


async def run_list(args: argparse.Namespace) -> dict[str, Any]:
    """``args.list_runs`` parked runs with attributes; time a selective ``engine.list``.

    The filter ``attrs.customer = 'c-42' and status = 'running'`` matches one
    run in 10,000 (100 at 1,000,000) and answers from the attribute index; a
    query no index helps (``workflow = 'nobody'``) shows what a full walk costs.
    """
    wanted = args.list_runs
    path = scratch("fusee-list")
    engine = await open_engine(path, args.engine_options)
    try:
        t0 = time.perf_counter()
        for first in range(0, wanted, 1000):
            await asyncio.gather(*(engine.start(tagged, f"l-{i}", i)
                                   for i in range(first, min(first + 1000, wanted))))
        # Every run journals its attributes in its first activation; wait for the last ones.
        while len(engine.list("attrs.customer = 'c-42'", limit=10_000).items) < wanted // 10_000 + (
                1 if wanted % 10_000 > 42 else 0):
            await asyncio.sleep(0.01)
        start_s = time.perf_counter() - t0
        await asyncio.sleep(args.park_wait)
        where = "attrs.customer = 'c-42' and status = 'running'"
        samples = []
        for _ in range(args.list_repeats):
            t0 = time.perf_counter()
            page = engine.list(where, limit=100)
            samples.append(time.perf_counter() - t0)
        matched = len(page.items)
        t0 = time.perf_counter()
        engine.list("workflow = 'nobody'")
        scan_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        engine.metrics()
        metrics_ms = (time.perf_counter() - t0) * 1000
    finally:
        await engine.close()
    return {
        "workload": "list", "count": wanted, "matched": matched, "start_s": start_s,
        "rss_bytes": common.rss_bytes(), "full_scan_ms": scan_ms, "metrics_ms": metrics_ms,
        **{f"list_{k}": v for k, v in common.latency_summary(samples).items()},
    }


async def recovery_child(args: argparse.Namespace) -> None:
    """The process that gets SIGKILLed: fills a directory, prints READY, waits.

    With ``--checkpoint`` it then writes a checkpoint (``engine.checkpoint()``,
    or a clean close and reopen) and adds a tail of 1 % fresh runs, so only the
    tail needs replaying.
    """
    path, runs, steps = Path(args.dir), args.recovery_runs, args.recovery_steps
    engine = await open_engine(path, args.engine_options)
    await gather_limited((engine.start(parked, f"r-{i}", steps) for i in range(runs)), 1000)
    while len(STAMPS) < runs * steps:
        await asyncio.sleep(0.01)
    # Appends reach the log in order, so this durable execute covers what came before.
    await engine.execute(one_step, "r-barrier", 0)
    if args.checkpoint:
        if hasattr(engine, "checkpoint"):
            await engine.checkpoint()
        else:  # a clean close writes one too
            await engine.close()
            engine = await open_engine(path, args.engine_options)
        tail = max(1, runs // 100)
        await gather_limited(
            (engine.start(parked, f"tail-{i}", steps) for i in range(tail)), 1000)
        await engine.execute(one_step, "tail-barrier", 0)
    # Every run has the same journal, so one run's length counts them all (approximately:
    # the tail and barrier runs are left out).
    records = len(await engine.journal("r-0")) * runs if hasattr(engine, "journal") else -1
    print(f"READY {records}", flush=True)
    await asyncio.sleep(3600)


async def run_recovery(args: argparse.Namespace) -> dict[str, Any]:
    """Reopen time after SIGKILL of a child with many runs, without and with a checkpoint."""
    out: dict[str, Any] = {"workload": "recovery", "runs": args.recovery_runs,
                           "steps_per_run": args.recovery_steps}
    for checkpoint in (False, True):
        path = scratch("fusee-recovery")
        cmd = [sys.executable, __file__, "recovery-child", "--dir", str(path),
               "--recovery-runs", str(args.recovery_runs),
               "--recovery-steps", str(args.recovery_steps),
               *(["--checkpoint"] if checkpoint else []),
               *(f"--engine-opt={k}={v}" for k, v in args.raw_engine_options)]
        t0 = time.perf_counter()
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as child:
            assert child.stdout is not None
            line = child.stdout.readline()
            fill_s = time.perf_counter() - t0
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        if not line.startswith("READY"):
            raise RuntimeError(f"recovery child failed before READY (exit {child.returncode})")
        out["records"] = int(line.split()[1])
        t0 = time.perf_counter()
        engine = await open_engine(path, args.engine_options)
        reopen_s = time.perf_counter() - t0
        engine.get(f"r-{args.recovery_runs - 1}")  # acknowledged before the kill: still there
        await engine.close()
        key = "with_checkpoint" if checkpoint else "no_checkpoint"
        out[f"{key}_reopen_s"] = reopen_s
        out[f"{key}_fill_s"] = fill_s
        out[f"{key}_dir_bytes"] = dir_bytes(path)
    return out


async def run_stream(args: argparse.Namespace) -> dict[str, Any]:
    """One step writes ``args.chunks`` chunks while a reader follows: chunks/s and write→read latency."""
    n = args.chunks
    WRITTEN.clear()
    engine = await open_engine(scratch("fusee-stream"), args.engine_options)
    lat: list[float] = []
    try:
        with common.measured() as m:
            await engine.start(streamer, "s-1", n)
            seen = 0
            async for chunk in engine.read_stream("s-1", "tokens"):
                lat.append(time.perf_counter() - WRITTEN[int(chunk)])
                seen += 1
        assert seen == n, seen
        read_s = m["wall_s"]
        with common.measured() as m2:
            again = [c async for c in engine.read_stream("s-1", "tokens")]
        assert len(again) == n
    finally:
        await engine.close()
    return {
        "workload": "stream", "count": n, "wall_s": read_s, "cpu_s": m["cpu_s"],
        "chunks_per_s": n / read_s, "reread_chunks_per_s": n / m2["wall_s"],
        **common.latency_summary(lat),
    }


async def run_codec(args: argparse.Namespace) -> dict[str, Any]:
    """The chain with and without ``fusee.AesGcmCodec`` (payload encryption at rest): µs per step.

    Alternates plain and encrypted chains of ``args.chain`` steps (three of
    each, best kept: the disk's noise is larger than the codec's cost) in
    fresh directories.
    """
    steps = args.chain
    codec = fusee.AesGcmCodec(keys={"k1": fusee.AesGcmCodec.generate_key()}, current="k1")
    best: dict[str, float] = {}
    for round_ in range(3):
        for label, options in (("plain", {}), ("aesgcm", {"codec": codec})):
            engine = await open_engine(scratch(f"fusee-codec-{label}-{round_}"),
                                       {**args.engine_options, **options})
            try:
                with common.measured() as m:
                    result = await engine.execute(chain, "chain", steps)
            finally:
                await engine.close()
            assert result == steps, result
            per_step = m["wall_s"] / steps * 1e6
            best[label] = min(best.get(label, per_step), per_step)
            cpu = m["cpu_s"] / steps * 1e6
            best[f"cpu_{label}"] = min(best.get(f"cpu_{label}", cpu), cpu)
    payload = b'{"value": 12345}'
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        codec.decode(codec.encode(payload))
    roundtrip_us = (time.perf_counter() - t0) / n * 1e6
    APPLIED_OPTIONS["codec"] = "AesGcmCodec (aesgcm columns)"
    return {
        "workload": "codec", "steps": steps, "us_per_step_plain": best["plain"],
        "us_per_step_aesgcm": best["aesgcm"], "overhead_us_per_step": best["aesgcm"] - best["plain"],
        "cpu_us_per_step_plain": best["cpu_plain"], "cpu_us_per_step_aesgcm": best["cpu_aesgcm"],
        "payload_roundtrip_us": roundtrip_us,
    }


WORKLOADS = {
    "chain": run_chain, "fanout": run_fanout, "users": run_users, "start": run_start, "signals": run_signals,
    "timers": run_timers, "due": run_due, "wakes": run_wakes, "soak": run_soak, "scale": run_scale, "recovery": run_recovery,
    "list": run_list, "stream": run_stream, "codec": run_codec,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The workload, its sizes (defaults per issue 6, or small with ``--quick``)."""
    parser = argparse.ArgumentParser(description="Fusee side of the benchmarks")
    parser.add_argument("workload", choices=[*WORKLOADS, "all", "recovery-child"])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--chain", type=int, help="steps in the chain (2,000)")
    parser.add_argument("--fanout", type=int, help="fan-out workflows (2,000)")
    parser.add_argument("--fanout-steps", type=int, default=10)
    parser.add_argument("--starts", type=int, help="one-step workflows (500)")
    parser.add_argument("--signals", type=int, help="signalled workflows (10,000)")
    parser.add_argument("--timers", type=int, help="sleeping workflows (10,000)")
    parser.add_argument("--due", type=int, help="workflows asleep until one instant (10,000)")
    parser.add_argument("--wakes", type=int, help="parked workflows woken by a signal each (100,000)")
    parser.add_argument("--soak-s", type=float, help="soak: seconds of continuous fan-out (600)")
    parser.add_argument("--scale", type=int, help="parked workflows (1,000,000)")
    parser.add_argument("--max-rss-gib", type=float, default=4.0,
                        help="scale: stop starting runs past this RSS (4 GiB)")
    parser.add_argument("--park-wait", type=float, default=None,
                        help="seconds to wait for runs to park before reading RSS (2)")
    parser.add_argument("--list-runs", type=int, help="list: parked runs with attributes (1,000,000)")
    parser.add_argument("--chunks", type=int, help="stream: chunks written and read (20,000)")
    parser.add_argument("--list-repeats", type=int, default=200, help="list: timed queries (200)")
    parser.add_argument("--recovery-runs", type=int, help="runs before the SIGKILL (100,000)")
    parser.add_argument("--recovery-steps", type=int, default=8,
                        help="steps per run before it sleeps (8: 10 records per run)")
    parser.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Engine.open option (int/float/str), repeatable")
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "chain": (200, 2000), "fanout": (100, 2000), "starts": (50, 500),
        "signals": (50, 10_000), "timers": (50, 10_000), "due": (50, 10_000), "scale": (2000, 1_000_000),
        "recovery_runs": (500, 100_000), "park_wait": (0.5, 2.0), "list_runs": (5_000, 1_000_000),
        "chunks": (500, 20_000), "wakes": (500, 100_000), "soak_s": (3.0, 600.0),
    }
    for name, (small, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    args.raw_engine_options = [opt.split("=", 1) for opt in args.engine_opt]
    args.engine_options = {k: _parse_value(v) for k, v in args.raw_engine_options}
    return args


def _parse_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main(argv: list[str] | None = None) -> int:
    """Runs one workload (or all) and emits each result."""
    args = parse_args(argv)
    if args.workload == "recovery-child":
        asyncio.run(recovery_child(args))
        return 0
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        try:
            result = asyncio.run(WORKLOADS[name](args))
        finally:
            for path in SCRATCH:
                shutil.rmtree(path, ignore_errors=True)
            SCRATCH.clear()
        result = {"system": "fusee", "engine_options": dict(APPLIED_OPTIONS), **result}
        common.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
