"""Records: every kind round-trips; arbitrary bytes decode or raise CorruptRecord."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.core import records as r
from fusee.errors import CorruptRecord

SAMPLES: list[r.Record] = [
    r.Start(
        run=7,
        id="order-1",
        wtype="order",
        version=2,
        codec=1,
        started_ms=1_700_000_000_000,
        deadline_ms=0,
        parent=r.ParentRef(id="p", run=3, seq=4),
        policy=0x12,
        update=r.UpdateWithStart(name="add", id="u1", payload=b"5"),
        input=b'{"n":5}',
        trace=b"00-abc-01",
    ),
    r.Step(run=7, seq=0, name="quote", attempt=1, status=r.Status.OK, payload=b"42"),
    r.Attempt(run=7, seq=1, name="charge", attempt=2, retry_at_ms=r.PAUSED, error=b"boom"),
    r.Resume(run=7, seq=1, attempt=2, by=b"cli:ana"),
    r.Timer(run=7, seq=2, name="cool-off", fire_at_ms=123),
    r.Fired(run=7, seq=2),
    r.Signal(run=7, name="approve", dedup=99, payload=b"1", by=None),
    r.Wait(run=7, seq=3, name="approve", deadline_ms=456),
    r.Waited(run=7, seq=3, outcome=r.WaitOutcome.SIGNAL, ordinal=0),
    r.Waited(run=7, seq=3, outcome=r.WaitOutcome.ABANDONED),
    r.Value(run=7, seq=4, kind=r.ValueKind.UUID, value=b"\x00" * 16),
    r.Child(run=7, seq=5, wtype="ship", id="ship-1", flags=r.DETACHED | 1, deadline_ms=0, input=b""),
    r.ChildDone(run=7, seq=5, status=r.Status.FAILED, payload=b"err"),
    r.Send(run=7, seq=6, target="other", name="ping", payload=b"x"),
    r.Cancel(run=7, reason=b"stop", by=b"api"),
    r.Done(run=7, status=r.Status.CONTINUED, finished_ms=999, payload=b"next", by=None),
    r.Update(run=7, name="add", id="u2", payload=b"3", caller=b"c"),
    r.UpdateDone(run=7, seq=8, ordinal=1, status=r.Status.OK, payload=b"8"),
    r.Heartbeat(run=7, seq=9, attempt=1, payload=b"page-7"),
    r.Awaiting(run=7, seq=10, name="approval", attempt=1),
    r.Completed(run=7, seq=10, attempt=1, status=r.Status.OK, payload=b"yes"),
    r.Patch(run=7, at=11, id="fix-1"),
    r.Attributes(run=7, seq=11, payload=b"{}"),
    r.Chunk(run=7, seq=r.WORKFLOW, attempt=0, stream="tokens", offset=0, payload=b"a"),
    r.StreamEnd(run=7, seq=12, stream="tokens", chunks=3, status=r.Status.OK),
    r.CancelRequest(run=7, reason=b"customer asked", by=b"alice"),
]


def test_every_kind_has_a_sample() -> None:
    assert {type(s) for s in SAMPLES} == set(r.RECORD_TYPES)


@pytest.mark.parametrize("rec", SAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip(rec: r.Record) -> None:
    data = r.encode(rec)
    assert data[0] == r.FORMAT_VERSION
    back = r.decode(data)
    assert back == rec and type(back) is type(rec)
    # Canonical: encoding the decoded record gives the same bytes.
    assert r.encode(back) == data
    buf = bytearray(b"xx")
    r.encode_into(rec, buf, 2)
    assert bytes(buf[2:]) == data


def test_records_are_frozen_and_slotted() -> None:
    rec = SAMPLES[1]
    with pytest.raises(AttributeError):
        rec.seq = 3  # type: ignore[misc]
    assert not hasattr(rec, "__dict__")


def test_wrong_version_is_corrupt() -> None:
    data = bytearray(r.encode(SAMPLES[1]))
    data[0] = 99
    with pytest.raises(CorruptRecord, match="version"):
        r.decode(bytes(data))


def test_wrong_field_type_is_corrupt() -> None:
    bad = b"\x01" + msgspec.msgpack.encode([1, "not-an-int", 0, "a", 1, 0, b""])
    with pytest.raises(CorruptRecord):
        r.decode(bad)


@settings(max_examples=2000)
@given(st.binary(max_size=200))
def test_decoding_arbitrary_bytes_is_a_record_or_corrupt(data: bytes) -> None:
    try:
        rec = r.decode(data)
    except CorruptRecord:
        return
    assert isinstance(rec, r.RECORD_TYPES)


@settings(max_examples=1000)
@given(st.sampled_from(SAMPLES), st.data())
def test_mutated_encodings_never_raise_anything_else(rec: r.Record, data: st.DataObject) -> None:
    enc = bytearray(r.encode(rec))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(enc) - 1))
        enc[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(enc)))
    try:
        r.decode(bytes(enc[:cut]))
    except CorruptRecord:
        pass
