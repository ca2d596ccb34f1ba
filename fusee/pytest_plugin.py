"""pytest fixtures for workflow tests (registered as the ``fusee`` pytest plugin).

Name the workflows with a marker and take a fixture; each fixture gives an
engine to open with ``async with``::

    @pytest.mark.fusee_workflows(order, ship)
    async def test_order(fusee_engine):
        async with fusee_engine as env:       # a TestEngine: memory, time skips
            assert await env.execute(order, "o-1", 3) == ...

The tests are ``async def``, which pytest does not run by itself: install an
async plugin such as pytest-asyncio and set ``asyncio_mode = "auto"`` (or mark
each test ``@pytest.mark.asyncio``). The fixtures themselves are plain
(synchronous) fixtures, so they work under any async plugin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fusee.engine.engine import Engine
from fusee.testing import TestEngine


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fusee_workflows(*workflows): the workflows the fusee_engine fixtures register"
    )


def _workflows(request: pytest.FixtureRequest) -> list[Any]:
    marker = request.node.get_closest_marker("fusee_workflows")
    return list(marker.args) if marker is not None else []


@pytest.fixture
def fusee_engine(request: pytest.FixtureRequest) -> TestEngine:
    """A :class:`fusee.testing.TestEngine` (memory, a clock that skips idle time) to open
    with ``async with``, registering the workflows of the ``fusee_workflows`` marker."""
    return TestEngine(workflows=_workflows(request))


@pytest.fixture
def fusee_tmp_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A real engine on ``tmp_path`` (real clock, real disk) to open with ``async with``,
    registering the workflows of the ``fusee_workflows`` marker."""
    return Engine.open(tmp_path / "fusee", workflows=_workflows(request))
