"""What a backup target holds: immutable objects, and points that say how to put them together.

::

    chunks/<segment>-<life>/<start>-<end>   bytes [start, end) of a log segment, as written
    blobs/<life>-<n>.blob                   a blob file, as written
    checkpoints/<sha256>                    a checkpoint file, as written
    points/<time ns>-<position>.json        one consistent point (a ``Point``)
    newest.json                             a copy of the newest point (where a backup resumes)

Objects are never changed once written, so a point stays restorable whatever is
uploaded after it. A point is written only after every object it names was
uploaded and verified. Its *position* is the sequence number of the last log batch
it holds (batches are numbered 1, 2, 3, ... across segments and lives), its *time*
when that batch was known durable. Names sort by time, so the newest point is the
last name under ``points/``.
"""

from __future__ import annotations

import hashlib

import msgspec

FORMAT = 1
NEWEST = "newest.json"
POINTS = "points/"


class ObjectRef(msgspec.Struct, array_like=True, frozen=True):
    """An uploaded object: its key, and the sha256 (hex) of its bytes."""

    key: str
    sha256: str


class Chunk(msgspec.Struct, array_like=True, frozen=True):
    """Bytes ``[start, end)`` of a segment, in the object ``ref``."""

    start: int
    end: int
    ref: ObjectRef


class Segment(msgspec.Struct, frozen=True):
    """One log segment as of a point: its bytes up to ``end`` are the ``chunks``, in order."""

    number: int
    #: The life of the writer that created it (a segment number alone may repeat after a cut).
    life: int
    end: int
    chunks: tuple[Chunk, ...]


class Blob(msgspec.Struct, array_like=True, frozen=True):
    name: str
    ref: ObjectRef


class Point(msgspec.Struct, frozen=True):
    """A restorable state of an engine directory."""

    format: int
    #: Unix time (seconds) at which the point's last batch was known durable.
    time: float
    #: The sequence number of the last batch the point holds (0: none yet).
    position: int
    #: The directory's meta file (and epoch file, if any), verbatim.
    meta: str
    epoch: str | None
    checkpoint: ObjectRef | None
    #: The position of the last batch the checkpoint had seen (a restore never cuts before it).
    checkpoint_position: int
    segments: tuple[Segment, ...]
    blobs: tuple[Blob, ...]

    @property
    def key(self) -> str:
        return point_key(self.time, self.position)


def point_key(time: float, position: int) -> str:
    return f"{POINTS}{int(time * 1e9):020d}-{position:012d}.json"


def key_time(key: str) -> float:
    """The time a point's key names (seconds)."""
    return int(key[len(POINTS):].split("-", 1)[0]) / 1e9


def chunk_key(number: int, life: int, start: int, end: int) -> str:
    return f"chunks/{number:012d}-{life:016x}/{start:016d}-{end:016d}"


def sha256(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(point: Point) -> bytes:
    return msgspec.json.encode(point)


def decode(data: bytes, key: str) -> Point:
    """The point in ``data``; raises ``BackupCorrupted`` naming ``key`` when it is not one."""
    from fusee.errors import BackupCorrupted

    try:
        point = msgspec.json.decode(data, type=Point)
    except msgspec.DecodeError as e:
        raise BackupCorrupted(f"the backup's {key} is not a backup point ({e}): restore an earlier "
                              "point (--at or --position)") from None
    if point.format != FORMAT:
        raise BackupCorrupted(f"the backup's {key} has format {point.format}; this version of Fusee "
                              f"reads format {FORMAT}")
    return point
