"""Sizes in bytes as users write them (``memory_budget=``)."""

from __future__ import annotations

import pytest

from fusee.errors import InvalidSize
from fusee.sizes import to_bytes


@pytest.mark.parametrize(("text", "expected"), [
    (1, 1), (4096, 4096), ("4096B", 4096), ("256MiB", 256 << 20), ("1.5GiB", 3 << 29), ("2 KB", 2000),
    (" 1TB ", 10**12), ("0.5KiB", 512), (".5MB", 500_000), ("1.0009KB", 1000), ("3TiB", 3 << 40),
])
def test_sizes_read_as_bytes(text: int | str, expected: int) -> None:
    assert to_bytes(text) == expected


@pytest.mark.parametrize("bad", [0, -5, False, 2.0, None, "", "5", "kb", "5kb", "5 K", "5KB5", "1e3B", "-1B", "0B",
                                 "0.4B"])
def test_bad_sizes_name_the_option_and_the_forms(bad: object) -> None:
    with pytest.raises(InvalidSize, match=r"invalid memory_budget .*accepted: a positive int of bytes") as e:
        to_bytes(bad, "memory_budget")
    assert isinstance(e.value, ValueError)
