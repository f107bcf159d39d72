"""Failed plan jobs for the retry policy, and the policy's decisions written back in one transaction.

The store does not decide: it hands each failed job's last attempt (state, exit code, node,
memory used, the changes that attempt carried) and its earlier failures by class to the
policy (hpcrun/operate/retries/policy.py), then applies what it decided: back to pending with the
changes for the next submission, or parked with the reason. The class is written on the
failed submission, so later decisions and the report count attempts by class.
"""

from __future__ import annotations

import datetime as dt
from typing import Dict, List, Optional, Sequence, Set

from sqlalchemy import func, insert, or_, select, update

from hpcrun.store.base import StoreBase, _now
from hpcrun.store.records import ActiveSubmission, FailedJob, RetryDecision
from hpcrun.store.sql import schema

# the words that mark a submission sent to its inputs' node, and a job released from that wish
LOCALITY_WORDS = "locality: on node "
RELEASED_WORDS = "locality: waited "


class Failures(StoreBase):
    """Failed jobs in, retry decisions out (a mixin of StateStore)."""

    def failed_jobs(self, campaign_id: int, job_indices: Optional[Sequence[int]] = None) -> List[FailedJob]:
        t, s, c = schema.input_file, schema.submission, schema.state_change
        query = (select(t.c.job_index, func.max(t.c.attempts), func.max(t.c.last_submission_id),
                        func.max(t.c.adjust), func.max(t.c.last_reason))
                 .where(t.c.campaign_id == campaign_id, t.c.state == "failed", t.c.job_index.is_not(None))
                 .group_by(t.c.job_index).order_by(t.c.job_index))
        with self._read() as conn:
            rows = [r for r in conn.execute(query) if job_indices is None or r[0] in job_indices]
            sub_ids = [int(r[2]) for r in rows if r[2] is not None]
            last_seen = (select(c.c.submission_id, func.max(c.c.id)).group_by(c.c.submission_id))
            newest = {sid: cid for sid, cid in self._rows_in(conn, last_seen, c.c.submission_id, sub_ids)}
            ends = {r[0]: r[1:] for r in self._rows_in(
                conn, select(c.c.submission_id, c.c.slurm_state, c.c.exit_code, c.c.node, c.c.max_rss_bytes,
                             c.c.reason, c.c.elapsed_s), c.c.id, list(newest.values()))}
            states = {r[0]: (r[1], r[2], r[3]) for r in self._rows_in(
                conn, select(s.c.id, s.c.last_state, s.c.cancel_requested_by, s.c.failure_class), s.c.id, sub_ids)}
            past = self._past_classes(conn, campaign_id, [int(r[0]) for r in rows])
        out = []
        for job_index, attempts, sid, adjust, last_reason in rows:
            end = ends.get(sid, (None, None, None, None, None, None))
            state, by, classed = states.get(sid, (None, None, None))
            earlier = dict(past.get(int(job_index), {}))
            if classed in earlier:   # decided before and left failed (an operator's cancel): not a failure again
                earlier[classed] -= 1
            out.append(FailedJob(int(job_index), int(attempts or 0), sid, state or end[0], end[1],
                                 end[2], end[3], end[4] or last_reason, adjust, earlier, by, end[5]))
        return out

    def request_cancel(self, campaign_id: int, job_indices: Optional[Sequence[int]], who: str) -> int:
        """Mark the latest submissions in flight of these plan jobs (None: all) as cancelled by ``who``
        before the scheduler is asked, so that the poll that sees them end CANCELLED knows the operators
        did it (not the site). Returns how many submissions were marked."""
        t, s = schema.input_file, schema.submission
        query = select(t.c.last_submission_id, t.c.job_index).where(
            t.c.campaign_id == campaign_id, t.c.state.in_(("submitted", "running")),
            t.c.last_submission_id.is_not(None))
        wanted = None if job_indices is None else set(job_indices)
        with self._write() as conn:
            ids = sorted({int(sid) for sid, job in conn.execute(query) if wanted is None or job in wanted})
            for at in range(0, len(ids), 900):
                conn.execute(update(s).where(s.c.id.in_(ids[at:at + 900])).values(cancel_requested_by=who[:300]))
        return len(ids)

    def operator_cancelled(self, campaign_id: int) -> int:
        """Inputs left failed because the campaign's operators cancelled them (``hpcrun cancel``)."""
        t, s = schema.input_file, schema.submission
        query = (select(func.count()).select_from(t.join(s, s.c.id == t.c.last_submission_id))
                 .where(t.c.campaign_id == campaign_id, t.c.state == "failed", s.c.cancel_requested_by.is_not(None)))
        with self._read() as conn:
            return int(conn.scalar(query) or 0)

    def _past_classes(self, conn: object, campaign_id: int, jobs: List[int]) -> Dict[int, Dict[str, int]]:
        """Per plan job: how many of its earlier submissions failed in each class."""
        t, s, link = schema.input_file, schema.submission, schema.submission_input
        query = (select(t.c.job_index, s.c.failure_class, func.count(s.c.id.distinct()))
                 .select_from(s.join(link, link.c.submission_id == s.c.id).join(t, t.c.id == link.c.input_id))
                 .where(s.c.campaign_id == campaign_id, s.c.failure_class.is_not(None))
                 .group_by(t.c.job_index, s.c.failure_class))
        found: Dict[int, Dict[str, int]] = {}
        for job_index, cls, n in self._rows_in(conn, query, t.c.job_index, jobs):  # type: ignore[arg-type]
            found.setdefault(int(job_index), {})[cls] = int(n)
        return found

    def apply_retry(self, campaign_id: int, decisions: Sequence[RetryDecision]) -> None:
        """Write the policy's decisions: classes on the failed submissions, inputs to pending or parked."""
        t, s = schema.input_file, schema.submission
        now = _now()
        with self._write() as conn:
            for d in decisions:
                if d.submission_id is not None:
                    conn.execute(update(s).where(s.c.id == d.submission_id).values(failure_class=d.failure_class))
                base = update(t).where(t.c.campaign_id == campaign_id, t.c.state == "failed",
                                       t.c.job_index == d.job_index)
                if d.requeue:
                    conn.execute(base.values(state="pending", adjust=d.adjust, claim_token=None, claimed_by=None,
                                             claimed_at=None, updated_at=now))
                elif d.reason is None:   # left failed for the operator (their cancellation): only classed
                    continue
                else:
                    conn.execute(base.values(state="parked", last_reason=d.reason, updated_at=now))

    def pending_adjustments(self, campaign_id: int) -> Dict[int, str]:
        """Pending plan jobs whose next submission must change something (job index -> JSON)."""
        t = schema.input_file
        query = (select(t.c.job_index, func.max(t.c.adjust))
                 .where(t.c.campaign_id == campaign_id, t.c.state == "pending", t.c.adjust.is_not(None),
                        t.c.job_index.is_not(None)).group_by(t.c.job_index))
        with self._read() as conn:
            return {int(j): a for j, a in conn.execute(query) if a}

    def record_move(self, campaign_id: int, submission_id: int, reason: str) -> int:
        """A job taken off one cluster's queue (cancelled there, confirmed gone) to go to another: its
        inputs back to pending, not counted as an attempt, the submission classed ``moved``. Returns how
        many inputs moved (0: they were no longer waiting on this submission)."""
        t, s, sc = schema.input_file, schema.submission, schema.state_change
        now = _now()
        with self._write() as conn:
            moved = conn.execute(update(t).where(
                t.c.campaign_id == campaign_id, t.c.last_submission_id == submission_id,
                t.c.state == "submitted").values(
                state="pending", attempts=t.c.attempts - 1, last_reason=reason, claim_token=None, claimed_by=None,
                claimed_at=None, updated_at=now)).rowcount
            if moved:
                conn.execute(update(s).where(s.c.id == submission_id).values(
                    failure_class="moved", last_state="CANCELLED", last_observed_at=now))
                conn.execute(insert(sc).values(submission_id=submission_id, observed_at=now, slurm_state="CANCELLED",
                                               reason=reason[:2000]))
        return int(moved or 0)

    def recent_moves(self, campaign_id: int, since: dt.datetime) -> Dict[Optional[str], int]:
        """Jobs moved off each cluster since ``since`` (a cluster that made work wait is not given more)."""
        s = schema.submission
        query = (select(s.c.cluster, func.count()).where(s.c.campaign_id == campaign_id, s.c.failure_class == "moved",
                                                        s.c.last_observed_at >= since).group_by(s.c.cluster))
        with self._read() as conn:
            return {c: int(n) for c, n in conn.execute(query)}

    def last_clusters(self, campaign_id: int) -> Dict[int, Optional[str]]:
        """Plan job -> the cluster of its latest submission (a retry's excluded nodes are that cluster's)."""
        t, s = schema.input_file, schema.submission
        query = (select(t.c.job_index, func.max(s.c.cluster)).join(s, s.c.id == t.c.last_submission_id)
                 .where(t.c.campaign_id == campaign_id, t.c.state == "pending", t.c.job_index.is_not(None))
                 .group_by(t.c.job_index))
        with self._read() as conn:
            return {int(j): c for j, c in conn.execute(query)}

    def attempts_by_class(self, campaign_id: int) -> Dict[str, int]:
        """Failed submissions per failure class (each array task counts once)."""
        s = schema.submission
        query = (select(s.c.failure_class, func.count()).where(s.c.campaign_id == campaign_id,
                                                                s.c.failure_class.is_not(None))
                 .group_by(s.c.failure_class))
        with self._read() as conn:
            return {cls: int(n) for cls, n in conn.execute(query)}

    def retry_changes(self, campaign_id: int, limit: int = 50) -> List[tuple]:
        """The latest resubmissions that changed something: (job id, array index, changes)."""
        s = schema.submission
        query = (select(s.c.job_id, s.c.array_index, s.c.changes)
                 .where(s.c.campaign_id == campaign_id, s.c.changes.is_not(None))
                 .order_by(s.c.id.desc()).limit(limit))
        with self._read() as conn:
            return [tuple(r) for r in conn.execute(query)]


    # -- jobs.locality: prefer ---------------------------------------------------------------
    def waiting_for_node(self, campaign_id: int, older_than: dt.datetime) -> List[ActiveSubmission]:
        """Submissions still pending since before ``older_than`` that asked for their inputs' node."""
        t, s = schema.input_file, schema.submission
        query = (select(s.c.id, s.c.job_id, s.c.array_index, s.c.last_state, s.c.submitted_at,
                        func.min(t.c.job_index), func.min(t.c.job_name), s.c.cluster)
                 .select_from(s.join(t, t.c.last_submission_id == s.c.id))
                 .where(s.c.campaign_id == campaign_id, t.c.state == "submitted", s.c.submitted_at < older_than,
                        or_(s.c.last_state.is_(None), s.c.last_state == "PENDING"),
                        s.c.changes.like(f"%{LOCALITY_WORDS}%"))
                 .group_by(s.c.id, s.c.job_id, s.c.array_index, s.c.last_state, s.c.submitted_at, s.c.cluster))
        with self._read() as conn:
            return [ActiveSubmission(int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in conn.execute(query)]

    def released_from_node(self, campaign_id: int) -> Set[int]:
        """Pending plan jobs that waited too long for their node: they go to any node now."""
        t = schema.input_file
        query = (select(t.c.job_index).distinct().where(
            t.c.campaign_id == campaign_id, t.c.state == "pending", t.c.job_index.is_not(None),
            t.c.last_reason.like(f"{RELEASED_WORDS}%")))
        with self._read() as conn:
            return {int(j) for j in conn.scalars(query)}
