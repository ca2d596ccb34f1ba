"""Flow control built on the journal: schedules, and debounce and batch windows.

Each concept is a built-in durable workflow (see :mod:`fusee.flow.schedules`
and :mod:`fusee.flow.windows`), so it survives crashes and replays like any
other run; :mod:`fusee.flow.api` is the engine's client side of them.
"""

from fusee.flow.rules import Batch, Debounce, Receipt

__all__ = ["Batch", "Debounce", "Receipt"]
