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


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = ("fusee", *path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the fusee modules it imports: ``from fusee.x import y`` counts as fusee.x.y if that
    is a module, else as fusee.x (a name defined there)."""

    def module_of(name: str) -> str:
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(module_of(a.name) for a in node.names if a.name.split(".")[0] == "fusee")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None \
                    and node.module.split(".")[0] == "fusee":
                found.update(module_of(f"{node.module}.{a.name}") for a in node.names)
        edges[name] = found - {name}
    return edges


def test_no_module_imports_itself_back_through_others() -> None:
    """No import circle between fusee's modules, counting imports inside functions and under
    TYPE_CHECKING: a lower piece takes a Protocol of what it needs (e.g. ``fusee.ui.pages``,
    ``fusee.engine.bulk.BulkEngine``) instead of importing what uses it."""
    mods = _modules()
    edges = _edges(mods)
    circles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = [stack.pop()]
            while part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    assert circles == [], "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(edges[m] & set(c))}" for m in c) for c in circles)


def test_the_core_is_sans_io_and_imports_nothing_above_it() -> None:
    assert reaching_up("core", ("fusee.runtime", "fusee.storage", "fusee.engine", "fusee.scale", "fusee.sim",
                                "fusee.http", "fusee.ui", "fusee.cli")) == {}
    for path in (ROOT / "core").rglob("*.py"):
        io = sorted(m for m in imported(path) if m.split(".")[0] in {"asyncio", "os", "threading", "time", "socket"})
        assert io == [], f"{path.name} imports {io}"
