"""The pytest plugin's fixtures, used the way a user's test suite would."""

from __future__ import annotations

from typing import Any

import pytest

import fusee


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    await ctx.sleep("think", "2d")
    return await ctx.step("hello", lambda: f"hello {name}")


@pytest.mark.fusee_workflows(greet)
async def test_the_memory_engine_fixture(fusee_engine: Any) -> None:
    async with fusee_engine as env:
        assert await env.execute(greet, "g-1", "ann") == "hello ann"  # two days, skipped


@pytest.mark.fusee_workflows(greet)
async def test_the_disk_engine_fixture(fusee_tmp_engine: Any) -> None:
    async with fusee_tmp_engine as engine:
        run = await engine.start(greet, "g-1", "bob")
        assert engine.describe("g-1").status == "running"
        await run.cancel()


def test_the_plugin_says_the_async_plugin_its_tests_need(tmp_path: Any) -> None:
    """The fixtures are opened with ``async with`` in an ``async def`` test, which pytest alone does
    not run: the plugin's documentation must say an async plugin is needed."""
    import subprocess
    import sys

    import fusee.pytest_plugin

    (tmp_path / "test_user.py").write_text(
        "import fusee, pytest\n\n"
        "@fusee.workflow('w')\n"
        "async def w(ctx, n: int) -> int:\n"
        "    return n\n\n"
        "@pytest.mark.fusee_workflows(w)\n"
        "async def test_it(fusee_engine):\n"
        "    async with fusee_engine as env:\n"
        "        assert await env.execute(w, 'w-1', 1) == 1\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:asyncio", "-p", "no:cacheprovider",
                        "-p", "no:anyio", str(tmp_path / "test_user.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "1 passed" not in p.stdout and "not natively supported" in p.stdout, p.stdout
    doc = fusee.pytest_plugin.__doc__ or ""
    assert "no async plugin is needed" not in doc
    assert "pytest-asyncio" in doc and "asyncio_mode" in doc
