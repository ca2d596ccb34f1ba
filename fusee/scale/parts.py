"""A parted directory: one engine's workflows split into parts, each held and run by one process.

A directory created with ``Engine.open(path, parts=N)`` holds N parts. Each is
an engine directory of its own (its log, checkpoint, ``flock`` lease and
epoch), so no two processes ever write the same file. A workflow lives on the
part its ID hashes to (:func:`part_of`). Every process that opens the
directory becomes a *member* (an ``flock`` on a slot file while it is open)
and holds the parts the members' order gives it (:func:`desired_holder`):
part ``p`` goes to the ``p % members``-th live member. It runs only the
workflows and steps of the parts it holds; for every other part it is a
follower (:class:`fusee.scale.follower.Follower`) that routes calls to the
part's holder and takes the part over when the holder dies and the part
falls to it. A member that holds a part which now falls to another (one
joined) closes it gracefully, one part at a time, and the other opens it.

Layout::

    <dir>/parts          {"format": 1, "parts": N}, written once at creation
    <dir>/members/NNN    one slot per open process (its flock while open)
    <dir>/part-NNN/      one engine directory per part

Messages between runs on different parts (child starts and results, close
policies, signals from workflow code) go through :class:`PartMail`: sent
after the sender's record is durable, acknowledged once the receiver made
what it journaled durable, sent again until then, and refused when the
sender's part has a newer holder (its epoch is fenced).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Generator
from typing import Any

import msgspec

from fusee import journal_file
from fusee.backup.parted import mark_parted
from fusee.definitions import WorkflowDef
from fusee.engine.engine import Engine, RunHandle, RunSummary
from fusee.engine.visibility import Metrics, RunPage, ShardMetrics
from fusee.errors import (
    CorruptRecord,
    DirectoryLocked,
    EngineClosed,
    FencedSender,
    FuseeError,
    InvalidQuery,
    InvalidSchedule,
    LeaseHeld,
    LeaseLost,
    NotAnEngineDirectory,
    OutcomeUnknown,
    OwnerUnreachable,
    ScheduleNotFound,
    ShardCountMismatch,
    UnknownLimit,
)
from fusee.flow import schedules, windows
from fusee.flow.api import ScheduleInfo, ScheduleList
from fusee.limits import KEEP, Limit, LimitStatus
from fusee.objects import Handler, ObjectDef
from fusee.runtime.runtime import mail_target
from fusee.scale.follower import Follower
from fusee.scale.lease import DirectoryLease
from fusee.scale.owner import HELD_HERE, dir_key, open_owner
from fusee.scale.places import DirectoryPlace
from fusee.scale.server import dispatch
from fusee.storage.directory import read_epoch
from fusee.storage.partsfile import (
    MAX_PARTS,
    MEMBERS_DIR,
    create_parts,
    part_name,
    part_path,
    read_limits_file,
    read_parts,
    update_limits_file,
)
from fusee.storage.posix import PosixStorage

logger = logging.getLogger("fusee.scale")

#: The most processes open on one directory at once.
MAX_MEMBERS = 256
#: How often a member looks whether a part it holds now falls to another (a process joined).
REBALANCE_EVERY_S = 0.2
#: How often a waiting follower looks whether its part fell to it.
GATE_EVERY_S = 0.05


def part_of(workflow_id: str, parts: int) -> int:
    """The part a workflow ID lives on: a stable hash, independent of the shard hash inside a part."""
    h = hashlib.blake2b(workflow_id.encode(), digest_size=8, person=b"fusee-part").digest()
    return int.from_bytes(h, "little") % parts


#: The environment variable that gives the part count of a directory created without ``parts=``
#: (so that ``FUSEE_PARTS=4 uvicorn app:app --workers 4`` splits the work with no code change).
PARTS_ENV = "FUSEE_PARTS"


def parts_from_env() -> int | None:
    """The part count ``FUSEE_PARTS`` gives new directories, or None when it is unset or empty.
    ValueError names a value that is not a part count."""
    raw = os.environ.get(PARTS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARTS:
        raise ValueError(f"{PARTS_ENV}={raw!r} is not a part count: give an int from 1 to {MAX_PARTS} "
                         "(the parts of a directory created without parts=), or unset it")
    return n


class Membership:
    """This process's slot among the processes that have a parted directory open.

    A slot is an ``flock`` on ``<dir>/members/NNN``: the kernel drops it when the process dies,
    so the live members are the slots locked now. Reached through the members directory's
    descriptor, not by path."""

    def __init__(self, root: str) -> None:
        os.makedirs(f"{root}/{MEMBERS_DIR}", exist_ok=True)
        self._dir = os.open(f"{root}/{MEMBERS_DIR}", os.O_RDONLY | os.O_DIRECTORY)
        self._fd: int | None = None
        self._mutex = threading.Lock()
        self.slot = -1
        for slot in range(MAX_MEMBERS):
            fd = os.open(f"{slot:03d}", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=self._dir)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue
                raise
            self._fd, self.slot = fd, slot
            break
        if self._fd is None:
            os.close(self._dir)
            raise DirectoryLocked(root, None)

    def live(self) -> list[int]:
        """The slots of the processes that have the directory open now, this one among them.

        Raises ``OSError`` once released. Callers on several threads take turns: a listing
        through a descriptor shares its offset."""
        with self._mutex:
            if self._fd is None:
                raise OSError(errno.EBADF, "the membership was released")
            return self._live()

    def _live(self) -> list[int]:
        out = {self.slot}
        for name in os.listdir(self._dir):
            if not name.isdigit():
                continue
            slot = int(name)
            if slot == self.slot:
                continue
            try:
                fd = os.open(name, os.O_RDONLY, dir_fd=self._dir)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)  # free: nobody holds that slot
            except OSError:
                out.add(slot)
            finally:
                os.close(fd)
        return sorted(out)

    def release(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                os.close(self._dir)


def desired_holder(part: int, live: list[int]) -> int:
    """The member slot part ``part`` falls to among the ``live`` slots (sorted)."""
    assert live, "a member always counts itself among the live ones"
    return live[part % len(live)]


class _GatedLease:
    """A part's directory lease that a follower takes only once the part falls to its process."""

    def __init__(self, path: str, gate: Callable[[], bool]) -> None:
        self._lease = DirectoryLease(path)
        self._gate = gate

    @property
    def epoch(self) -> int:
        return self._lease.epoch

    def wait_acquire(self, stop: threading.Event) -> bool:
        while not stop.is_set():
            try:
                if self._gate() and self._lease.try_acquire():
                    return True
            except OSError as e:
                logger.warning("waiting for %s: %s", self._lease.path, e)
            stop.wait(GATE_EVERY_S)
        return False

    def handover(self) -> int:
        return self._lease.handover()

    def release(self) -> None:
        self._lease.release()


class PartPlace(DirectoryPlace):
    """A part's directory, as its followers see it: takeover waits for the part to fall to them."""

    def __init__(self, path: str, gate: Callable[[], bool]) -> None:
        super().__init__(path)
        self._gate = gate

    def new_lease(self) -> Any:
        return _GatedLease(self.target, self._gate)


class DirectoryHome:
    """Where a parted directory's parts live: ``<dir>/parts``, member slots by ``flock``, and each
    part an engine directory (``<dir>/part-NNN``). :class:`fusee.scale.pg_parts.PostgresHome`
    answers the same for a PostgreSQL namespace."""

    def __init__(self, root: str) -> None:
        self.root = self.label = root
        self.key = dir_key(root)

    def read_parts(self) -> int | None:
        return read_parts(self.root)

    def create_parts(self, parts: int) -> int:
        return create_parts(self.root, parts)

    def join(self) -> Membership:
        return Membership(self.root)

    def part_target(self, part: int) -> str:
        return part_path(self.root, part)

    def part_options(self, part: int) -> dict[str, Any]:
        return {}

    def part_place(self, part: int, gate: Callable[[], bool]) -> PartPlace:
        return PartPlace(part_path(self.root, part), gate)

    def prepare_part(self, part: int) -> None:
        os.makedirs(part_path(self.root, part), exist_ok=True)

    def part_epoch(self, part: int) -> int:
        return read_epoch(PosixStorage(), part_path(self.root, part))

    def read_limits(self) -> bytes | None:
        return read_limits_file(self.root)

    def update_limits(self, change: Callable[[bytes | None], bytes | None]) -> None:
        update_limits_file(self.root, change)

    def close(self) -> None:
        pass


def part_share(limit: Limit, part: int, parts: int) -> Limit:
    """What part ``part`` of ``parts`` enforces of ``limit``: its share of the concurrency
    (``concurrency // parts``, one more for each of the first ``concurrency % parts`` parts) and
    ``per_second / parts``. The shares add up to the limit, so the steps of every part together
    never exceed it, whichever processes hold the parts."""
    c = limit.concurrency
    share = None if c is None else c // parts + (1 if part < c % parts else 0)
    rate = None if limit.per_second is None else limit.per_second / parts
    return Limit(limit.name, concurrency=share, per_second=rate, weights=limit.weights)


def check_limits(limits: tuple[Limit, ...], parts: int) -> None:
    """Refuses a limit some part would get no share of (its steps there could never run)."""
    for limit in limits:
        if not isinstance(limit, Limit):
            raise TypeError(f"limits must be fusee.Limit values, got {limit!r}")
        if limit.concurrency is not None and limit.concurrency < parts:
            raise ValueError(
                f"limit {limit.name!r}: concurrency {limit.concurrency} is below the directory's {parts} "
                f"parts. Each part enforces its share of a limit (concurrency // parts), so a part "
                f"would get none and its runs' steps under the limit could never run. Give a "
                f"concurrency of at least {parts}, or use a directory with fewer parts "
                "(see docs/scale-out.md#limits-on-parts)")


class LimitChanges(msgspec.Struct, frozen=True):
    """What ``set_limit`` changed on a parted directory (or namespace) while processes have it
    open: each changed limit's bounds for the whole directory, and a version each change bumps."""

    version: int = 0
    limits: dict[str, tuple[int | None, float | None, dict[str, int]]] = msgspec.field(default_factory=dict)

    @classmethod
    def decode(cls, data: bytes | None) -> LimitChanges:
        if data is None:
            return cls()
        try:
            return msgspec.msgpack.decode(data, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            # Only set_limit writes it, whole (a rename): keep the bounds in force, say so.
            logger.warning("the limit changes of a parted directory cannot be read (%s): ignored", e)
            return cls()

    def changed(self, base: Limit) -> Limit:
        """``base`` (a limit as given at open) with the change made to it, if any."""
        found = self.limits.get(base.name)
        if found is None:
            return base
        concurrency, per_second, weights = found
        return Limit(base.name, concurrency, per_second, weights)


class PartMail:
    """The mail of one part's runtime: messages for runs on other parts, carried to their holders."""

    def __init__(self, parted: PartedEngine, part: int) -> None:
        self._parted = parted
        self.part = part

    def elsewhere(self, workflow_id: str) -> bool:
        return part_of(workflow_id, self._parted.parts) != self.part

    async def send(self, kind: str, args: tuple[Any, ...]) -> bool:
        parted = self._parted
        if not parted._all_open.is_set():
            await parted._all_open.wait()
        target = part_of(mail_target(kind, args), parted.parts)
        data = msgspec.msgpack.encode(args)
        epoch = parted._slots[self.part].epoch  # the part is held here: its engine's epoch
        delay = 0.005
        while not parted.closed:
            try:
                await parted.relay(target, [kind, data, self.part, epoch])
                return True
            except FencedSender as e:
                logger.warning("part %d: %s", self.part, e)
                return False
            except (EngineClosed, OwnerUnreachable, OutcomeUnknown, OSError) as e:
                # The receiver's holder is changing (a takeover or a handoff): try again.
                logger.debug("part %d: message to part %d waits (%s)", self.part, target, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        return False

    def fenced(self, part: int, epoch: int) -> bool:
        """Whether a sender of part ``part`` under ``epoch`` has been replaced by a newer holder."""
        newest: int = self._parted._home.part_epoch(part)
        return newest > epoch


def _not_on_parts() -> FuseeError:
    return FuseeError("this call is not supported yet on a directory with several parts "
                      "(see docs/scale-out.md#parts for what is)")


class _Registrations:
    """What callers of a parted engine read of a runtime (the HTTP API and the UI look up the
    registered workflows and objects): every part registers the same. Anything else a call
    would take from one part's runtime is refused, so that a call not routed by part fails
    loudly instead of acting on one part."""

    def __init__(self, rt: Any) -> None:
        self.versions = rt.versions
        self.workflows = rt.workflows
        self.check_registered = rt.check_registered

    def __getattr__(self, name: str) -> Any:
        raise _not_on_parts()


class PartedSchedules(ScheduleList):
    """``engine.schedules()`` on a parted directory.

    As a plain list: the schedules of the parts this process holds, by ID. Awaited: a new
    list of every part's schedules, by ID, those of the other parts asked of their holders
    (each within the engine's route timeout); ``unanswered`` then names the parts whose
    holder did not answer (their schedules are missing from the list)."""

    def __init__(self, parted: PartedEngine) -> None:
        held = dict(parted._held())
        super().__init__(ScheduleInfo.of(state) for slot in held.values() for state in slot._schedule_states())
        self.sort(key=lambda i: i.schedule_id)
        self._parted = parted
        #: The parts whose schedules are missing (not held here and, once awaited, not answered).
        self.unanswered: tuple[int, ...] = tuple(p for p in range(parted.parts) if p not in held)

    def __await__(self) -> Generator[Any, None, ScheduleList]:
        return self._ask().__await__()

    async def _ask(self) -> PartedSchedules:
        parted = self._parted

        async def states(part: int) -> builtins.list[dict[str, Any]]:
            moved = parted._moved.get(part)
            if moved is not None:
                await moved.wait()  # being handed over: ask its next engine
            slot = parted._slots[part]
            if isinstance(slot, Follower):
                return await asyncio.wait_for(slot.asked_schedule_states(), parted._route_timeout)
            await asyncio.sleep(0)
            return slot._schedule_states()

        got = await asyncio.gather(*(states(p) for p in range(parted.parts)), return_exceptions=True)
        out = PartedSchedules.__new__(PartedSchedules)
        list.__init__(out, (ScheduleInfo.of(state) for answer in got if not isinstance(answer, BaseException)
                            for state in answer))
        out.sort(key=lambda i: i.schedule_id)
        out._parted = parted
        out.unanswered = tuple(p for p, answer in enumerate(got) if isinstance(answer, BaseException))
        for p in out.unanswered:
            logger.warning("part %d of %s did not answer for its schedules: %s", p, parted.root, got[p])
        return out


class PartedEngine(Engine):
    """An engine on a parted directory: holds some of its parts, routes to the others' holders.

    Made by :meth:`fusee.Engine.open` on a directory created with ``parts=N`` (see
    docs/scale-out.md#parts). Every call keeps its meaning; calls for a workflow go to the
    holder of its part, reads ask every part.
    """

    root: str
    parts: int
    closed: bool
    _slots: list[Engine]
    #: This process's member slot (None: a read-only view, which holds nothing).
    _member: Any
    #: Where the parts live (a directory's, or a PostgreSQL namespace's: fusee.scale.pg_parts).
    _home: Any
    _route_address: str | None
    _route_tls: Any
    _options: dict[str, Any]
    #: The limits as given at open; ``_options["limits"]`` holds them with ``_limit_changes`` made.
    _declared: tuple[Limit, ...]
    #: The last limit changes taken from the directory (or namespace): see :meth:`set_limit`.
    _limit_changes: LimitChanges
    _route_timeout: float
    _floop: asyncio.AbstractEventLoop
    _rebalancer: asyncio.Task[None] | None
    _moving: asyncio.Lock
    #: Parts being handed over now: set once the part's next engine (a follower) is in place.
    _moved: dict[int, asyncio.Event]
    #: Set once every part has its engine (held or followed): the relay waits for it, since a
    #: part recovering at open sends what its runs owe before the later parts are opened.
    _all_open: asyncio.Event

    @classmethod
    async def open_parted(cls, root: str | Any, parts: int | None, options: dict[str, Any],
                          route_timeout: float, *, exclusive: bool = False, route_address: str | None = None,
                          route_tls: Any = None, front_end: bool = False) -> PartedEngine:
        """The engine of this process on the parted directory ``root`` (or the parts home given:
        a PostgreSQL namespace's), created with ``parts`` parts if it is new. ``exclusive``:
        :class:`fusee.errors.DirectoryLocked` if another process has it open. ``front_end``: it
        takes no member slot and holds no part (every call routed to the parts' holders)."""
        loop = asyncio.get_running_loop()
        home = DirectoryHome(root) if isinstance(root, str) else root
        label = home.label
        if parts is None:
            found = await loop.run_in_executor(None, home.read_parts)
            if found is None:
                raise NotAnEngineDirectory(f"{label} is not a parted engine directory")
            count = found
        else:
            if not isinstance(parts, int) or isinstance(parts, bool) or not 1 <= parts <= MAX_PARTS:
                raise ValueError(f"parts must be an int from 1 to {MAX_PARTS}, not {parts!r}")
            count = await loop.run_in_executor(None, home.create_parts, parts)
            if count != parts:
                raise ShardCountMismatch(f"{label} was created with {count} parts, not {parts}: "
                                         "the part count is fixed when the directory is created")
        limits = tuple(options.get("limits", ()))
        check_limits(limits, count)
        backup = options.get("backup")
        if backup is not None:
            if not isinstance(home, DirectoryHome):
                raise ValueError("backup= needs an engine directory on the disk (not a PostgreSQL namespace)")
            # Each part backs up under part-NNN/ of the target, which says it holds parts.
            await loop.run_in_executor(None, mark_parted, backup.target, count)
        self = cls._blank(label, count, {**options, "limits": limits}, route_timeout, read_only=False)
        self._home = home
        self._route_address = route_address
        self._route_tls = route_tls
        key = home.key
        if front_end:
            try:
                await self._adopt_limits(alone=False)
                for p in range(count):
                    self._slots.append(await self._open_part(p, False))
            except BaseException:
                for s in self._slots:
                    with contextlib.suppress(Exception):
                        await s.close()
                raise
        else:
            self._member = await loop.run_in_executor(None, home.join)
            member = self._member
            try:
                live = member.live()
                if exclusive and len(live) > 1:
                    raise DirectoryLocked(label, None)
                await self._adopt_limits(alone=len(live) == 1)
                for p in range(count):
                    self._slots.append(await self._open_part(p, desired_holder(p, live) == member.slot))
            except BaseException:
                for s in self._slots:
                    with contextlib.suppress(Exception):
                        await s.close()
                member.release()
                raise
        if key is not None:
            HELD_HERE.add(key)
            self._on_release.append(lambda: HELD_HERE.discard(key))
        self._all_open.set()
        self._rebalancer = loop.create_task(self._rebalance())
        return self

    @classmethod
    async def open_view(cls, root: str | Any, options: dict[str, Any]) -> PartedEngine:
        """A read-only view of the parted directory ``root`` (or the parts home given: a
        PostgreSQL namespace's) for ``Engine.open(read_only=True)``: every part opened read-only
        (no lock, no lease, no write, no workflow code run), reads merged as on a holder; it
        holds nothing and takes no member slot."""
        loop = asyncio.get_running_loop()
        home = DirectoryHome(root) if isinstance(root, str) else root
        count = await loop.run_in_executor(None, home.read_parts)
        if count is None:
            raise NotAnEngineDirectory(f"{home.label} is not a parted engine directory")
        self = cls._blank(home.label, count, {**options, "limits": tuple(options.get("limits", ())), "backup": None},
                          1.0, read_only=True)
        self._home = home
        try:
            for p in range(count):
                self._slots.append(await Engine.open(home.part_target(p), **{**self._options,
                                                                             **home.part_options(p)}))
        except BaseException:
            for slot in self._slots:
                with contextlib.suppress(Exception):
                    await slot.close()
            raise
        return self

    @classmethod
    def _blank(cls, root: str, count: int, options: dict[str, Any], route_timeout: float, *,
               read_only: bool) -> PartedEngine:
        """The engine's fields, every one set here; no part opened yet."""
        self = object.__new__(cls)
        self._pid = os.getpid()
        self.root = root
        self.parts = count
        self.closed = self._closed = False
        self._read_only = read_only
        self._route_server = None
        self._on_release = []
        self._telemetry = None
        self._options = options
        self._declared = tuple(options.get("limits", ()))
        self._limit_changes = LimitChanges()
        self._route_timeout = route_timeout
        self._floop = asyncio.get_running_loop()
        self._rebalancer = None
        self._moving = asyncio.Lock()
        self._moved = {}
        self._all_open = asyncio.Event()
        self._member = None
        self._slots = []
        self._home = DirectoryHome(root)
        self._route_address = None
        self._route_tls = None
        return self

    @property
    def recovered_records(self) -> int:  # type: ignore[override]
        """The log records every part's open read after its checkpoint (a held part's; 0 for one
        followed)."""
        return sum(getattr(slot, "recovered_records", 0) for slot in self._slots)

    def _part_options(self, part: int) -> dict[str, Any]:
        limits = tuple(part_share(limit, part, self.parts) for limit in self._options["limits"])
        out = {**self._options, "limits": limits, "_mail": PartMail(self, part)}
        backup = self._options.get("backup")
        if backup is not None:
            out["backup"] = backup.under(f"{part_name(part)}/")
        return out

    def _falls_here(self, part: int) -> bool:
        """Whether part ``part`` falls to this process now (called on a lease's waiting thread too)."""
        member = self._member
        if member is None:
            return False
        try:
            live = member.live()
        except OSError:
            return False
        return not self.closed and desired_holder(part, live) == member.slot

    async def _open_part(self, part: int, hold: bool) -> Engine:
        home = self._home
        target = home.part_target(part)
        opts = {k: v for k, v in {**self._part_options(part), **home.part_options(part)}.items() if k != "read_only"}
        if hold:
            try:
                return await open_owner(Engine, target, opts, route_address=self._route_address,
                                        route_tls=self._route_tls, claim=False)
            except (DirectoryLocked, LeaseHeld):
                pass  # another member still holds it: it hands it over when it sees us
        await self._floop.run_in_executor(None, home.prepare_part, part)
        return await Follower.follow(home.part_place(part, lambda: self._falls_here(part)), opts,
                                     self._route_timeout, self._route_address, self._route_tls,
                                     take_over=self._member is not None)

    async def _rebalance(self) -> None:
        """Takes the limit changes other processes made, and hands over, one at a time, the parts
        this process holds that fall to another member now."""
        member = self._member
        while not self.closed:
            await asyncio.sleep(REBALANCE_EVERY_S)
            await self._catch_up_limits()
            if member is None:
                continue  # a front end holds no part
            try:
                live = await self._floop.run_in_executor(None, member.live)
            except OSError:
                continue
            for p, slot in enumerate(self._slots):
                # A part whose lease lapsed (a pause past it: another holder took it) goes back to
                # following, so that it can come back here when it falls here again.
                lapsed = isinstance(slot.failure, LeaseLost)
                if slot.is_owner and (lapsed or desired_holder(p, live) != member.slot):
                    await self._hand_over(p)
                    break

    async def _adopt_limits(self, alone: bool) -> None:
        """Takes the limit changes of the processes that have the directory open; a process alone
        clears them instead (they ended with the processes that made them)."""
        home = self._home
        if alone:
            await self._floop.run_in_executor(None, home.update_limits, lambda _old: None)
        else:
            data = await self._floop.run_in_executor(None, home.read_limits)
            self._take_limits(LimitChanges.decode(data))

    async def _catch_up_limits(self) -> None:
        try:
            data = await self._floop.run_in_executor(None, self._home.read_limits)
        except Exception as e:  # the store is unreachable for now: the next turn asks again
            logger.debug("the limit changes of %s cannot be read now: %s", self.root, e)
            return
        changes = LimitChanges.decode(data)
        if changes.version != self._limit_changes.version:
            self._take_limits(changes)
        else:
            self._share_limits(force=False)

    def _take_limits(self, changes: LimitChanges) -> None:
        self._limit_changes = changes
        self._options["limits"] = tuple(changes.changed(limit) for limit in self._declared)
        self._share_limits(force=True)

    def _share_limits(self, force: bool) -> None:
        """Gives each part held here its share of the limits in force. Without ``force``, only
        where its bounds differ: a part opened meanwhile (a handover) may have taken older ones."""
        for p, slot in self._held():
            try:
                status = slot.limits()
                for limit in self._options["limits"]:
                    share = part_share(limit, p, self.parts)
                    now = status.get(limit.name)
                    if not force and now is not None and (now.concurrency, now.per_second) == (
                            share.concurrency, share.per_second):
                        continue
                    slot.set_limit(limit.name, concurrency=share.concurrency, per_second=share.per_second,
                                   weights=share.weights)
            except FuseeError as e:  # the part is closing (handed over, or its lease lapsed)
                logger.debug("part %d keeps its limits for now: %s", p, e)

    async def _hand_over(self, part: int) -> None:
        async with self._moving:
            if self.closed:
                return
            old = self._slots[part]
            logger.info("part %d of %s falls to another process: handing it over", part, self.root)
            moved = self._moved[part] = asyncio.Event()
            try:
                await old.close()
                self._slots[part] = await self._open_part(part, False)
            finally:
                del self._moved[part]
                moved.set()

    # --- routing ----------------------------------------------------------------------

    def part_epoch(self, part: int) -> int:
        """The epoch of part ``part``'s holder as its directory (or namespace) says."""
        epoch: int = self._home.part_epoch(part)
        return epoch

    async def relay(self, part: int, args: list[Any]) -> None:
        """Delivers a message to part ``part``'s runtime (here or at its holder)."""
        slot = self._slots[part]
        if isinstance(slot, Follower):
            await slot._route("relay", args, safe=True)
        else:
            await dispatch(slot, "relay", args)

    def _slot(self, workflow_id: str) -> Engine:
        self._check_open()
        return self._slots[part_of(self._check_id(workflow_id), self.parts)]

    def _check_open(self) -> None:
        self._check_process()
        if self.closed:
            raise EngineClosed("the engine is closed: open it again to continue")

    async def _on_part(self, workflow_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """``name(*args, **kwargs)`` on the engine of ``workflow_id``'s part; again on its new engine
        when the part was handed over meanwhile."""
        part = part_of(self._check_id(workflow_id), self.parts)
        while True:
            self._check_open()
            slot = self._slots[part]
            try:
                return await getattr(slot, name)(*args, **kwargs)
            except EngineClosed:
                moved = self._moved.get(part)
                if moved is not None:
                    await moved.wait()  # the part is being handed over: ask its next engine
                elif self.closed or self._slots[part] is slot:
                    raise

    def _rebind(self, handle: RunHandle[Any]) -> RunHandle[Any]:
        return RunHandle(self, handle.workflow_id, handle.run_id)

    async def start(self, workflow: Any, workflow_id: str, input: Any = None, **kwargs: Any) -> Any:
        return self._rebind(await self._on_part(workflow_id, "start", workflow, workflow_id, input, **kwargs))

    async def execute(self, workflow: Any, workflow_id: str, input: Any = None, **kwargs: Any) -> Any:
        return await self._on_part(workflow_id, "execute", workflow, workflow_id, input, **kwargs)

    def get(self, workflow_id: str) -> RunHandle[Any]:
        """See :meth:`fusee.Engine.get`. While the run's part changes hands the ID is not checked
        (as on a follower): the handle's calls wait for the part's next holder."""
        slot = self._slot(workflow_id)
        try:
            return self._rebind(slot.get(workflow_id))
        except EngineClosed:
            if self.closed:
                raise
            return RunHandle(self, workflow_id, 0)

    async def _result(self, workflow_id: str) -> Any:
        return await self._on_part(workflow_id, "_result", workflow_id)

    async def signal(self, workflow_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self._on_part(workflow_id, "signal", workflow_id, *args, **kwargs)

    async def query(self, workflow_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self._on_part(workflow_id, "query", workflow_id, *args, **kwargs)

    async def update(self, workflow_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self._on_part(workflow_id, "update", workflow_id, *args, **kwargs)

    async def update_with_start(self, workflow: Any, workflow_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self._on_part(workflow_id, "update_with_start", workflow, workflow_id, *args, **kwargs)

    async def cancel(self, workflow_id: str, *args: Any, **kwargs: Any) -> None:
        await self._on_part(workflow_id, "cancel", workflow_id, *args, **kwargs)

    async def terminate(self, workflow_id: str, *args: Any, **kwargs: Any) -> None:
        await self._on_part(workflow_id, "terminate", workflow_id, *args, **kwargs)

    async def resume(self, workflow_id: str, *args: Any, **kwargs: Any) -> None:
        await self._on_part(workflow_id, "resume", workflow_id, *args, **kwargs)

    async def journal(self, workflow_id: str) -> Any:
        return await self._on_part(workflow_id, "journal", workflow_id)

    async def read_stream(self, workflow_id: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return await self._on_part(workflow_id, "read_stream", workflow_id, *args, **kwargs)

    async def export(self, workflow_id: str, path: Any) -> int:
        return await self._on_part(workflow_id, "export", workflow_id, path)  # type: ignore[no-any-return]

    async def complete(self, token: str, value: Any = None, *, by: str | None = None) -> bool:
        from fusee.runtime.tokens import parse_token

        wid = parse_token(token)[0]
        return await self._on_part(wid, "complete", token, value, by=by)  # type: ignore[no-any-return]

    async def fail_completion(self, token: str, message: str = "", *, by: str | None = None) -> bool:
        from fusee.runtime.tokens import parse_token

        wid = parse_token(token)[0]
        return await self._on_part(wid, "fail_completion", token, message, by=by)  # type: ignore[no-any-return]

    async def _reset(
        self, workflow_id: str, new_id: str | None, before_step: str | None, before_position: int | None,
        reapply_signals: bool, version: int | None, by: str | None,
    ) -> RunHandle[Any]:
        wid = self._check_id(workflow_id)
        if new_id is not None and part_of(new_id, self.parts) != part_of(wid, self.parts):
            # The original's durable journal, imported on the new ID's part and cut there as the
            # fork of one engine would cut it.
            journal = await self._on_part(wid, "journal", wid)
            return self._rebind(await self._on_part(
                new_id, "_import_records", journal, new_id, before_step, before_position,
                reapply_signals, version, True, by))
        return self._rebind(await self._on_part(wid, "_reset", wid, new_id, before_step, before_position,
                                                reapply_signals, version, by))

    async def import_journal(self, path: Any, workflow_id: str | None = None,
                             before_step: str | None = None) -> RunHandle[Any]:
        """See :meth:`fusee.Engine.import_journal`: the run is made on the part of its ID."""
        self._check_open()
        if before_step is not None and not isinstance(before_step, str):
            raise TypeError(f"before_step must be a step's name (a str) or None, got {before_step!r}")
        journal = await asyncio.get_running_loop().run_in_executor(None, journal_file.read, path)
        start = journal[0] if journal else None
        wid = self._check_id(workflow_id) if workflow_id is not None else getattr(start, "id", None)
        if not isinstance(wid, str):
            raise CorruptRecord(f"{path} holds no Start record: it is not a journal Fusee exported")
        return self._rebind(await self._on_part(wid, "_import_records", journal, wid, before_step))

    # --- schedules, windows and keyed objects: each is a run on the part of its ID ------------

    async def schedule(self, schedule_id: str, workflow: Any, input: Any = None, **kwargs: Any) -> None:
        if not isinstance(schedule_id, str) or not schedule_id:
            raise InvalidSchedule(f"a schedule ID must be a non-empty string, got {schedule_id!r}")
        await self._on_part(schedules.PREFIX + schedule_id, "schedule", schedule_id, workflow, input, **kwargs)

    async def _schedule_state(self, schedule_id: str, request: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(schedule_id, str) or not schedule_id:
            raise ScheduleNotFound(f"no schedule {schedule_id!r} exists (a schedule ID is a non-empty string)")
        got: dict[str, Any] = await self._on_part(schedules.PREFIX + schedule_id, "_schedule_state",
                                                  schedule_id, request)
        return got

    def schedules(self) -> ScheduleList:
        """See :meth:`fusee.Engine.schedules`. On several parts, awaited (``await
        engine.schedules()``) it asks every part's holder; as a plain list it holds the
        schedules of the parts this process holds (see :class:`PartedSchedules`)."""
        self._check_open()
        return PartedSchedules(self)

    async def enqueue(self, workflow: Any, key: str, event: Any, *, event_id: str | None = None) -> Any:
        name = workflow.name if isinstance(workflow, WorkflowDef) else workflow
        if not isinstance(name, str) or not name:
            raise TypeError(f"enqueue takes a workflow or its name, got {workflow!r}")
        if not isinstance(key, str) or not key:
            raise TypeError(f"a window key must be a non-empty string, got {key!r}")
        if event_id is None:
            event_id = os.urandom(16).hex()  # here, so that a call sent again after a handover is one event
        return await self._on_part(windows.coordinator_id(name, key), "enqueue", workflow, key, event,
                                   event_id=event_id)

    async def call(self, handler: Any, key: str, arg: Any = None, *, call_id: str | None = None) -> Any:
        if not isinstance(handler, Handler):
            raise TypeError(f"engine.call takes a handler made with @obj.exclusive or @obj.shared, got {handler!r}")
        if call_id is None:
            call_id = os.urandom(16).hex()  # here, so that a call sent again after a handover runs once
        return await self._on_part(handler.obj.workflow_id(key), "call", handler, key, arg, call_id=call_id)

    def _object_id(self, obj: Any, key: str) -> str:
        if not isinstance(obj, ObjectDef):
            raise TypeError(f"expected an object made with fusee.object(...), got {obj!r}")
        return obj.workflow_id(key)

    async def object_state(self, obj: Any, key: str) -> Any:
        return await self._on_part(self._object_id(obj, key), "object_state", obj, key)

    async def set_object_state(self, obj: Any, key: str, value: Any, *, if_version: int | None = None) -> int:
        got: int = await self._on_part(self._object_id(obj, key), "set_object_state", obj, key, value,
                                       if_version=if_version)
        return got

    async def clear_object_state(self, obj: Any, key: str, *, if_version: int | None = None) -> int:
        got: int = await self._on_part(self._object_id(obj, key), "clear_object_state", obj, key,
                                       if_version=if_version)
        return got

    async def patch_object_state(self, obj: Any, key: str, patch: builtins.list[dict[str, Any]], *,
                                 if_version: int | None = None) -> int:
        got: int = await self._on_part(self._object_id(obj, key), "patch_object_state", obj, key, patch,
                                       if_version=if_version)
        return got

    async def checkpoint(self) -> None:
        self._check_open()
        for slot in self._slots:
            await slot.checkpoint()

    async def refresh(self) -> None:
        """Reads again the parts other processes hold (see :meth:`fusee.scale.follower.Follower.refresh`)."""
        self._check_open()
        for slot in self._slots:
            if isinstance(slot, Follower) and not slot.is_owner:
                await slot.refresh()

    # --- reads across parts -----------------------------------------------------------

    def describe(self, workflow_id: str) -> RunSummary:
        return self._slot(workflow_id).describe(workflow_id)

    def runs(self) -> list[RunSummary]:
        self._check_open()
        return [r for slot in self._slots for r in slot.runs()]

    def list(self, where: str | None = None, limit: int = 100, cursor: str | None = None, *,
             order: str = "oldest") -> RunPage:
        """See :meth:`fusee.Engine.list`; across parts the runs come part by part (each part in
        its own order), and a query's ``order by`` is refused (:class:`fusee.InvalidQuery`)."""
        self._check_open()
        if where is not None and "order by" in " ".join(where.lower().split()):
            raise InvalidQuery("'order by' is not supported yet on a directory with several parts: "
                               "list without it, and sort the runs yourself", where, 0)
        part, inner = 0, None
        if cursor is not None:
            try:
                head, _, rest = cursor.partition(":")
                if not head.startswith("p"):
                    raise ValueError(cursor)
                part, inner = int(head[1:]), (rest or None)
            except ValueError:
                raise InvalidQuery("not a cursor of Engine.list: pass page.cursor as it was returned",
                                   str(cursor), 0) from None
        items: builtins.list[RunSummary] = []
        while part < self.parts:
            page = self._slots[part].list(where, limit - len(items), inner, order=order)
            items.extend(page.items)
            if page.cursor is not None:
                return RunPage(items, f"p{part}:{page.cursor}")
            part, inner = part + 1, None
            if len(items) >= limit:
                return RunPage(items, f"p{part}:" if part < self.parts else None)
        return RunPage(items, None)

    def counts(self, where: str | None = None) -> dict[str, int]:
        self._check_open()
        out: dict[str, int] = {}
        for slot in self._slots:
            for k, v in slot.counts(where).items():
                out[k] = out.get(k, 0) + v
        return out

    def metrics(self) -> Metrics:
        """See :meth:`fusee.Engine.metrics`, over every part: ``shards`` lists each part's shards in
        part order, numbered on (part ``p``'s shard ``s`` is ``p * k + s``, ``k`` shards per part);
        run counts are every part's. Step, flush, timer and memory figures are those of the parts
        this process holds (the others' are their holders' own); flush p50 and p99 are the largest
        among them. No backup status here (each part's backup has its own: docs/operations.md)."""
        self._check_open()
        each = [slot.metrics() for slot in self._slots]
        shards: builtins.list[ShardMetrics] = []
        for m in each:
            shards.extend(dataclasses.replace(sm, shard=len(shards)) for sm in m.shards)
        holding = dict(self._held())
        held = [m for p, m in enumerate(each) if p in holding]
        stats: dict[str, int] = {}
        for m in held:
            for k, v in m.stats.items():
                stats[k] = stats.get(k, 0) + v
        budgets = [m.memory_budget for m in held if m.memory_budget is not None]

        def total(field: str) -> int:
            return sum(getattr(m, field) for m in held)

        return Metrics(
            shards=tuple(shards), steps_run=total("steps_run"), steps_executing=total("steps_executing"),
            steps_gated=total("steps_gated"), timers_pending=total("timers_pending"),
            flushes=total("flushes"), inline_flushes=total("inline_flushes"),
            records_flushed=total("records_flushed"), records_pending=total("records_pending"),
            flush_p50_ms=max((m.flush_p50_ms for m in held), default=0.0),
            flush_p99_ms=max((m.flush_p99_ms for m in held), default=0.0),
            indexed=sum(m.indexed for m in each), stats=stats, loaded_bytes=total("loaded_bytes"),
            memory_budget=sum(budgets) if budgets else None, runs_to_load=total("runs_to_load"),
            backup=None)

    def limits(self) -> dict[str, LimitStatus]:
        """Each limit as given at open (the whole directory's bound), with the permits out and the
        step executions waiting on the parts this process holds (each part enforces its share,
        see :func:`part_share`)."""
        self._check_open()
        out: dict[str, LimitStatus] = {}
        for limit in self._options["limits"]:
            held = [s.limits().get(limit.name) for _, s in self._held()]
            out[limit.name] = LimitStatus(
                limit.name, limit.concurrency, limit.per_second,
                sum(h.in_use for h in held if h is not None), sum(h.waiting for h in held if h is not None))
        return out

    def set_limit(self, name: str, *, concurrency: Any = KEEP, per_second: Any = KEEP,
                  weights: Any = KEEP) -> Limit:
        """Changes a limit's bounds for the whole directory (what is not given stays) and returns
        the new :class:`fusee.Limit`; each part enforces its share of it (:func:`part_share`).

        The change is stored with the directory's members (or the namespace's), so it reaches
        every process that has the directory open: the parts held here take it before this
        returns, the other processes' parts within about 0.2 s, and a process that opens while
        one is still open takes it too. Until then another process's parts keep their old
        shares (as a smaller ``concurrency`` takes no permit back). Not durable beyond the
        processes: once every one has closed, the next open takes the ``limits=`` it is given.
        Raises :class:`fusee.UnknownLimit` for a name the engine was not opened with, and
        ``ValueError`` for a ``concurrency`` below the part count (a part would get no share).
        """
        self._check_open()
        if self._read_only:
            raise FuseeError("set_limit on a read-only view: it runs no step; call it in a process "
                             "that opened the directory without read_only=True")
        declared = {limit.name: limit for limit in self._declared}
        if name not in declared:
            raise UnknownLimit(f"set_limit: no limit named {name!r}; declare it with Engine.open(..., "
                               "limits=[fusee.Limit(name, ...)]) in every process", name=name)
        made: builtins.list[LimitChanges] = []

        def change(data: bytes | None) -> bytes:
            old = LimitChanges.decode(data)
            now = old.changed(declared[name])
            new = Limit(name, now.concurrency if concurrency is KEEP else concurrency,
                        now.per_second if per_second is KEEP else per_second,
                        now.weights if weights is KEEP else weights)
            check_limits((new,), self.parts)
            made.append(LimitChanges(old.version + 1, {
                **old.limits, name: (new.concurrency, new.per_second, dict(new.weights))}))
            return msgspec.msgpack.encode(made[-1])

        # Synchronous, as Engine.set_limit is: a lock and a small file (or one transaction).
        self._home.update_limits(change)
        self._take_limits(made[-1])
        return made[-1].changed(declared[name])

    def stuck(self) -> dict[str, str]:
        self._check_open()
        out: dict[str, str] = {}
        for slot in self._slots:
            out.update(slot.stuck())
        return out

    @property
    def is_owner(self) -> bool:
        """Whether this process holds at least one part."""
        return bool(self._held())

    @property
    def held_parts(self) -> builtins.list[int]:
        """The parts this process holds (runs the workflows of) now; a part being handed over to
        another process is not among them."""
        return [p for p, _ in self._held()]

    def _held(self) -> builtins.list[tuple[int, Engine]]:
        """The parts this process holds now, with their engines (not the ones being handed over)."""
        return [(p, s) for p, s in enumerate(self._slots) if s.is_owner and p not in self._moved]

    @property
    def epoch(self) -> int:
        """The largest epoch among the parts this process holds (0: it holds none); each part has
        its own (:meth:`part_epoch`)."""
        return max((s.epoch for _, s in self._held()), default=0)

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the log of a part this process holds, or None."""
        for s in self._slots:
            if s.is_owner and s.failure is not None:
                return s.failure
        return None

    @property
    def live(self) -> bool:
        return False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine was opened on: every call must be made there."""
        return self._floop

    @property
    def _rt(self) -> Any:  # type: ignore[override]
        return _Registrations(self._slots[0]._rt)

    @property
    def _log(self) -> Any:  # type: ignore[override]
        raise _not_on_parts()

    _committer = _log

    @property
    def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self._slots:
            if s.is_owner:
                for k, v in s.stats.items():
                    out[k] = out.get(k, 0) + v
        return out

    async def close(self, grace: Any = 10.0) -> None:
        """Closes every part this process holds (gracefully, as :meth:`fusee.Engine.close`) and
        stops following the others; the other members take the parts it held over."""
        self._check_process()
        if self.closed:
            return
        self.closed = self._closed = True
        if self._rebalancer is not None:
            self._rebalancer.cancel()
            with contextlib.suppress(BaseException):
                await self._rebalancer
        async with self._moving:
            for slot in self._slots:
                try:
                    await slot.close(grace)
                except Exception as e:
                    logger.error("closing a part of %s: %s", self.root, e)
        if self._member is not None:
            self._member.release()
        self._home.close()
        for released in self._on_release:
            released()

    def __repr__(self) -> str:
        if self._member is None and not self._read_only:
            return f"<fusee engine on {self.root} ({self.parts} parts, a front end holding none)>"
        return f"<fusee engine on {self.root} ({self.parts} parts, holding {self.held_parts})>"
