"""Issue 28: PostgreSQL's own backups cover a namespace: one dumped with ``pg_dump --schema``
and loaded with ``pg_restore`` into another database opens with every run, and goes on."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

import fusee


@fusee.workflow("pg_backed")
async def backed(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)  # type: ignore[no-any-return]


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not on PATH (it comes with the PostgreSQL client)"
    return found


async def test_a_namespace_restored_by_pg_dump_and_pg_restore_opens(pg_dsn: str, tmp_path: Path) -> None:
    async with fusee.Engine.open(pg_dsn, workflows=[backed], namespace="shop") as engine:
        for i in range(10):
            assert await (await engine.start(backed, f"o-{i}", i)).result() == i * 2
    dump = tmp_path / "shop.dump"
    subprocess.run([_tool("pg_dump"), "--format=custom", "--schema=shop", f"--file={dump}",
                    f"--dbname={pg_dsn}"], check=True, capture_output=True, timeout=120)

    base, _, query = pg_dsn.partition("?")
    server, _, db = base.rpartition("/")
    name = f"restored_{db}"
    other, admin = f"{server}/{name}?{query}", f"{server}/postgres?{query}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        subprocess.run([_tool("pg_restore"), f"--dbname={other}", str(dump)], check=True,
                       capture_output=True, timeout=120)
        async with fusee.Engine.open(other, workflows=[backed], namespace="shop") as engine:
            assert {r.workflow_id for r in engine.runs()} == {f"o-{i}" for i in range(10)}
            assert await engine.get("o-3").result() == 6
            assert await (await engine.start(backed, "after", 21)).result() == 42
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_backup_is_refused_on_a_namespace(pg_dsn: str) -> None:
    async def go() -> None:
        await fusee.Engine.open(pg_dsn, backup=fusee.Backup("unused"))

    import asyncio

    with pytest.raises(ValueError, match="PostgreSQL"):
        asyncio.run(go())
