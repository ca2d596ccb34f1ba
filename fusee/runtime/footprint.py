"""What a loaded run is counted as holding in memory (the memory budget's unit, ``fusee.runtime.budget``).

A loaded run is counted as ``RUN_BYTES`` plus, for each record of its
journal, ``RECORD_BYTES`` and the record's encoded size. The constants were
measured with tracemalloc (``bench/memory_per_run.py``) on runs of a small
workflow: what a loaded run holds (its Run, state machine, coroutine, decoded
records) beyond its table entry. Objects the workflow's own code keeps in its
locals are not counted, beyond what the journal holds of them.
"""

from __future__ import annotations

from fusee.core import records as rec

#: A loaded run's own objects beyond its journal (tracemalloc, ``bench/memory_per_run.py``).
RUN_BYTES = 10_000
#: Each decoded record beyond its encoded bytes: the struct, its fields' objects, the LSN.
RECORD_BYTES = 200


def journal_bytes(journal: list[rec.Record]) -> int:
    """What a loaded journal is counted as holding."""
    return len(journal) * RECORD_BYTES + sum(len(rec.encode(r)) for r in journal)
