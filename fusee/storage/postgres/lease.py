"""The namespace's lease: which engine serves it, with which epoch, until when (the server's clock).

One row per namespace: ``(owner, epoch, expires_at, address)``. An engine
takes it when it is free (released) or expired, with ``epoch + 1``, in one
statement judged by the server's ``now()``; it renews it every third of the
TTL from a thread. Every flush checks, in its own transaction, that the row
still holds this engine's owner and epoch and has not expired (see
``PostgresLog``): that check, not this object's belief, is the fence. A
renewal only ever extends a lease that is still this engine's and unexpired,
so a paused engine that wakes after another took over cannot take it back.
Steps act outside the server, where no fence reaches: ``holds`` says whether
the lease is still this engine's by its own clock (``fusee.storage.holding``),
asked before each step's function begins.

The lease has its own connection: a slow flush does not delay renewals.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from fusee import sabotage
from fusee.storage.holding import Holding
from fusee.storage.postgres.connection import connect
from fusee.storage.postgres.schema import table

logger = logging.getLogger("fusee")


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease, as the server sees it now."""

    owner: str
    epoch: int
    #: Seconds until it expires without renewal (negative: expired already).
    expires_in: float
    address: str | None


def new_owner_id() -> str:
    """host:pid:random, unique per engine open (two engines in one process differ too)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


class Lease:
    """This engine's claim on a namespace. ``epoch`` is 0 until ``try_acquire`` succeeds."""

    def __init__(self, dsn: str, namespace: str, ttl: float, owner: str | None = None) -> None:
        if not ttl > 0:
            raise ValueError(f"lease_ttl must be a positive number of seconds, not {ttl!r}")
        self.namespace = namespace
        self.ttl = float(ttl)
        self.owner = owner or new_owner_id()
        self.epoch = 0
        #: Set once a renewal found the lease gone: it never comes back.
        self.lost = threading.Event()
        #: Called (on the renewal thread) when a renewal finds the lease gone.
        self.on_lost: Callable[[], None] | None = None
        #: Until when (on this process's monotonic clock) the lease is surely this engine's.
        self.holding = Holding(self.ttl, time.monotonic)
        self._table = table(namespace, "lease")
        self._dsn = dsn
        self._conn: Any = connect(dsn, "lease")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def renewing(self) -> bool:
        """Whether a thread renews this lease now."""
        return self._thread is not None

    # --- the routing-facing interface --------------------------------------------

    def try_acquire(self) -> bool:
        """Takes the lease if it is free or expired (epoch + 1); True if this engine now holds it.

        Holding it already counts as success (the lease is renewed then).
        """
        if self.epoch and self.renew():
            return True
        sent = self.holding.clock()
        row = self._conn.execute(
            f"""UPDATE {self._table}
                   SET owner = %s, epoch = epoch + 1, expires_at = now() + %s * interval '1 second',
                       address = NULL
                 WHERE id AND (owner IS NULL OR expires_at <= now())
             RETURNING epoch""",
            (self.owner, self.ttl),
        ).fetchone()
        if row is None:
            return False
        self.epoch = int(row[0])
        self.lost.clear()
        self.holding.held(sent)
        return True

    def wait_acquire(self, stop: threading.Event) -> bool:
        """Tries every third of the TTL until the lease is taken (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            if self.try_acquire():
                return True
            stop.wait(self.ttl / 3)
        return False

    def holds(self) -> bool:
        """Whether the lease is surely this engine's now, by its own clock (no statement: a step
        asks it before it begins). False once it lapsed, even if no renewal has failed yet."""
        return not self.lost.is_set() and self.holding.holds()

    def still_held(self) -> bool:
        """Whether the server says this engine holds the lease now (owner, epoch, not expired)."""
        if not self.epoch:
            return False
        row = self._conn.execute(
            f"SELECT 1 FROM {self._table} WHERE id AND owner = %s AND epoch = %s AND expires_at > now()",
            (self.owner, self.epoch),
        ).fetchone()
        return row is not None

    def publish(self, address: str) -> None:
        """Records where this engine serves (for routing), while it holds the lease."""
        self._conn.execute(
            f"UPDATE {self._table} SET address = %s WHERE id AND owner = %s AND epoch = %s",
            (address, self.owner, self.epoch),
        )

    def routing_secret(self) -> bytes:
        """The key the namespace's engines authenticate routed calls with (see ``fusee.scale.tcp``)."""
        from fusee.storage.postgres import schema

        return schema.routing_secret(self._conn, self.namespace)

    def owner_address(self) -> str | None:
        """The address the live holder published (None: no live holder, or none published)."""
        holder = self.holder()
        return holder.address if holder is not None else None

    def release(self) -> None:
        """Stops renewing and frees the lease if still ours (the next engine need not wait out the TTL)."""
        self.stop_renewing()
        self.holding.drop()
        if self._closed:
            return
        try:
            if self.epoch:
                self._conn.execute(
                    f"""UPDATE {self._table} SET owner = NULL, expires_at = '-infinity', address = NULL
                         WHERE id AND owner = %s AND epoch = %s""",
                    (self.owner, self.epoch),
                )
        except Exception as e:  # it expires on its own: the next engine waits one TTL at most
            logger.warning("could not release the lease of namespace %r: %s", self.namespace, e)
        finally:
            self._closed = True
            self._conn.close()

    # --- renewal -------------------------------------------------------------------

    def holder(self) -> Holder | None:
        """The live holder (unexpired, not released), or None."""
        row = self._conn.execute(
            f"""SELECT owner, epoch, extract(epoch FROM expires_at - now()), address FROM {self._table}
                 WHERE id AND owner IS NOT NULL AND expires_at > now()""",
        ).fetchone()
        if row is None:
            return None
        return Holder(row[0], int(row[1]), float(row[2]), row[3])

    def renew(self) -> bool:
        """Extends the lease by a TTL if it is still ours and unexpired; False (and ``lost`` set) if not."""
        # Only an unexpired lease is renewed (see fusee.scale.expiring): a lapsed one is taken again.
        unexpired = "" if sabotage.active.renewal_ignores_expiry else " AND expires_at > now()"
        sent = self.holding.clock()
        row = self._conn.execute(
            f"""UPDATE {self._table} SET expires_at = now() + %s * interval '1 second'
                 WHERE id AND owner = %s AND epoch = %s{unexpired}
             RETURNING epoch""",
            (self.ttl, self.owner, self.epoch),
        ).fetchone()
        if row is None:
            self.lost.set()
            self.holding.drop()
            return False
        self.holding.held(sent)
        return True

    def start_renewing(self) -> None:
        """Renews every third of the TTL on a thread until ``stop_renewing`` or the lease is lost
        (then ``on_lost`` is called, on that thread)."""
        assert self._thread is None and self.epoch
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop,
                                        name=f"fusee-lease-{self.namespace}", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        """Stops the renewal thread (the lease then expires one TTL after its last renewal)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _reconnect_if_broken(self) -> None:
        if not (self._conn.closed or self._conn.broken) or self._stop.is_set():
            return
        try:
            self._conn = connect(self._dsn, "lease")
        except Exception as e:
            logger.warning("reconnecting for the lease of namespace %r failed: %s", self.namespace, e)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if self.renew():
                    continue
            except Exception as e:
                # A transient failure: the next tick tries again (on a new connection if this
                # one broke). If the lease expires meanwhile, the next renewal (and every
                # flush) finds it gone.
                logger.warning("renewing the lease of namespace %r failed: %s", self.namespace, e)
                self._reconnect_if_broken()
                continue
            logger.error("the lease of namespace %r (epoch %d) was lost: another engine may serve it; "
                         "this engine acknowledges nothing more", self.namespace, self.epoch)
            if self.on_lost is not None:
                self.on_lost()
            return
