"""Matching one accounting answer to the jobs in flight on one cluster, at 10^5 jobs.

A poll that changes nothing must cost little beyond the scheduler's answer: a job still as the
store knew it comes back as the one shared "as you knew" record and is not looked at again; only
the records that say something, the jobs accounting does not list, and the waiting jobs (whose
pending reason the queue gives) are matched one by one. The index of the jobs in flight is built
once per list, and the supervisor keeps the list between polls (hpcrun/operate/tracking/inflight.py).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from hpcrun.backends.scheduler.base import Record
from hpcrun.store.records import ActiveSubmission

_BRACKET = re.compile(r"^(\d+)_\[(.*)\]$")
Found = Dict[int, Tuple[ActiveSubmission, Record]]


class Index:
    """The jobs in flight on one cluster, keyed as the scheduler names them."""

    def __init__(self, active: Sequence[ActiveSubmission]):
        self.active = active
        self.by_sid = {a.slurm_id: a for a in active}
        self.known = {sid: a.last_state for sid, a in self.by_sid.items() if a.last_state}
        self.waiting: Set[str] = {sid for sid, a in self.by_sid.items() if a.last_state in (None, "PENDING")}
        self.job_ids = sorted({a.job_id for a in active}, key=lambda j: int(j) if j.isdigit() else 0)
        self.first_submitted: Optional[dt.datetime] = min((a.submitted_at for a in active), default=None)


    def forget(self, a: ActiveSubmission) -> None:
        """``a`` is no longer in flight."""
        self.by_sid.pop(a.slurm_id, None)
        self.known.pop(a.slurm_id, None)
        self.waiting.discard(a.slurm_id)

    def note_all(self, noted: Sequence[ActiveSubmission]) -> None:
        """These have a new recorded state (a poll that saw 10^5 jobs start: set operations, no loop
        of method calls)."""
        self.known.update((a.slurm_id, a.last_state) for a in noted if a.last_state)
        waiting = {a.slurm_id for a in noted if a.last_state in (None, "PENDING")}
        self.waiting.difference_update(a.slurm_id for a in noted)
        self.waiting |= waiting


_LAST: List[object] = [None, None]   # the last list indexed, and its index


def keep_index(active: Sequence[ActiveSubmission], index: Index) -> None:
    """``index`` (brought up to date) is now the index of ``active``."""
    _LAST[:] = [active, index]


def index_of(active: Sequence[ActiveSubmission]) -> Index:
    """The index of this very list (built again only for another list)."""
    if _LAST[0] is not active:
        _LAST[:] = [active, Index(active)]
    index = _LAST[1]
    assert isinstance(index, Index)
    return index


def in_bracket(spec: str, index: int) -> bool:
    """Is array task ``index`` in the scheduler's ``0-3,7,9-12%2`` list?"""
    for part in spec.split("%", 1)[0].split(","):
        lo, _, hi = part.partition("-")
        try:
            if int(lo) <= index <= int(hi or lo):
                return True
        except ValueError:
            continue
    return False


def match(index: Index, records: Dict[str, Record]) -> Tuple[Found, List[ActiveSubmission]]:
    """(submission, record) of the jobs whose record may say something new, and the jobs the queue
    must be asked about: those accounting does not list, and those waiting."""
    found: Found = {}
    brackets: Dict[str, List[Tuple[str, Record]]] = {}
    by_sid = index.by_sid
    need: List[ActiveSubmission] = []
    asked: Set[int] = set()
    still: List[str] = []   # jobs known to be waiting whose record is the shared "unchanged" one
    waiting = index.waiting
    for key, rec in records.items():
        if not rec.raw_id:   # the shared unchanged record
            if rec.state == "PENDING" and key in waiting:
                still.append(key)
            continue
        a = by_sid.get(key)
        if a is not None:
            found[a.id] = (a, rec)
            if rec.state == "PENDING":   # waiting: the queue says why
                need.append(a)
                asked.add(a.id)
            continue
        m = _BRACKET.match(key) if key.endswith("]") else None
        if m:   # a pending array's tasks, listed as one record
            brackets.setdefault(m.group(1), []).append((m.group(2), rec))
    for sid in by_sid.keys() - records.keys():
        a = by_sid[sid]
        hit = None
        if a.array_index is not None and a.job_id in brackets:
            hit = next((r for spec, r in brackets[a.job_id] if in_bracket(spec, a.array_index)), None)
        if hit is not None:
            found[a.id] = (a, hit)
        if (hit is None or hit.state == "PENDING") and a.id not in asked:
            need.append(a)
            asked.add(a.id)
    for sid in still:
        a = by_sid.get(sid)
        if a is not None and a.id not in asked:
            found.setdefault(a.id, (a, records[sid]))
            need.append(a)
            asked.add(a.id)
    return found, need
