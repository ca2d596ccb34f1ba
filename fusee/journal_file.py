"""Journals as portable files (``.fjnl``) and as normalized JSON.

A ``.fjnl`` file holds one run's journal in the canonical record encoding:
an 8-byte magic, a format version, the record count, the records (each
length-prefixed), and a crc32c of everything before it. It is what
``engine.export`` writes and ``fusee.testing.load_journal`` reads, to replay
recorded histories against new code (``fusee.testing.replay``).

``journal_json`` is the language-neutral view of a journal: record kinds,
positions, names and decoded payloads, without times, run IDs or random
values, so two runs that did the same thing compare equal.
"""

from __future__ import annotations

import base64
import datetime
import enum
import os
import struct
from typing import Any

import crc32c
import msgspec

from fusee.core import records as rec
from fusee.errors import CorruptRecord

MAGIC = b"FUSEEJNL"
FORMAT = 1
_HEAD = struct.Struct("<8sHI")
_LEN = struct.Struct("<I")
_CRC = struct.Struct("<I")
#: A journal file larger than this is refused rather than read.
MAX_BYTES = 1 << 30


def dumps(journal: list[rec.Record]) -> bytes:
    """The ``.fjnl`` bytes of ``journal``."""
    parts = [_HEAD.pack(MAGIC, FORMAT, len(journal))]
    for r in journal:
        data = rec.encode(r)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    body = b"".join(parts)
    return body + _CRC.pack(crc32c.crc32c(body))


def loads(data: bytes, where: str = "journal") -> list[rec.Record]:
    """The journal in ``.fjnl`` bytes; :class:`CorruptRecord` naming ``where`` for anything else."""
    if len(data) < _HEAD.size + _CRC.size or data[:8] != MAGIC:
        raise CorruptRecord(f"{where} is not a Fusee journal file (.fjnl)")
    body, (crc,) = data[:-_CRC.size], _CRC.unpack(data[-_CRC.size:])
    if crc32c.crc32c(body) != crc:
        raise CorruptRecord(f"{where}: checksum mismatch (the file is damaged or cut short)")
    _, fmt, count = _HEAD.unpack_from(body, 0)
    if fmt != FORMAT:
        raise CorruptRecord(f"{where}: journal file format {fmt} is not {FORMAT}")
    out: list[rec.Record] = []
    pos = _HEAD.size
    for i in range(count):
        if pos + _LEN.size > len(body):
            raise CorruptRecord(f"{where}: record {i} runs past the end", path=where, offset=pos)
        (n,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        if pos + n > len(body):
            raise CorruptRecord(f"{where}: record {i} runs past the end", path=where, offset=pos)
        r = rec.decode(body[pos:pos + n])
        _check_times(r, i, where)
        out.append(r)
        pos += n
    if pos != len(body):
        raise CorruptRecord(f"{where}: bytes after the last record", path=where, offset=pos)
    if not out or not isinstance(out[0], rec.Start):
        raise CorruptRecord(f"{where}: a journal begins with its Start record")
    return out


#: Record fields holding a time (UTC milliseconds; 0: none), and the range a datetime can show.
_TIME_FIELDS = ("started_ms", "finished_ms", "fire_at_ms", "deadline_ms", "retry_at_ms")
_MIN_MS = int(datetime.datetime(1, 1, 1, tzinfo=datetime.UTC).timestamp() * 1000)
_MAX_MS = int(datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC).timestamp() * 1000)


def _check_times(r: rec.Record, i: int, where: str) -> None:
    """A record's times are times: a checksum only says the file is as its writer made it,
    and a time no datetime holds would fail every reader of the journal later, naming nothing."""
    for field in _TIME_FIELDS:
        value = getattr(r, field, 0)
        if not value or (field == "retry_at_ms" and value == rec.PAUSED) or _MIN_MS <= value <= _MAX_MS:
            continue
        raise CorruptRecord(
            f"{where}: record {i} ({type(r).__name__}) holds {field}={value}, which is no time "
            "(years 1 to 9999 in UTC milliseconds): the file was not written by Fusee's export, or was "
            "altered and its checksum made again")


def write(path: str | os.PathLike[str], journal: list[rec.Record]) -> None:
    """Writes ``journal`` to ``path`` (replacing it) and makes it durable."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(dumps(journal))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(path: str | os.PathLike[str]) -> list[rec.Record]:
    """The journal in the ``.fjnl`` file at ``path``."""
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise CorruptRecord(f"{os.fspath(path)} holds {size} bytes: more than a journal file may")
    with open(path, "rb") as f:
        return loads(f.read(), os.fspath(path))


_json = msgspec.json.Decoder()


def _payload(data: bytes) -> Any:
    try:
        return _json.decode(data)
    except msgspec.DecodeError:
        return {"$encoded": base64.b64encode(data).decode()}


#: Fields left out of the normalized view: they differ between equivalent runs.
_VOLATILE = {"run", "started_ms", "finished_ms", "deadline_ms", "fire_at_ms", "retry_at_ms", "trace", "began_ms",
             "began_us", "took_us", "queued_us"}


def journal_json(journal: list[rec.Record]) -> list[dict[str, Any]]:
    """The normalized, language-neutral view of a journal (see the module's doc)."""
    out: list[dict[str, Any]] = []
    for r in journal:
        d: dict[str, Any] = {"kind": type(r).__name__}
        for k, v in msgspec.structs.asdict(r).items():
            if k in _VOLATILE:
                continue
            if isinstance(r, rec.Value) and k == "value":
                continue  # a recorded time, random number or UUID
            if isinstance(v, bytes):
                v = _payload(v) if k in ("payload", "input", "error", "reason") else base64.b64encode(v).decode()
            elif isinstance(v, msgspec.Struct):
                v = {kk: vv for kk, vv in msgspec.structs.asdict(v).items() if kk not in _VOLATILE}
            elif isinstance(v, enum.Enum):
                v = v.name.lower()  # its name reads the same in every language
            d[k] = v
        out.append(d)
    return out
