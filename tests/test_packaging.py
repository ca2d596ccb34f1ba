"""The package as users install it: a wheel, in a fresh virtual environment, running the quick start."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_and_runs_the_quick_start(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    wheels = list(dist.glob("fusee-*.whl"))
    assert len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as wheel:  # the web UI's templates and assets ship as package data
        names = set(wheel.namelist())
    assert {"fusee/ui/templates/run.html", "fusee/ui/static/ui.css", "fusee/ui/static/ui.js"} <= names
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # The dependencies (msgspec, crc32c, lark) come from this environment's site-packages, added as a
    # plain path: its editable install of fusee is not, so only the wheel can be imported.
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    str(wheels[0])], check=True, capture_output=True, timeout=300)
    readme = (ROOT / "README.md").read_text()
    quick_start = re.search(r"## Quick start\s+```python\n(.*?)```", readme, re.S)
    assert quick_start is not None
    run = subprocess.run([str(py), "-c", quick_start.group(1)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "teapot for 42" in run.stdout
    where = subprocess.run([str(py), "-c", "import fusee, os; print(os.path.dirname(fusee.__file__))"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert where.startswith(site), f"fusee was imported from {where}, not the installed wheel"
    typed = subprocess.run([str(py), "-c", "import fusee, os; print(os.path.exists(os.path.join("
                            "os.path.dirname(fusee.__file__), 'py.typed')))"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert typed == "True"


def test_type_checkers_find_the_development_install(tmp_path: Path) -> None:
    """``make``'s editable install is a plain path (editable_mode=compat), not an import hook that
    type checkers cannot run: mypy in another directory finds fusee, its py.typed and its types."""
    (tmp_path / "app.py").write_text(
        "import fusee\n\n"
        "@fusee.workflow('w')\n"
        "async def w(ctx: fusee.Ctx, n: int) -> int:\n"
        "    doubled: int = await ctx.step('double', lambda: n * 2)\n"
        "    return doubled\n\n"
        "text: str = w  # type: ignore[assignment]\n"
    )
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--warn-unused-ignores", "--no-incremental",
                          "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
