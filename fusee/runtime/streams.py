"""Streams: chunks a run writes as it goes (progress, tokens), read while it runs.

Workflow code writes with ``ctx.stream(name)``; a step's function with
``info.stream(name)``. Chunks are journal records: a reader sees only durable
ones, in order, never changed, and one end. A step that runs again (a retry,
or after a crash) continues after the chunks its earlier attempts recorded:
either it reads ``recorded`` (how many there are) and writes only the ones
after them, or it writes them all again and its writes of the recorded offsets
are checked against what was recorded and dropped. A step's result completes
the streams it wrote.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fusee import codec, sabotage
from fusee.core import records as rec
from fusee.errors import StreamError

if TYPE_CHECKING:
    from fusee.core import journal as jm


class _Flushes(Protocol):
    def flush_soon(self) -> None: ...


class StreamRun(Protocol):
    """What a stream asks of the run it belongs to (``fusee.runtime.run.Run`` provides it),
    so that this module, below the run, does not import it."""

    @property
    def machine(self) -> jm.RunMachine: ...
    @property
    def journal(self) -> Sequence[rec.Record]: ...
    @property
    def dead(self) -> bool: ...
    @property
    def rt(self) -> _Flushes: ...

    def append(self, r: rec.Record) -> int: ...


class WorkflowStream:
    """A stream written by workflow code (``ctx.stream(name)``)."""

    __slots__ = ("_name", "_run")

    def __init__(self, run: StreamRun, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a stream name must be a non-empty string, got {name!r}")
        self._run = run
        self._name = name
        run.machine.stream_open(name, None)

    async def write(self, chunk: Any) -> None:
        """Appends ``chunk`` (a JSON value); readers see it once it is durable."""
        r = self._run.machine.stream_append(self._name, None, codec.encode(chunk))
        if r is not None:
            self._run.append(r)
            self._run.rt.flush_soon()

    async def close(self) -> None:
        """Ends the stream: readers see its end; later writes raise :class:`fusee.errors.StreamError`."""
        r = self._run.machine.stream_close(self._name, None)
        if r is not None:
            self._run.append(r)
            self._run.rt.flush_soon()


class StepStream:
    """A stream written by a step's function (``info.stream(name)``), from the loop or a thread."""

    __slots__ = ("_loop", "_name", "_recorded", "_run", "_seq", "_skipped")

    def __init__(self, run: StreamRun, seq: int, name: str, loop: asyncio.AbstractEventLoop) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a stream name must be a non-empty string, got {name!r}")
        self._run, self._seq, self._name, self._loop = run, seq, name, loop
        opened = _on_loop(loop, lambda: run.machine.stream_open(name, seq))
        # What earlier attempts of this step recorded: this attempt's first writes repeat them.
        self._recorded = [
            r.payload for r in run.journal
            if type(r) is rec.Chunk and r.stream == name and r.seq == seq
        ][: opened.recorded]
        self._skipped = 0

    @property
    def recorded(self) -> int:
        """How many chunks earlier attempts of this step recorded on this stream (0 on a
        first attempt). Reading it means this attempt continues after them: its next
        ``write`` is chunk ``recorded`` of the stream, not a repeat of the first one."""
        self._skipped = len(self._recorded)
        return len(self._recorded)

    @property
    def recorded_chunks(self) -> list[Any]:
        """The values of those recorded chunks, in order (a step that continues after them
        may need them to build its result). Reading it does not change what ``write`` does."""
        return [codec.decode(p) for p in self._recorded]

    def write(self, chunk: Any) -> None:
        """Appends ``chunk`` (a JSON value). A step running again continues after its
        recorded chunks: rewriting one of them must give the same value (else StreamError)."""
        payload = codec.encode(chunk)
        if self._skipped < len(self._recorded):
            if payload != self._recorded[self._skipped]:
                raise StreamError(
                    f"stream '{self._name}': this attempt wrote {payload!r} at offset {self._skipped}, "
                    f"where an earlier attempt recorded {self._recorded[self._skipped]!r}; a step "
                    "that runs again must write the same chunks before new ones"
                )
            self._skipped += 1
            return
        _on_loop(self._loop, lambda: self._append(payload))

    def _append(self, payload: bytes) -> None:
        r = self._run.machine.stream_append(self._name, self._seq, payload)
        if r is not None and not self._run.dead:
            self._run.append(r)
            self._run.rt.flush_soon()

    def close(self) -> None:
        """Ends the stream before the step's result does."""

        def close() -> None:
            r = self._run.machine.stream_close(self._name, self._seq)
            if r is not None and not self._run.dead:
                self._run.append(r)
                self._run.rt.flush_soon()

        _on_loop(self._loop, close)


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` on the engine's loop: directly there, or from a thread, waiting for it."""
    if asyncio.events._get_running_loop() is loop:
        return fn()

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result()


@dataclasses.dataclass(frozen=True, slots=True)
class StreamBatch:
    """One answer of a stream read (:meth:`fusee.Engine.stream_batch`).

    ``chunks`` are the durable chunks of run ``run_id``'s stream from ``offset``;
    ``next_offset`` is where to read next. ``end_status`` is None while the
    stream goes on, else how it ended: ``"ok"`` (closed, or its step or run
    succeeded), ``"failed"`` (its step or run failed), ``"cancelled"``,
    ``"timed_out"``, ``"terminated"`` or ``"continued"`` (the run handed over
    to a next run by continue-as-new without closing it). Once it is set,
    ``chunks`` held every chunk up to the end.
    """

    workflow_id: str
    run_id: int
    offset: int
    chunks: list[Any]
    next_offset: int
    end_status: str | None

    @property
    def ended(self) -> bool:
        """The stream ended and no chunk comes after ``next_offset``."""
        return self.end_status is not None


def durable_chunks(
    journal: list[rec.Record], lsns: list[int], durable: int, name: str, offset: int, start: int = 0
) -> tuple[list[Any], int, rec.Status | None, int]:
    """(chunk values from ``offset``, the next offset, how the stream ended or None, where
    to look next time), durable ones only. ``start`` is a journal index no later than the
    chunk at ``offset`` (what an earlier call returned): a follower reads each record once."""
    if sabotage.active.stream_shows_nondurable:
        durable = 1 << 62  # every appended record counts as durable
    chunks: list[Any] = []
    ended: rec.Status | None = None
    nxt = offset
    i = start
    n = len(journal)
    while i < n:
        r, lsn = journal[i], lsns[i]
        if lsn > durable:
            break
        i += 1
        t = type(r)
        if t is rec.Chunk and r.stream == name:  # type: ignore[union-attr]
            if r.offset >= offset:  # type: ignore[union-attr]
                chunks.append(codec.decode(r.payload))  # type: ignore[union-attr]
                nxt = r.offset + 1  # type: ignore[union-attr]
        elif t is rec.StreamEnd and r.stream == name:  # type: ignore[union-attr]
            ended = r.status  # type: ignore[union-attr]
        elif t is rec.Done and ended is None:
            ended = r.status  # type: ignore[union-attr]  # the run ended: nothing more comes
    return chunks, nxt, ended, i
