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
from typing import List, Optional, Sequence

from hpcrun.backends.scheduler.base import SchedulerError, Unreachable
from hpcrun.operate.plandir import ClusterInfo

DOWN, MAINTENANCE, UP = "down", "maintenance", "up"
BACKLOG_WAVES = 2   # jobs waiting in a cluster's queue: at most this many times what it runs at once


@dataclass
class Seat:
    """One cluster's standing this round."""

    cluster: ClusterInfo
    state: str = UP                 # up | down | maintenance
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


def survey(cluster: ClusterInfo, in_flight: int, pending: int, walltime_s: int,
           now: Optional[dt.datetime] = None) -> Seat:
    """Ask one cluster whether it answers, is in maintenance, and how much room it has."""
    seat = Seat(cluster, pending=pending)
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
