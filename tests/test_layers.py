"""The layers the code is built in: each imports only the ones below it (docs/scale-out.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fusee
from fusee.errors import DirectoryLocked

ROOT = Path(fusee.__file__).parent


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function or ``if TYPE_CHECKING:``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def reaching_up(package: str, above: tuple[str, ...]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        up = sorted(m for m in imported(path) if m.startswith(above))
        if up:
            found[str(path.relative_to(ROOT))] = up
    return found


def test_the_engine_knows_nothing_of_scale_out_or_the_tools() -> None:
    """One holder's engine: placement and routing (fusee.scale) and the tools sit above it."""
    assert reaching_up("engine", ("fusee.scale", "fusee.http", "fusee.cli", "fusee.ui")) == {}


def test_the_engine_calls_mixed_in_do_not_import_the_engine_back() -> None:
    """They take a Protocol of what they use, so the engine's module is not in a circle with them."""
    for name in ("limit_api.py", "object_api.py"):
        assert not {m for m in imported(ROOT / "engine" / name) if m.startswith("fusee.engine.engine")}, name


def test_scale_out_does_not_reach_the_tools() -> None:
    assert reaching_up("scale", ("fusee.http", "fusee.cli", "fusee.ui")) == {}


async def test_engine_open_still_picks_owner_or_follower(tmp_path: Path) -> None:
    """The opener the scale-out layer installs is the one fusee.Engine.open uses."""
    owner = await fusee.Engine.open(tmp_path / "data")
    try:
        assert isinstance(owner, fusee.Engine) and owner.is_owner
        assert owner._route_server is not None  # it serves the processes that follow it
        with pytest.raises(DirectoryLocked):
            await fusee.Engine.open(tmp_path / "data")  # a second open in one process
    finally:
        await owner.close()
