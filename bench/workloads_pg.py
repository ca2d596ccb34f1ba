"""Fusee on PostgreSQL (``Engine.open("postgresql://...")``): chain µs/step and fan-out steps/s.

    .venv/bin/python bench/workloads_pg.py --url postgresql://user@host:port/db [--quick]
        [--workloads chain,fanout] [--chain N] [--fanout N] [--fanout-steps K]

The same two workloads as ``workloads_fusee.py`` (async step functions that
stamp the clock), on a PostgreSQL server whose commits are durable:
``synchronous_commit`` is checked to be ``on`` (or stronger) and the engine
acknowledges only what the server committed. The database in the URL is
created if missing; each workload uses a fresh namespace. ``run_all.py`` runs
this on its throwaway cluster (``--no-pg-backend`` skips it). Prints one
marked JSON line per workload (see ``common.emit_result``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from workloads_fusee import STAMPS, chain, fan  # the same workflows and step as on a directory

import fusee

SYSTEM = "fusee-postgres"


def prepare(url: str) -> str:
    """Creates the URL's database if missing; returns the server's synchronous_commit (refusing a weak one)."""
    db = conninfo_to_dict(url).get("dbname") or "postgres"
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{db}"')
        level = str(conn.execute("SHOW synchronous_commit").fetchone()[0])  # type: ignore[index]
    if level in ("off", "local"):
        raise SystemExit(f"synchronous_commit is {level} on this server: commits would not be "
                         "durable when acknowledged; the engine sets it to on in its sessions, but "
                         "a benchmark against such a server compares nothing")
    return level


def fresh_namespace(url: str, name: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    return name


async def run_chain(url: str, steps: int) -> dict[str, Any]:
    STAMPS.clear()
    ns = fresh_namespace(url, "bench_chain")
    engine = await fusee.Engine.open(url, workflows=[chain, fan], namespace=ns)
    try:
        with common.measured() as m:
            result = await engine.execute(chain, "chain", steps)
    finally:
        await engine.close()
    assert result == steps, result
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    return {"workload": "chain", "steps": steps, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
            "us_per_step": m["wall_s"] / steps * 1e6, **common.latency_summary(gaps)}


async def run_fanout(url: str, workflows: int, steps: int) -> dict[str, Any]:
    STAMPS.clear()
    ns = fresh_namespace(url, "bench_fanout")
    latencies: list[float] = []
    engine = await fusee.Engine.open(url, workflows=[chain, fan], namespace=ns)

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        handle = await engine.start(fan, f"fan-{i}", steps)
        assert await handle.result() == steps
        latencies.append(time.perf_counter() - t0)

    try:
        with common.measured() as m:
            await asyncio.gather(*(one(i) for i in range(workflows)))
        flushes = engine.stats["flushes"]
    finally:
        await engine.close()
    total = workflows * steps
    assert len(STAMPS) == total, len(STAMPS)
    return {"workload": "fanout", "workflows": workflows, "steps_per_workflow": steps,
            "wall_s": m["wall_s"], "cpu_s": m["cpu_s"], "steps_per_s": total / m["wall_s"],
            "workflows_per_s": workflows / m["wall_s"],
            "cpu_s_per_1000_steps": m["cpu_s"] / total * 1000, "transactions": flushes,
            **common.latency_summary(latencies)}


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="postgresql://... (the database is created if missing)")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--workloads", default="chain,fanout")
    parser.add_argument("--chain", type=int, help="steps in the chain (2,000; 200 quick)")
    parser.add_argument("--fanout", type=int, help="fan-out workflows (2,000; 200 quick)")
    parser.add_argument("--fanout-steps", type=int, default=10)
    args = parser.parse_args(argv)
    level = prepare(args.url)
    durability = (f"every acknowledged start, signal and step result was committed by PostgreSQL "
                  f"(one transaction per group-commit flush, synchronous_commit={level})")
    for workload in [w for w in args.workloads.split(",") if w]:
        try:
            if workload == "chain":
                result = await run_chain(args.url, args.chain or (200 if args.quick else 2000))
            elif workload == "fanout":
                result = await run_fanout(args.url, args.fanout or (200 if args.quick else 2000),
                                          args.fanout_steps)
            else:
                raise SystemExit(f"unknown workload {workload!r}: chain or fanout")
        except Exception as e:  # reported in the table, as the other scripts do
            result = {"workload": workload, "error": f"{type(e).__name__}: {e}"}
        common.emit_result({**result, "system": SYSTEM, "durability": durability})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
