"""Fencing: a lock's lease and the check every write of its holder makes.

The supervisor and submit locks (store/locking/lock.py) are held by OS or server sessions; a session
the server dropped (a restart, a network blip, a hung login node reaped) loses its lock without
its process knowing. So each lock comes with a lease: taking it bumps an epoch, and a store that
holds a lease (``StoreBase.fence``) checks in every write transaction that the epoch is still its
own, under a share lock on the lease row, so that a takeover's bump waits for the writes in
flight and every later write of the old holder is refused by the store itself (:class:`Fenced`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from hpcrun.errors import HpcrunError
from hpcrun.store.sql import schema


class Fenced(HpcrunError):
    """This process's lease was taken by another: it must stop, having written nothing more."""

    exit_code = 4


@dataclass(frozen=True)
class Lease:
    campaign_id: int
    purpose: str
    epoch: int
    holder: str


def check_fence(conn: Connection, lease: Lease, location: str) -> None:
    """Refuse this transaction unless ``lease`` is still current (share-locks the lease row)."""
    t = schema.lease
    row = conn.execute(select(t.c.epoch, t.c.holder, t.c.taken_at)
                       .where(t.c.campaign_id == lease.campaign_id, t.c.purpose == lease.purpose)
                       .with_for_update(read=True)).first()
    if row is not None and row.epoch == lease.epoch:
        return
    holder = f"{row.holder} (since {row.taken_at:%Y-%m-%d %H:%M:%S} UTC)" if row is not None else "nobody"
    raise lost(location, lease.holder, lease.purpose, holder)


def lost(location: str, mine: str, purpose: str, holder: str) -> Fenced:
    """The one paragraph a process that lost its lock stops with (from the store, or on reconnecting)."""
    return Fenced(
        f"{location}: this process ({mine}) no longer holds the campaign's {purpose} lock: it is now held "
        f"by {holder}. Its database session was dropped while it ran, and another process took the lock "
        f"over; this one stops here and has submitted and recorded nothing since. `hpcrun status` shows "
        f"who drives the campaign now.")
