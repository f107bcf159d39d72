"""The supervisor's row: who drives the campaign and its heartbeat.

The OS or server lock (hpcrun/store/locking/lock.py) decides who may supervise; this row is what
everyone else sees: ``status``, the web view and a supervisor that takes over after a
crash. Every beat names its holder, so a supervisor that finds another holder's name in
the row (it lost the row to a takeover while it hung) knows to stop.
"""

from __future__ import annotations

import datetime as dt
from typing import List, Optional

from sqlalchemy import insert, select, update

from hpcrun.store.base import StoreBase, _now, _whoami
from hpcrun.store.records import ClusterHealth, Outage, SupervisorRecord
from hpcrun.store.sql import schema

_COLUMNS = ("holder", "started_at", "heartbeat_at", "rounds", "phase", "note", "poll_interval_s")


class Supervision(StoreBase):
    """Supervisor rows (a mixin of StateStore)."""

    def supervisor(self, campaign_id: int) -> Optional[SupervisorRecord]:
        t = schema.supervisor
        with self._read() as conn:
            row = conn.execute(select(*(t.c[n] for n in _COLUMNS)).where(t.c.campaign_id == campaign_id)).first()
        return None if row is None else SupervisorRecord(*row)

    def begin_supervising(self, campaign_id: int, holder: Optional[str] = None) -> Optional[SupervisorRecord]:
        """Write this process as the campaign's supervisor; returns the row it replaces (a takeover)."""
        t = schema.supervisor
        now = _now()
        values = {"holder": holder or _whoami(), "started_at": now, "heartbeat_at": now, "rounds": 0,
                  "phase": "running", "note": None, "poll_interval_s": None}
        with self._write() as conn:
            row = conn.execute(select(*(t.c[n] for n in _COLUMNS)).where(t.c.campaign_id == campaign_id)).first()
            if row is None:
                conn.execute(insert(t).values(campaign_id=campaign_id, **values))
                return None
            conn.execute(update(t).where(t.c.campaign_id == campaign_id).values(**values))
        return SupervisorRecord(*row)

    def beat(self, campaign_id: int, holder: str, *, rounds: int, phase: str, note: str,
             poll_interval_s: Optional[float]) -> bool:
        """Record a round; False when another supervisor has taken the row over (this one must stop)."""
        t = schema.supervisor
        with self._write(inputs=False) as conn:
            done = conn.execute(update(t).where(t.c.campaign_id == campaign_id, t.c.holder == holder).values(
                heartbeat_at=_now(), rounds=rounds, phase=phase, note=note[:4000],
                poll_interval_s=poll_interval_s))
        return bool(done.rowcount)

    # -- the clusters of a campaign on several -------------------------------------------------
    def record_cluster_health(self, campaign_id: int, name: Optional[str], state: str, detail: str = "") -> None:
        """What a submit or poll found of one cluster; ``since`` moves only when the state changes."""
        t = schema.cluster_health
        key = name or ""
        now = _now()
        with self._write() as conn:
            row = conn.execute(select(t.c.state).where(t.c.campaign_id == campaign_id, t.c.name == key)).first()
            if row is None:
                conn.execute(insert(t).values(campaign_id=campaign_id, name=key, state=state, detail=detail[:2000],
                                              since=now, checked_at=now))
                return
            values = {"state": state, "detail": detail[:2000], "checked_at": now}
            if row[0] != state:
                values["since"] = now
            conn.execute(update(t).where(t.c.campaign_id == campaign_id, t.c.name == key).values(**values))

    def cluster_health(self, campaign_id: int) -> List[ClusterHealth]:
        t = schema.cluster_health
        with self._read() as conn:
            rows = conn.execute(select(t.c.name, t.c.state, t.c.detail, t.c.since, t.c.checked_at)
                                .where(t.c.campaign_id == campaign_id).order_by(t.c.name))
            return [ClusterHealth(r[0] or None, r[1], r[2] or "", r[3], r[4]) for r in rows]

    # -- daemons that do not answer (scheduler outages) ---------------------------------------
    def record_outage(self, campaign_id: int, cluster: Optional[str], daemon: str, detail: str,
                      since: Optional[dt.datetime] = None) -> bool:
        """``daemon`` of ``cluster`` did not answer now (a new outage began at ``since``, default now); True
        when this begins an outage (it was answering)."""
        t = schema.outage
        key = (t.c.campaign_id == campaign_id, t.c.cluster == (cluster or ""), t.c.daemon == daemon)
        now = _now()
        began = since or now
        with self._write() as conn:
            row = conn.execute(select(t.c.ended_at).where(*key)).first()
            if row is None:
                conn.execute(insert(t).values(campaign_id=campaign_id, cluster=cluster or "", daemon=daemon,
                                              detail=detail[:2000], since=began, checked_at=now, ended_at=None))
                return True
            values = {"detail": detail[:2000], "checked_at": now}
            if row[0] is not None:   # answered in between: a new outage
                values.update(since=began, ended_at=None)
            conn.execute(update(t).where(*key).values(**values))
            return row[0] is not None

    def end_outage(self, campaign_id: int, cluster: Optional[str], daemon: str) -> Optional[Outage]:
        """``daemon`` of ``cluster`` answered: the outage it ends (None: there was none)."""
        t = schema.outage
        key = (t.c.campaign_id == campaign_id, t.c.cluster == (cluster or ""), t.c.daemon == daemon,
               t.c.ended_at.is_(None))
        now = _now()
        with self._write(inputs=False) as conn:
            row = conn.execute(select(t.c.detail, t.c.since).where(*key)).first()
            if row is None:
                return None
            conn.execute(update(t).where(*key).values(ended_at=now, checked_at=now))
        return Outage(cluster, daemon, row[0] or "", row[1], now, now)

    def outages(self, campaign_id: int) -> List[Outage]:
        """Every daemon's last outage, open ones (still not answering) first."""
        t = schema.outage
        with self._read() as conn:
            rows = conn.execute(select(t.c.cluster, t.c.daemon, t.c.detail, t.c.since, t.c.checked_at, t.c.ended_at)
                                .where(t.c.campaign_id == campaign_id))
            found = [Outage(r[0] or None, r[1], r[2] or "", r[3], r[4], r[5]) for r in rows]
        return sorted(found, key=lambda o: (not o.open, o.cluster or "", o.daemon))
