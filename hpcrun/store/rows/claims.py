"""Claims and submissions: the claim -> tag -> record protocol, and unparking."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from hpcrun.store.base import _INPUT_COLUMNS, StateStoreError, StoreBase, _chunks, _now, _whoami
from hpcrun.store.records import Claim, InputRecord, NewSubmission
from hpcrun.store.sql import schema


class Claims(StoreBase):
    """Claims and submissions: the claim -> tag -> record protocol, and unparking."""

    def claim_pending(self, campaign_id: int, limit: int, *, claimed_by: Optional[str] = None) -> Claim:
        """Atomically move up to ``limit`` pending inputs to submitted for this caller.

        Two processes claiming at the same time never get the same input: SQLite's
        BEGIN IMMEDIATE serializes the whole select-and-update, and on servers the
        selected rows are locked (SKIP LOCKED, so the other claimer takes the next ones).
        The claim token is to be put on the Slurm job (name or comment) so that a
        restarted submitter can reconcile a claim whose job id was never recorded.
        """
        t = schema.input_file
        token = uuid.uuid4().hex
        who = (claimed_by or _whoami())[:255]
        now = _now()
        if limit <= 0:
            return Claim(token, who, ())
        with self._write() as conn:
            ids = list(conn.scalars(
                select(t.c.id).where(t.c.campaign_id == campaign_id, t.c.state == "pending")
                .order_by(t.c.id).limit(limit).with_for_update(skip_locked=True)))
            return self._claim_ids(conn, ids, token, who, now)

    def release_claim(self, token: str, reason: Optional[str] = None) -> int:
        """Return a claim's inputs that never got a recorded submission to pending (e.g. the scheduler refused it)."""
        t = schema.input_file
        with self._write() as conn:
            result = conn.execute(
                update(t).where(t.c.claim_token == token, t.c.state == "submitted", t.c.last_submission_id.is_(None))
                .values(state="pending", claim_token=None, claimed_by=None, claimed_at=None,
                        last_reason=reason, updated_at=_now()))
            return int(result.rowcount)

    # -- plan jobs: the unit of submission -------------------------------------------------
    # Every input of a plan job is submitted in the same Slurm job, so the inputs of a job
    # always share one state; the methods below claim, retry and park whole jobs.

    def pending_jobs(self, campaign_id: int) -> List[int]:
        """Plan jobs with work neither done nor in flight, in plan order."""
        t = schema.input_file
        query = (select(t.c.job_index).where(t.c.campaign_id == campaign_id, t.c.state == "pending",
                                             t.c.job_index.is_not(None))
                 .group_by(t.c.job_index).order_by(t.c.job_index))
        with self._read() as conn:
            return [int(j) for j in conn.scalars(query)]

    def claim_jobs(self, campaign_id: int, job_indices: Sequence[int], *, claimed_by: Optional[str] = None,
                   token: Optional[str] = None) -> Claim:
        """Atomically move the pending inputs of these plan jobs to submitted under one claim token.

        Jobs another submitter claimed meanwhile are simply not in the result (the claim
        only takes rows still pending, inside one write transaction).
        """
        t = schema.input_file
        token = token or uuid.uuid4().hex
        who = (claimed_by or _whoami())[:255]
        now = _now()
        with self._write() as conn:
            # the inputs of these jobs by the (campaign, job) index, then the claim by primary key: a
            # single UPDATE ... WHERE state = 'pending' AND job_index IN (...) may be planned on the
            # (campaign, state) index and scan every pending input once per chunk
            by_job = select(t.c.id).where(t.c.campaign_id == campaign_id)
            ids: List[int] = []
            for chunk in _chunks(list(job_indices)):
                ids.extend(conn.scalars(by_job.where(t.c.job_index.in_(chunk))))
            return self._claim_ids(conn, ids, token, who, now)

    def unresolved_claims(self, campaign_id: int) -> List[Claim]:
        """Claims whose inputs have no recorded submission: the submitter stopped between claim and record.

        The caller must hold the campaign's submit lock (no live submitter is between the two
        steps) and settle each claim with Slurm: record the job found under its tag, or release it.
        """
        t = schema.input_file
        query = (select(t.c.claimed_by, *_INPUT_COLUMNS)
                 .where(t.c.campaign_id == campaign_id, t.c.state == "submitted",
                        t.c.last_submission_id.is_(None), t.c.claim_token.is_not(None))
                 .order_by(t.c.claim_token, t.c.id))
        claims: Dict[str, Tuple[str, List[InputRecord]]] = {}
        with self._read() as conn:
            for row in conn.execute(query):
                rec = InputRecord(*row[1:])
                assert rec.claim_token is not None
                claims.setdefault(rec.claim_token, (row[0] or "?", []))[1].append(rec)
        return [Claim(token, who, tuple(recs)) for token, (who, recs) in claims.items()]

    def unpark(self, campaign_id: int, job_indices: Optional[Sequence[int]] = None) -> List[int]:
        """Parked jobs (all, or these) back to pending with a fresh attempt count, for a human's second try."""
        t = schema.input_file
        now = _now()
        with self._write() as conn:
            query = select(t.c.job_index).where(t.c.campaign_id == campaign_id, t.c.state == "parked").distinct()
            found = sorted(int(j) for j in conn.scalars(query) if job_indices is None or j in job_indices)
            for chunk in _chunks(found):
                conn.execute(update(t).where(t.c.campaign_id == campaign_id, t.c.state == "parked",
                                             t.c.job_index.in_(chunk))
                             .values(state="pending", attempts=0, claim_token=None, claimed_by=None,
                                     claimed_at=None, updated_at=now))
        return found

    def record_submission(self, campaign_id: int, sub: NewSubmission) -> int:
        return self.record_submissions(campaign_id, [sub])[0]

    def record_submissions(self, campaign_id: int, subs: Sequence[NewSubmission]) -> List[int]:
        """Record accepted jobs or array tasks and link each to its claimed inputs, in one transaction.

        Every linked input must be claimed (state submitted, no submission yet, and the
        submission's claim token if it names one): recording unclaimed work would let two
        submitters run the same file.
        """
        t, s, link = schema.input_file, schema.submission, schema.submission_input
        now = _now()
        owner: Dict[int, NewSubmission] = {}
        for sub in subs:
            for iid in sub.input_ids:
                if iid in owner:
                    raise StateStoreError(f"{self.location}: input {iid} is in two submissions "
                                          f"({owner[iid].job_id} and {sub.job_id})")
                owner[iid] = sub
        with self._write() as conn:
            bad = self._not_claimed(conn, campaign_id, owner)
            if bad:
                raise StateStoreError(
                    f"{self.location}: inputs {sorted(bad)[:10]}{' ...' if len(bad) > 10 else ''} are not claimed "
                    f"for this submission in campaign {campaign_id} (claim them with claim_pending first)")
            rows = [{"campaign_id": campaign_id, "job_id": sub.job_id, "array_index": sub.array_index,
                     "script_path": sub.script_path, "script_digest": sub.script_digest,
                     "submitted_at": sub.submitted_at or now, "tag": sub.tag, "claim_token": sub.claim_token,
                     "changes": sub.changes, "cluster": sub.cluster, "generation": sub.generation}
                    for sub in subs]
            ids = self._insert_claimed(conn, campaign_id, rows) or self._insert_ids(conn, s, rows)
            self._keep_texts(conn, subs)
            links = [{"submission_id": sid, "input_id": iid} for sid, sub in zip(ids, subs) for iid in sub.input_ids]
            if links:
                self._insert_many(conn, link, links)
                # each input's new submission is the one just linked: set it in set-based chunks, not row by row
                newest = (select(func.max(link.c.submission_id)).where(link.c.input_id == t.c.id)
                          .scalar_subquery())
                attach = update(t).values(attempts=t.c.attempts + 1, last_submission_id=newest, updated_at=now)
                for chunk in _chunks(list(owner)):
                    conn.execute(attach.where(t.c.id.in_(chunk)))
        return ids

    def _keep_texts(self, conn: Connection, subs: Sequence[NewSubmission]) -> None:
        """The exact text of each script rendered at submission, once per distinct text."""
        texts = {sub.script_digest: sub.script_text for sub in subs if sub.script_text is not None}
        if not texts:
            return
        st = schema.script_text
        known = set(conn.scalars(select(st.c.digest).where(st.c.digest.in_(list(texts)))))
        new = [{"digest": d, "text": t} for d, t in texts.items() if d not in known]
        if new:
            self._insert_many(conn, st, new)

    def script_text(self, digest: str) -> Optional[str]:
        """The text submitted under this digest (scripts rendered at submission), or None."""
        st = schema.script_text
        with self._read() as conn:
            return conn.scalar(select(st.c.text).where(st.c.digest == digest))

    def _insert_claimed(self, conn: Connection, campaign_id: int, rows: List[Dict[str, Any]]) -> List[int]:
        """Submissions of one claim inserted in bulk, their ids read back by (job id, array index).

        The fast path of a large array: one driver executemany and one indexed query instead of
        a RETURNING statement processed row by row. Returns [] when the rows do not qualify
        (several claims, or no claim), and the caller inserts them the general way.
        """
        s = schema.submission
        token = rows[0]["claim_token"] if rows else None
        keys = {(r["job_id"], r["array_index"]) for r in rows}
        if token is None or len(keys) != len(rows) or any(r["claim_token"] != token for r in rows):
            return []
        if conn.execute(select(s.c.id).where(s.c.claim_token == token).limit(1)).first() is not None:
            return []  # an earlier record of the same claim (a recovered job): keep the ids unambiguous
        self._insert_many(conn, s, rows)
        query = select(s.c.id, s.c.job_id, s.c.array_index).where(s.c.campaign_id == campaign_id,
                                                                   s.c.claim_token == token)
        found = {(job_id, index): int(sid) for sid, job_id, index in conn.execute(query)}
        return [found[(r["job_id"], r["array_index"])] for r in rows]

    @staticmethod
    def _not_claimed(conn: Connection, campaign_id: int, owner: Mapping[int, NewSubmission]) -> List[int]:
        """Inputs among ``owner`` that are not claimed and waiting for a submission record."""
        t = schema.input_file
        ready = select(t.c.id).where(t.c.campaign_id == campaign_id, t.c.state == "submitted",
                                     t.c.last_submission_id.is_(None))
        by_token: Dict[Optional[str], List[int]] = {}
        for iid, sub in owner.items():
            by_token.setdefault(sub.claim_token, []).append(iid)
        bad: List[int] = []
        for token, iids in by_token.items():
            if token is not None:
                # one query on the claim-token index (with the other conditions checked here: a
                # planner offered (campaign, state) too may scan every submitted input instead)
                by_claim = select(t.c.id, t.c.campaign_id, t.c.state, t.c.last_submission_id).where(
                    t.c.claim_token == token)
                ok = {i for i, camp, state, last in conn.execute(by_claim)
                      if camp == campaign_id and state == "submitted" and last is None}
            else:
                ok = set()
                for chunk in _chunks(iids):
                    ok.update(conn.scalars(ready.where(t.c.id.in_(chunk))))
            bad.extend(i for i in iids if i not in ok)
        return bad

    @staticmethod
    def _claim_ids(conn: Connection, ids: List[int], token: str, who: str, now: dt.datetime) -> Claim:
        """Claim these inputs (those still pending) under ``token``; the claim as recorded."""
        t = schema.input_file
        claim = (update(t).where(t.c.state == "pending")
                 .values(state="submitted", claim_token=token, claimed_by=who, claimed_at=now,
                         last_submission_id=None, updated_at=now))
        for chunk in _chunks(ids):
            conn.execute(claim.where(t.c.id.in_(chunk)))
        rows = conn.execute(select(*_INPUT_COLUMNS).where(t.c.claim_token == token).order_by(t.c.id)).all()
        return Claim(token, who, tuple(InputRecord(*r) for r in rows))
