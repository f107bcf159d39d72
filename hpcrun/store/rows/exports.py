"""Outputs sent on to ``outputs.export``: one row per input, written by the supervisor's exporter.

An input's row appears once the input is done; it stays ``pending`` (with a not-before time)
until a copy is verified at the destination (``verified``) or the attempts run out
(``failed``: the output stays on the cluster's filesystem, and an operator can re-arm it).
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable, List, Optional, Sequence, Set, Tuple

from sqlalchemy import func, insert, select, update

from hpcrun.store.base import StoreBase, _chunks, _now
from hpcrun.store.records import ExportRecord, ExportSummary
from hpcrun.store.sql import schema

_STATES = ("pending", "verified", "failed")


class Exports(StoreBase):
    """Export rows (a mixin of StateStore)."""

    def done_unexported(self, campaign_id: int, limit: int = 10000) -> List[Tuple[int, str, Optional[int]]]:
        """Done inputs with no export row yet: (input id, path, plan job)."""
        i, e = schema.input_file, schema.export
        query = (select(i.c.id, i.c.path, i.c.job_index)
                 .select_from(i.outerjoin(e, e.c.input_id == i.c.id))
                 .where(i.c.campaign_id == campaign_id, i.c.state == "done", e.c.input_id.is_(None))
                 .order_by(i.c.id).limit(limit))
        with self._read() as conn:
            return [(int(r[0]), r[1], r[2]) for r in conn.execute(query)]

    def queue_exports(self, campaign_id: int, rows: Iterable[Tuple[int, str, str]]) -> int:
        """Add (input id, source, destination) rows as pending; an input that has one keeps it."""
        now = _now()
        rows_list = list(rows)
        values = [{"input_id": iid, "campaign_id": campaign_id, "source": src, "dest": dest, "state": "pending",
                   "attempts": 0, "next_at": now, "updated_at": now} for iid, src, dest in rows_list]
        if not values:
            return 0
        e = schema.export
        with self._write() as conn:
            have: Set[int] = set()
            for chunk in _chunks([int(iid) for iid, _, _ in rows_list]):
                have.update(r[0] for r in conn.execute(select(e.c.input_id).where(e.c.input_id.in_(chunk))))
            fresh = [v for v in values if v["input_id"] not in have]
            if fresh:
                conn.execute(insert(e), fresh)
        return len(fresh)

    def due_exports(self, campaign_id: int, limit: int, skip: Sequence[int] = ()) -> List[ExportRecord]:
        """Pending exports whose wait is over, oldest first (``skip``: those being copied now)."""
        e = schema.export
        query = (select(e).where(e.c.campaign_id == campaign_id, e.c.state == "pending", e.c.next_at <= _now())
                 .order_by(e.c.next_at, e.c.input_id).limit(limit + len(skip)))
        with self._read() as conn:
            rows = [_record(r) for r in conn.execute(query)]
        busy = set(skip)
        return [r for r in rows if r.input_id not in busy][:limit]

    def record_export(self, input_id: int, *, state: str, attempts: int, next_at: Optional[dt.datetime] = None,
                      error: Optional[str] = None, size: Optional[int] = None, checksum: Optional[str] = None,
                      seconds: Optional[float] = None) -> None:
        """One attempt's outcome: verified (size, checksum, time), or failed and when to try again."""
        assert state in _STATES, state
        values = {"state": state, "attempts": attempts, "updated_at": _now(), "last_error": error}
        if next_at is not None:
            values["next_at"] = next_at
        if state == "verified":
            values.update(bytes=size, checksum=checksum, seconds=seconds)
        e = schema.export
        with self._write() as conn:
            conn.execute(update(e).where(e.c.input_id == input_id).values(**values))

    def rearm_exports(self, campaign_id: int) -> int:
        """Given-up exports back to pending with a fresh budget (an operator fixed the destination)."""
        e = schema.export
        with self._write() as conn:
            done = conn.execute(update(e).where(e.c.campaign_id == campaign_id, e.c.state == "failed")
                                .values(state="pending", attempts=0, next_at=_now(), updated_at=_now()))
        return int(done.rowcount or 0)

    def exports(self, campaign_id: int) -> List[ExportRecord]:
        e = schema.export
        with self._read() as conn:
            return [_record(r) for r in conn.execute(
                select(e).where(e.c.campaign_id == campaign_id).order_by(e.c.input_id))]

    def export_summary(self, campaign_id: int) -> Optional[ExportSummary]:
        """None when the campaign has sent nothing on (no export rows)."""
        e = schema.export
        with self._read() as conn:
            counts = {s: int(n) for s, n in conn.execute(
                select(e.c.state, func.count()).where(e.c.campaign_id == campaign_id).group_by(e.c.state))}
            if not counts:
                return None
            size, secs, attempts = conn.execute(
                select(func.coalesce(func.sum(e.c.bytes), 0), func.coalesce(func.sum(e.c.seconds), 0.0),
                       func.coalesce(func.sum(e.c.attempts), 0)).where(e.c.campaign_id == campaign_id)).one()
            last = conn.execute(select(e.c.last_error).where(e.c.campaign_id == campaign_id,
                                                             e.c.last_error.is_not(None), e.c.state != "verified")
                                .order_by(e.c.updated_at.desc()).limit(1)).scalar()
        files = {s: counts.get(s, 0) for s in _STATES}
        return ExportSummary(files, int(size), float(secs), int(attempts) - files["verified"], last)


def _record(r: object) -> ExportRecord:
    m = r._mapping  # type: ignore[attr-defined]
    return ExportRecord(int(m["input_id"]), m["source"], m["dest"], m["state"], int(m["attempts"]), m["bytes"],
                        m["checksum"], m["seconds"], m["last_error"], m["next_at"])
