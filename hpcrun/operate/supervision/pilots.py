"""Late binding: the supervisor's care of the pilots, once a round (hpcrun/backends/late/pilots.py).

Pilots claim and commit without the supervisor, so nothing here bounds the dispatch rate: a round
only returns the claims of pilots that ended or went silent, and submits the pilots the remaining work
needs (one array, within the site's caps, none while one waits or the allocation is spent).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional

from hpcrun.backends.late.pilots import FAILING_MAX, Pilots
from hpcrun.backends.scheduler.base import Scheduler, SubmitUncertain, Unreachable
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.metrics import Family
from hpcrun.operate.results import IN_FLIGHT
from hpcrun.operate.submission.locality import near_tasks
from hpcrun.store.store import StateStore

LOOK_BACK_S = 86400.0   # pilots asked of the accounting since this long before their walltime


def tend(sup: Any, status: Any, jobs: Dict[str, int], settled: bool) -> Optional[Dict[str, Any]]:
    """A supervisor's round: every pilot scheduler of its clusters tended (``jobs``: the store's plan jobs
    by state); what the round shows of the pilots (None: arrays)."""
    work = jobs.get("pending", 0) + sum(jobs.get(s, 0) for s in IN_FLIGHT)
    return tend_all(sup.store, sup.campaign.id, [c.sched for c in sup.listed], settled=settled,
                    spent=bool(status.budget_held), work=work, on_outage=sup.wait_out)


def hint(manifest: Manifest, scheds: List[Scheduler]) -> int:
    """Locality hints for the pilots' claims, after the round filled the queue: each waiting task whose
    inputs a node's cache holds, named under that node (``jobs.locality: prefer``); how many."""
    made = 0
    for sched in scheds:
        if isinstance(sched, Pilots) and manifest.locality:
            waiting = [f"{qid}_{i}" for qid, idx in sched.q.waiting().items() for i in idx]
            made += sched.q.hint(near_tasks(manifest, waiting))
    return made


def tend_all(store: StateStore, campaign_id: int, scheds: List[Scheduler], *, settled: bool, spent: bool,
             work: int, on_outage: Any) -> Optional[Dict[str, Any]]:
    """Every pilot scheduler tended; what the round shows of the pilots (None: arrays)."""
    shown: Optional[Dict[str, Any]] = None
    for sched in scheds:
        if not isinstance(sched, Pilots):
            continue
        since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(
            seconds=LOOK_BACK_S + 2 * float(sched.config.walltime_s))
        try:
            care = sched.tend(since=since, settled=settled, paused=store.paused(campaign_id) is not None,
                              spent=spent, work=work)
        except (Unreachable, SubmitUncertain) as exc:   # asked again next round; claims wait
            on_outage(exc)
            continue
        for pilot, why in care.fenced:
            store.audit(campaign_id, "pilot", f"pilot {pilot} fenced ({why}); its claims return to the queue")
        if care.returned:
            store.audit(campaign_id, "pilot", f"{len(care.returned)} claim(s) returned to the queue, "
                                              "not counted as attempts: " + ", ".join(care.returned[:20]))
        if care.submitted:
            store.audit(campaign_id, "pilot", f"submitted {care.added} pilot(s) as job {care.submitted}")
        for pilot, window in care.drained:
            store.audit(campaign_id, "pilot", f"pilot {pilot} drains before maintenance reservation {window} of its "
                                              "cluster: it claims only inputs that end before the window starts")
        for cluster, n, after in care.handed:
            store.audit(campaign_id, "pilot", f"{n} pilot(s) pending on cluster {cluster} for more than {after:.0f} s "
                                              "cancelled there: the other clusters' pilots claim the inputs; none "
                                              f"goes to {cluster} for {3 * after:.0f} s")
        turned = (care.failing >= FAILING_MAX) != sched.failing
        sched.failing = care.failing >= FAILING_MAX
        if turned and care.failing >= FAILING_MAX:
            store.audit(campaign_id, "pilot", f"{care.failing} pilot(s) failed within a minute of their start in "
                                              "the last 10 minutes: no new pilot until that changes; see their "
                                              f"logs ({sched.config.name}-<id>.out in the plan's logs/)")
        shown = {**care.pilots, "slots": care.pilots["running"] * sched.config.slots, "submitted": care.added,
                 "fenced": len(care.fenced), "returned": len(care.returned), "spent": care.spent,
                 "failing": care.failing, "down": [c for c, _why in care.down],
                 "handed": sum(n for _c, n, _a in care.handed)}
    return shown


def words(p: Dict[str, Any]) -> str:
    """The pilots in a round's summary line."""
    return (f"pilots {p['running']} running ({p['draining']} draining), {p['pending']} pending"
            + (f", {p['submitted']} submitted" if p["submitted"] else "")
            + (f", {p['fenced']} fenced ({p['returned']} claim(s) returned)" if p["fenced"] else "")
            + (f", {p['failing']} failed at their start lately: none submitted" if p.get("failing", 0) >= FAILING_MAX
               else "")
            + (f", {p['handed']} pending too long handed off" if p.get("handed") else "")
            + (f", cluster(s) {', '.join(p['down'])} not answering" if p.get("down") else ""))


def families(p: Optional[Dict[str, Any]]) -> List[Family]:
    """Late binding in the metrics file: pilots per state this round (none for arrays)."""
    if not p:
        return []
    fam = Family("hpcrun_pilots", "Late binding: the campaign's pilots per state (running includes draining).")
    for state in ("pending", "running", "draining"):
        fam.add(p.get(state, 0), state=state)
    return [fam, Family("hpcrun_pilots_fenced_round", "Pilots fenced in the last round (ended or silent; their claims "
                        "returned).").add(p.get("fenced", 0))]
