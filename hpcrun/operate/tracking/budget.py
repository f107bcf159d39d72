"""A spent allocation while the campaign runs: jobs the account's limit holds, and what is done about it.

A poll sees each pending job's reason; one the scheduler calls a budget reason (Slurm:
``AssocGrpCPUMinutesLimit``, ``AssocGrpBillingMinutes`` ...) will not start until someone raises the
limit. The poll records it per cluster in the outage table (daemon ``allocation``: since when, how
many jobs by reason), ends it once a poll of that cluster finds none held, and writes both turns to
the audit trail; status, serve and report show it from there. While a cluster's allocation is spent
the supervisor submits nothing more there (another cluster of the campaign still gets work), rather
than fill its queue with jobs that cannot start.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from hpcrun.operate.metrics import Family
from hpcrun.operate.plandir import ClusterInfo
from hpcrun.operate.results import StatusReport
from hpcrun.operate.submission.placement import spent_words
from hpcrun.operate.tracking.outages import ALLOCATION
from hpcrun.store.records import Outage
from hpcrun.store.store import StateStore

Held = Dict[str, int]   # budget reason -> jobs it holds


def _where(name: Optional[str]) -> str:
    return f"cluster {name}: " if name else ""


def record(store: StateStore, campaign_id: int, spent: Dict[Optional[str], Held], answered: Set[Optional[str]],
           known: Sequence[Outage]) -> bool:
    """This poll's spent allocations recorded; one a poll of its cluster no longer sees is ended.
    True when a row was written (the outages are to be read again)."""
    changed = bool(spent)
    for cluster, held in spent.items():
        if store.record_outage(campaign_id, cluster, ALLOCATION, spent_words(held)):
            store.audit(campaign_id, "budget", _where(cluster) + spent_words(held, said=True))
    for o in known:
        if o.daemon == ALLOCATION and o.open and o.cluster not in spent and o.cluster in answered:
            if store.end_outage(campaign_id, o.cluster, ALLOCATION) is not None:
                changed = True
                store.audit(campaign_id, "budget", _where(o.cluster) + "no job is held by the allocation any "
                            "more: submitting again")
    return changed


def by_name(status: StatusReport, clusters: Sequence[ClusterInfo]) -> Dict[Optional[str], Held]:
    """The poll's held jobs keyed by cluster name (what submit takes), from status's labels."""
    names = {("" if len(clusters) < 2 else c.label): c.name for c in clusters}
    return {names.get(label): held for label, held in status.budget_held.items() if held}


def families(held: Dict[str, Held]) -> List[Family]:
    """Jobs held by a spent allocation per cluster and reason (0 when none is)."""
    fam = Family("hpcrun_jobs_budget_held", "Pending jobs the account's allocation holds (AssocGrp...Minutes): "
                 "the supervisor submits nothing more to that cluster meanwhile.")
    if not held:
        fam.add(0)
    for cluster, reasons in sorted(held.items()):
        for reason, n in sorted(reasons.items()):
            fam.add(n, cluster=cluster, reason=reason)
    return [fam]


def status_lines(held: Dict[str, Held]) -> List[str]:
    return [_where(cluster) + spent_words(reasons, said=True) for cluster, reasons in sorted(held.items()) if reasons]


Opened = Dict[Optional[str], dt.datetime]   # cluster -> since when its allocation is recorded spent


def turns(before: Opened, outages: Sequence[Outage]) -> Tuple[Opened, List[Dict[str, Any]]]:
    """The spec's ``budget`` events since the last look, from the outage rows (whichever poll wrote them):
    an allocation found spent (a row open now that was not) and one raised (a row open before, ended now);
    and the open ones, for the next look."""
    open_rows = {o.cluster: o for o in outages if o.daemon == ALLOCATION and o.open}
    found = [{"cluster": c, "spent": True, "since": o.since.isoformat(timespec="seconds"), "held": o.detail}
             for c, o in open_rows.items() if before.get(c) != o.since]
    raised = [{"cluster": c, "spent": False} for c in before if c not in open_rows]
    return {c: o.since for c, o in open_rows.items()}, found + raised
