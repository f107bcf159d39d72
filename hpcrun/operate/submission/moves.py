"""Moving jobs that wait too long on one cluster to another (``site.move_pending_after``).

A move is cancel, confirm, release: the job is cancelled on the cluster where it waits, and
only once that cluster's queue and accounting both say it is gone (cancelled, not running,
not pending) do its inputs go back to pending, to be placed again by the next submit. A
cluster that does not answer cannot confirm anything, so its jobs stay where they are and
are recorded as they were. A job therefore never runs on two clusters at once, and a move
is not counted as an attempt (the submission is classed ``moved``).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from hpcrun.backends.scheduler.base import TERMINAL, SchedulerError, Unreachable, normalize_state
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import ClusterInfo, clusters_of
from hpcrun.operate.submission.placement import UP, survey
from hpcrun.store.records import ActiveSubmission, Campaign
from hpcrun.store.store import StateStore
from hpcrun.units import format_duration

CONFIRM_WAIT_S = 30.0


@dataclass
class Move:
    job: str
    cluster: str
    job_id: str
    waited_s: float


def move_stuck(manifest: Manifest, store: StateStore, campaign: Campaign, *,
               now: Optional[dt.datetime] = None, sleep: Callable[[float], None] = time.sleep) -> List[Move]:
    """Move the jobs pending longer than the plan allows to clusters with room; returns the moves made."""
    after = manifest.move_pending_after_s
    clusters = clusters_of(manifest)
    if not after or len(clusters) < 2:
        return []
    now = now or dt.datetime.now(dt.timezone.utc)
    active = store.active_submissions(campaign.id)
    stuck: Dict[Optional[str], List[ActiveSubmission]] = {}
    for a in active:
        if a.last_state in (None, "PENDING") and (now - a.submitted_at).total_seconds() > after:
            stuck.setdefault(a.cluster, []).append(a)
    moves: List[Move] = []
    for cluster in clusters:
        subs = stuck.get(cluster.name)
        if not subs:
            continue
        room = _room_elsewhere(manifest, clusters, cluster, active)
        if room <= 0:
            continue
        moves += _move(store, campaign, cluster, subs[:room], now, sleep)
    if moves:
        store.audit(campaign.id, "move", "; ".join(
            f"{m.job} ({m.job_id}) off {m.cluster} after {format_duration(int(m.waited_s))} pending"
            for m in moves[:50]) + (" ..." if len(moves) > 50 else ""))
    return moves


def _room_elsewhere(manifest: Manifest, clusters: Sequence[ClusterInfo], here: ClusterInfo,
                    active: Sequence[ActiveSubmission]) -> int:
    """How many jobs the other clusters that answer can take now (a move to nowhere is no move)."""
    walltime = manifest.walltime_seconds
    room = 0
    for other in clusters:
        if other is here:
            continue
        mine = [a for a in active if a.cluster == other.name]
        seat = survey(other, len(mine), sum(1 for a in mine if a.last_state in (None, "PENDING")), walltime)
        if seat.state == UP:
            room += 10 ** 6 if seat.room is None else seat.room
    return room


def _move(store: StateStore, campaign: Campaign, cluster: ClusterInfo, subs: Sequence[ActiveSubmission],
          now: dt.datetime, sleep: Callable[[float], None]) -> List[Move]:
    def reason(waited: float) -> str:
        return (f"moved: pending {format_duration(int(waited))} on cluster {cluster.label}; cancelled there "
                f"(confirmed gone) to be placed again")
    return cancel_and_release(store, campaign, cluster, subs, now, sleep, reason)


def cancel_and_release(store: StateStore, campaign: Campaign, cluster: ClusterInfo,
                       subs: Sequence[ActiveSubmission], now: dt.datetime, sleep: Callable[[float], None],
                       reason: Callable[[float], str]) -> List[Move]:
    """Cancel pending jobs, and put back to pending (class ``moved``) those the cluster confirms gone."""
    try:
        cluster.sched.cancel([a.slurm_id for a in subs])
    except SchedulerError:          # unreachable or refused: nothing is known to have changed there
        return []
    gone = _confirm_gone(cluster, subs, sleep)
    moves = []
    for a in subs:
        if a.slurm_id not in gone:
            continue
        waited = (now - a.submitted_at).total_seconds()
        if store.record_move(campaign.id, a.id, reason(waited)):
            moves.append(Move(a.job_name or f"#{a.job_index}", cluster.label, a.slurm_id, waited))
    return moves


def _confirm_gone(cluster: ClusterInfo, subs: Sequence[ActiveSubmission], sleep: Callable[[float], None],
                  wait_s: float = CONFIRM_WAIT_S) -> set:
    """The ids that the queue and the accounting list as cancelled once neither lists them pending or running (a
    job cancelled in the moment it started, too: its work did not finish).
    A job that ended otherwise (it started and completed, or failed, between the poll and the cancel) ran: it
    is not moved, and the tracker records its end (moved, its inputs would run twice)."""
    ids = {a.slurm_id for a in subs}
    since = cluster.sched.since_text(min(a.submitted_at for a in subs))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            queued = {q.job_id: normalize_state(q.state) for q in cluster.sched.queue(
                job_ids=sorted({a.job_id for a in subs}), ended=True)}
            records = cluster.sched.records(sorted({a.job_id for a in subs}), since) if cluster.accounting else {}
        except Unreachable:
            return set()
        states = {i: (queued.get(i, "CANCELLED"), normalize_state(records[i].state) if i in records else None)
                  for i in ids}
        ended = {i for i, (q, r) in states.items() if q in TERMINAL and (r is None or r in TERMINAL)}
        if ended == ids or time.monotonic() > deadline:
            return {i for i in ended if states[i][0] == "CANCELLED" and states[i][1] in (None, "CANCELLED")}
        sleep(1.0)
