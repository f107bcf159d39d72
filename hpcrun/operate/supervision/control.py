"""What operators do to a running campaign: cancel work in flight, pause and resume submissions,
and read the audit trail of every state-changing action (who, when, what).

Cancelling goes through the plan's scheduler backend; each submission is marked as the
operators' cancellation first, so its CANCELLED is the ``cancelled`` class, which the retry
policy leaves alone unless asked (``retry --cancelled``); a CANCELLED nobody asked hpcrun for
came from the site (``site_cancel``) and is retried. A pause is a row in the
store: the supervisor keeps polling and recording, and every submit (the supervisor's or one
by hand) submits nothing new while it is there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from hpcrun.backends.scheduler.base import task_id
from hpcrun.errors import InputError, Problem
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import clusters_of, has_store, open_plan_store, read_manifest
from hpcrun.operate.retries.retry import job_indices
from hpcrun.operate.submission.submit import register
from hpcrun.operate.tracking.track import IN_FLIGHT
from hpcrun.store.base import StateStoreError, _whoami
from hpcrun.store.records import Campaign
from hpcrun.store.rows.control import AuditEntry, PauseRecord
from hpcrun.store.store import StateStore


@dataclass
class CancelReport:
    campaign: str
    cancelled: Dict[str, str] = field(default_factory=dict)   # plan job -> scheduler job id
    clusters: Dict[str, Optional[str]] = field(default_factory=dict)   # plan job -> its cluster (several)
    not_in_flight: List[str] = field(default_factory=list)     # selected jobs with nothing to cancel

    def as_dict(self) -> Dict[str, object]:
        return {"campaign": self.campaign, "cancelled": self.cancelled, "not_in_flight": self.not_in_flight}


def _no_state(plan_dir: Path) -> InputError:
    return InputError([Problem(str(plan_dir), None, "", (
        "has no campaign state yet (nothing was submitted): start it with `hpcrun run` or `hpcrun submit`"))])


def _select(manifest: Manifest, jobs: Sequence[str], inputs: Sequence[str],
            all_jobs: bool) -> Optional[List[int]]:
    """Plan job indices chosen by name, by input path, or all (None)."""
    if sum(bool(x) for x in (jobs, inputs, all_jobs)) != 1:
        raise InputError([Problem("hpcrun cancel", None, "", (
            "say what to cancel: --jobs NAME[,NAME...], --inputs PATH[,PATH...] or --all (one of them)"))])
    if all_jobs:
        return None
    if jobs:
        return job_indices(manifest, jobs)
    by_path = {p: j["index"] for j in manifest.jobs for p in j["inputs"]}
    unknown = [p for p in inputs if p not in by_path]
    if unknown:
        raise InputError([Problem("manifest.json", None, "", (
            f"has no input {unknown[0]}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + "; give inputs as the plan lists them (`hpcrun status --json` shows each job's inputs)"))])
    return sorted({by_path[p] for p in inputs})


def cancel(plan_dir: Union[str, Path], *, db: Optional[str] = None, jobs: Sequence[str] = (),
           inputs: Sequence[str] = (), all_jobs: bool = False) -> CancelReport:
    """Cancel the selected plan jobs that are in flight; recorded in the audit trail."""
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir)
    selected = _select(manifest, jobs, inputs, all_jobs)
    report = CancelReport(manifest.campaign)
    if not has_store(plan_dir, db):
        raise _no_state(plan_dir)
    names = {j["index"]: j["name"] for j in manifest.jobs}
    with open_plan_store(plan_dir, db) as store:
        campaign = register(store, manifest)
        wanted = None if selected is None else set(selected)
        chosen: List[int] = []
        for job in store.job_states(campaign.id):
            if wanted is not None and job.job_index not in wanted:
                continue
            name = names.get(job.job_index, f"#{job.job_index}")
            if job.state in IN_FLIGHT and job.slurm_job_id:
                report.cancelled[name] = task_id(job.slurm_job_id, job.array_index)
                report.clusters[name] = job.cluster
                chosen.append(job.job_index)
            elif wanted is not None:
                report.not_in_flight.append(name)
        if report.cancelled:
            store.request_cancel(campaign.id, chosen, _whoami())   # before the scheduler: a poll may see it end
            for cluster in clusters_of(manifest):   # job ids are per cluster: each cancels its own
                mine = {i for n, i in report.cancelled.items() if report.clusters[n] == cluster.name}
                if mine:
                    cluster.sched.cancel(sorted(mine))
            store.audit(campaign.id, "cancel", "cancelled " + ", ".join(
                f"{n} ({i})" for n, i in sorted(report.cancelled.items())) + "; not retried unless asked "
                "(`hpcrun retry --cancelled`)")
    return report


def pause(plan_dir: Union[str, Path], *, db: Optional[str] = None,
          note: Optional[str] = None) -> Optional[PauseRecord]:
    """Hold new submissions; returns the pause already in force (None: this call paused it)."""
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir)   # a campaign may be paused before its first submission
    with open_plan_store(plan_dir, db) as store:
        return store.pause(register(store, manifest).id, note)


def resume(plan_dir: Union[str, Path], *, db: Optional[str] = None) -> Optional[PauseRecord]:
    """Allow submissions again; returns the pause it lifted (None: the campaign was not paused)."""
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir, jobs=False)
    if not has_store(plan_dir, db):
        return None
    with open_plan_store(plan_dir, db) as store:
        campaign = _campaign(store, manifest)
        return None if campaign is None else store.resume(campaign.id)


def audit_log(plan_dir: Union[str, Path], *, db: Optional[str] = None) -> List[AuditEntry]:
    """Every state-changing action recorded for the campaign, oldest first."""
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir, jobs=False)
    if not has_store(plan_dir, db):
        return []
    with open_plan_store(plan_dir, db) as store:
        campaign = _campaign(store, manifest)
        return [] if campaign is None else store.audit_log(campaign.id)


def _campaign(store: StateStore, manifest: Manifest) -> Optional[Campaign]:
    try:
        return store.get_campaign(str(manifest.campaign))
    except StateStoreError:
        return None

