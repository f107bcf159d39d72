"""Resubmit failed work by the spec's retry policy; park what will fail again.

``retry`` first polls Slurm (so failures that just happened count), then lets the retry
policy (hpcrun/operate/retries/policy.py, the same one ``hpcrun run`` uses) send each failed plan
job back to pending, with the change its failure class asks for, or park it with the
reason, and finally submits the pending work through the normal submit path (claims,
tags, lock). Cancelled jobs are parked unless asked: a cancel is usually an operator's
decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from hpcrun.errors import InputError, Problem
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import has_store, open_plan_store, read_manifest
from hpcrun.operate.results import Batch, SubmitReport
from hpcrun.operate.retries.policy import RetryPolicy
from hpcrun.operate.submission.submit import submit_store
from hpcrun.operate.tracking.track import poll_store
from hpcrun.store.base import StateStoreError


@dataclass
class RetryReport:
    campaign: str
    requeued: List[str] = field(default_factory=list)     # plan job names
    parked: List[str] = field(default_factory=list)
    unparked: List[str] = field(default_factory=list)
    submit: Optional[SubmitReport] = None
    dry_run: bool = False

    def as_dict(self) -> Dict[str, Any]:
        sub = self.submit
        return {"campaign": self.campaign, "requeued": self.requeued, "parked": self.parked,
                "unparked": self.unparked, "dry_run": self.dry_run,
                "submitted": [{"script": b.script.path, "job_id": b.job_id, "array": b.array_spec,
                               "tag": b.tag, "jobs": len(b.jobs)} for b in sub.batches] if sub else [],
                "finalize": sub.finalize.as_dict() if sub and sub.finalize else None}


def job_indices(manifest: Manifest, names: Sequence[str]) -> Optional[List[int]]:
    """Plan job indices of these job names (None: no names, every job); an unknown name is an error."""
    if not names:
        return None
    by_name = {j["name"]: j["index"] for j in manifest.jobs}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InputError([Problem(str(Path("manifest.json")), None, "", (
            f"has no job named {', '.join(unknown)}; job names look like {next(iter(by_name), '?')} "
            "(see `hpcrun status`)"))])
    return [by_name[n] for n in names]


def retry(plan_dir: Union[str, Path], *, db: Optional[str] = None, max_attempts: Optional[int] = None,
          cancelled: Optional[bool] = None, jobs: Sequence[str] = (), unpark: bool = False,
          dry_run: bool = False, on_batch: Optional[Callable[[Batch], None]] = None,
          finalize_again: bool = False) -> RetryReport:
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir)
    names = {j["index"]: j["name"] for j in manifest.jobs}
    selected = job_indices(manifest, jobs)
    policy = RetryPolicy.from_manifest(manifest, max_attempts=max_attempts, cancelled=cancelled)
    report = RetryReport(manifest.campaign, dry_run=dry_run)
    if not has_store(plan_dir, db):
        return report  # nothing was ever submitted
    with open_plan_store(plan_dir, db) as store:   # one manifest, one store for the poll, requeue and submit
        if not dry_run:
            poll_store(plan_dir, manifest, store)
        try:
            campaign = store.get_campaign(manifest.campaign)
        except StateStoreError:
            return report
        if unpark:
            report.unparked = [names.get(i, f"#{i}") for i in
                               (store.unpark(campaign.id, selected) if not dry_run else [])]
        requeued, parked = policy.apply(store, campaign.id, selected, dry_run=dry_run)
        report.requeued = [names.get(i, f"#{i}") for i in requeued]
        report.parked = [names.get(i, f"#{i}") for i in parked]
        if not dry_run and (report.unparked or report.requeued or report.parked):
            store.audit(campaign.id, "retry", "; ".join(f"{what} {', '.join(jobs[:20])}" + (" ..." * (len(jobs) > 20))
                                                        for what, jobs in (("unparked", report.unparked),
                                                                           ("requeued", report.requeued),
                                                                           ("parked", report.parked)) if jobs))
        if not dry_run and (requeued or report.unparked or finalize_again):
            report.submit = submit_store(plan_dir, manifest, store, on_batch=on_batch, finalize_again=finalize_again)
    return report
