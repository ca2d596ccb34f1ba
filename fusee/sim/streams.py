"""Streams in the simulator: talkers that stream, readers that follow them, and their checks.

A **talker** (the seed's ``Talker`` job) streams its progress from workflow
code ("start", "generated", "end") and, from a step, the tokens of a model
call. A step that runs again (after a crash, or a failed first attempt for odd
inputs) continues after the recorded tokens: for lengths divisible by three it
asks how many were recorded (``recorded``) and writes only the rest; otherwise
it writes every token from the first and its rewrites are checked and dropped.
It returns the tokens.

**Readers** follow a talker's streams from before it starts, reconnect at
their offset in every new life, sometimes read again from a random earlier
offset, use long polls of several lengths (``read_stream_batch``) or follow
with ``read_stream``. Every answer is checked at once:

- a chunk at an offset never changes (across readers, reconnections and lives);
- no offset is skipped: a batch from offset ``k`` holds ``k, k+1, ...``;
- a stream ends once, at one offset, with one ``StreamEnd`` in its journal;
- only durable chunks are shown: each chunk a reader got is, at that moment,
  in the run's durable journal (``engine.journal``) at its offset.

At the end, a talker that finished has readers that saw exactly the tokens its
step returned and its three progress chunks, each stream ended ``OK``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import fusee
from fusee import codec as values
from fusee import errors
from fusee.core import records as rec
from fusee.sim.service import TransientError, stable_hash

#: What a talker streams from workflow code, in order.
PROGRESS = ("start", "generated", "end")
#: Long polls a reader uses (virtual seconds; 0: answer at once).
WAITS = (0.0, 0.002, 0.020, 0.200)

_GONE: tuple[type[BaseException], ...] = (errors.EngineClosed, errors.StorageError, errors.Busy)


def token(seed: int, key: str, i: int) -> int:
    """The ``i``-th token a model call keyed ``key`` produces (the same on every attempt)."""
    return stable_hash(seed, key, i) % 100_000


def talker_workflow(seed: int, retry: Any) -> Any:
    """The talker job: ``n`` tokens from a step, progress from the workflow."""

    @fusee.workflow("talker")
    async def talker(ctx: fusee.Ctx, n: int) -> list[int]:
        progress = ctx.stream("progress")
        await progress.write(PROGRESS[0])

        async def talk(info: Any) -> list[int]:
            out = info.stream("tokens")
            toks: list[int] = []
            if n % 3 == 0:  # continue after what earlier attempts recorded (the seed's way)
                toks = [int(t) for t in out.recorded_chunks[: out.recorded]]
            for i in range(len(toks), n):
                await asyncio.sleep(0.001)  # a slow model: readers see tokens as they come
                t = token(seed, info.key, i)
                out.write(t)  # written again after a crash or a retry: checked, then dropped
                toks.append(t)
                if n % 2 == 1 and info.attempt == 1 and i == n // 2:
                    raise TransientError("the model dropped the connection")
            return toks

        tokens = await ctx.step("talk", talk, retry=retry(4))
        await progress.write(PROGRESS[1])
        await ctx.sleep("rest", 0.004)
        await progress.write(PROGRESS[2])
        await progress.close()
        return [int(t) for t in tokens]

    return talker


@dataclasses.dataclass
class Seen:
    """What readers saw of one stream: its chunks by offset, and where it ended."""

    chunks: list[Any] = dataclasses.field(default_factory=list)
    end: int | None = None


@dataclasses.dataclass
class Reader:
    """A client following ``name`` of workflow ``id`` (``follow``: with ``read_stream``)."""

    n: int
    id: str
    name: str
    start_ms: int
    follow: bool
    next: int = 0
    done: bool = False
    life: int = 0
    #: The talker ended on an engine without history: its chunks were gone before this
    #: reader got to the end (``HistoryUnavailable``).
    cut: bool = False


class Streams:
    """The talkers' readers and what they saw; wired into a world by ``fusee.sim.workload``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(f"stream-readers-{seed}")
        self.readers: list[Reader] = []
        self.seen: dict[tuple[str, str], Seen] = {}
        self.violations: list[str] = []
        self.talkers: dict[str, int] = {}
        self.chunks_read = 0
        self.streams_read = 0
        self.rereads = 0
        #: Streams at least one reader of which was cut short (see ``Reader.cut``).
        self.cut: set[tuple[str, str]] = set()

    def plan(self, wid: str, n: int, t_ms: int) -> None:
        """Talker ``wid`` starts at ``t_ms``; readers of its streams start around then."""
        self.talkers[wid] = n
        for name in ("tokens", "progress", "tokens"):
            if name == "tokens" and self.rng.random() < 0.3:
                continue
            self.readers.append(Reader(len(self.readers), wid, name, max(0, t_ms - 5) + self.rng.randrange(80),
                                       follow=self.rng.random() < 0.3))

    # --- in the world ---------------------------------------------------------------

    def on_open(self, world: Any) -> None:
        """A new life: every unfinished reader reconnects at its offset."""
        for r in self.readers:
            if not r.done:
                r.life = world.life
                world.loop.create_task(self._read(world, r, world.life))

    def unfinished(self) -> list[str]:
        """Readers not at the end of their stream (of talkers whose start was acknowledged)."""
        return [f"reader {r.n} of {r.id} {r.name} (at offset {r.next})" for r in self.readers if not r.done]

    async def _read(self, world: Any, r: Reader, life: int) -> None:
        rng = random.Random(f"reader-{self.seed}-{r.n}-{life}")
        delay = r.start_ms / 1000.0 - world.loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        while not r.done and life == world.life:
            engine = world.engine
            if engine is None or world.closing:
                return
            try:
                if r.follow:
                    await self._follow(world, engine, r, life)
                else:
                    await self._batch(world, engine, r, life, rng)
            except errors.NotFound:
                await asyncio.sleep(0.005)  # not started yet
            except errors.HistoryUnavailable:
                # keep_history=False: the run ended and its chunks went with it. Only what
                # readers saw before is checked (a prefix of what the talker made).
                r.done = r.cut = True
                self.cut.add((r.id, r.name))
                return
            except _GONE:
                return  # this life's engine is closing or failed: the next life reconnects
            except Exception as e:  # anything else is an engine bug the world reports
                self.violations.append(f"reader {r.n} of {r.id} {r.name} got {type(e).__name__}: {e}")
                return

    async def _batch(self, world: Any, engine: Any, r: Reader, life: int, rng: random.Random) -> None:
        offset = r.next
        if r.next and rng.random() < 0.15:
            offset = rng.randrange(r.next + 1)  # reconnect anywhere before: the same chunks
            self.rereads += 1
        chunks, nxt, ended = await engine.read_stream_batch(r.id, r.name, offset, wait=rng.choice(WAITS))
        if life != world.life:
            return
        await self._check(engine, r, offset, chunks, nxt, ended)
        r.next = max(r.next, nxt)
        if ended and r.next >= nxt:
            r.done = True
            self.streams_read += 1
        elif not chunks:
            await asyncio.sleep(0.001 * (1 + r.n % 3))  # a short poll came back empty: wait a little

    async def _follow(self, world: Any, engine: Any, r: Reader, life: int) -> None:
        offset = r.next
        async for chunk in engine.read_stream(r.id, r.name, offset):
            if life != world.life:
                return
            await self._check(engine, r, offset, [chunk], offset + 1, False)
            offset += 1
            r.next = offset
        if life == world.life:
            await self._check(engine, r, offset, [], offset, True)
            r.done = True
            self.streams_read += 1

    async def _check(self, engine: Any, r: Reader, offset: int, chunks: list[Any], nxt: int, ended: bool) -> None:
        """Checks one answer against what readers saw before and the durable journal now."""
        # No suspension since the answer: what is durable now was durable then, or became so since.
        durable = await engine.journal(r.id)
        self.chunks_read += len(chunks)
        where = f"{r.id} {r.name}"
        if nxt != offset + len(chunks):
            self.violations.append(f"a reader of {where} asked from offset {offset} and got {len(chunks)} "
                                   f"chunks with next offset {nxt}: an offset was skipped")
            return
        recorded = {c.offset: c for c in durable if type(c) is rec.Chunk and c.stream == r.name}
        ends = [e for e in durable if type(e) is rec.StreamEnd and e.stream == r.name]
        if len(ends) > 1:
            self.violations.append(f"{where} has {len(ends)} ends in its journal: {ends}")
        seen = self.seen.setdefault((r.id, r.name), Seen())
        for i, value in enumerate(chunks):
            at = offset + i
            c = recorded.get(at)
            if c is None or values.decode(c.payload) != value:
                self.violations.append(
                    f"a reader of {where} got {value!r} at offset {at}, which is not in the durable journal "
                    f"({'nothing' if c is None else repr(values.decode(c.payload))} there): it showed a "
                    "chunk that was not durable")
                return
            if at < len(seen.chunks):
                if seen.chunks[at] != value:
                    self.violations.append(f"chunk {at} of {where} was {seen.chunks[at]!r} for a reader and "
                                           f"{value!r} later: a chunk changed")
                    return
            elif at == len(seen.chunks):
                seen.chunks.append(value)
            else:
                self.violations.append(f"a reader of {where} got chunk {at} while readers had seen only "
                                       f"{len(seen.chunks)}: an offset was skipped")
                return
        if ended:
            if nxt < len(seen.chunks):
                self.violations.append(f"{where} ended at offset {nxt} after readers saw {len(seen.chunks)} chunks")
            elif seen.end is not None and seen.end != nxt:
                self.violations.append(f"{where} ended at offset {seen.end} for a reader and at {nxt} for another")
            else:
                seen.end = nxt

    # --- checks ----------------------------------------------------------------------

    def check(self, snap: Any, results: dict[str, Any], final: bool) -> list[str]:
        """After every recovery: what readers saw is still what the journal holds; at the end,
        each finished talker's streams hold exactly what it made, each ended once, OK."""
        out = list(self.violations)
        for (wid, name), seen in self.seen.items():
            view = snap.runs.get(wid)
            if view is None or view.journal is None or (view.done is not None and not view.full):
                continue  # unknown, or an ended run that kept only its start and ending
            recorded = {c.offset: values.decode(c.payload) for c in view.journal
                        if type(c) is rec.Chunk and c.stream == name}
            for at, value in enumerate(seen.chunks):
                if at not in recorded or recorded[at] != value:
                    out.append(f"readers saw {value!r} at offset {at} of {wid} {name}, and after recovery the "
                               f"journal holds {recorded.get(at)!r}: a reader saw a chunk a crash took back")
                    break
        if not final:
            return out
        for wid in self.talkers:
            outcome = results.get(wid)
            if outcome is None or outcome.status != "ok":
                continue
            view = snap.runs.get(wid)
            for name, want in (("tokens", list(outcome.value)), ("progress", list(PROGRESS))):
                got = self.seen.get((wid, name))
                if (wid, name) in self.cut and got is not None:
                    # Some reader came too late (no history): what readers saw is a prefix.
                    if got.chunks != want[:len(got.chunks)] or got.end not in (None, len(want)):
                        out.append(f"readers of {wid} {name} saw {got.chunks} (end {got.end}), not a "
                                   f"prefix of {want}: a replay or a retried step appended again")
                    continue
                if got is not None and got.chunks != want:
                    out.append(f"readers of {wid} {name} saw {got.chunks}, not {want}: a replay or a retried "
                               "step appended again, or an append was lost")
                if got is not None and got.end != len(want):
                    out.append(f"readers of {wid} {name} saw its end at {got.end}, not {len(want)}")
                if view is not None and view.journal is not None and view.full:
                    ends = [e for e in view.journal if type(e) is rec.StreamEnd and e.stream == name]
                    if [e.status for e in ends] != [rec.Status.OK]:
                        out.append(f"{wid} {name} ended {[e.status.name for e in ends]}, not once OK")
        return out

    def counters(self) -> dict[str, int]:
        return {"chunks_read": self.chunks_read, "streams_read": self.streams_read,
                "stream_rereads": self.rereads, "streams_cut": len(self.cut)}
