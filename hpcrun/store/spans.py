"""What a forecast reads: each run's span (from its latest observation) and the campaign's inputs in
total (bytes, events, how many are left), in two queries."""

from __future__ import annotations

from typing import List

from sqlalchemy import case, func, select

from hpcrun.store import schema
from hpcrun.store.queries import Queries, _int_sum
from hpcrun.store.records import InputTotals, RunSpan

# the scheduler's words for a run that ended (hpcrun.backends.scheduler.base.TERMINAL plus LOST)
_RUNNING = "RUNNING"


class Spans(Queries):
    """Run spans and input totals (a mixin of StateStore)."""

    def run_spans(self, campaign_id: int) -> List[RunSpan]:
        """Every run that started: its state, start, end (None: running), elapsed, CPUs and inputs."""
        s, sc, link = schema.submission, schema.state_change, schema.submission_input
        latest = (select(sc.c.submission_id, func.max(sc.c.id).label("change_id"))
                  .join(s, s.c.id == sc.c.submission_id).where(s.c.campaign_id == campaign_id)
                  .group_by(sc.c.submission_id).subquery())
        carried = (select(link.c.submission_id, func.count().label("inputs"))
                   .join(s, s.c.id == link.c.submission_id).where(s.c.campaign_id == campaign_id)
                   .group_by(link.c.submission_id).subquery())
        query = (select(sc.c.slurm_state, sc.c.started_at, sc.c.ended_at, sc.c.elapsed_s, sc.c.alloc_cpus,
                        carried.c.inputs, s.c.failure_class)
                 .select_from(latest.join(sc, sc.c.id == latest.c.change_id)
                              .join(s, s.c.id == latest.c.submission_id)
                              .outerjoin(carried, carried.c.submission_id == latest.c.submission_id))
                 .where(sc.c.started_at.is_not(None)))
        with self._read() as conn:
            return [RunSpan(r[0], r[1], r[2] if r[0] != _RUNNING else None, r[3], r[4], int(r[5] or 0),
                            r[6]) for r in conn.execute(query)]

    def input_totals(self, campaign_id: int) -> InputTotals:
        """Inputs listed now: how many, their bytes and events (where known), and how many are not ended."""
        t = schema.input_file
        open_states = ("pending", "submitted", "running", "failed")
        query = (select(func.count(), _int_sum(t.c.size), _int_sum(t.c.events),
                        func.sum(case((t.c.events.is_(None), 1), else_=0)),
                        func.sum(case((t.c.state.in_(open_states), 1), else_=0)),
                        func.sum(case((t.c.state == "done", 1), else_=0)))
                 .where(t.c.campaign_id == campaign_id, t.c.withdrawn_in.is_(None)))
        with self._read() as conn:
            n, size, events, no_events, left, done = conn.execute(query).one()
        return InputTotals(int(n or 0), int(size or 0), int(events or 0) if not no_events else None,
                           int(left or 0), int(done or 0))
