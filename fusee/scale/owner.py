"""An owner: the one-holder engine on a directory or namespace, serving the other processes' calls.

:class:`fusee.engine.engine.Engine` holds a log and knows nothing of other
processes. Opened where others may follow (a directory on the real disk, a
PostgreSQL namespace), the owner also serves their routed calls: on the
directory's Unix socket, or over TCP at ``route_address`` (authenticated by
the namespace's routing secret). The server is closed by the engine's close,
after the last checkpoint and before the lock goes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from fusee.engine.engine import MEMORY_PATH, Engine, shared_directory
from fusee.scale.lease import DirectoryLease
from fusee.scale.server import RouteServer
from fusee.scale.tcp import DEFAULT_ROUTE_ADDRESS
from fusee.storage import postgres as pg_store
from fusee.tls import RouteTLS

logger = logging.getLogger("fusee.scale")

#: Directories this process has open (as owner or follower), by (device, inode): a second
#: open in one process is refused as it always was, instead of following itself.
HELD_HERE: set[tuple[int, int]] = set()

if hasattr(os, "register_at_fork"):
    # A forked child holds none of them: the engines it copied refuse every call and it let go of
    # their descriptors (fusee.storage.forks), so it may open the directory anew, as a follower.
    os.register_at_fork(after_in_child=HELD_HERE.clear)


def dir_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


async def open_owner(
    cls: type[Engine],
    path: str | os.PathLike[str] | None,
    options: dict[str, Any],
    *,
    route_address: str | None = None,
    route_tls: RouteTLS | None = None,
    claim: bool = True,
    **won: Any,
) -> Engine:
    """``cls`` opened on ``path`` with ``options`` (``Engine._open``'s), serving other processes when
    they may follow it. ``won``: the lease a follower won (``Place.takeover_options``); ``claim``:
    record the directory in :data:`HELD_HERE` (a follower taking over already did). Raises what
    the holder's open raises (:class:`fusee.errors.DirectoryLocked`, :class:`fusee.errors.LeaseHeld`)."""
    eng = await cls._open(path, **options, **won)
    target = MEMORY_PATH if path is None else os.fspath(path)
    read_only = bool(options.get("read_only", False))
    if shared_directory(path, options.get("env"), read_only):
        await _serve_directory(eng, target, claim)
    elif pg_store.is_dsn(target) and not read_only and options.get("env") is None:
        await _serve_over_tcp(eng, route_address, route_tls)
    return eng


async def _serve_directory(eng: Engine, path: str, claim: bool) -> None:
    """Owner of a directory other processes may open: serve their routed calls."""
    d = eng._log.dir
    assert d._lock is not None and d.epoch > 0, "an owner holds the lock under an epoch"
    if claim:
        key = dir_key(path)
        if key is not None:
            HELD_HERE.add(key)
            eng._on_release.append(lambda: HELD_HERE.discard(key))
    server = RouteServer(eng, DirectoryLease.adopt(path, d._lock, d.epoch), path)
    try:
        await server.start()
    except OSError as e:
        # Followers cannot reach us; this process still works alone.
        logger.warning("owner of %s cannot serve other processes (%s): their calls will fail", path, e)
        return
    eng._route_server = server


async def _serve_over_tcp(eng: Engine, route_address: str | None, route_tls: RouteTLS | None) -> None:
    """Owner of a PostgreSQL namespace: serve the other engines' routed calls over TCP."""
    log: Any = eng._log
    try:
        secret = await asyncio.get_running_loop().run_in_executor(None, log.lease.routing_secret)
        server = RouteServer(eng, log.lease, log.dir.path, tcp=route_address or DEFAULT_ROUTE_ADDRESS,
                             secret=secret, tls=route_tls)
        await server.start()
    except Exception as e:
        # The other engines cannot reach us; this one still serves the namespace alone.
        logger.warning("owner of %s cannot serve other engines (%s): their calls will fail",
                       log.dir.path, e)
        return
    eng._route_server = server
