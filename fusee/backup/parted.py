"""Backups of a parted directory: each part backed up as a directory of its own, under one target.

Layout in the target::

    parts.json           {"format": 1, "parts": N}, put when the first part's backup starts
    part-NNN/...         part NNN's backup (its points, chunks, checkpoints), as a plain one

Each part's points are consistent for that part (a checkpoint and its log up to
one batch). The parts are backed up independently, so the points of different
parts are not one cut across them: a restore takes, for each part, its newest
point at or before the time asked, and the messages between parts (a child's
start and result, a signal) that one part's journal holds and another's point
lacks are sent again by the replay of the part that holds them (see
docs/operations.md, "A directory with parts").
"""

from __future__ import annotations

import datetime
import json
import os
import shutil

from fusee.backup import manifest as mf
from fusee.backup.restore import PointInfo, Restored, fsync_dir, list_points, new_destination
from fusee.backup.restore import restore as restore_one
from fusee.backup.targets import PrefixedTarget, Target
from fusee.errors import BackupError
from fusee.storage.partsfile import MAX_PARTS, create_parts, part_name, part_path

#: The key that marks a target as the backup of a parted directory.
PARTS_KEY = "parts.json"


def part_target(target: Target, part: int) -> PrefixedTarget:
    """Where part ``part``'s backup lives inside ``target``."""
    return PrefixedTarget(target, f"{part_name(part)}/")


def parted_count(target: Target) -> int | None:
    """The part count of the parted directory ``target`` holds the backup of (None: a plain one)."""
    try:
        raw = target.get(PARTS_KEY)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        n = data["parts"]
        ok = data.get("format") == 1 and isinstance(n, int) and 1 <= n <= MAX_PARTS
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise BackupError(f"{target.name}/{PARTS_KEY} is not a parts marker Fusee wrote: {raw[:200]!r}")
    return int(n)


def mark_parted(target: Target, parts: int) -> None:
    """Marks ``target`` as the backup of a directory of ``parts`` parts (once); refuses a target
    that holds the backup of a directory without parts, or of one with another count."""
    found = parted_count(target)
    if found == parts:
        return
    if found is not None:
        raise BackupError(f"the backup target {target.name} holds the backup of a directory of {found} "
                          f"parts, not {parts}: give each directory a target of its own")
    if target.exists(mf.NEWEST) or target.list(mf.POINTS):
        raise BackupError(f"the backup target {target.name} holds the backup of a directory without "
                          "parts: give each directory a target of its own")
    target.put(PARTS_KEY, json.dumps({"format": 1, "parts": parts}).encode())


def list_parted_points(target: Target, parts: int) -> list[PointInfo]:
    """Every part's points, oldest first, each key with its part's folder in front."""
    out = [PointInfo(f"{part_name(p)}/{info.key}", info.time, info.position)
           for p in range(parts) for info in list_points(part_target(target, p))]
    return sorted(out, key=lambda i: (i.time, i.key))


def restore_parted(target: Target, parts: int, directory: str | os.PathLike[str], *,
                   at: datetime.datetime | float | None) -> Restored:
    """Rebuilds the parted ``directory`` (new, or empty): each part from its newest point, or its
    newest at or before ``at``. Built beside the destination and renamed into place once every
    part restored and checked: a failed restore leaves no half directory behind."""
    dest = new_destination(directory)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{dest}.restoring-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        create_parts(tmp, parts)
        each = tuple(restore_one(part_target(target, p), part_path(tmp, p), at=at) for p in range(parts))
        if os.path.isdir(dest):
            os.rmdir(dest)
        os.rename(tmp, dest)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    each = tuple(Restored(part_path(dest, p), r.position, r.time, f"{part_name(p)}/{r.point}")
                 for p, r in enumerate(each))
    oldest = min(each, key=lambda r: r.time)
    return Restored(dest, sum(r.position for r in each), oldest.time, PARTS_KEY, parts=each)
