"""A parted directory on one simulated machine: parts held by several processes, mail between them.

    python -m fusee.sim.parted --seeds 0..200 [--verbose]

A seed picks the part count (2 to 4), the holder processes (2 or 3), a
workload and a fault plan. Each part is an engine directory of its own
(``/parted/part-NNN``) on one :class:`~fusee.storage.simdisk.SimDisk`, held by
exactly one live process under its own ``flock`` and epoch, as
:mod:`fusee.scale.parts` holds it: part ``p`` goes to the ``p % live``-th live
process. Every process has its own virtual-time loop; the world runs them in
lock step. A run's message for a run on another part goes through
:class:`SimMail`: stamped with the sender's part and epoch and put on a
network that drops, delays (0.1 to 20 ms), duplicates and so reorders it,
applied on the target part's current holder by the real routed call
(:func:`fusee.scale.server.dispatch` ``"relay"``), its answer sent back the
same way, sent again until acknowledged.

Faults: a process dies (its loop never runs again, the kernel releases its
locks, what it wrote stays in the page cache, what it appended and had not
written yet is gone) and the survivors take its parts over under larger
epochs; a process joins and the holders hand it parts gracefully (close,
release, the newcomer takes the lock); the machine loses power (every process
dies, unsynced writes may go, all parts restart). Each fault waits a little
for its riskiest moment: a crash for the victim's mail on the wire (delivered
once its part has a newer holder) or for a write in flight, a power loss for
a write in flight.

Workload: sinks that wait for an exact number of signals; parents started by
a client on another machine (sent again when their answer was lost), whose
children live on other parts and signal a sink on yet another part; pulses (a
parent's detached children) that signal a sink and continue as new, one value
per run; naps, children a parent stops waiting for, to be cancelled by their
close policy across parts. Checkers:

- one holder per part and epoch: nobody gets a part's lock while its holder
  holds it, and each part's epochs strictly grow;
- every message delivered exactly once: every child's result reaches its
  parent once, every sink gets every value once (none twice, none missing), a
  nap's parent's close policy reaches it (sabotage ``relay_drops_dedup_key``
  breaks it);
- no mail from a fenced holder applied: a relay is applied only while its
  sender's epoch is its part's epoch on disk (sabotage ``relay_ignores_fence``);
- nothing acknowledged lost: every start the client had acknowledged, and
  every message a part acknowledged to its sender (a child it started, a
  signal, a child's result), is there after every takeover and power loss, and
  every run completes with its result (sabotage ``mail_acked_before_durable``:
  a holder that dies mid-write loses what it acknowledged, and its sender, on
  a live holder, never sends it again).

Two engine bugs this world found are listed in tests/sim/test_parted.py
(``KNOWN_ENGINE_BUGS``) until they are fixed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import random
import sys
from typing import Any

import msgspec

import fusee
from fusee import codec
from fusee.core import records as rec
from fusee.errors import (
    AlreadyExists,
    DirectoryLocked,
    EngineClosed,
    FencedSender,
    FuseeError,
    NotFound,
    StorageError,
)
from fusee.runtime.runtime import MAIL_TYPES, mail_target
from fusee.scale.parts import part_of
from fusee.scale.server import dispatch
from fusee.sim.env import SimEnv
from fusee.sim.loop import SimLoop
from fusee.sim.scaleout import ScaleFailure, open_options, seeds_main, trace_hash
from fusee.storage.directory import bump_epoch, read_epoch
from fusee.storage.partsfile import part_path
from fusee.storage.simdisk import SimDisk

ROOT = "/parted"
#: The sabotage switches this simulator (not the single-process world) must catch.
SWITCHES = ("relay_ignores_fence", "mail_acked_before_durable", "relay_drops_dedup_key")
#: The longest the world lets virtual time pass without looking at its processes.
_STEP_S = 0.05
#: How long the world waits, once the faults are over, for every run to complete.
_SETTLE_S = 30.0
#: How long a sender waits for a relay's answer before it sends the message again.
_ANSWER_WAIT_S = 0.1
#: A crash waits this long at most for its victim's mail on the wire, a power loss for a flush in
#: flight (each lands at its riskiest moment then).
_FAULT_WAIT_S = 0.3
_MAX_HOLDERS = 4

got = fusee.signal("sim-parted-got", int)


@fusee.workflow("sim-parted-sink")
async def sink(ctx: fusee.Ctx, n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        v = await ctx.wait_for(got)
        assert v is not None
        out.append(v)
    return out


@fusee.workflow("sim-parted-child")
async def child(ctx: fusee.Ctx, job: list[Any]) -> int:
    v, to = job
    doubled: int = await ctx.step("double", lambda: v * 2)
    await ctx.signal_workflow(to, got, v)
    return doubled


@fusee.workflow("sim-parted-pulse")
async def pulse(ctx: fusee.Ctx, job: list[Any]) -> int:
    to, values, i = job
    await ctx.signal_workflow(to, got, values[i])
    if i + 1 < len(values):
        # The signal's Send record goes with this run: it must be durable at the sink first.
        await ctx.continue_as_new([to, values, i + 1])
    return len(values)


@fusee.workflow("sim-parted-nap")
async def nap(ctx: fusee.Ctx) -> None:
    await ctx.sleep("nap", 3600)


@fusee.workflow("sim-parted-parent")
async def parent(ctx: fusee.Ctx, job: dict[str, Any]) -> int:
    for pid, to, values in job["pulses"]:
        await ctx.start_child(pulse, pid, [to, values, 0])
    results = await asyncio.gather(*(ctx.child(child, cid, [v, to]) for cid, v, to in job["kids"]))
    if job["nap"]:
        try:
            await ctx.child(nap, job["nap"], None, close_policy="request_cancel", timeout=job["wait"])
        except fusee.WorkflowTimedOut:
            pass
    return sum(results)


WORKFLOWS = [sink, child, pulse, nap, parent]


class PartedFailure(ScaleFailure):
    """A broken promise of a parted directory, with the seed's trace and the replay command."""

    module = "fusee.sim.parted"


@dataclasses.dataclass
class _Holder:
    """One process: its own loop, its member slot (the order parts fall to processes)."""

    name: str
    slot: int
    loop: SimLoop
    dead: bool = False
    #: Handing a part over now (one at a time, as parts.py does).
    moving: bool = False


@dataclasses.dataclass(eq=False)
class _Hold:
    """One part held by one process under one epoch: opening, open, closing, closed or dead."""

    part: int
    holder: _Holder
    epoch: int
    lock: Any
    env: SimEnv | None = None
    state: str = "opening"
    task: asyncio.Task[Any] | None = None
    engine: Any = None
    #: Whether it took the part from a dead holder (a takeover) rather than from a graceful close.
    takeover: bool = False


@dataclasses.dataclass(eq=False)
class _Msg:
    """One message a part's runtime sent, as its sender keeps it until it is answered."""

    id: int
    kind: str
    data: bytes
    part: int
    epoch: int
    target: int
    #: The workflow it is for (on part ``target``).
    wid: str
    sender: _Hold
    future: asyncio.Future[str] | None = None
    tries: int = 0


@dataclasses.dataclass
class _Start:
    """A start the client sends (again, until it has the answer)."""

    wid: str
    workflow: Any
    input: Any
    part: int
    #: Seconds after the sinks were acknowledged (sinks: 0, and first).
    at: float
    tries: int = 0
    acked_epoch: int | None = None
    via: _Hold | None = None


@dataclasses.dataclass
class _Want:
    """A run whose end the world waits for, and what it must have returned."""

    wid: str
    part: int
    expected: Any
    #: A sink: it returns the values it got, each expected once, in any order.
    sink: bool
    value: Any = None
    done: bool = False
    asking: _Hold | None = None

    def problem(self) -> str | None:
        if self.sink:
            return _sink_problem(self.value, self.expected)
        return None if self.value == self.expected else f"returned {self.value!r}, not {self.expected!r}"


@dataclasses.dataclass
class PartedResult:
    seed: int
    parts: int
    holders: int
    takeovers: int
    handovers: int
    power_losses: int
    sent: int
    applied: int
    dropped: int
    duplicated: int
    fenced: int
    resent: int
    trace: list[str]

    @property
    def trace_hash(self) -> str:
        return trace_hash(self.trace)


class SimMail:
    """The ``Mail`` of one part's runtime (see :class:`fusee.runtime.runtime.Mail`): the world's
    network instead of :class:`fusee.scale.parts.PartMail`'s relay through the holder's socket."""

    def __init__(self, world: PartedWorld, hold: _Hold) -> None:
        self.world, self.hold = world, hold

    def elsewhere(self, workflow_id: str) -> bool:
        return part_of(workflow_id, self.world.parts) != self.hold.part

    async def send(self, kind: str, args: tuple[Any, ...]) -> bool:
        return await self.world.send(self.hold, kind, args)

    def fenced(self, part: int, epoch: int) -> bool:
        return read_epoch(self.world.disk, part_path(ROOT, part)) > epoch


class PartedWorld:
    def __init__(self, seed: int, verbose: bool = False) -> None:
        self.seed, self.verbose = seed, verbose
        self.rng = random.Random(f"parted-{seed}")
        self.net_rng = random.Random(f"parted-net-{seed}")
        self.disk = SimDisk(random.Random(f"parted-disk-{seed}"))
        self.parts = self.rng.randint(2, 4)
        self.first_holders = self.rng.randint(2, 3)
        self.drop = self.rng.choice([0.0, 0.05, 0.15])
        self.dup = self.rng.choice([0.0, 0.05, 0.15])
        #: Each part's disk is fast or slow: a slow sink part keeps what it applied undurable longer.
        self.io_max = [self.rng.choice([0.001, 0.004, 0.02]) for _ in range(self.parts)]
        self.load_s = self.rng.uniform(0.5, 2.0)
        self.now = 0.0
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.holders: list[_Holder] = []
        self._names = itertools.count()
        self.current: list[_Hold | None] = [None] * self.parts
        self.holds: list[_Hold] = []
        self.last_epoch = [0] * self.parts
        #: Parts whose holder died: their next holder takes them over (rather than being handed them).
        self._lost = [False] * self.parts
        # The network: (due, order, event), events the world applies between its steps.
        self._net: list[tuple[float, int, tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._msg_ids = itertools.count(1)
        self.takeovers = self.handovers = self.power_losses = 0
        self.sent = self.applied = self.dropped = self.duplicated = self.fenced = self.resent = 0
        #: When every sink's start was acknowledged: the rest of the load starts from then.
        self.load_at: float | None = None
        self.starts: list[_Start] = []
        #: The messages their senders heard were applied (durably, the receiver promised), by kind
        #: and target.
        self.acknowledged: dict[tuple[str, str], list[_Msg]] = {}
        self.wants: list[_Want] = []
        self._plan_workload()
        kinds = ["crash", "crash", "crash mid-write", "crash mid-write", "join", "join", "power", "power"]
        self.faults = sorted((self.rng.uniform(0.02, self.load_s), self.rng.choice(kinds))
                             for _ in range(self.rng.randint(1, 3)))
        #: Since when the first fault waits for its moment (a crash for mail on the wire, a power
        #: loss for a flush in flight).
        self._waits_since: float | None = None

    # --- the workload -----------------------------------------------------------------

    def _placed(self, stem: str, avoid: list[int]) -> str:
        """An ID starting with ``stem`` that lives on none of the parts ``avoid`` names (on none but
        the first when they are all of them: two parts cannot keep a parent, its child and the
        child's sink apart)."""
        if len(set(avoid)) >= self.parts:
            avoid = avoid[:1]
        for j in itertools.count():
            wid = stem if j == 0 else f"{stem}.{j}"
            if part_of(wid, self.parts) not in avoid:
                return wid
        raise AssertionError("unreachable")

    def _plan_workload(self) -> None:
        rng = self.rng
        sinks = [f"sink{i}" for i in range(rng.randint(1, 3))]
        expected: dict[str, list[int]] = {s: [] for s in sinks}
        values = itertools.count(1)
        parents: list[tuple[str, dict[str, Any]]] = []
        for k in range(rng.randint(3, 10)):
            pid = f"parent{k}"
            home = part_of(pid, self.parts)
            kids: list[list[Any]] = []
            for i in range(rng.randint(1, 3)):
                to = rng.choice(sinks)
                cid = self._placed(f"{pid}-kid{i}", [home, part_of(to, self.parts)])
                v = next(values)
                kids.append([cid, v, to])
                expected[to].append(v)
                self._want(cid, 2 * v)
            pulses: list[list[Any]] = []
            if rng.random() < 0.7:
                to = rng.choice(sinks)
                qid = self._placed(f"{pid}-pulse", [home, part_of(to, self.parts)])
                vs = [next(values) for _ in range(rng.randint(2, 5))]
                pulses.append([qid, to, vs])
                expected[to].extend(vs)
                self._want(qid, len(vs))
            napper = self._placed(f"{pid}-nap", [home]) if rng.random() < 0.35 else ""
            job = {"kids": kids, "pulses": pulses, "nap": napper, "wait": rng.choice([0.01, 0.05, 0.3])}
            self._want(pid, sum(2 * int(v) for _, v, _ in kids))
            parents.append((pid, job))
            self.starts.append(_Start(pid, parent, job, part_of(pid, self.parts),
                                      rng.uniform(0.0, 0.8 * self.load_s)))
        self.naps = [job["nap"] for _, job in parents if job["nap"]]
        self.kids_of = {pid: [cid for cid, _, _ in job["kids"]] for pid, job in parents}
        for s in sinks:
            want = sorted(expected[s])
            self._want(s, want, sink=True)
            self.starts.insert(0, _Start(s, sink, len(want), part_of(s, self.parts), 0.0))
        self.expected = expected

    def _want(self, wid: str, expected: Any, *, sink: bool = False) -> None:
        self.wants.append(_Want(wid, part_of(wid, self.parts), expected, sink))

    # --- the trace --------------------------------------------------------------------

    def log(self, text: str) -> None:
        line = f"{self.now:9.4f} {text}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    def fail(self, message: str) -> PartedFailure:
        return PartedFailure(self.seed, message, self.trace)

    # --- processes and parts ------------------------------------------------------------

    def _live(self) -> list[_Holder]:
        return sorted((h for h in self.holders if not h.dead), key=lambda h: h.slot)

    def _join(self) -> _Holder:
        taken = {h.slot for h in self._live()}
        slot = next(s for s in itertools.count() if s not in taken)  # the lowest free member slot
        h = _Holder(f"h{next(self._names)}", slot, SimLoop(start=self.now))
        self.holders.append(h)
        self.log(f"{h.name} joins (slot {slot})")
        return h

    def _acquire(self, part: int, holder: _Holder, takeover: bool) -> None:
        """``holder`` takes part ``part``'s lock and the next epoch, and opens (recovers) it."""
        path = part_path(ROOT, part)
        try:
            lock = self.disk.lock(path)
        except DirectoryLocked:
            raise self.fail(f"one holder per part: {holder.name} cannot lock part {part}, which no live "
                            "holder holds (a closed or dead holder kept its lock)") from None
        try:
            self.disk.lock(path)
        except DirectoryLocked:
            pass
        else:
            raise self.fail(f"one holder per part: part {part} could be locked twice")
        for h in self.holds:
            if h.part == part and not h.holder.dead and h.state in ("opening", "open", "closing"):
                raise self.fail(f"one holder per part: {holder.name} takes part {part} while {h.holder.name} "
                                f"still has it {h.state} (epoch {h.epoch})")
        epoch = bump_epoch(self.disk, path)
        if epoch <= self.last_epoch[part]:
            raise self.fail(f"epochs grow: {holder.name} took part {part} under epoch {epoch}, not above "
                            f"the last holder's {self.last_epoch[part]}")
        self.last_epoch[part] = epoch
        hold = _Hold(part, holder, epoch, lock, takeover=takeover)
        io = random.Random(self.rng.getrandbits(64))
        hold.env = SimEnv(self.disk, random.Random(self.rng.getrandbits(64)), holder.loop,
                          lambda: io.uniform(0.0001, self.io_max[part]))
        options = {**open_options(), "workflows": WORKFLOWS, "env": hold.env, "_lock": lock, "_epoch": epoch,
                   "park_after": None, "segment_bytes": 1 << 20, "_mail": SimMail(self, hold)}
        hold.task = holder.loop.create_task(fusee.Engine._open(path, **options))
        self.holds.append(hold)
        self.current[part] = hold
        self.takeovers += takeover
        self.log(f"{holder.name} takes part {part} under epoch {epoch}"
                 f"{' (takeover)' if takeover else ''} and recovers it")

    def _rebalance(self) -> None:
        """Part ``p`` goes to the ``p % live``-th live holder: unheld parts are taken, held ones
        that fall to another live holder are handed over, one at a time per holder."""
        live = self._live()
        for p in range(self.parts):
            want = live[p % len(live)]
            hold = self.current[p]
            if hold is None:
                self._acquire(p, want, takeover=self._lost[p])
                self._lost[p] = False
            elif hold.state == "open" and hold.holder is not want and not hold.holder.moving:
                hold.holder.moving = True
                hold.state = "closing"
                assert hold.engine is not None
                hold.task = hold.holder.loop.create_task(hold.engine.close())
                self.handovers += 1
                self.log(f"{hold.holder.name} hands part {p} over to {want.name}: closing it (epoch {hold.epoch})")

    def _poll(self) -> None:
        """Opens and closes that finished since the last step."""
        for hold in list(self.current):
            if hold is None or hold.holder.dead or hold.task is None or not hold.task.done():
                continue
            task, hold.task = hold.task, None
            if task.cancelled():
                raise self.fail(f"{hold.holder.name}'s {hold.state} of part {hold.part} was cancelled")
            err = task.exception()
            if err is not None:
                raise self.fail(f"{hold.holder.name} could not {'open' if hold.state == 'opening' else 'close'} "
                                f"part {hold.part}: {type(err).__name__}: {err}")
            if hold.state == "opening":
                hold.engine = task.result()
                hold.state = "open"
                self.log(f"{hold.holder.name} serves part {hold.part} (epoch {hold.epoch})")
                self._check_acknowledged(hold)
                self._check_acknowledged_mail(hold, "after recovering it")
            else:
                hold.state = "closed"
                hold.holder.moving = False
                self.current[hold.part] = None
                if self.disk.held(part_path(ROOT, hold.part)):
                    raise self.fail(f"one holder per part: {hold.holder.name} closed part {hold.part} "
                                    "and still holds its lock")
                self.log(f"{hold.holder.name} closed part {hold.part} and released it")
            self._rebalance()

    def _check_acknowledged(self, hold: _Hold) -> None:
        for s in self.starts:
            if s.acked_epoch is None or s.part != hold.part:
                continue
            try:
                hold.engine.describe(s.wid)
            except NotFound:
                raise self.fail(f"nothing acknowledged lost: the start of {s.wid} was acknowledged (part "
                                f"{s.part}, epoch {s.acked_epoch}) and {hold.holder.name} does not find it "
                                f"after recovering the part (epoch {hold.epoch})") from None

    def _die(self, h: _Holder) -> None:
        """A process crash: its loop never runs again, the kernel releases its locks, the page
        cache (and so its unsynced writes) stays."""
        h.dead = True
        for p, hold in enumerate(self.current):
            if hold is None or hold.holder is not h:
                continue
            path = part_path(ROOT, p)
            if self.disk.held(path):  # its close may have released it already
                self.disk.unlock(hold.lock)
            hold.state = "dead"
            self.current[p] = None
            self._lost[p] = True
        for s in self.starts:
            if s.via is not None and s.via.holder is h:
                s.via = None

    def _sending(self) -> _Holder | None:
        """A live holder that has a message on the wire now (the first one due), if any."""
        for _due, _order, event in sorted(self._net):
            if event[0] == "deliver" and not event[1].sender.holder.dead:
                holder: _Holder = event[1].sender.holder
                return holder
        return None

    def _writing(self) -> _Holder | None:
        """A live holder with a storage call in flight now (the first in slot order), if any."""
        for h in self._live():
            if any(c is not None and c.holder is h and c.env is not None and c.env.io_in_flight
                   for c in self.current):
                return h
        return None

    def _crash(self, victim: _Holder | None) -> None:
        live = self._live()
        victims = [h for h in live if any(c is not None and c.holder is h for c in self.current)] or live
        h = victim if victim is not None else self.rng.choice(victims)
        held = [c.part for c in self.current if c is not None and c.holder is h]
        self.log(f"{h.name} dies (process crash{', mid-write' if h is victim and victim is self._writing() else ''}), "
                 f"holding parts {held}")
        self._die(h)
        if not self._live():
            self._join()  # its supervisor starts it again
        self._rebalance()

    def _power_loss(self) -> None:
        busy = sum(c.env.io_in_flight for c in self.current if c is not None and c.env is not None)
        self.log(f"power loss ({busy} storage calls in flight): every holder dies")
        self.power_losses += 1
        for h in self._live():
            self._die(h)
        self.disk.crash()
        self._net.clear()  # messages between processes of the machine die with them
        for _ in range(self.first_holders):
            self._join()
        self._rebalance()

    # --- mail -----------------------------------------------------------------------------

    async def send(self, hold: _Hold, kind: str, args: tuple[Any, ...]) -> bool:
        """:meth:`SimMail.send`: on the network until the target part's holder answers, as
        :meth:`fusee.scale.parts.PartMail.send` relays it; stops once this part's engine closes
        (its tasks are cancelled) or is refused as fenced."""
        loop = asyncio.get_running_loop()
        wid = mail_target(kind, args)
        msg = _Msg(next(self._msg_ids), kind, msgspec.msgpack.encode(args), hold.part, hold.epoch,
                   part_of(wid, self.parts), wid, hold)
        self.sent += 1
        self.log(f"m{msg.id} ({kind} p{msg.part}/e{msg.epoch}->{wid}) sent by {hold.holder.name}")
        delay = 0.005
        while hold.state in ("opening", "open", "closing"):
            msg.future = loop.create_future()
            msg.tries += 1
            self._post(msg)
            await asyncio.wait({msg.future}, timeout=_ANSWER_WAIT_S)
            answer = msg.future.result() if msg.future.done() else None
            if answer == "ok":
                self.acknowledged.setdefault((kind, msg.wid), []).append(msg)
            if answer in ("ok", "fenced"):
                return answer == "ok"
            await asyncio.sleep(delay)  # no answer, or the target part is changing hands
            delay = min(delay * 2, 0.5)
        return False

    def _delay(self) -> float:
        r = self.net_rng
        return r.uniform(0.0001, 0.002) if r.random() < 0.7 else r.uniform(0.002, 0.02)

    def _at(self, due: float, event: tuple[Any, ...]) -> None:
        heapq.heappush(self._net, (due, next(self._order), event))

    def _post(self, msg: _Msg) -> None:
        t = msg.sender.holder.loop.time()
        if self.net_rng.random() < self.drop:
            self.dropped += 1
            self.log(f"m{msg.id} ({msg.kind} p{msg.part}->{msg.wid}, try {msg.tries}) dropped")
            return
        copies = 1
        if self.net_rng.random() < self.dup:
            copies = 2
            self.duplicated += 1
        for _ in range(copies):
            self._at(t + self._delay(), ("deliver", msg))

    def _deliver(self, msg: _Msg) -> None:
        hold = self.current[msg.target]
        if hold is None or hold.state != "open" or hold.holder.dead:
            self.log(f"m{msg.id} ({msg.kind} p{msg.part}->{msg.wid}) finds no holder serving part {msg.target}")
            return
        hold.holder.loop.create_task(self._apply(hold, msg))

    async def _apply(self, hold: _Hold, msg: _Msg) -> None:
        """The target holder's side: the real routed call, on its loop."""
        # dispatch checks the fence and applies the message before its first suspension: the
        # epoch on disk read here is the one in force when it was applied.
        on_disk = read_epoch(self.disk, part_path(ROOT, msg.part))
        try:
            await dispatch(hold.engine, "relay", [msg.kind, msg.data, msg.part, msg.epoch])
        except FencedSender:
            self.fenced += 1
            answer = "fenced"
        except (EngineClosed, StorageError) as e:
            answer = type(e).__name__
        except Exception as e:
            self.violations.append(f"the relay of m{msg.id} ({msg.kind}) to part {msg.target} failed: "
                                   f"{type(e).__name__}: {e}")
            return
        else:
            answer = "ok"
            self.applied += 1
            if msg.epoch < on_disk:
                self.violations.append(
                    f"no mail from a fenced holder applied: m{msg.id} ({msg.kind}) from part {msg.part} "
                    f"under epoch {msg.epoch} was applied on part {msg.target} while part {msg.part} "
                    f"had epoch {on_disk} (a newer holder)")
        self.log(f"m{msg.id} ({msg.kind} p{msg.part}/e{msg.epoch}->{msg.wid}) on {hold.holder.name}: {answer}")
        if self.net_rng.random() < self.drop:
            self.dropped += 1
            self.log(f"m{msg.id}'s answer dropped")
            return
        self._at(hold.holder.loop.time() + self._delay(), ("answer", msg, answer))

    def _answer(self, msg: _Msg, answer: str) -> None:
        fut = msg.future
        if msg.sender.holder.dead or fut is None or fut.done():
            return  # the sender died, or has this answer already
        fut.set_result(answer)

    # --- the client -------------------------------------------------------------------------

    def _route(self) -> None:
        for s in self.starts:
            if s.acked_epoch is not None:
                continue
            if s.via is not None and (s.via.holder.dead or s.via.state != "open"):
                s.via = None  # its holder died or is handing the part over: the answer may never come
            if s.via is not None:
                continue
            if s.workflow is not sink and (self.load_at is None or self.now < self.load_at + s.at):
                continue
            hold = self.current[s.part]
            if hold is None or hold.state != "open":
                continue
            s.via = hold
            s.tries += 1
            self.resent += s.tries > 1
            hold.holder.loop.create_task(self._start(hold, s))

    async def _start(self, hold: _Hold, s: _Start) -> None:
        """The client's start: to the part's holder after a delay, the answer back after another."""
        again = s.tries > 1
        args = [[s.workflow.name, s.workflow.version], s.wid, codec.encode(s.input), "fail", "fail", None, again]
        try:
            await asyncio.sleep(self.rng.uniform(0.0, 0.01))
            await dispatch(hold.engine, "start", args)
            await asyncio.sleep(self.rng.uniform(0.0, 0.01))
        except AlreadyExists as e:
            self.violations.append(f"the start of {s.wid}, sent {'again' if again else 'first'}, was refused: {e}")
            return
        except FuseeError as e:
            self.log(f"start of {s.wid} through {hold.holder.name} failed ({type(e).__name__}): sent again later")
            return
        finally:
            if s.via is hold:
                s.via = None
        if s.acked_epoch is None:
            s.acked_epoch = hold.epoch
            self.log(f"{s.wid} acknowledged by {hold.holder.name} (part {s.part}, epoch {hold.epoch})")
            if self.load_at is None and all(x.acked_epoch is not None for x in self.starts if x.workflow is sink):
                self.load_at = self.now
                self.log("every sink is started: the parents start")

    # --- the results ------------------------------------------------------------------------

    def _ask(self) -> None:
        for w in self.wants:
            if w.done or w.asking is not None:
                continue
            hold = self.current[w.part]
            if hold is None or hold.state != "open":
                continue
            try:
                status = hold.engine.describe(w.wid).status
            except NotFound:
                continue  # its start is still on its way
            if status in ("running", "retrying"):
                continue
            if status != "ok":
                raise self.fail(f"{w.wid} ended {status}")
            w.asking = hold
            hold.holder.loop.create_task(self._fetch(hold, w))

    async def _fetch(self, hold: _Hold, w: _Want) -> None:
        try:
            _wtype, _version, data = await dispatch(hold.engine, "result", [w.wid])
        except EngineClosed:
            return
        finally:
            w.asking = None
        w.value, w.done = codec.decode(data), True

    def _final_checks(self) -> None:
        for w in self.wants:
            problem = w.problem()
            if problem is not None:
                raise self.fail(f"{w.wid} {problem}")
        for pid, kids in self.kids_of.items():
            self._check_parent(pid, kids)
        for wid in self.naps:
            status = self._nap_status(wid)
            if status not in ("cancelled", "never started"):
                raise self.fail(f"every message delivered: nap {wid} is {status} after its parent ended (its "
                                "close policy, request_cancel, did not reach it across parts)")

    def _all_served(self) -> bool:
        return all(c is not None and c.state == "open" for c in self.current)

    def _nap_status(self, wid: str) -> str:
        # A nap its parent stopped waiting for before its start arrived may never start: its
        # start is owed no more once the timeout is journaled (then its cancel is what is sent).
        hold = self.current[part_of(wid, self.parts)]
        if hold is None or hold.state != "open":
            return "running"  # not known until its part is served again
        try:
            return str(hold.engine.describe(wid).status)
        except NotFound:
            return "never started"

    def _engine_of(self, wid: str) -> Any:
        hold = self.current[part_of(wid, self.parts)]
        assert hold is not None and hold.state == "open"
        return hold.engine

    def _check_parent(self, pid: str, kids: list[str]) -> None:
        engine = self._engine_of(pid)
        rt = engine._rt
        st = rt.current(pid)
        journal = rt.journal_of(st)[0]
        seqs = {r.seq: r.id for r in journal if type(r) is rec.Child}
        done: dict[int, int] = {}
        for r in journal:
            if type(r) is rec.ChildDone:
                done[r.seq] = done.get(r.seq, 0) + 1
        for seq, cid in seqs.items():
            if cid in kids and done.get(seq) != 1:
                raise self.fail(f"every message delivered once: child {cid}'s result reached {pid} "
                                f"{done.get(seq, 0)} times")
            if cid not in kids:
                continue
            cst = self._engine_of(cid)._rt.current(cid)
            start = self._engine_of(cid)._rt.journal_of(cst)[0][0]
            if not isinstance(start, rec.Start) or start.parent is None or start.parent.id != pid \
                    or start.parent.run != st.run_id:
                raise self.fail(f"every message delivered once: child {cid} is not the run {pid} started "
                                f"(its start: {start!r})")

    def _check_results_arrived(self) -> None:
        """A parent still waiting for a child that ended long ago: the child's result was lost."""
        for pid, kids in self.kids_of.items():
            hold = self.current[part_of(pid, self.parts)]
            if hold is None or hold.state != "open" or pid not in hold.engine._rt.wf:
                continue
            rt = hold.engine._rt
            journal = rt.journal_of(rt.current(pid))[0]
            ended = {r.seq for r in journal if type(r) is rec.ChildDone}
            for r in journal:
                if type(r) is not rec.Child or r.seq in ended or r.id not in kids:
                    continue
                ch = self.current[part_of(r.id, self.parts)]
                if ch is None or ch.state != "open" or r.id not in ch.engine._rt.wf:
                    continue
                status = ch.engine.describe(r.id).status
                if status not in ("running", "retrying"):
                    raise self.fail(f"every message delivered: child {r.id} ended {status} and its result "
                                    f"never reached its parent {pid} (on part {hold.part}), which still waits")

    def _check_acknowledged_mail(self, hold: _Hold, when: str) -> None:
        """Every message a holder of ``hold``'s part acknowledged (so made durable) is still applied
        there: a child it started exists, a signal is in its running sink's journal, a child's
        result in its running parent's."""
        rt = hold.engine._rt
        for (kind, wid), msgs in self.acknowledged.items():
            if part_of(wid, self.parts) != hold.part:
                continue
            where = f"part {hold.part} ({hold.holder.name}, epoch {hold.epoch}) {when}"
            if kind == "_start_child" and wid not in rt.wf:
                raise self.fail(f"nothing acknowledged lost: the start of child {wid} was acknowledged to its "
                                f"parent (m{msgs[0].id}, from part {msgs[0].part}) and {where} does not have it")
            if wid not in rt.wf or rt.current(wid).status is not None:
                continue  # ended: its result is checked at the end
            st = rt.current(wid)
            journal = rt.journal_of(st)[0]
            for m in msgs:
                args = msgspec.msgpack.decode(m.data, type=MAIL_TYPES[kind])
                if kind == "_signal_quiet":
                    value = codec.decode(args[2])
                    if value not in {codec.decode(r.payload) for r in journal if type(r) is rec.Signal}:
                        raise self.fail(f"nothing acknowledged lost: signal {value} for {wid} was acknowledged "
                                        f"to its sender (m{m.id}, from part {m.part}) and {wid} on {where} "
                                        "does not have it")
                elif kind == "_child_finished" and args[0].run == st.run_id and args[1] is not None and not any(
                        type(r) is rec.ChildDone and r.seq == args[0].seq for r in journal):
                    raise self.fail(f"nothing acknowledged lost: the result of {wid}'s child number {args[0].seq} "
                                    f"(m{m.id}, from part {m.part}) was acknowledged and {wid} on {where} "
                                    "does not have it")

    def _waiting(self) -> str:
        """What the world still waits for, for a failure's message."""
        for w in self.wants:
            if w.done:
                continue
            hold = self.current[w.part]
            if hold is None or hold.state != "open":
                return f"part {w.part} of {w.wid} has no holder serving it"
            try:
                status = hold.engine.describe(w.wid).status
            except NotFound:
                return f"{w.wid} was never started"
            if w.wid in self.expected:
                st = hold.engine._rt.current(w.wid)
                values = [codec.decode(r.payload) for r in hold.engine._rt.journal_of(st)[0]
                          if type(r) is rec.Signal]
                missing = sorted(set(self.expected[w.wid]) - set(values))
                return (f"sink {w.wid} is {status}: it has {len(values)} of {len(self.expected[w.wid])} "
                        f"values, missing {missing}")
            if w.wid in self.kids_of:
                st = hold.engine._rt.current(w.wid)
                journal = hold.engine._rt.journal_of(st)[0]
                ended = {r.seq for r in journal if type(r) is rec.ChildDone}
                owed = [r.id for r in journal if type(r) is rec.Child and r.seq not in ended
                        and not r.flags & rec.DETACHED]
                states = []
                for cid in owed:
                    ch = self.current[part_of(cid, self.parts)]
                    try:
                        states.append(f"{cid} {ch.engine.describe(cid).status}" if ch is not None
                                      and ch.state == "open" else f"{cid} (part not served)")
                    except NotFound:
                        states.append(f"{cid} never started")
                return f"{w.wid} is {status}, waiting for children: {', '.join(states)}"
            return f"{w.wid} is {status}"
        return "nothing"

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> PartedResult:
        try:
            return self._run()
        except PartedFailure:
            raise
        except Exception as e:
            raise self.fail(f"{type(e).__name__}: {e}") from e
        finally:
            self._bury()

    def _bury(self) -> None:
        """Disposes of every process's coroutines and lets go of its engines' tables (an
        engine not closed keeps its runs, loop and world alive)."""
        for h in self.holders:
            h.loop.bury()
        for hold in self.holds:
            if hold.engine is not None:
                hold.engine._rt.release_table()

    def _step(self) -> None:
        """Every live process's loop runs up to the next thing due anywhere (a timer, a message,
        a fault, a start); then the network's due events apply."""
        if self.violations:
            raise self.fail(self.violations[0])
        live = self._live()
        due = [self.now + _STEP_S]
        for h in live:
            if h.loop.has_ready():
                due.append(self.now)
            else:
                d = h.loop.next_deadline()
                if d is not None:
                    due.append(d)
        if self._net:
            due.append(self._net[0][0])
        if self.load_at is not None:
            due.extend(at for s in self.starts if s.acked_epoch is None and (at := self.load_at + s.at) > self.now)
        if self.faults and self.load_at is not None:
            at = self.load_at + self.faults[0][0]
            # A fault waiting for its moment (see _faults) looks again every 0.5 ms.
            due.append(at if at > self.now else self.now + 0.0005)
        self.now = max(self.now, min(due))
        for h in live:
            h.loop.run_until(self.now)
            if h.loop.errors:
                ctx = h.loop.errors[0]
                raise self.fail(f"{h.name}: {ctx.get('message')}: {ctx.get('exception')!r}")
        while self._net and self._net[0][0] <= self.now:
            _due, _order, event = heapq.heappop(self._net)
            if event[0] == "deliver":
                self._deliver(event[1])
            else:
                self._answer(event[1], event[2])
        if self.violations:
            raise self.fail(self.violations[0])
        self._poll()
        self._route()

    def _faults(self) -> None:
        if not self.faults or self.load_at is None or self.now < self.load_at + self.faults[0][0]:
            return
        kind = self.faults[0][1]
        victim: _Holder | None = None
        if kind != "join":
            # A fault lands at its riskiest moment when it can: a process dies with its mail on
            # the wire (delivered after its part has a newer holder) or while it writes (what it
            # appended since its last flush is lost), the power goes mid-write.
            if self._waits_since is None:
                self._waits_since = self.now
            victim = self._sending() if kind == "crash" else self._writing()
            if victim is None and self.now - self._waits_since < _FAULT_WAIT_S:
                return
            self._waits_since = None
        self.faults.pop(0)
        if kind.startswith("crash"):
            self._crash(victim)
        elif kind == "join":
            if len(self._live()) >= _MAX_HOLDERS:
                self.log(f"no process joins: {_MAX_HOLDERS} hold the parts already")
                return
            self._join()
            self._rebalance()
        else:
            self._power_loss()

    def _run(self) -> PartedResult:
        for p in range(self.parts):
            self.disk.makedirs(part_path(ROOT, p))
        self.disk.fsync_dir(ROOT)
        self.disk.fsync_dir("/")
        self.log(f"{self.parts} parts, {self.first_holders} holders, {len(self.starts)} client starts, "
                 f"drop {self.drop}, duplicate {self.dup}, io up to {[t * 1000 for t in self.io_max]} ms, "
                 f"faults {[(round(t, 3), k) for t, k in self.faults]}")
        for _ in range(self.first_holders):
            self._join()
        self._rebalance()
        deadline: float | None = None
        same_instant = 0
        while True:
            before = self.now
            self._step()
            same_instant = same_instant + 1 if self.now == before else 0
            if same_instant > 100_000:
                raise self.fail(f"the world makes no progress at {self.now:.4f}: something spins")
            self._faults()
            if self.faults or self.load_at is None:
                if self.now > 10 * _SETTLE_S:
                    raise self.fail(f"the load never began: {self._waiting()}")
                continue
            if deadline is None:
                deadline = self.now + _SETTLE_S
                self.log("the faults are over: every run must complete")
            if all(s.acked_epoch is not None for s in self.starts):
                self._ask()
                if all(w.done for w in self.wants):
                    break
            if self.now > deadline:
                for hold in self.current:
                    if hold is not None and hold.state == "open":
                        self._check_acknowledged_mail(hold, "now")
                self._check_results_arrived()
                unacked = [s.wid for s in self.starts if s.acked_epoch is None]
                raise self.fail(f"runs did not complete within {_SETTLE_S:.0f} s after the faults ended "
                                f"(starts never acknowledged: {unacked}; waiting for: {self._waiting()})")
        # A part may still change hands, and a nap's cancel may still be on its way.
        settle = self.now + 5.0
        while self.now < settle and (not self._all_served() or any(
                self._nap_status(n) == "running" for n in self.naps)):
            self._step()
        if not self._all_served():
            raise self.fail(f"parts {[p for p, c in enumerate(self.current) if c is None or c.state != 'open']} "
                            "have no holder serving them 5 s after the faults ended")
        self._final_checks()
        self.log(f"all {len(self.wants)} runs completed: {self.sent} messages sent, {self.applied} applied, "
                 f"{self.fenced} refused as fenced, {self.takeovers} takeovers, {self.handovers} handovers")
        return PartedResult(self.seed, self.parts, len(self.holders), self.takeovers, self.handovers,
                            self.power_losses, self.sent, self.applied, self.dropped, self.duplicated,
                            self.fenced, self.resent, self.trace)


def _sink_problem(got: Any, want: list[int]) -> str | None:
    if not isinstance(got, list):
        return f"returned {got!r}, not a list of values"
    dups = sorted({v for v in got if got.count(v) > 1})
    if dups:
        return f"got values {dups} more than once (every message delivered once): {got}"
    if sorted(got) != want:
        return f"got {sorted(got)}, not {want} (every message delivered once)"
    return None


def run_seed(seed: int, *, verbose: bool = False) -> PartedResult:
    """Runs one seed; raises :class:`PartedFailure` naming the broken promise."""
    return PartedWorld(seed, verbose).run()


def main(argv: list[str] | None = None) -> int:
    return seeds_main(argv, __doc__, run_seed, PartedFailure,
                      lambda r: f"{r.parts} parts, {r.holders} holders, {r.takeovers} takeovers, "
                                f"{r.handovers} handovers, {r.power_losses} power losses, {r.sent} messages "
                                f"({r.dropped} dropped, {r.duplicated} duplicated, {r.fenced} fenced)")


if __name__ == "__main__":
    sys.exit(main())
