"""The stream readers' checks on synthetic answers: each kind of broken promise is reported."""

from __future__ import annotations

from typing import Any

from fusee import codec
from fusee.core import records as rec
from fusee.sim.checkers import Outcome, RunView, Snapshot
from fusee.sim.streams import PROGRESS, Reader, Streams


def chunk(offset: int, value: Any, stream: str = "tokens") -> rec.Chunk:
    return rec.Chunk(run=1, seq=1, attempt=1, stream=stream, offset=offset, payload=codec.encode(value))


def end(stream: str = "tokens", status: rec.Status = rec.Status.OK) -> rec.StreamEnd:
    return rec.StreamEnd(run=1, seq=1, stream=stream, chunks=0, status=status)


class FakeEngine:
    """What the checks read: the durable journal of the run."""

    def __init__(self, journal: list[rec.Record]) -> None:
        self.durable = journal

    async def journal(self, wid: str) -> list[rec.Record]:
        return list(self.durable)


def reader(name: str = "tokens") -> Reader:
    return Reader(0, "talk-0", name, 0, follow=False)


async def test_answers_that_keep_the_promises_pass() -> None:
    s = Streams(1)
    engine = FakeEngine([chunk(0, 7), chunk(1, 8)])
    await s._check(engine, reader(), 0, [7, 8], 2, False)
    await s._check(engine, reader(), 1, [8], 2, False)  # a re-read from an earlier offset
    engine.durable.append(end())
    await s._check(engine, reader(), 2, [], 2, True)
    assert s.violations == []
    assert s.seen[("talk-0", "tokens")].chunks == [7, 8]


async def test_a_chunk_not_in_the_durable_journal_is_reported() -> None:
    s = Streams(1)
    await s._check(FakeEngine([chunk(0, 7)]), reader(), 0, [7, 8], 2, False)
    assert "not durable" in s.violations[0]


async def test_a_changed_chunk_is_reported() -> None:
    s = Streams(1)
    await s._check(FakeEngine([chunk(0, 7)]), reader(), 0, [7], 1, False)
    await s._check(FakeEngine([chunk(0, 9)]), reader(), 0, [9], 1, False)
    assert "changed" in s.violations[0]


async def test_a_skipped_offset_is_reported() -> None:
    s = Streams(1)
    await s._check(FakeEngine([chunk(0, 7), chunk(1, 8)]), reader(), 0, [7], 2, False)
    assert "skipped" in s.violations[0]
    s = Streams(1)
    await s._check(FakeEngine([chunk(0, 7), chunk(1, 8), chunk(2, 9)]), reader(), 2, [9], 3, False)
    assert "skipped" in s.violations[0]


async def test_two_ends_or_two_end_offsets_are_reported() -> None:
    s = Streams(1)
    await s._check(FakeEngine([chunk(0, 7), end(), end()]), reader(), 0, [7], 1, True)
    assert "2 ends" in s.violations[0]
    s = Streams(1)
    await s._check(FakeEngine([chunk(0, 7), end()]), reader(), 0, [7], 1, True)
    await s._check(FakeEngine([chunk(0, 7), end()]), reader(), 0, [], 0, True)
    assert "ended at offset 0 after readers saw 1" in s.violations[0]


async def test_recovery_and_final_checks() -> None:
    s = Streams(1)
    s.plan("talk-0", 2, 0)
    await s._check(FakeEngine([chunk(0, 7), chunk(1, 8), end()]), reader(), 0, [7, 8], 2, True)
    journal: list[rec.Record] = [chunk(0, 7), chunk(1, 8), end()]
    snap = Snapshot(runs={"talk-0": RunView("talk-0", journal)})
    assert s.check(snap, {}, final=False) == []
    # A crash took a chunk readers saw back.
    lost = Snapshot(runs={"talk-0": RunView("talk-0", [chunk(0, 7)])})
    assert "took back" in s.check(lost, {}, final=False)[0]
    # The step returned other tokens than readers saw.
    problems = s.check(snap, {"talk-0": Outcome("ok", [7, 9])}, final=True)
    assert any("saw [7, 8], not [7, 9]" in p for p in problems)
    assert len(PROGRESS) == 3
