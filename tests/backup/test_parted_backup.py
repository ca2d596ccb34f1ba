"""Backup and restore of a directory with parts: each part backed up under ``part-NNN/`` of one
target; a restore rebuilds every part, and the runs whose messages crossed parts complete."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path

import pytest

import fusee
import fusee.backup as fb
from fusee.errors import BackupError
from fusee.scale.parts import PartedEngine, part_of
from fusee.storage.partsfile import read_parts
from tests.scale.test_directory_scale import spawn


@fusee.workflow("pb-kid")
async def kid(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


@fusee.workflow("pb-parent")
async def parent(ctx: fusee.Ctx, n: int) -> int:
    kids = [ctx.child(kid, f"{ctx.workflow_id}-k{i}", i) for i in range(n)]
    return sum(await asyncio.gather(*kids))


def expected(n: int) -> int:
    return sum(2 * i for i in range(n))


async def _results(path: Path) -> dict[str, int]:
    """Every run of the restored directory ``path``, run to its end there."""
    async with fusee.Engine.open(path, workflows=[kid, parent]) as eng:
        assert isinstance(eng, PartedEngine)
        got: dict[str, int] = {}
        while True:  # a parent's replay may start again children its part's point lacked
            ids = sorted(r.workflow_id for r in eng.runs() if r.workflow_id not in got)
            if not ids:
                return got
            got.update({w: await asyncio.wait_for(eng.get(w).result(), 60) for w in ids})


async def test_a_parted_directory_backs_up_per_part_and_restores_whole(tmp_path: Path) -> None:
    data, target = tmp_path / "data", tmp_path / "target"
    async with fusee.Engine.open(data, parts=3, workflows=[kid, parent],
                                 backup=fb.Backup(target, interval=0.05)) as eng:
        assert await eng.execute(parent, "p", 9) == expected(9)
        assert {part_of(f"p-k{i}", 3) for i in range(9)} == {0, 1, 2}
    assert json.loads((target / "parts.json").read_bytes()) == {"format": 1, "parts": 3}
    pts = fb.points(target)
    assert {p.key.split("/")[0] for p in pts} == {"part-000", "part-001", "part-002"}
    done = fb.restore(target, tmp_path / "restored")
    assert read_parts(str(tmp_path / "restored")) == 3 and len(done.parts) == 3
    assert [r.directory for r in done.parts] == [str(tmp_path / "restored" / f"part-{p:03d}") for p in range(3)]
    got = await _results(tmp_path / "restored")
    assert got == {"p": expected(9), **{f"p-k{i}": 2 * i for i in range(9)}}
    # A one-off backup of the closed directory (fusee backup DIR TARGET) into another target.
    once = fb.backup_once(data, tmp_path / "once")
    assert once.key == "parts.json" and len(fb.points(tmp_path / "once")) == 3
    assert await _results(fb.restore(tmp_path / "once", tmp_path / "again").directory) == got  # type: ignore[arg-type]


async def test_backup_targets_of_parted_and_plain_directories_are_never_mixed(tmp_path: Path) -> None:
    plain_target, parted_target = tmp_path / "plain-t", tmp_path / "parted-t"
    async with fusee.Engine.open(tmp_path / "plain", workflows=[kid], backup=fb.Backup(plain_target)) as eng:
        await eng.execute(kid, "k", 1)
    with pytest.raises(BackupError, match="without parts"):
        await fusee.Engine.open(tmp_path / "parted", parts=2, workflows=[kid], backup=fb.Backup(plain_target))
    async with fusee.Engine.open(tmp_path / "parted2", parts=2, workflows=[kid],
                                 backup=fb.Backup(parted_target)) as eng:
        await eng.execute(kid, "k", 1)
    with pytest.raises(BackupError, match="with parts"):
        await fusee.Engine.open(tmp_path / "plain2", workflows=[kid], backup=fb.Backup(parted_target))
    with pytest.raises(BackupError, match="2 parts, not 3"):
        await fusee.Engine.open(tmp_path / "parted3", parts=3, workflows=[kid], backup=fb.Backup(parted_target))
    with pytest.raises(ValueError, match="position"):
        fb.restore(parted_target, tmp_path / "r", position=3)
    assert not (tmp_path / "r").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(BackupError, match="not an empty directory"):
        fb.restore(parted_target, tmp_path / "busy")
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["x"]


APP = textwrap.dedent("""
    import asyncio, json, sys
    import fusee, fusee.backup as fb
    from tests.backup.test_parted_backup import kid, parent

    async def main():
        data, target = sys.argv[1], sys.argv[2]  # target "-": no backup
        backup = fb.Backup(target, interval=0.02) if target != "-" else None
        async with fusee.Engine.open(data, parts=3, workflows=[kid, parent], backup=backup) as eng:
            async def one(i):
                h = await eng.start(parent, f"p{i}", 4)
                print(json.dumps({"acked": f"p{i}"}), flush=True)
                await h.result()
            i = 0
            while True:  # until killed
                await asyncio.gather(*(one(i + j) for j in range(10)))
                i += 10

    asyncio.run(main())
""")


def test_a_restore_after_a_kill_lets_every_run_across_parts_complete(tmp_path: Path) -> None:
    """Killed (-9) mid-load: each part's newest point is its own, so a parent's part may hold a
    child's start or result that the child's part does not, or the reverse. Restored, every run
    there completes with its one right result: the replay of the part that holds a message
    sends it again, and the other part applies it once."""
    data, target = tmp_path / "data", tmp_path / "target"
    app = spawn("-c", APP, str(data), str(target))
    assert app.stdout is not None
    acked = 0
    deadline = time.monotonic() + 120
    while acked < 150 or len(fb.points(target)) < 15:
        line = app.stdout.readline()
        assert line, f"the app exited: {app.communicate()}"
        acked += "acked" in json.loads(line)
        assert time.monotonic() < deadline, "no load"
    app.kill()
    app.communicate()
    pts = fb.points(target)
    for name, at in (("newest", None), ("earlier", pts[len(pts) // 2].time)):
        done = fb.restore(target, tmp_path / name, at=at)
        got = asyncio.run(_results(Path(done.directory)))
        parents = {w for w in got if "-k" not in w}
        assert parents, "the restored directory holds runs"
        for w, value in got.items():
            if w in parents:
                assert value == expected(4), (name, w, value)
            else:
                assert value == 2 * int(w.rsplit("-k", 1)[1]), (name, w, value)
        # (A parent whose point holds its children's results completes from its journal even
        # when the children's part's point lacks them: nothing is asked of that part then.)
