"""Where ``Engine.open`` puts an engine: the owner of its directory or namespace, or a follower.

The engine (:mod:`fusee.engine.engine`) only holds a log. This module is the
opener :meth:`fusee.Engine.open` calls (installed when it is imported; the
``fusee`` package imports it): it opens the engine as the owner (which
serves the other processes, :mod:`fusee.scale.owner`), and when another
process holds the directory, or another engine the namespace's lease, it
returns a :class:`fusee.scale.follower.Follower` of that owner instead,
unless ``exclusive=True``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fusee.engine import engine as holder
from fusee.engine.engine import MEMORY_PATH, Engine, shared_directory
from fusee.errors import DirectoryLocked, LeaseHeld, NotAnEngineDirectory
from fusee.scale.follower import Follower
from fusee.scale.owner import HELD_HERE, dir_key, open_owner
from fusee.scale.parts import MAX_MEMBERS, PartedEngine, parts_from_env
from fusee.scale.pg_parts import PostgresHome
from fusee.scale.places import DirectoryPlace, PostgresPlace
from fusee.scale.tcp import DEFAULT_ROUTE_ADDRESS, parse_address
from fusee.storage import postgres as pg_store
from fusee.storage.partsfile import MAX_PARTS, is_new_directory, read_parts
from fusee.tls import RouteTLS, checked


async def open_engine(
    cls: type[Engine],
    path: str | os.PathLike[str] | None,
    *,
    exclusive: bool,
    route_timeout: float,
    route_address: str | None,
    route_tls: RouteTLS | None,
    parts: int | None = None,
    front_end: bool = False,
    **options: Any,
) -> Engine:
    """:meth:`fusee.Engine.open`: the owner of ``path``, or a follower of the process that owns it
    (never the owner with ``front_end``). ``options`` are the holder's (``Engine._open``)."""
    if not isinstance(route_timeout, (int, float)) or isinstance(route_timeout, bool) or route_timeout <= 0:
        raise ValueError(f"route_timeout must be a positive number of seconds, got {route_timeout!r}")
    target = MEMORY_PATH if path is None else os.fspath(path)
    on_postgres = pg_store.is_dsn(target)
    if not isinstance(front_end, bool):
        raise TypeError(f"front_end must be True or False, got {front_end!r}")
    if front_end:
        if path is None or options.get("env") is not None:
            raise ValueError("front_end=True needs a directory on the real disk or a PostgreSQL DSN "
                             "that other processes hold (not memory or env=...)")
        if exclusive or options.get("read_only"):
            raise ValueError("front_end=True routes every call to other processes: it cannot be "
                             "exclusive=True or read_only=True")
    if route_address is not None:
        if not on_postgres:
            raise ValueError("route_address= applies to a PostgreSQL DSN: on a directory the owner "
                             "serves the other processes on a Unix socket")
        parse_address(route_address)  # a clear error before anything is opened
    if route_tls is not None and not on_postgres:
        raise ValueError("route_tls= applies to a PostgreSQL DSN: on a directory the processes of one "
                         "machine route over a Unix socket")
    route_tls = checked(route_tls)  # its files load now, or the open fails naming them
    options["workflows"] = list(options.get("workflows", ()))
    env, read_only = options.get("env"), bool(options.get("read_only", False))
    shared = shared_directory(path, env, read_only)
    if on_postgres and env is None:
        home = _postgres_home(target, options, route_tls)
        try:
            parted = parts is not None or await _run(home.read_parts) is not None
            if not parted and not read_only:
                default = parts_from_env()  # FUSEE_PARTS: the part count of a namespace created now
                if default is not None and await _run(home.is_new):
                    parts, parted = default, True
        except BaseException:
            home.close()
            raise
        if not parted:
            home.close()
        else:
            try:
                if read_only:
                    return await PartedEngine.open_view(home, options)  # every part read-only, reads merged
                return await PartedEngine.open_parted(home, parts, options, route_timeout, exclusive=exclusive,
                                                      route_address=_any_port(route_address), route_tls=route_tls,
                                                      front_end=front_end)
            except BaseException:
                home.close()
                raise
    if parts is None and shared and not on_postgres:
        default = parts_from_env()  # FUSEE_PARTS: the part count of a directory created now
        if default is not None and read_parts(target) is None and is_new_directory(target):
            parts = default
    if parts is not None or (path is not None and not on_postgres and read_parts(target) is not None):
        if parts is None and read_only and env is None:
            return await PartedEngine.open_view(target, options)  # every part read-only, reads merged
        if not shared:
            raise ValueError("parts= applies to a directory on the real disk opened to write (not to "
                             "memory, a PostgreSQL DSN or env=...); a parted directory opens "
                             "read_only=True without parts=")
        if dir_key(target) in HELD_HERE:
            raise DirectoryLocked(target, os.getpid())
        return await PartedEngine.open_parted(target, parts, options, route_timeout, exclusive=exclusive,
                                              front_end=front_end)
    if shared and dir_key(target) in HELD_HERE:
        raise DirectoryLocked(target, os.getpid())
    place: Any
    if front_end and on_postgres:
        place = _postgres_place(target, options, route_tls)
    elif front_end:
        if not os.path.isdir(target):
            raise NotAnEngineDirectory(f"{target} does not exist: a front end follows a directory that "
                                       "another process created and holds")
        place = DirectoryPlace(target)
    else:
        try:
            return await open_owner(cls, path, options, route_address=route_address, route_tls=route_tls)
        except DirectoryLocked:
            if not shared or exclusive:
                raise
            place = DirectoryPlace(target)
        except LeaseHeld:
            if exclusive or env is not None:
                raise
            place = _postgres_place(target, options, route_tls)
    # What the follower needs to open the place itself when it takes over (and for its view).
    follow_options = {k: v for k, v in options.items() if k != "read_only"}
    return await Follower.follow(place, follow_options, route_timeout, route_address, route_tls,
                                 take_over=not front_end)


def _postgres_place(dsn: str, options: dict[str, Any], route_tls: RouteTLS | None) -> PostgresPlace:
    namespace, lease_ttl = options.get("namespace"), options.get("lease_ttl")
    return PostgresPlace(dsn, pg_store.DEFAULT_NAMESPACE if namespace is None else namespace,
                         pg_store.DEFAULT_LEASE_TTL if lease_ttl is None else lease_ttl, route_tls)


def _postgres_home(dsn: str, options: dict[str, Any], route_tls: RouteTLS | None) -> PostgresHome:
    namespace, lease_ttl = options.get("namespace"), options.get("lease_ttl")
    return PostgresHome(dsn, pg_store.DEFAULT_NAMESPACE if namespace is None else namespace,
                        pg_store.DEFAULT_LEASE_TTL if lease_ttl is None else lease_ttl, route_tls,
                        MAX_PARTS, MAX_MEMBERS)


def _any_port(route_address: str | None) -> str:
    """Where each part's holder serves: the host of ``route_address``, on a port of its own."""
    host, _ = parse_address(route_address or DEFAULT_ROUTE_ADDRESS)
    return f"[{host}]:0" if ":" in host else f"{host}:0"


async def _run(fn: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


holder.install_opener(open_engine)
