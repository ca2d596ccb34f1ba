"""The soak's own logic (``fusee.sim.soak``): sharding, the canary, the atlas. A few seeds only."""

from __future__ import annotations

import json
import pathlib

from fusee.sim import soak


def test_atlas_sorts_least_covered_first_and_counts_seeds_not_totals() -> None:
    atlas = soak.Atlas()
    atlas.register([("fault", "never")])
    atlas.merge({"seeds": [[("fault", "crashes", 5), ("path", "replays", 1)],
                           [("fault", "crashes", 0), ("path", "replays", 2)]],
                 "fired": {}, "failures": [{"seed": 9, "checker": "durable", "message": "lost"}]})
    rows = atlas.sorted_rows()
    assert rows[0] == ("fault", "never", 0, 0)
    # crashes: one seed of two (total 5); replays: both seeds (total 3): crashes is less covered.
    assert rows[1:] == [("fault", "crashes", 1, 5), ("path", "replays", 2, 3)]
    assert atlas.seeds == 2
    text = atlas.markdown(title="t")
    assert "| 9 | durable | lost |" in text
    assert text.index("| fault | never |") < text.index("| fault | crashes |")


def test_a_small_soak_runs_its_seeds_in_a_worker_and_the_canary_fails(tmp_path: pathlib.Path) -> None:
    lines: list[str] = []
    atlas = soak.soak(range(0, 3), jobs=1, out=str(tmp_path), canary=soak.CANARY, every=1.0, chunk=2,
                      echo=lambda text, **_: lines.append(text))
    assert atlas.seeds == 3 and atlas.failures == []
    # The canary (a sabotaged seed) failed, and the atlas names the checker that caught it.
    assert atlas.canary and "log_integrity" in atlas.canary, atlas.canary
    data = json.loads((tmp_path / "atlas.json").read_text())
    assert data["seeds"] == 3
    rows = {(r["category"], r["name"]): r for r in data["rows"]}
    assert rows[("checker", "log_integrity")]["seeds"] == 3  # it ran at the end of every seed
    assert rows[("knob", "keep_history=False")]["seeds"] == 1  # seed 1 of 0, 1, 2
    assert ("path", "log_batches") in rows and rows[("path", "log_batches")]["seeds"] == 3
    assert any("3/3 seeds" in line for line in lines)
    assert "least covered first" in (tmp_path / "atlas.md").read_text()


def test_a_canary_that_passes_is_reported() -> None:
    # A switch that this seed's world never trips: the soak must say the checkers proved nothing.
    assert soak.run_canary("backup_no_recheck@0") == ""


def test_a_resumed_soak_runs_only_the_seeds_not_covered(tmp_path: pathlib.Path) -> None:
    first = soak.soak(range(0, 2), jobs=1, out=str(tmp_path), canary=None, every=1.0, chunk=1,
                      echo=lambda text, **_: None)
    assert first.done == {0, 1}
    data = json.loads((tmp_path / "atlas.json").read_text())
    assert data["covered"] == [[0, 2]]
    lines: list[str] = []
    atlas = soak.soak(range(0, 3), jobs=1, out=str(tmp_path), canary=None, every=1.0, chunk=1,
                      echo=lambda text, **_: lines.append(text), resume=True)
    assert "resuming: 2 seeds already covered" in lines
    assert any("1/1 seeds" in line for line in lines)  # only seed 2 ran
    assert atlas.seeds == 3 and atlas.done == {0, 1, 2}
    rows = {(c, n): s for c, n, s, _ in atlas.sorted_rows()}
    assert rows[("checker", "log_integrity")] == 3  # the first part's rows were kept


def test_ranges_are_compact_and_sorted() -> None:
    assert soak.ranges({5, 0, 1, 2, 7, 6}) == [[0, 3], [5, 8]]
    assert soak.ranges([]) == []


def _die(seeds: list[int], switches: object = None, seed_timeout: object = None) -> dict[str, object]:
    import os

    if 1 in seeds:
        os._exit(9)  # as the kernel's OOM killer would end it: no exception, no result
    return {"seeds": [], "fired": {}, "failures": [], "ran": list(seeds)}


def test_a_seed_that_kills_its_worker_is_recorded_and_the_rest_still_run(
        tmp_path: pathlib.Path, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    # The worker (spawned) imports this test module to find _die: run_chunk is replaced there too.
    monkeypatch.setattr(soak, "run_chunk", _die)
    lines: list[str] = []
    atlas = soak.soak(range(0, 6), jobs=2, out=str(tmp_path), canary=None, every=1.0, chunk=3,
                      echo=lambda text, **_: lines.append(text))
    assert [(f.seed, f.checker) for f in atlas.failures] == [(1, "(worker died)")]
    assert atlas.done == set(range(6))
    assert any("a worker died" in line for line in lines)


def test_a_runaway_seed_fails_on_its_time_limit_and_the_memory_cap_is_applied() -> None:
    import resource

    part = soak.run_chunk([0], None, seed_timeout=0.05)
    assert part["failures"] == [{"seed": 0, "checker": "(timeout)",
                                 "message": "the seed ran longer than 0.05 s of wall clock"}]
    before = resource.getrlimit(resource.RLIMIT_AS)
    try:
        soak.limit_worker(3 << 30)
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == 3 << 30
    finally:
        resource.setrlimit(resource.RLIMIT_AS, before)


def test_a_memory_error_in_a_chunk_runs_the_rest_again_and_fails_only_a_seed_that_fails_alone(
        monkeypatch: object) -> None:
    import pytest

    from fusee.sim import world

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    real = world.run_seed

    def run_seed(seed: int) -> object:
        if seed == 2:
            raise MemoryError
        return real(seed)

    monkeypatch.setattr(world, "run_seed", run_seed)
    part = soak.run_chunk([0, 1, 2, 3], None, None)
    assert part["ran"] == [0, 1] and part["unrun"] == [2, 3] and part["poisoned"]
    assert part["failures"] == []  # not yet: seed 2 may have met what earlier seeds left
    alone = soak.run_chunk([2], None, None)
    assert [(f["seed"], f["checker"]) for f in alone["failures"]] == [(2, "(memory)")]


#: Set in a worker once it ran seed 2 among others: from then on it is "full".
_FULL = False


def _poisoning(seeds: list[int], switches: object = None, seed_timeout: object = None) -> dict[str, object]:
    """As a worker whose heap seed 2 left near the cap: seeds after it in the same process fail."""
    global _FULL
    out: dict[str, object] = {"seeds": [], "fired": {}, "failures": [], "ran": []}
    for i, seed in enumerate(seeds):
        if _FULL:
            out["poisoned"], out["unrun"] = True, seeds[i:]
            return out
        out["ran"].append(seed)  # type: ignore[attr-defined]
        if seed == 2:
            _FULL = True
    return out


def test_a_worker_full_after_a_seed_is_retired_and_no_seed_fails_for_it(
        tmp_path: pathlib.Path, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(soak, "run_chunk", _poisoning)  # the spawned workers import this module
    lines: list[str] = []
    atlas = soak.soak(range(0, 8), jobs=1, out=str(tmp_path), canary=None, every=1.0, chunk=4,
                      echo=lambda text, **_: lines.append(text))
    assert atlas.failures == []
    assert atlas.done == set(range(8))
    assert any("memory cap" in line for line in lines)
