"""What a forecast reads, in bounded queries however long the campaign: the latest runs that ended
and those running now (a sample of at most ``SAMPLE`` each, newest first), how many of each there
are, and the campaign's inputs in total (bytes, events, how many are left)."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from sqlalchemy import and_, case, func, select

from hpcrun.backends.scheduler.base import TERMINAL
from hpcrun.store.base import _chunks
from hpcrun.store.queries import Queries, _int_sum
from hpcrun.store.records import InputTotals, RunSample, RunSpan
from hpcrun.store.sql import schema

SAMPLE = 2000   # runs read per kind (ended, running): the forecast's view of a 10^5-job campaign
_ENDED = tuple(sorted(TERMINAL | {"LOST"}))   # the states of a run that ended, as the store keeps them


class Spans(Queries):
    """Run samples and input totals (a mixin of StateStore)."""

    def run_sample(self, campaign_id: int, limit: int = SAMPLE) -> RunSample:
        """The newest ``limit`` ended runs and up to ``limit`` running ones (each with its inputs), and how
        many of each there are."""
        s, sc = schema.submission, schema.state_change
        cols = (sc.c.submission_id, sc.c.slurm_state, sc.c.started_at, sc.c.ended_at, sc.c.elapsed_s,
                sc.c.alloc_cpus)
        mine = and_(s.c.id == sc.c.submission_id, s.c.campaign_id == campaign_id)
        ended_where = (sc.c.ended_at.is_not(None), sc.c.started_at.is_not(None), sc.c.slurm_state.in_(_ENDED),
                       s.c.last_state == sc.c.slurm_state)
        # any of the running ones will do (they all run now): no order, so the query stops at the limit
        running_q = (select(*cols).join(s, mine).where(sc.c.slurm_state == "RUNNING", s.c.last_state == "RUNNING",
                                                       sc.c.started_at.is_not(None)).limit(limit))
        count_q = (select(func.sum(case((s.c.last_state.in_(_ENDED), 1), else_=0)),
                          func.sum(case((s.c.last_state == "RUNNING", 1), else_=0)))
                   .where(s.c.campaign_id == campaign_id))
        with self._read() as conn:
            ended, running = conn.execute(count_q).one()
            rows = self._newest(conn, cols, mine, ended_where, min(limit, int(ended or 0)))
            rows += list(conn.execute(running_q))
            inputs = self._inputs_of(conn, [r[0] for r in rows])
        spans = [RunSpan(r[1], r[2], r[3] if r[1] != "RUNNING" else None, r[4], r[5], inputs.get(r[0], 0))
                 for r in rows]
        return RunSample(spans, int(ended or 0), int(running or 0))

    @staticmethod
    def _newest(conn: Any, cols: Sequence[Any], mine: Any, where: Sequence[Any], want: int) -> List[Any]:
        """The newest ``want`` observations matching ``where``, read from the top of the table down in
        widening slices of ids (the primary key), not by sorting every observation of the campaign."""
        sc = schema.state_change
        top = conn.execute(select(func.max(sc.c.id))).scalar() or 0
        width = max(1, 4 * want)
        while want:
            low = max(0, top - width)
            rows = list(conn.execute(select(*cols).join(schema.submission, mine)
                                     .where(sc.c.id > low, *where).order_by(sc.c.id.desc()).limit(want)))
            if len(rows) >= want or low == 0:
                return rows
            width *= 4
        return []

    @staticmethod
    def _inputs_of(conn: Any, ids: Sequence[int]) -> Dict[int, int]:
        link = schema.submission_input
        out: Dict[int, int] = {}
        for chunk in _chunks(sorted(set(ids))):
            q = (select(link.c.submission_id, func.count()).where(link.c.submission_id.in_(chunk))
                 .group_by(link.c.submission_id))
            out.update((int(k), int(n)) for k, n in conn.execute(q))
        return out

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
