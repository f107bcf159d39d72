"""The scheduler's daemons that do not answer: each outage recorded (since when, the scheduler's words),
its start and end in the audit trail, and shown by ``status``, ``serve`` and the metrics.

A site restarts its controller and takes accounting down for upgrades; the poll and the supervisor
wait these out (hpcrun/operate/tracking/track.py, hpcrun/operate/supervision/supervise.py) and only say what they see
here: which daemon of which cluster, since when. A daemon nothing else asks (no job in flight) is
asked directly (``probe``), so an outage is seen to end even when the campaign is idle.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from hpcrun.backends.scheduler.base import Scheduler
from hpcrun.store.records import Outage
from hpcrun.store.store import StateStore

RECENT_OUTAGE_S = 3600.0   # status shows an outage that ended within the last hour too


ALLOCATION = "allocation"   # the outage table also records a spent allocation (hpcrun/operate/tracking/budget.py)
SLOW = "slow"               # and a scheduler whose commands answer slowly (throttled, overloaded)
NOT_DAEMONS = (ALLOCATION, SLOW)   # rows no daemon probe ends


def _where(cluster: Optional[str]) -> str:
    return f"cluster {cluster}" if cluster else "the cluster"


def unanswered(store: StateStore, campaign_id: int, sched: Scheduler, cluster: Optional[str], daemon: str,
               detail: str) -> None:
    """``daemon`` of ``cluster`` did not answer now (the audit trail gets the start of an outage)."""
    if store.record_outage(campaign_id, cluster, daemon, detail):
        store.audit(campaign_id, "outage", f"{sched.daemon_name(daemon)} of {_where(cluster)} does not answer: "
                    f"{detail}")


def answered(store: StateStore, campaign_id: int, sched: Scheduler, cluster: Optional[str], daemon: str) -> None:
    """``daemon`` of ``cluster`` answered: the outage it was in ends (recorded, and in the audit trail)."""
    ended = store.end_outage(campaign_id, cluster, daemon)
    if ended is not None:
        store.audit(campaign_id, "outage", ended.text(sched.daemon_name(daemon)))


def after_poll(store: StateStore, campaign_id: int, sched: Scheduler, known: Sequence[Outage],
               down: Dict[Tuple[Optional[str], str], str], up: Set[Tuple[Optional[str], str]]) -> List[Dict[str, Any]]:
    """What a poll found not answering (``down``) and answering (``up``), written; the outages as status
    shows them."""
    open_now = {(o.cluster or None, o.daemon) for o in known if o.open}
    for (cluster, daemon), detail in down.items():
        unanswered(store, campaign_id, sched, cluster, daemon, detail)
    for cluster, daemon in up:
        if (cluster or None, daemon) in open_now and (cluster, daemon) not in down:
            answered(store, campaign_id, sched, cluster, daemon)
    return rows(store.outages(campaign_id) if down or open_now else known, sched)


def probe(store: StateStore, campaign_id: int, scheds: Dict[Optional[str], Scheduler],
          default: Scheduler) -> List[Outage]:
    """Ask each daemon still recorded as not answering whether it answers now; the outages after that."""
    found = store.outages(campaign_id)
    still = [o for o in found if o.open and o.daemon not in NOT_DAEMONS]   # ended by a poll, not a probe
    for o in still:
        sched = scheds.get(o.cluster, default)
        words = sched.unanswered(o.daemon)
        if words:
            store.record_outage(campaign_id, o.cluster, o.daemon, words)
        else:
            answered(store, campaign_id, sched, o.cluster, o.daemon)
    return store.outages(campaign_id) if still else found   # read again only when a row may have changed


def paced(store: StateStore, campaign_id: int, slowest_s: float, slow_since: Optional[dt.datetime],
          pause_s: float) -> None:
    """A round's slowest scheduler command: a slow spell recorded when it starts (since when, how slow,
    the pause it brought), and ended in the audit trail after a round without a slow command."""
    if slow_since is not None:
        detail = f"its slowest command took {slowest_s:.0f} s; polling every {pause_s:.0f} s"
        if store.record_outage(campaign_id, None, SLOW, detail, since=slow_since):
            store.audit(campaign_id, "outage", f"the scheduler is slow: {detail}")
        return
    ended = store.end_outage(campaign_id, None, SLOW)
    if ended is not None:
        store.audit(campaign_id, "outage", ended.text())


def rows(outages: Sequence[Outage], sched: Scheduler) -> List[Dict[str, Any]]:
    """Open outages and those ended within the last hour, each with its sentence (``text``) and, while
    open, that sentence with the scheduler's words or the held jobs (``line``)."""
    now = dt.datetime.now(dt.timezone.utc)
    out = []
    for o in outages:
        if o.open or (o.ended_at is not None and (now - o.ended_at).total_seconds() < RECENT_OUTAGE_S):
            text = o.text(sched.daemon_name(o.daemon))
            out.append(dict(o.as_dict(), text=text, line=text + (f": {o.detail}" if o.open and o.detail else "")))
    return out
