"""The rules of a lease that expires: take, renew, fence. One lease row per namespace.

PostgreSQL applies these rules in SQL, judged by the server's clock
(:mod:`fusee.storage.postgres.lease` and the fenced statements of
:mod:`fusee.storage.postgres.log`); the simulator applies them here, on a
simulated clock, to the same engine (:mod:`fusee.sim.expiry`). The two must say
the same thing:

- **take**: a lease that is free (released) or expired goes to the taker with
  ``epoch + 1`` until ``now + ttl``; a live one cannot be taken.
- **renew**: extends by a TTL a lease that is still the renewer's epoch *and
  has not expired*. A lapsed lease is never revived: its holder must take it
  again, under a new epoch, and recover, because another engine may have seen
  it lapse and acted on it.
- **fence**: a write (a flush, a checkpoint) is accepted only while the writer
  holds the lease: its owner and epoch, not expired. A writer that lost it
  (paused past the TTL, cut off) makes nothing durable any more.
- **act**: a step's function, which no fence reaches, begins only while the
  holder's own clock says the lease is still its own: before the send time of
  its last successful take or renewal plus the TTL
  (:class:`fusee.storage.holding.Holding`, which both apply). A write that comes
  back committed after a pause proves nothing about now.
"""

from __future__ import annotations

import dataclasses

from fusee import sabotage
from fusee.errors import LeaseLost


@dataclasses.dataclass
class LeaseRow:
    """The namespace's one lease row (``owner`` None: released)."""

    owner: str | None = None
    epoch: int = 0
    expires_at: float = float("-inf")

    def live(self, now: float) -> bool:
        return self.owner is not None and self.expires_at > now

    def held_by(self, owner: str, epoch: int, now: float) -> bool:
        return self.owner == owner and self.epoch == epoch and self.expires_at > now


def take(row: LeaseRow, owner: str, now: float, ttl: float) -> int | None:
    """Takes a free or expired lease; the new epoch, or None while another holder's is live."""
    if row.live(now):
        return None
    row.owner, row.epoch, row.expires_at = owner, row.epoch + 1, now + ttl
    return row.epoch


def renew(row: LeaseRow, owner: str, epoch: int, now: float, ttl: float) -> bool:
    """Extends the renewer's own unexpired lease; False once it lapsed or another took it."""
    mine = row.owner == owner and row.epoch == epoch
    if not mine or (row.expires_at <= now and not sabotage.active.renewal_ignores_expiry):
        return False
    row.expires_at = now + ttl
    return True


def release(row: LeaseRow, owner: str, epoch: int) -> None:
    """Frees the lease if it is still the caller's (the next taker need not wait out the TTL)."""
    if row.owner == owner and row.epoch == epoch:
        row.owner, row.expires_at = None, float("-inf")


def check_fence(row: LeaseRow, owner: str, epoch: int, now: float, namespace: str) -> None:
    """Raises :class:`fusee.errors.LeaseLost` unless the writer holds the lease now."""
    if sabotage.active.append_skips_epoch_check or row.held_by(owner, epoch, now):
        return
    holder = (f"it is now held by {row.owner} with epoch {row.epoch}" if row.live(now)
              else "it expired and nobody holds it now")
    raise LeaseLost(
        f"this engine lost the lease of {namespace!r} (its epoch was {epoch}; {holder}): the write "
        "made nothing durable and the log takes no more records. Another engine may serve it: "
        "close this one; nothing it acknowledged is lost."
    )
