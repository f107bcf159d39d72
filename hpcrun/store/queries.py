"""The campaign and its inputs, and the read-side queries of status and report."""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

from sqlalchemy import BigInteger, bindparam, case, cast, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from hpcrun.store.base import _INPUT_COLUMNS, StateStoreError, StoreBase, _now, _path_key
from hpcrun.store.locking.mounts import INPUT_STATES
from hpcrun.store.records import Campaign, InputRecord, InputRow, JobState, NewInput, QaRow, ReportData, RunRow
from hpcrun.store.sql import schema

ADD_CHUNK = 20000   # inputs registered per step of add_inputs


def _batches(items: Iterable[Any], size: int) -> Iterator[List[Any]]:
    it = iter(items)
    while True:
        batch = list(itertools.islice(it, size))
        if not batch:
            return
        yield batch


def _int_sum(column: Any) -> Any:
    """SUM of an integer column as an integer: PostgreSQL answers SUM(bigint) as NUMERIC, which
    psycopg hands over as Decimal (and Decimal / float is a TypeError in the report)."""
    return cast(func.sum(column), BigInteger)


class Queries(StoreBase):
    """The campaign and its inputs, and the read-side queries of status and report."""

    def register_campaign(self, name: str, spec_digest: str, profile_digest: str, generation: int = 1) -> Campaign:
        """Create the campaign, or return it if it exists with the same digests or ``generation`` is newer
        than the one it has taken up (the caller takes that one up).

        A campaign's inputs and jobs are tied to the spec and profile of their generation, so other
        digests under the same generation are refused rather than overwritten.
        """
        c, g = schema.campaign, schema.generation
        for _ in range(2):
            try:
                with self._write(inputs=False) as conn:
                    row = conn.execute(select(c).where(c.c.name == name)).first()
                    if row is None:
                        conn.execute(insert(c).values(name=name, spec_digest=spec_digest,
                                                      profile_digest=profile_digest, created_at=_now()))
                        row = conn.execute(select(c).where(c.c.name == name)).one()
                    elif (row.spec_digest, row.profile_digest) != (spec_digest, profile_digest):
                        taken = int(conn.scalar(select(func.max(g.c.number)).where(g.c.campaign_id == row.id)) or 1)
                        if generation <= taken:
                            raise StateStoreError(
                                f"{self.location}: campaign '{name}' is at generation {taken}, registered with spec "
                                f"digest {row.spec_digest[:12]} and profile digest {row.profile_digest[:12]}, but this "
                                f"plan (generation {generation}) has {spec_digest[:12]} and {profile_digest[:12]}: "
                                "the plan directory was changed by hand or by an older hpcrun. Plan the campaign "
                                "into it again (`hpcrun plan SPEC --out DIR --apply`) to make a new generation.")
                    return Campaign(row.id, row.name, row.spec_digest, row.profile_digest, row.created_at)
            except StateStoreError as exc:
                if not isinstance(exc.__cause__, IntegrityError):
                    raise  # an IntegrityError here is a concurrent insert of the same name: read it again
        raise StateStoreError(f"{self.location}: campaign '{name}' could not be registered")

    def get_campaign(self, name: str) -> Campaign:
        c = schema.campaign
        with self._read() as conn:
            row = conn.execute(select(c).where(c.c.name == name)).first()
        if row is None:
            raise StateStoreError(f"{self.location}: no campaign named '{name}'")
        return Campaign(row.id, row.name, row.spec_digest, row.profile_digest, row.created_at)

    def add_inputs(self, campaign_id: int, inputs: Iterable[NewInput], generation: Optional[int] = None,
                   remap: bool = True) -> int:
        """Register input files in one transaction; paths already registered are skipped. Returns the number added.

        Taken ADD_CHUNK inputs at a time (each chunk's known paths looked up by the unique key, the new
        ones inserted by one executemany), so a 10^6-input plan is never held as 10^6 rows at once.
        ``remap``: a known input moves to the job (and generation) given; else only its checksum is filled in.
        """
        with self._write() as conn:
            return self._add_inputs(conn, campaign_id, inputs, generation, remap)

    def _add_inputs(self, conn: Any, campaign_id: int, inputs: Iterable[NewInput], generation: Optional[int],
                    remap: bool) -> int:
        t = schema.input_file
        now = _now()
        known = select(t.c.id, t.c.path_key, t.c.job_index, t.c.checksum, t.c.job_name).where(
            t.c.campaign_id == campaign_id)
        added = 0
        for chunk in _batches(inputs, ADD_CHUNK):
            rows: Dict[str, Dict[str, Any]] = {}
            for item in chunk:
                key = _path_key(item.path)
                if key not in rows:
                    rows[key] = {"campaign_id": campaign_id, "path": item.path, "path_key": key,
                                 "size": item.size, "checksum": item.checksum,
                                 "checksum_algo": item.checksum_algo, "state": "pending", "attempts": 0,
                                 "updated_at": now, "job_index": item.job_index, "events": item.events,
                                 "job_name": item.job_name, "generation": item.generation or generation}
            self._update_known(conn, rows, self._rows_in(conn, known, t.c.path_key, list(rows)), remap)
            if rows:
                self._insert_many(conn, t, list(rows.values()))
            added += len(rows)
        return added

    @staticmethod
    def _update_known(conn: Any, rows: Dict[str, Dict[str, Any]], existing: Iterable[Any], remap: bool) -> None:
        """Take the inputs already registered out of ``rows``; a new generation gives a known input another
        job (``remap``), and a checksum is recorded once, when first known."""
        t = schema.input_file
        moved: List[Dict[str, Any]] = []
        for iid, key, job_index, checksum, job_name in existing:
            row = rows.pop(key, None)
            if row is None:
                continue
            move = remap and (row["job_index"] != job_index or row["job_name"] != job_name
                              or row["generation"] is not None)
            if move or (checksum is None and row["checksum"]):
                moved.append({"b_id": iid, "b_job": row["job_index"] if move else job_index,
                              "b_name": row["job_name"] if move else job_name,
                              "b_sum": checksum or row["checksum"],
                              "b_algo": row["checksum_algo"] if checksum is None else None,
                              "b_gen": row["generation"] if move else None, "b_move": int(move)})
        if moved:
            stmt = (update(t).where(t.c.id == bindparam("b_id"))
                    .values(job_index=bindparam("b_job"), job_name=bindparam("b_name"),
                            checksum=bindparam("b_sum"),
                            checksum_algo=func.coalesce(t.c.checksum_algo, bindparam("b_algo")),
                            generation=func.coalesce(bindparam("b_gen"), t.c.generation),
                            withdrawn_in=case((bindparam("b_move") == 1, None), else_=t.c.withdrawn_in)))
            conn.execute(stmt, moved)

    def inputs(self, campaign_id: int, states: Optional[Iterable[str]] = None,
               limit: Optional[int] = None) -> List[InputRecord]:
        t = schema.input_file
        query = select(*_INPUT_COLUMNS).where(t.c.campaign_id == campaign_id).order_by(t.c.id)
        if states is not None:
            query = query.where(t.c.state.in_(list(states)))
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [InputRecord(*r) for r in conn.execute(query)]

    def counts_by_state(self, campaign_id: int) -> Dict[str, int]:
        """Inputs per state, every state present (zero when empty), in lifecycle order."""
        t = schema.input_file
        query = (select(t.c.state, func.count()).where(t.c.campaign_id == campaign_id, t.c.withdrawn_in.is_(None))
                 .group_by(t.c.state))
        return self._counted("inputs", campaign_id, query)

    def job_counts(self, campaign_id: int) -> Dict[str, int]:
        """Plan jobs per state, every state present (a job's inputs share one state)."""
        t = schema.input_file
        query = (select(t.c.state, func.count(t.c.job_index.distinct()))
                 .where(t.c.campaign_id == campaign_id, t.c.job_index.is_not(None)).group_by(t.c.state))
        return self._counted("jobs", campaign_id, query)

    def runs_by_state(self, campaign_id: int) -> Dict[str, int]:
        """Submissions (runs: array tasks, jobs, claims) per latest state seen; never seen: ``""``. A failed
        run keeps its run directory, so status counts them for the footprint."""
        s = schema.submission
        query = select(s.c.last_state, func.count()).where(s.c.campaign_id == campaign_id).group_by(s.c.last_state)
        with self._read() as conn:
            return {state or "": int(n) for state, n in conn.execute(query)}

    def any_in(self, campaign_id: int, states: Sequence[str]) -> bool:
        """Whether any input is in these states (one probe of the state index: asked every second near the end)."""
        t = schema.input_file
        query = select(t.c.id).where(t.c.campaign_id == campaign_id, t.c.state.in_(list(states))).limit(1)
        with self._read() as conn:
            return conn.execute(query).first() is not None

    def job_names(self, campaign_id: int, job_indices: Sequence[int]) -> Dict[int, str]:
        """The names of these plan jobs (a round names the few it retried or parked; a dict of 10^6 names
        kept for that would cost 100 MB)."""
        t = schema.input_file
        query = select(t.c.job_index, t.c.job_name).where(t.c.campaign_id == campaign_id)
        with self._read() as conn:
            return {int(j): n for j, n in self._rows_in(conn, query, t.c.job_index, sorted(set(job_indices))) if n}

    def input_history(self, campaign_id: int, name: str, limit: int = 100) -> List[Dict[str, Any]]:
        """The inputs ``name`` names (a path, a file name, or a plan job's name), each with every
        submission that carried it, oldest first (``hpcrun logs``)."""
        t, link, sub = schema.input_file, schema.submission_input, schema.submission
        cols = (t.c.id, t.c.path, t.c.job_name, t.c.state, t.c.attempts, t.c.last_reason)
        base = select(*cols).where(t.c.campaign_id == campaign_id).order_by(t.c.id).limit(limit)
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        with self._read() as conn:
            found = conn.execute(base.where((t.c.path_key == _path_key(name)) | (t.c.job_name == name))).all()
            if not found and "/" not in name:   # a file name: one scan of the campaign's paths
                found = conn.execute(base.where(t.c.path.like("%/" + escaped, escape="\\"))).all()
            out = [dict(zip(("id", "path", "job", "state", "attempts", "last_reason"), r), submissions=[])
                   for r in found]
            if out:
                by_id = {o["id"]: o for o in out}
                query = (select(link.c.input_id, sub.c.id, sub.c.job_id, sub.c.array_index, sub.c.tag,
                                sub.c.last_state, sub.c.submitted_at)
                         .join(sub, sub.c.id == link.c.submission_id)
                         .where(link.c.input_id.in_(list(by_id))).order_by(sub.c.id))
                for iid, sid, job_id, index, tag, state, at in conn.execute(query):
                    by_id[iid]["submissions"].append({"id": sid, "job_id": job_id, "array_index": index, "tag": tag,
                                                      "state": state, "submitted_at": at})
        return out

    @contextmanager
    def one_round(self) -> Iterator[None]:
        """Counts per state read once and kept until this process writes (or the round ends): a supervisor's
        round asks them several times, and at 10^6 inputs each asking reads an index of 10^6 entries. Another
        process's write meanwhile is seen at the next round, as if the counts had been read a moment earlier."""
        self.memo = {}
        try:
            yield
        finally:
            self.memo = None

    def _counted(self, what: str, campaign_id: int, query: Any) -> Dict[str, int]:
        kept = self.memo.get((what, campaign_id)) if self.memo is not None else None
        if kept is None:
            with self._read() as conn:
                found = {state: int(n) for state, n in conn.execute(query)}
            kept = {state: found.get(state, 0) for state in INPUT_STATES}
            if self.memo is not None:
                self.memo[(what, campaign_id)] = kept
        return dict(kept)

    def cluster_counts(self, campaign_id: int) -> Dict[Optional[str], Dict[str, int]]:
        """Plan jobs per state on each cluster (of their latest submission; never submitted: None)."""
        t, s = schema.input_file, schema.submission
        per_job = (select(t.c.job_index, func.min(t.c.state).label("state"), func.max(s.c.cluster).label("cluster"))
                   .select_from(t.outerjoin(s, s.c.id == t.c.last_submission_id))
                   .where(t.c.campaign_id == campaign_id, t.c.job_index.is_not(None))
                   .group_by(t.c.job_index).subquery())
        query = select(per_job.c.cluster, per_job.c.state, func.count()).group_by(per_job.c.cluster, per_job.c.state)
        out: Dict[Optional[str], Dict[str, int]] = {}
        with self._read() as conn:
            for cluster, state, n in conn.execute(query):
                out.setdefault(cluster, {})[state] = int(n)
        return out

    def job_states(self, campaign_id: int, states: Optional[Sequence[str]] = None) -> List[JobState]:
        """One row per plan job (or per job in ``states``): its state, attempts, last reason, latest
        submission and its last observation."""
        t, s, sc = schema.input_file, schema.submission, schema.state_change
        # each row's last change by the (submission, time) index: a subquery of every submission's last change
        # is made whole first, at 10^6 submissions however few jobs are asked for
        last = sc.alias("last_change")
        last_id = select(func.max(sc.c.id)).where(sc.c.submission_id == s.c.id).scalar_subquery()
        query = (select(t.c.job_index, func.min(t.c.state), func.max(t.c.attempts), func.max(t.c.last_reason),
                        func.max(s.c.job_id), func.max(s.c.array_index), func.max(s.c.last_state),
                        func.count(), _int_sum(t.c.size), func.max(last.c.exit_code), func.max(last.c.signal),
                        func.max(last.c.elapsed_s), func.max(last.c.reason), func.min(t.c.job_name),
                        func.max(s.c.cluster), func.max(s.c.cancel_requested_by))
                 .select_from(t.outerjoin(s, s.c.id == t.c.last_submission_id).outerjoin(last, last.c.id == last_id))
                 .where(t.c.campaign_id == campaign_id, t.c.job_index.is_not(None))
                 .group_by(t.c.job_index).order_by(t.c.job_index))
        with self._read() as conn:
            if states is None:
                rows: Any = conn.execute(query)
            else:   # the jobs in these states by the (campaign, state) index first (a few among 10^6), then theirs
                found = select(t.c.job_index).where(t.c.campaign_id == campaign_id, t.c.state.in_(list(states)))
                jobs = sorted({int(j) for j in conn.scalars(found) if j is not None})
                rows = self._rows_in(conn, query.where(t.c.state.in_(list(states))), t.c.job_index, jobs)
            return [JobState(int(r[0]), r[1], int(r[2] or 0), r[3], r[4], r[5], r[6], int(r[7]), r[8],
                             r[9], r[10], r[11], r[12], r[13], r[14], r[15])
                    for r in rows]

    def report_rows(self, campaign_id: int) -> ReportData:
        """Everything a campaign report needs, in three queries: runs, inputs and QA outcomes."""
        t, s, sc, link, qa = (schema.input_file, schema.submission, schema.state_change, schema.submission_input,
                              schema.qa_outcome)
        latest = (select(sc.c.submission_id, func.max(sc.c.id).label("change_id"))
                  .join(s, s.c.id == sc.c.submission_id).where(s.c.campaign_id == campaign_id)
                  .group_by(sc.c.submission_id).subquery())
        job_of = (select(link.c.submission_id, func.min(t.c.job_index).label("job_index"),
                         _int_sum(t.c.size).label("bytes"), func.count().label("inputs"))
                  .join(t, t.c.id == link.c.input_id).where(t.c.campaign_id == campaign_id)
                  .group_by(link.c.submission_id).subquery())
        runs_q = (select(s.c.id, s.c.job_id, s.c.array_index, job_of.c.job_index, job_of.c.bytes, job_of.c.inputs,
                         s.c.submitted_at, sc.c.slurm_state, sc.c.exit_code, sc.c.signal, sc.c.elapsed_s, sc.c.cpu_s,
                         sc.c.alloc_cpus, sc.c.max_rss_bytes, sc.c.started_at, sc.c.ended_at, sc.c.node, sc.c.reason,
                         sc.c.req_mem_bytes, s.c.failure_class, s.c.changes, s.c.cluster)
                  .select_from(s.outerjoin(latest, latest.c.submission_id == s.c.id)
                               .outerjoin(sc, sc.c.id == latest.c.change_id)
                               .outerjoin(job_of, job_of.c.submission_id == s.c.id))
                  .where(s.c.campaign_id == campaign_id).order_by(s.c.id))
        inputs_q = (select(t.c.id, t.c.job_index, t.c.path, t.c.size, t.c.events, t.c.state, t.c.attempts,
                           t.c.last_reason).where(t.c.campaign_id == campaign_id).order_by(t.c.id))
        qa_q = (select(qa.c.input_id, qa.c.submission_id, qa.c.events_in, qa.c.events_out, qa.c.passed)
                .join(t, t.c.id == qa.c.input_id).where(t.c.campaign_id == campaign_id).order_by(qa.c.id))
        with self._read() as conn:
            runs = [RunRow(*list(r)) for r in conn.execute(runs_q)]
            inputs = [InputRow(*r) for r in conn.execute(inputs_q)]
            outcomes = [QaRow(*r) for r in conn.execute(qa_q)]
        return ReportData(runs, inputs, outcomes)
