"""Placeholder demo until the engine exists: records round-trip."""

from fusee.core import records

rec = records.Step(run=1, seq=0, name="hello", attempt=1, status=records.Status.OK, payload=b"42")
data = records.encode(rec)
print(f"step record: {len(data)} bytes, round-trips: {records.decode(data) == rec}")
