"""A campaign's generations (each planning of it) and the provenance record of each output.

A generation is taken up once, in one transaction: its row, its inputs moved to its jobs (new ones
added), the inputs it reruns given a fresh start, and what it no longer lists withdrawn (the row
kept, with the generation that withdrew it). Provenance rows are read back a page at a time, so a
catalogue export of 10^6 outputs never holds them all.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set

from sqlalchemy import and_, func, insert, or_, select, update

from hpcrun.store.base import _chunks, _now, _path_key
from hpcrun.store.queries import Queries, _int_sum
from hpcrun.store.records import GenerationRecord, NewInput, OutputBytes, ProvenanceRow
from hpcrun.store.sql import schema

IN_FLIGHT = ("submitted", "running")


def _iso(when: Optional[dt.datetime]) -> Optional[str]:
    return None if when is None else when.isoformat(timespec="seconds")


PAGE = 5000   # provenance rows read per query when streamed


def _record(row: Any) -> GenerationRecord:
    return GenerationRecord(int(row.number), row.spec_digest, row.profile_digest, row.reprocess,
                            json.loads(row.details or "{}"), row.planned_by, row.planned_at, row.applied_at)


class Generations(Queries):
    """Generations and provenance (a mixin of StateStore)."""

    def generations(self, campaign_id: int) -> List[GenerationRecord]:
        g = schema.generation
        with self._read() as conn:
            rows = conn.execute(select(g).where(g.c.campaign_id == campaign_id).order_by(g.c.number)).all()
        return [_record(r) for r in rows]

    def current_generation(self, campaign_id: int) -> int:
        """The latest generation taken up (1 for a campaign from before generations)."""
        g = schema.generation
        with self._read() as conn:
            return int(conn.scalar(select(func.max(g.c.number)).where(g.c.campaign_id == campaign_id)) or 1)

    def in_flight_paths(self, campaign_id: int) -> Set[str]:
        """The inputs a running or queued job holds (a new generation leaves them to it)."""
        t = schema.input_file
        with self._read() as conn:
            return set(conn.scalars(select(t.c.path).where(t.c.campaign_id == campaign_id,
                                                           t.c.state.in_(IN_FLIGHT))))

    def input_states(self, campaign_id: int) -> Dict[str, str]:
        """Each input's state by path (withdrawn ones left out): what a new generation leaves or takes."""
        t = schema.input_file
        with self._read() as conn:
            return dict(conn.execute(select(t.c.path, t.c.state).where(t.c.campaign_id == campaign_id,
                                                                        t.c.withdrawn_in.is_(None))).all())

    def max_job_index(self, campaign_id: int) -> int:
        """The highest job index ever given (-1: none); a new generation numbers its jobs after it."""
        t = schema.input_file
        with self._read() as conn:
            found = conn.scalar(select(func.max(t.c.job_index)).where(t.c.campaign_id == campaign_id))
        return -1 if found is None else int(found)

    def record_generation(self, campaign_id: int, gen: GenerationRecord) -> bool:
        """The row of a generation (True: it is new); the first one of a campaign from before generations."""
        with self._write() as conn:
            return self._insert_generation(conn, campaign_id, gen)

    @staticmethod
    def _insert_generation(conn: Any, campaign_id: int, gen: GenerationRecord) -> bool:
        g = schema.generation
        found = conn.execute(select(g.c.number).where(g.c.campaign_id == campaign_id,
                                                      g.c.number == gen.number)).first()
        if found is not None:
            return False
        conn.execute(insert(g).values(campaign_id=campaign_id, number=gen.number, spec_digest=gen.spec_digest,
                                      profile_digest=gen.profile_digest, reprocess=gen.reprocess,
                                      details=json.dumps(gen.details, sort_keys=True),
                                      planned_by=gen.planned_by[:300], planned_at=gen.planned_at,
                                      applied_at=_now()))
        return True

    def take_up_generation(self, campaign_id: int, gen: GenerationRecord, inputs: Iterable[NewInput],
                           held: Sequence[str] = ()) -> Optional[Dict[str, int]]:
        """Make ``gen`` the campaign's generation, once (None: it was taken up already). ``inputs`` are its
        jobs' inputs (its plan left out what stays done and what was in flight); ``held`` the paths of its
        jobs that could not move (one of their inputs went into flight since it was planned): they stay in
        the jobs that hold them. Returns what moved, in counts."""
        t, c = schema.input_file, schema.campaign
        with self._write() as conn:
            if not self._insert_generation(conn, campaign_id, gen):
                return None
            conn.execute(update(c).where(c.c.id == campaign_id).values(spec_digest=gen.spec_digest,
                                                                        profile_digest=gen.profile_digest))
            added = self._add_inputs(conn, campaign_id, inputs, gen.number, remap=True)
            mine = and_(t.c.campaign_id == campaign_id, t.c.generation == gen.number)
            rerun = conn.execute(update(t).where(mine, t.c.state.in_(("done", "failed", "parked")))
                                 .values(state="pending", attempts=0, adjust=None, claim_token=None,
                                         claimed_by=None, claimed_at=None, updated_at=_now())).rowcount
            older = or_(t.c.generation.is_(None), t.c.generation < gen.number)
            keep = {_path_key(p) for p in held}
            stale = [int(i) for i, key in conn.execute(
                select(t.c.id, t.c.path_key).where(t.c.campaign_id == campaign_id, older, t.c.withdrawn_in.is_(None),
                                                   t.c.state.in_(("pending", "failed")))) if key not in keep]
            for chunk in _chunks(stale):
                conn.execute(update(t).where(t.c.id.in_(chunk)).values(withdrawn_in=gen.number, job_index=None,
                                                                      updated_at=_now()))
        return {"added": added, "rerun": rerun, "withdrawn": len(stale)}

    def counts_by_generation(self, campaign_id: int) -> Dict[int, Dict[str, int]]:
        """Inputs per state in each generation (withdrawn inputs under the key "withdrawn")."""
        t = schema.input_file
        gen = func.coalesce(t.c.generation, 1)
        state = t.c.state
        query = (select(gen, state, t.c.withdrawn_in.is_not(None), func.count())
                 .where(t.c.campaign_id == campaign_id).group_by(gen, state, t.c.withdrawn_in.is_not(None)))
        out: Dict[int, Dict[str, int]] = {}
        with self._read() as conn:
            for number, st, withdrawn, n in conn.execute(query):
                row = out.setdefault(int(number), {})
                key = "withdrawn" if withdrawn else st
                row[key] = row.get(key, 0) + int(n)
        return out

    # -- provenance ------------------------------------------------------------------------

    def record_provenance(self, campaign_id: int, rows: Sequence[ProvenanceRow]) -> int:
        if not rows:
            return 0
        now = _now()
        with self._write() as conn:
            self._insert_many(conn, schema.provenance, [
                {"campaign_id": campaign_id, "input_id": r.input_id, "generation": r.generation,
                 "output_path": r.output_path, "size": r.size, "checksum": r.checksum,
                 "record": json.dumps(r.record, sort_keys=True), "recorded_at": now} for r in rows])
        return len(rows)

    def run_facts(self, submission_ids: Sequence[int]) -> Dict[int, Dict[str, Any]]:
        """What accounting said of each submission's run (its last observation), for provenance records."""
        s, sc = schema.submission, schema.state_change
        latest = select(sc.c.submission_id, func.max(sc.c.id).label("change_id")).group_by(sc.c.submission_id)
        out: Dict[int, Dict[str, Any]] = {}
        with self._read() as conn:
            newest = {int(sid): int(cid) for sid, cid in self._rows_in(conn, latest, sc.c.submission_id,
                                                                        list(submission_ids))}
            runs = {int(r[0]): r[1:] for r in self._rows_in(
                conn, select(s.c.id, s.c.job_id, s.c.array_index, s.c.cluster, s.c.generation), s.c.id,
                list(submission_ids))}
            for r in self._rows_in(conn, select(sc.c.id, sc.c.submission_id, sc.c.slurm_state, sc.c.exit_code,
                                                sc.c.node, sc.c.started_at, sc.c.ended_at), sc.c.id,
                                   list(newest.values())):
                job_id, index, cluster, generation = runs.get(int(r[1]), (None, None, None, None))
                out[int(r[1])] = {"job_id": job_id, "array_task": index, "cluster": cluster,
                                  "generation": int(generation or 1), "state": r[2], "exit_code": r[3],
                                  "node": r[4], "started_at": _iso(r[5]), "ended_at": _iso(r[6])}
        return out

    def input_facts(self, input_ids: Sequence[int]) -> Dict[int, Dict[str, Any]]:
        """Each input's path and checksum (algo:value, None when not known)."""
        t = schema.input_file
        with self._read() as conn:
            rows = self._rows_in(conn, select(t.c.id, t.c.path, t.c.checksum, t.c.checksum_algo), t.c.id,
                                 list(input_ids))
        return {int(i): {"path": p, "checksum": f"{a}:{c}" if c and a else None} for i, p, c, a in rows}

    def provenance(self, campaign_id: int, generation: Optional[int] = None) -> Iterator[Dict[str, Any]]:
        """Every provenance record (of one generation), in the order recorded, PAGE rows per query."""
        return map(json.loads, self.provenance_texts(campaign_id, generation))

    def provenance_texts(self, campaign_id: int, generation: Optional[int] = None) -> Iterator[str]:
        """The records as stored (one JSON object each, keys sorted): a catalogue export passes them on."""
        p = schema.provenance
        last = 0
        while True:
            query = select(p.c.id, p.c.record).where(p.c.campaign_id == campaign_id, p.c.id > last)
            if generation is not None:
                query = query.where(p.c.generation == generation)
            with self._read() as conn:
                rows = conn.execute(query.order_by(p.c.id).limit(PAGE)).all()
            if not rows:
                return
            for _pid, text in rows:
                yield text
            last = int(rows[-1][0])

    def provenance_count(self, campaign_id: int) -> int:
        p = schema.provenance
        with self._read() as conn:
            return int(conn.scalar(select(func.count()).where(p.c.campaign_id == campaign_id)) or 0)

    def output_bytes(self, campaign_id: int) -> OutputBytes:
        """The bytes of the outputs recorded with their size, and the inputs they are of: what status shows as
        the outputs made, with no walk of the outputs location."""
        p = schema.provenance
        query = select(func.count(p.c.input_id.distinct()), _int_sum(p.c.size)).where(
            p.c.campaign_id == campaign_id, p.c.size.is_not(None))
        with self._read() as conn:
            inputs, size = conn.execute(query).one()
        return OutputBytes(int(inputs or 0), int(size or 0))

    def recorded_outputs(self, campaign_id: int, paths: Sequence[str]) -> Set[str]:
        """Which of these output paths an earlier generation's provenance names (never to be overwritten)."""
        p = schema.provenance
        found: Set[str] = set()
        with self._read() as conn:
            for chunk in _chunks(list(paths)):   # type: ignore[arg-type]
                found.update(conn.scalars(select(p.c.output_path).where(p.c.campaign_id == campaign_id,
                                                                        p.c.output_path.in_(chunk))))
        return found
