"""Observed job states, QA outcomes and finalize rounds, written by a poll."""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sqlalchemy import func, insert, select, text, type_coerce, update
from sqlalchemy.types import NullType

from hpcrun.backends.scheduler.base import INPUT_STATE_OF, normalize_state
from hpcrun.store.base import StateStoreError, StoreBase, _failure_reason, _now
from hpcrun.store.records import (
    ActiveSubmission,
    FinalizeRecord,
    NewStateChange,
    QaResult,
    StateChangeRecord,
)
from hpcrun.store.sql import schema

# a state change's columns taken as observed (its state is normalized, its time defaults to the poll's)
_ID_CHUNK = 20000   # ids written into one IN (...) list as literals (they are our own integers)
SCAN_ABOVE = 50000  # more ids than this: one scan of the table beats looking each up by its key


def _id_chunks(ids: Sequence[int]) -> Any:
    for i in range(0, len(ids), _ID_CHUNK):
        yield ids[i:i + _ID_CHUNK]


def _id_in(column: Any, ids: Sequence[int]) -> Any:
    """``column IN (1, 2, ...)`` with the integers written into the statement: at 10^5 rows, binding
    and compiling one parameter per id cost more than the update itself."""
    return text(f"{column.table.name}.{column.name} IN ({','.join(map(str, map(int, ids)))})")


class Observations(StoreBase):
    """Observed job states, QA outcomes and finalize rounds, written by a poll."""

    def submission_inputs(self, submission_ids: Sequence[int]) -> Dict[int, List[Tuple[int, str]]]:
        """(input id, path) of each submission's inputs."""
        t, link = schema.input_file, schema.submission_input
        query = select(link.c.submission_id, t.c.id, t.c.path).join(t, t.c.id == link.c.input_id)
        out: Dict[int, List[Tuple[int, str]]] = {}
        wanted = set(submission_ids)
        with self._read() as conn:
            if len(wanted) > SCAN_ABOVE:  # many (a poll where a whole campaign ended): one scan of the links
                rows: Any = (r for r in conn.execute(query) if r[0] in wanted)
            else:   # a few thousand among 10^6 (a late-bound round): by the key, ids written into the statement
                rows = [r for chunk in _id_chunks(sorted(wanted))
                        for r in conn.execute(query.where(_id_in(link.c.submission_id, chunk)))]
            for sid, iid, path in rows:
                out.setdefault(int(sid), []).append((int(iid), path))
        return out

    def active_submissions(self, campaign_id: int, states: Sequence[str] = ("submitted", "running")
                           ) -> List[ActiveSubmission]:
        """The latest submission of every job in flight (inputs submitted or running; ``states``: only
        those), for a status poll, in the order they were made.

        Read with the driver's own cursor: at 10^5 jobs in flight SQLAlchemy's rows and the UTC type's
        conversion of each timestamp cost more than the query (one submit time per array: converted once).
        One row per input, not grouped (grouping and ordering in SQL cost twice the join): the inputs of
        one submission are one plan job's, with its index and name, so the first row of each is kept."""
        t = schema.input_file
        with self._read() as conn:
            rows = self._raw_rows(conn, self._latest().where(t.c.campaign_id == campaign_id, t.c.state.in_(states)))
        return self._as_active(rows)

    def submissions_of(self, campaign_id: int, tasks: Sequence[Tuple[str, int]]) -> List[ActiveSubmission]:
        """The submission of each (job id, array index) named, in flight or ended, with its plan job (a poll
        that reads only what changed looks these up; an older attempt's too: the store does not let its end
        change the inputs, which a newer submission holds)."""
        s, t, link = schema.submission, schema.input_file, schema.submission_input
        by_link = (select(s.c.id, s.c.job_id, s.c.array_index, s.c.last_state,
                          type_coerce(s.c.submitted_at, NullType()), t.c.job_index, t.c.job_name, s.c.cluster)
                   .select_from(s.join(link, link.c.submission_id == s.c.id).join(t, t.c.id == link.c.input_id)))
        by_job: Dict[str, List[int]] = {}
        for job_id, index in tasks:
            by_job.setdefault(job_id, []).append(int(index))
        rows: List[Any] = []
        with self._read() as conn:
            for job_id, indices in by_job.items():
                for chunk in _id_chunks(sorted(set(indices))):
                    rows += self._raw_rows(conn, by_link.where(
                        s.c.campaign_id == campaign_id, s.c.job_id == job_id, _id_in(s.c.array_index, chunk)))
        return self._as_active(rows)

    @staticmethod
    def _latest() -> Any:
        t, s = schema.input_file, schema.submission
        return (select(s.c.id, s.c.job_id, s.c.array_index, s.c.last_state, type_coerce(s.c.submitted_at, NullType()),
                       t.c.job_index, t.c.job_name, s.c.cluster)
                .select_from(t.join(s, t.c.last_submission_id == s.c.id)))

    @staticmethod
    def _as_active(rows: Sequence[Any]) -> List[ActiveSubmission]:
        first: Dict[int, Any] = {}
        for r in rows:
            first.setdefault(r[0], r)
        stamp: Dict[Any, dt.datetime] = {}

        def when(raw: Any) -> dt.datetime:
            got = stamp.get(raw)
            if got is None:
                value = dt.datetime.fromisoformat(raw) if isinstance(raw, str) else raw
                got = stamp[raw] = value.replace(tzinfo=dt.timezone.utc)
            return got
        return [ActiveSubmission(int(r[0]), r[1], r[2], r[3], when(r[4]), r[5], r[6], r[7])
                for r in map(first.__getitem__, sorted(first))]

    def active_fingerprint(self, campaign_id: int) -> Tuple[int, int, int, int]:
        """Changes whenever the set of jobs in flight or their recorded states may have changed (a
        submission, an observation, an input leaving flight): lets a poller keep its previous list."""
        t, s, sc = schema.input_file, schema.submission, schema.state_change
        with self._read() as conn:
            count, last = conn.execute(select(func.count(), func.max(t.c.last_submission_id)).where(
                t.c.campaign_id == campaign_id, t.c.state.in_(("submitted", "running")))).one()
            top_sub = conn.scalar(select(func.max(s.c.id)))
            top_change = conn.scalar(select(func.max(sc.c.id)))
        return int(count), int(last or 0), int(top_sub or 0), int(top_change or 0)

    def record_state_change(self, campaign_id: int, change: NewStateChange) -> bool:
        return self.record_state_changes(campaign_id, [change]) == 1

    def record_state_changes(self, campaign_id: int, changes: Sequence[NewStateChange]) -> int:
        """Record observations that differ from each submission's last known state; returns how many."""
        return len(self.record_transitions(campaign_id, changes))

    def record_transitions(self, campaign_id: int, changes: Sequence[NewStateChange]) -> List[int]:
        """Record observations that differ from each submission's last known state; returns the
        submissions whose transition this call recorded (what their end leads to is this caller's to do:
        another poller that saw the same end recorded nothing, and must not record its outputs again).

        A status poll observes every job each time; only transitions are stored, so polling
        is idempotent. Inputs follow the state of their latest submission (an observation of
        an older attempt, or of an input set back to pending or parked, changes nothing).
        """
        s, sc, t, camp = schema.submission, schema.state_change, schema.input_file, schema.campaign
        if not changes:
            return []
        now = _now()
        with self._write() as conn:
            # status writers of one campaign take turns (the campaign row is their lock on servers; SQLite's
            # BEGIN IMMEDIATE already serializes), so two pollers cannot both record the same transition.
            # key_share: PostgreSQL's FOR NO KEY UPDATE, which does not block submitters' foreign-key checks
            lock = select(camp.c.id).where(camp.c.id == campaign_id).with_for_update(key_share=True)
            if conn.execute(lock).first() is None:
                raise StateStoreError(f"{self.location}: no campaign with id {campaign_id}")
            sub_ids = sorted({c.submission_id for c in changes})
            known = select(s.c.id, s.c.last_state, s.c.campaign_id)
            if len(sub_ids) > SCAN_ABOVE:  # a whole-campaign poll: one scan beats many IN lists
                rows_found: List[Any] = self._raw_rows(conn, known.where(s.c.campaign_id == campaign_id))
            else:   # by the primary key alone, the campaign checked here: SQLite offered the campaign's index
                # too scans its 10^6 submissions for a few ids (0.16 s a query)
                rows_found = [r for chunk in _id_chunks(sub_ids) for r in self._raw_rows(conn, known.where(
                    _id_in(s.c.id, chunk)))]
            last: Dict[int, Optional[str]] = {r[0]: r[1] for r in rows_found if r[2] == campaign_id}
            missing = [i for i in sub_ids if i not in last]
            if missing:
                raise StateStoreError(f"{self.location}: campaign {campaign_id} has no submission with id "
                                      f"{missing[:10]}{' ...' if len(missing) > 10 else ''}")
            kept: List[NewStateChange] = []   # the transitions among the changes offered
            states: List[str] = []
            stamps: List[dt.datetime] = []
            latest: Dict[int, Tuple[str, dt.datetime]] = {}
            inputs_to: Dict[int, Tuple[str, Optional[str]]] = {}
            for c in changes:
                state = normalize_state(c.slurm_state)
                if last[c.submission_id] == state:
                    continue
                last[c.submission_id] = state
                at = c.observed_at or now
                kept.append(c)
                states.append(state)
                stamps.append(at)
                latest[c.submission_id] = (state, at)
                target = INPUT_STATE_OF.get(state)
                if target is not None:
                    why = _failure_reason(state, c.exit_code, c.signal, c.reason) if target == "failed" else None
                    inputs_to[c.submission_id] = (target, why)
            if not kept:
                return []
            columns = dict(zip(NewStateChange._fields, map(list, zip(*kept))))   # column by column
            columns.update(observed_at=stamps, slurm_state=states)
            self._insert_columns(conn, sc, columns)
            # one statement per (state, time) seen, not per row: a poll gives few distinct pairs
            by_state: Dict[Tuple[str, dt.datetime], List[int]] = {}
            for sid, state_at in latest.items():
                by_state.setdefault(state_at, []).append(sid)
            for (state, at), sids in by_state.items():
                for chunk in _id_chunks(sids):
                    conn.execute(update(s).where(_id_in(s.c.id, chunk)).values(last_state=state, last_observed_at=at))
            groups: Dict[Tuple[str, Optional[str]], List[int]] = {}
            for sid, target_why in inputs_to.items():
                groups.setdefault(target_why, []).append(sid)
            for (target, why), sids in groups.items():
                values: Dict[str, Any] = {"state": target, "updated_at": now}
                if target in ("done", "failed"):
                    values["last_reason"] = why
                follow = update(t).where(t.c.state != "pending", t.c.state != "parked").values(**values)
                for chunk in _id_chunks(sids):
                    conn.execute(follow.where(_id_in(t.c.last_submission_id, chunk)))
        return [c.submission_id for c in kept]

    @staticmethod
    def _raw_rows(conn: Any, query: Any) -> List[Any]:
        """All rows of a query of plain columns through the driver's cursor (10^5 rows: no Row objects);
        its values are our own integers and constants, written into the statement."""
        compiled = query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            cursor.execute(str(compiled))
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def state_changes(self, submission_id: int) -> List[StateChangeRecord]:
        sc = schema.state_change
        query = select(sc).where(sc.c.submission_id == submission_id).order_by(sc.c.observed_at, sc.c.id)
        with self._read() as conn:
            return [StateChangeRecord(r.id, r.submission_id, r.observed_at, r.slurm_state, r.exit_code, r.signal,
                                      r.node, r.elapsed_s, r.cpu_s, r.max_rss_bytes, r.reason)
                    for r in conn.execute(query)]

    def record_qa(self, results: Sequence[QaResult]) -> List[int]:
        """Record QA outcomes per output (events in and out, pass or fail)."""
        now = _now()
        with self._write() as conn:
            return self._insert_ids(conn, schema.qa_outcome, [
                {"input_id": r.input_id, "submission_id": r.submission_id, "output_path": r.output_path,
                 "events_in": r.events_in, "events_out": r.events_out, "passed": r.passed,
                 "checked_at": r.checked_at or now} for r in results])

    def finalize_rounds(self, campaign_id: int) -> List[FinalizeRecord]:
        """Every finalize round of the campaign, oldest first."""
        f = schema.finalize
        with self._read() as conn:
            rows = conn.execute(select(f).where(f.c.campaign_id == campaign_id).order_by(f.c.round)).all()
        return [FinalizeRecord(r.id, r.campaign_id, r.round, r.tag, r.after, r.created_at, r.job_id,
                               r.script_digest, r.dependency, r.submitted_at, r.last_state, r.last_observed_at,
                               r.exit_code, r.elapsed_s, r.started_at, r.ended_at, r.reason) for r in rows]

    def add_finalize_round(self, campaign_id: int, tag: str, after: str) -> FinalizeRecord:
        """Open the next finalize round (its row exists before its submission; see ``record_finalize_job``).

        Refused while the latest round has no recorded job: that round is still to be settled.
        """
        f = schema.finalize
        with self._write() as conn:
            last = conn.execute(select(f.c.round, f.c.job_id).where(f.c.campaign_id == campaign_id)
                                .order_by(f.c.round.desc()).limit(1)).first()
            if last is not None and last.job_id is None:
                raise StateStoreError(f"{self.location}: finalize round {last.round} of campaign {campaign_id} "
                                      "has no recorded job yet; settle it before opening another")
            conn.execute(insert(f).values(campaign_id=campaign_id, round=(last.round + 1) if last else 1, tag=tag,
                                          after=after, created_at=_now()))
        return self.finalize_rounds(campaign_id)[-1]

    def record_finalize_job(self, finalize_id: int, job_id: str, script_digest: Optional[str],
                            dependency: Optional[str], submitted_at: Optional[dt.datetime] = None) -> None:
        """The job the scheduler accepted (or that was found under the round's name) for this round."""
        f = schema.finalize
        with self._write() as conn:
            result = conn.execute(update(f).where(f.c.id == finalize_id, f.c.job_id.is_(None)).values(
                job_id=job_id, script_digest=script_digest, dependency=dependency,
                submitted_at=submitted_at or _now(), reason=None))
            if result.rowcount != 1:
                raise StateStoreError(f"{self.location}: finalize round {finalize_id} is unknown or already has "
                                      "a job recorded")

    def note_finalize(self, finalize_id: int, reason: Optional[str]) -> None:
        """Why the round's job is not submitted (e.g. the scheduler's rejection), or None to clear it."""
        f = schema.finalize
        with self._write() as conn:
            conn.execute(update(f).where(f.c.id == finalize_id).values(reason=reason))

    def record_finalize_state(self, finalize_id: int, state: str, *, exit_code: Optional[int] = None,
                              elapsed_s: Optional[float] = None, started_at: Optional[dt.datetime] = None,
                              ended_at: Optional[dt.datetime] = None, reason: Optional[str] = None,
                              observed_at: Optional[dt.datetime] = None) -> bool:
        """An observation of the round's job; stored only when something changed. Returns whether it was."""
        f = schema.finalize
        state = normalize_state(state)
        values = {"last_state": state, "exit_code": exit_code, "elapsed_s": elapsed_s, "started_at": started_at,
                  "ended_at": ended_at, "reason": reason}
        with self._write() as conn:
            row = conn.execute(select(f).where(f.c.id == finalize_id)).first()
            if row is None:
                raise StateStoreError(f"{self.location}: no finalize round with id {finalize_id}")
            if all(getattr(row, k) == v for k, v in values.items()):
                return False
            conn.execute(update(f).where(f.c.id == finalize_id).values(last_observed_at=observed_at or _now(),
                                                                         **values))
        return True

    def in_flight_job_ids(self, campaign_id: int, cluster: Optional[str] = None) -> List[str]:
        """Slurm job ids (array ids for arrays) of the latest submission of every job the store
        believes queued or running on ``cluster``; the store may be behind the scheduler, so ask its queue
        before relying on them."""
        t, s = schema.input_file, schema.submission
        on = s.c.cluster.is_(None) if cluster is None else s.c.cluster == cluster
        query = (select(s.c.job_id).select_from(s.join(t, t.c.last_submission_id == s.c.id))
                 .where(s.c.campaign_id == campaign_id, t.c.state.in_(("submitted", "running")), on).distinct())
        with self._read() as conn:
            ids = [str(j) for j in conn.scalars(query)]
        return sorted(ids, key=lambda j: (len(j), j))
