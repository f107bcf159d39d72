"""Who may change a campaign, and what operators did to it: leases (store/locking/fence.py), the audit
trail and the pause switch (a mixin of StateStore)."""

from __future__ import annotations

import datetime as dt
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from hpcrun.store.base import StoreBase, _now, _whoami
from hpcrun.store.locking.fence import Lease
from hpcrun.store.sql import schema


@dataclass(frozen=True)
class AuditEntry:
    at: dt.datetime
    who: str
    command: str
    detail: str


@dataclass(frozen=True)
class PauseRecord:
    by: str
    at: dt.datetime
    note: Optional[str]

    def text(self) -> str:
        """``paused by USER@HOST at TIME (note)``, as status and the live page show it."""
        who = self.by.rpartition(":")[0] or self.by
        return f"paused by {who} at {self.at:%Y-%m-%d %H:%M:%S} UTC" + (f" ({self.note})" if self.note else "")


class Control(StoreBase):
    """Leases, audit trail, pause (a mixin of StateStore)."""

    def take_lease(self, campaign_id: int, purpose: str, holder: Optional[str] = None) -> Lease:
        """Bump the lease's epoch for this holder (call with the matching lock held) and fence this store.

        Other leases this store holds are checked as usual: a supervisor that lost its own lease
        cannot take the submit lease either."""
        t = schema.lease
        holder = holder or _whoami()
        self.fences.pop(purpose, None)
        with self._write(inputs=False) as conn:
            row = conn.execute(select(t.c.epoch).where(t.c.campaign_id == campaign_id, t.c.purpose == purpose)
                               .with_for_update()).first()
            epoch = 1 if row is None else int(row.epoch) + 1
            values = {"epoch": epoch, "holder": holder[:300], "taken_at": _now()}
            if row is None:
                conn.execute(insert(t).values(campaign_id=campaign_id, purpose=purpose, **values))
            else:
                conn.execute(update(t).where(t.c.campaign_id == campaign_id, t.c.purpose == purpose).values(**values))
        lease = self.fences[purpose] = Lease(campaign_id, purpose, epoch, holder)
        return lease

    def lease(self, campaign_id: int, purpose: str) -> Optional[Lease]:
        t = schema.lease
        with self._read() as conn:
            row = conn.execute(select(t.c.epoch, t.c.holder)
                               .where(t.c.campaign_id == campaign_id, t.c.purpose == purpose)).first()
        return None if row is None else Lease(campaign_id, purpose, int(row.epoch), row.holder)

    def drop_fence(self, purpose: str) -> None:
        self.fences.pop(purpose, None)

    @contextmanager
    def leased(self, campaign_id: int, purpose: str) -> Iterator[None]:
        """The lease that goes with a lock just taken: this store's writes are fenced while it holds it."""
        self.take_lease(campaign_id, purpose)
        try:
            yield
        finally:
            self.drop_fence(purpose)

    def check_fences(self) -> None:
        """Raise Fenced unless every lease this store holds is still its own (before an action the
        store cannot undo, such as handing a job to the scheduler)."""
        if self.fences:
            with self._write():
                pass

    # -- the audit trail ---------------------------------------------------------------------
    def audit(self, campaign_id: int, command: str, detail: str, who: Optional[str] = None) -> None:
        """Record an operator's (or the supervisor's) state-changing action."""
        with self._write(inputs=False) as conn:
            self._audit(conn, campaign_id, command, detail, who)

    @staticmethod
    def _audit(conn: Connection, campaign_id: int, command: str, detail: str, who: Optional[str] = None) -> None:
        conn.execute(insert(schema.audit).values(campaign_id=campaign_id, at=_now(), who=(who or _whoami())[:300],
                                                 command=command[:64], detail=detail[:4000]))

    def audit_log(self, campaign_id: int, limit: int = 10_000) -> List[AuditEntry]:
        t = schema.audit
        with self._read() as conn:
            rows = conn.execute(select(t.c.at, t.c.who, t.c.command, t.c.detail)
                                .where(t.c.campaign_id == campaign_id).order_by(t.c.id.desc()).limit(limit)).all()
        return [AuditEntry(*r) for r in reversed(rows)]

    # -- pause ---------------------------------------------------------------------------------
    def pause(self, campaign_id: int, note: Optional[str] = None) -> Optional[PauseRecord]:
        """Hold new submissions (the supervisor keeps polling); returns the pause already in force, if any."""
        t = schema.pause
        with self._write() as conn:
            row = conn.execute(select(t.c.by, t.c.at, t.c.note).where(t.c.campaign_id == campaign_id)).first()
            if row is not None:
                return PauseRecord(*row)
            who = _whoami()
            conn.execute(insert(t).values(campaign_id=campaign_id, by=who[:300], at=_now(), note=note))
            self._audit(conn, campaign_id, "pause", "new submissions held" + (f": {note}" if note else ""), who)
        return None

    def resume(self, campaign_id: int) -> Optional[PauseRecord]:
        """Lift the pause; returns it (None: the campaign was not paused)."""
        t = schema.pause
        with self._write() as conn:
            row = conn.execute(select(t.c.by, t.c.at, t.c.note).where(t.c.campaign_id == campaign_id)).first()
            if row is None:
                return None
            conn.execute(delete(t).where(t.c.campaign_id == campaign_id))
            self._audit(conn, campaign_id, "resume", f"submissions allowed again (paused by {row.by})")
        return PauseRecord(*row)

    def paused(self, campaign_id: int) -> Optional[PauseRecord]:
        t = schema.pause
        with self._read() as conn:
            row = conn.execute(select(t.c.by, t.c.at, t.c.note).where(t.c.campaign_id == campaign_id)).first()
        return None if row is None else PauseRecord(*row)
