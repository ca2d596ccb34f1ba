"""Signals sent by name only: which type their value is checked against, before anything is recorded.

HTTP, the CLI, the UI and a follower routing a call know a signal's name and a
JSON value, not its ``fusee.signal(...)`` definition: they send an untyped
``SignalDef(name)``. The engine holding the run checks such a value here, on the
one path all of them share (``Engine.signal``):

1. the run's code already waited for the name: that wait's type decides;
2. otherwise the ``fusee.signal(name, type)`` declarations of this process: the
   value must convert to one of their types;
3. a name neither waited for nor declared is refused (:class:`UnknownSignal`,
   listing the names that are known).

A signal sent with a typed definition is checked against its own type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusee import codec, sabotage
from fusee.definitions import SignalDef, declared_signal_names, declared_signal_types
from fusee.errors import SerializationError, UnknownSignal

if TYPE_CHECKING:
    from fusee.runtime.run import Run

#: At most this many known names are listed in an UnknownSignal's message.
LISTED = 40


def payload(run: Run, signal: SignalDef[Any], value: object) -> bytes:
    """The bytes to journal for ``value`` sent to ``run`` as ``signal``.

    Raises :class:`SerializationError` when the value does not convert to the
    type that applies (see the module's doc) and :class:`UnknownSignal` for an
    untyped signal whose name is known neither to the run nor to this process.
    """
    if not codec.is_undeclared(signal.type) or sabotage.active.signal_by_name_unchecked:
        return codec.encode_signal(signal, value)
    name = signal.name
    if name in run.signal_types:
        return codec.encode_signal(SignalDef(name, run.signal_types[name]), value)
    types = declared_signal_types(name)
    if not types:
        raise unknown(run, name)
    failures: list[SerializationError] = []
    for tp in types:
        try:
            return codec.encode_signal(SignalDef(name, tp), value)
        except SerializationError as e:
            failures.append(e)
    if len(failures) == 1:
        raise failures[0]
    raise SerializationError(
        f"the value of signal '{name}' converts to none of the {len(types)} types it is declared with in "
        "this process: " + "; ".join(str(e) for e in failures)
    )


def unknown(run: Run, name: str) -> UnknownSignal:
    """The refusal of a signal name that ``run`` does not wait for and no declaration names."""
    waited = sorted(n for n in run.signal_types if not n.startswith("fusee."))
    known = sorted({*waited, *declared_signal_names()})
    shown = ", ".join(repr(n) for n in known[:LISTED]) or "none"
    more = f" and {len(known) - LISTED} more" if len(known) > LISTED else ""
    its = f"its code waited for {', '.join(repr(n) for n in waited)}; " if waited else ""
    return UnknownSignal(
        run.workflow_id, name, known,
        f"workflow '{run.workflow_id}' ({run.wdef.name}) has no signal {name!r}: {its}the signals known "
        f"to this engine's process are {shown}{more}. Send one of those (names are case-sensitive), or "
        f"declare it with fusee.signal({name!r}, type) in a module the engine's process imports; "
        "nothing was recorded",
    )
