"""Shared fixtures of the storage tests: a disk of each kind."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from fusee.storage.posix import PosixStorage
from fusee.storage.seam import Storage
from fusee.storage.simdisk import SimDisk


@pytest.fixture(params=["sim", "posix"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Storage, str]]:
    """(storage, engine directory path) on the simulated disk and on the real one."""
    if request.param == "sim":
        yield SimDisk(random.Random(7)), "/engine"
    else:
        yield PosixStorage(), str(tmp_path / "engine")
