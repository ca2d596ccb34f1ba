"""Journal records: every kind the engine writes, and their canonical encoding.

A record is a frozen, slotted value (a msgspec Struct). Each kind has a small
integer tag; the encoding is MessagePack of ``[tag, field, field, ...]`` behind
one format-version byte. Decoding arbitrary bytes yields a record or raises
:class:`CorruptRecord`, never anything else.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec

from fusee.errors import CorruptRecord

#: Bumped whenever a record's fields change incompatibly.
FORMAT_VERSION: Final = 1

#: ``Attempt.retry_at_ms`` of a step whose retries ran out: it waits for a
#: resume instead of a time.
PAUSED: Final = (1 << 64) - 1

#: ``Chunk.seq`` / ``StreamEnd.seq`` of a chunk written by workflow code
#: itself rather than by a step.
WORKFLOW: Final = (1 << 32) - 1


class Status(enum.IntEnum):
    """How an operation or a run ended."""

    OK = 0
    FAILED = 1
    CANCELLED = 2
    TIMED_OUT = 3
    TERMINATED = 4
    #: Handed over to a new run by continue-as-new.
    CONTINUED = 5


class WaitOutcome(enum.IntEnum):
    """How a wait for a signal ended (``Waited.outcome``)."""

    SIGNAL = 0
    TIMED_OUT = 1
    #: The code dropped the wait (the losing side of a race).
    ABANDONED = 2


class ValueKind(enum.IntEnum):
    """What a recorded nondeterministic value is."""

    NOW = 0
    RANDOM = 1
    UUID = 2


class ClosePolicy(enum.IntEnum):
    """What happens to a child when its parent closes (low bits of flags)."""

    TERMINATE = 0
    REQUEST_CANCEL = 1
    ABANDON = 2


#: ``Child.flags`` bit: the parent does not wait for the child's result.
DETACHED: Final = 0x10
#: ``Child.flags`` mask of the close policy.
CLOSE_POLICY_MASK: Final = 0x0F


class _Rec(msgspec.Struct, frozen=True, array_like=True, tag_field="k", gc=False):
    """Base of every record; ``run`` is the run's numeric ID."""


class ParentRef(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The parent of a child run and the position of its child operation."""

    id: str
    run: int
    seq: int


class UpdateWithStart(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """An update delivered together with the run's start."""

    name: str
    id: str
    payload: bytes


class Start(_Rec, tag=0, frozen=True, array_like=True, gc=False):
    run: int
    id: str
    wtype: str
    version: int
    codec: int
    started_ms: int
    deadline_ms: int
    parent: ParentRef | None
    #: Workflow-ID reuse and parent-close policy, packed in one byte.
    policy: int
    update: UpdateWithStart | None
    input: bytes
    trace: bytes | None = None
    #: Who asked for this run when it came from a reset (the audit), else None.
    by: bytes | None = None


class Step(_Rec, tag=1, frozen=True, array_like=True, gc=False):
    """A step's outcome; the last three fields time the attempt that gave it.

    ``began_us`` is when the attempt's function began (wall-clock Unix
    microseconds from the engine's clock, 0: not recorded, as in records
    written before step times), ``took_us`` how long it ran to its outcome,
    and ``queued_us`` how long it waited for a limit's permit or a thread of
    the step pool before it began. They are plain trailing fields, not a
    nested struct, to spare an allocation per step.
    """

    run: int
    seq: int
    name: str
    attempt: int
    status: Status
    payload: bytes
    began_us: int = 0
    took_us: int = 0
    queued_us: int = 0


class Attempt(_Rec, tag=2, frozen=True, array_like=True, gc=False):
    """A failed attempt; ``retry_at_ms == PAUSED`` when retries ran out.

    ``began_us``, ``took_us`` and ``queued_us`` time the attempt, as a
    ``Step``'s do.
    """

    run: int
    seq: int
    name: str
    attempt: int
    retry_at_ms: int
    error: bytes
    began_us: int = 0
    took_us: int = 0
    queued_us: int = 0


class Resume(_Rec, tag=3, frozen=True, array_like=True, gc=False):
    """A paused step resumed with a fresh budget after ``attempt``."""

    run: int
    seq: int
    attempt: int
    by: bytes | None = None


class Timer(_Rec, tag=4, frozen=True, array_like=True, gc=False):
    """A sleep until ``fire_at_ms``, begun at ``began_ms`` (0: not recorded)."""

    run: int
    seq: int
    name: str
    fire_at_ms: int
    began_ms: int = 0


class Fired(_Rec, tag=5, frozen=True, array_like=True, gc=False):
    run: int
    seq: int


class Signal(_Rec, tag=6, frozen=True, array_like=True, gc=False):
    """A signal received by the run (its ordinal is its place among them)."""

    run: int
    name: str
    dedup: int
    payload: bytes
    by: bytes | None = None


class Wait(_Rec, tag=7, frozen=True, array_like=True, gc=False):
    """A wait for a signal (``deadline_ms`` 0: none), begun at ``began_ms`` (0: not recorded)."""

    run: int
    seq: int
    name: str
    deadline_ms: int
    began_ms: int = 0


class Waited(_Rec, tag=8, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    outcome: WaitOutcome
    #: The signal's ordinal when ``outcome`` is ``SIGNAL``.
    ordinal: int = 0


class Value(_Rec, tag=9, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    kind: ValueKind
    value: bytes


class Child(_Rec, tag=10, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    wtype: str
    id: str
    flags: int
    deadline_ms: int
    input: bytes


class ChildDone(_Rec, tag=11, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    status: Status
    payload: bytes


class Send(_Rec, tag=12, frozen=True, array_like=True, gc=False):
    """A signal to another workflow, sent once this record is durable."""

    run: int
    seq: int
    target: str
    name: str
    payload: bytes


class Cancel(_Rec, tag=13, frozen=True, array_like=True, gc=False):
    run: int
    reason: bytes
    by: bytes | None = None


class Done(_Rec, tag=14, frozen=True, array_like=True, gc=False):
    run: int
    status: Status
    finished_ms: int
    payload: bytes
    by: bytes | None = None


class Update(_Rec, tag=15, frozen=True, array_like=True, gc=False):
    """An accepted update; its ordinal is its place among the run's updates."""

    run: int
    name: str
    id: str
    payload: bytes
    caller: bytes | None = None


class UpdateDone(_Rec, tag=16, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    ordinal: int
    status: Status
    payload: bytes


class Heartbeat(_Rec, tag=17, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    attempt: int
    payload: bytes


class Awaiting(_Rec, tag=18, frozen=True, array_like=True, gc=False):
    """The completion token of ``attempt`` was handed out."""

    run: int
    seq: int
    name: str
    attempt: int


class Completed(_Rec, tag=19, frozen=True, array_like=True, gc=False):
    """An async completion's result, reported from outside (``by``: who reported it)."""

    run: int
    seq: int
    attempt: int
    status: Status
    payload: bytes
    by: bytes | None = None


class Patch(_Rec, tag=20, frozen=True, array_like=True, gc=False):
    """A patch decision; ``at`` is the position it was taken at (no position of its own)."""

    run: int
    at: int
    id: str


class Attributes(_Rec, tag=21, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    payload: bytes


class Chunk(_Rec, tag=22, frozen=True, array_like=True, gc=False):
    """A stream chunk; ``seq`` is the writing step's position or ``WORKFLOW``."""

    run: int
    seq: int
    attempt: int
    stream: str
    offset: int
    payload: bytes


class StreamEnd(_Rec, tag=23, frozen=True, array_like=True, gc=False):
    run: int
    seq: int
    stream: str
    chunks: int
    status: Status


class CancelRequest(_Rec, tag=24, frozen=True, array_like=True, gc=False):
    """A cancellation was asked for (and acknowledged once this is durable).

    It takes no position and delivers nothing: the ``Cancel`` that reaches the
    code follows once the run's step functions then running have settled. No
    step function of the run starts between the two.
    """

    run: int
    reason: bytes
    by: bytes | None = None


Record = (
    Start
    | Step
    | Attempt
    | Resume
    | Timer
    | Fired
    | Signal
    | Wait
    | Waited
    | Value
    | Child
    | ChildDone
    | Send
    | Cancel
    | Done
    | Update
    | UpdateDone
    | Heartbeat
    | Awaiting
    | Completed
    | Patch
    | Attributes
    | Chunk
    | StreamEnd
    | CancelRequest
)

#: Every record type, in tag order.
RECORD_TYPES: Final[tuple[type[Record], ...]] = (
    Start,
    Step,
    Attempt,
    Resume,
    Timer,
    Fired,
    Signal,
    Wait,
    Waited,
    Value,
    Child,
    ChildDone,
    Send,
    Cancel,
    Done,
    Update,
    UpdateDone,
    Heartbeat,
    Awaiting,
    Completed,
    Patch,
    Attributes,
    Chunk,
    StreamEnd,
    CancelRequest,
)

_VERSION_BYTE: Final = bytes([FORMAT_VERSION])
_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Record] = msgspec.msgpack.Decoder(Record)


def encode(record: Record) -> bytes:
    """The canonical bytes of ``record``: equal records give equal bytes."""
    return _VERSION_BYTE + _encoder.encode(record)


def encode_into(record: Record, buf: bytearray, offset: int) -> None:
    """Writes ``encode(record)`` into ``buf`` at ``offset`` (growing it)."""
    buf[offset:] = _VERSION_BYTE
    _encoder.encode_into(record, buf, offset + 1)


def decode(data: bytes | bytearray | memoryview) -> Record:
    """The record ``data`` encodes.

    Raises :class:`CorruptRecord` for anything that is not exactly one valid
    record of this format version.
    """
    if len(data) < 2:
        raise CorruptRecord(f"record of {len(data)} bytes is too short")
    if data[0] != FORMAT_VERSION:
        raise CorruptRecord(f"record format version {data[0]} is not {FORMAT_VERSION}")
    try:
        return _decoder.decode(memoryview(data)[1:])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CorruptRecord(f"record does not decode: {e}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        raise CorruptRecord(f"record does not decode: {e}") from None


def run_of(record: Record) -> int:
    """The numeric run ID every record carries."""
    return record.run
