"""Where each pending job goes, on a campaign with several clusters: decided at submission.

A cluster gets new work only when its controller answers and no maintenance reservation meets
the job's walltime; then up to its room (the campaign's ``max_queued_jobs`` for it, the site's
per-user limit, and a backlog of two waves: no more of the campaign's jobs waiting in its queue
than twice what its partition runs at once; the rest stays pending here, free to go to whichever
cluster has room next). Among clusters with room a job goes where the campaign's queue is shortest
for its share: pending jobs there (work that has not started) plus what this round already
sent, divided by the share. Work that waits less starts sooner, and the shares hold when
every cluster is equally busy.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from hpcrun.backends.scheduler.base import SchedulerError, Unreachable
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import ClusterInfo, scheduler_of
from hpcrun.store.records import ActiveSubmission
from hpcrun.store.store import StateStore

DOWN, MAINTENANCE, UP, SPENT = "down", "maintenance", "up", "budget"
BACKLOG_WAVES = 2   # jobs waiting in a cluster's queue: at most this many times what it runs at once


def queue_budget(manifest: Manifest, limit: Optional[int]) -> Tuple[Optional[int], Optional[Tuple[int, int]]]:
    """How many plan jobs one cluster takes now (``limit``, and the room under ``max_queued_jobs``), and its queue
    as (queued, the most)."""
    budget = limit
    queue = None
    max_queued = manifest.submit.max_queued_jobs
    if max_queued and not manifest.pilots:   # late binding: tasks go to the queue; the pilots keep the cap
        queued = scheduler_of(manifest).queued_count(getpass.getuser())
        queue = (queued, int(max_queued))
        room = max(0, int(max_queued) - queued)
        budget = room if budget is None else min(budget, room)
    return budget, queue


@dataclass
class Seat:
    """One cluster's standing this round."""

    cluster: ClusterInfo
    state: str = UP                 # up | down | maintenance | budget (its allocation is spent)
    detail: str = ""
    room: Optional[int] = None      # jobs it may still take (None: no limit)
    pending: int = 0                # the campaign's jobs waiting in its queue
    slow: bool = False              # its jobs wait longer than move_pending_after (or were moved off it)
    given: List[int] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.state == UP and (self.room is None or self.room > len(self.given))

    def load(self) -> float:
        return (self.pending + len(self.given)) / self.cluster.share


def _smaller(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return b if a is None else a if b is None else min(a, b)


def spent_words(held: Dict[str, int], said: bool = False) -> str:
    """Jobs the account's limit holds, in words (held: reason -> jobs); ``said``: opening with what it is."""
    return (("the allocation is spent: " if said else "")
            + ", ".join(f"{n} job(s) pend with {r}" for r, n in sorted(held.items()))
            + "; nothing new is submitted there until the limit is raised")


def survey(cluster: ClusterInfo, in_flight: int, pending: int, walltime_s: int,
           now: Optional[dt.datetime] = None, spent: Optional[Dict[str, int]] = None) -> Seat:
    """Ask one cluster whether it answers, is in maintenance, and how much room it has; one whose
    jobs pend on a spent allocation (``spent``: reason -> jobs) gets nothing new."""
    seat = Seat(cluster, pending=pending)
    if spent:
        seat.state, seat.detail = SPENT, spent_words(spent, said=True)
        return seat
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        windows = cluster.sched.maintenance()
        queued = cluster.sched.queued_count(getpass.getuser()) if cluster.site_max_queued_jobs else 0
    except Unreachable as exc:
        seat.state, seat.detail = DOWN, str(exc).splitlines()[0]
        return seat
    except SchedulerError as exc:
        seat.state, seat.detail = DOWN, f"not asked: {str(exc).splitlines()[0]}"
        return seat
    meeting = [w for w in windows if w.overlaps(now, walltime_s)]
    if meeting:
        w = meeting[0]
        seat.state = MAINTENANCE
        seat.detail = (f"maintenance reservation {w.name} from {w.start:%Y-%m-%d %H:%M} UTC"
                       if w.start else f"maintenance reservation {w.name}")
        return seat
    if cluster.max_queued_jobs:
        seat.room = max(0, cluster.max_queued_jobs - in_flight)
    if cluster.capacity_jobs:   # a backlog of two waves: the rest waits here, free to go where room opens
        seat.room = _smaller(seat.room, max(0, BACKLOG_WAVES * cluster.capacity_jobs - pending))
    if cluster.site_max_queued_jobs:
        seat.room = _smaller(seat.room, max(0, cluster.site_max_queued_jobs - queued))
    return seat


def place(jobs: Sequence[int], seats: Sequence[Seat]) -> List[int]:
    """Give each job to the open cluster with the lowest load (a slow one only when no other has room);
    returns the jobs nobody took."""
    left: List[int] = []
    for job in jobs:
        candidates = [s for s in seats if s.open]
        if not candidates:
            left.append(job)
            continue
        best = min(candidates, key=lambda s: (s.slow, s.load(), -s.cluster.share))
        best.given.append(job)
    return left


def on_cluster(adjust: str, last: Optional[str], target: Optional[str]) -> str:
    """A retry's changes for the cluster it goes to: nodes to avoid are the last cluster's, so
    they are dropped when the job goes elsewhere (it avoids them by going there)."""
    if last == target or '"exclude"' not in adjust:
        return adjust
    data = json.loads(adjust)
    data.pop("exclude", None)
    return json.dumps(data)


def mark_slow(seats: Sequence[Seat], store: StateStore, campaign_id: int, active: Sequence[ActiveSubmission],
              after: Optional[float]) -> None:
    """With moves on: a cluster where the campaign's work waits longer than the limit, or that work was
    moved off lately, gets new work only when no other cluster has room (no back and forth)."""
    if not after:
        return
    now = dt.datetime.now(dt.timezone.utc)
    moved = store.recent_moves(campaign_id, now - dt.timedelta(seconds=3 * after))
    for seat in seats:
        waits = [(now - a.submitted_at).total_seconds() for a in active
                 if a.cluster == seat.cluster.name and a.last_state in (None, "PENDING")]
        seat.slow = bool(moved.get(seat.cluster.name)) or any(w > after for w in waits)
