"""The retry policy: per failure class, retry (with a change) or park at once, with the reason.

The spec's ``retry`` section (hpcrun/model/retry.py; the classes: hpcrun/model/failures.py) is frozen into
the manifest as one rule per class. For each failed plan job this module picks the class of its last attempt, counts
the earlier failures of that class, and decides: park it (the class is not retried, it is out
of attempts, or the change it needs is no longer possible) or send it back to pending with
what its next submission must change (more time, more memory, other nodes). Both
``hpcrun run`` and ``hpcrun retry`` use it, so they never disagree.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpcrun.model.failures import classify, default_rules
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.results import adjust_of  # noqa: F401  (re-exported: the decision's JSON read back)
from hpcrun.store.records import FailedJob, RetryDecision
from hpcrun.store.store import StateStore
from hpcrun.units import format_duration, format_size

MAX_EXCLUDED = 16        # nodes kept off one job; older ones are forgotten first
EARLY_SHARE = 0.9        # a TIMEOUT before this share of the time limit was not the job's length (class allocation)


class RetryPolicy:
    """Rules per failure class, the campaign-wide cap, and the partition's limits."""

    def __init__(self, rules: Dict[str, Dict[str, Any]], max_total: int, limits: Dict[str, Any],
                 walltime_s: int):
        self.rules = rules
        self.max_total = max_total
        self.limits = limits
        self.walltime_s = walltime_s

    @classmethod
    def from_manifest(cls, manifest: Manifest, *, max_attempts: Optional[int] = None,
                      cancelled: Optional[bool] = None) -> RetryPolicy:
        sub = manifest.submit
        attempts = 3 if sub.max_attempts is None else int(sub.max_attempts)
        rules = sub.retry or default_rules(attempts, bool(sub.retry_cancelled))   # plans from before the policy
        defaults = default_rules(attempts)
        # a plan written before a class existed (site_cancel) gets that class's default rule
        rules = {**defaults, **{k: dict(v) for k, v in rules.items()}}
        if cancelled is not None:
            rules["cancelled"]["retry"] = cancelled
        total = int(max_attempts or sub.max_total_attempts or attempts)
        return cls(rules, total, dict(sub.limits), manifest.walltime_seconds)

    # -- one job ---------------------------------------------------------------------------
    def decide(self, job: FailedJob) -> RetryDecision:
        data: Dict[str, Any] = json.loads(job.adjust) if job.adjust else {}
        cls = classify(job.state, job.exit_code, by_operator=bool(job.cancel_requested_by),
                       early=self._early(job, int(data.get("walltime_s") or self.walltime_s)))
        rule = self.rules.get(cls) or self.rules["other"]
        failures = job.past_classes.get(cls, 0) + 1          # this one included
        what = f"{cls} ({job.reason or job.state or 'failed'})"
        if cls == "site_cancel" and not job.reason:
            what = f"{cls} (CANCELLED, not through hpcrun cancel)"

        def park(why: str) -> RetryDecision:
            return RetryDecision(job.job_index, job.submission_id, cls, False, reason=f"parked: {why}")

        if not rule.get("retry", True):
            if cls == "cancelled":   # an operator's decision: left failed for them (retry --cancelled)
                return RetryDecision(job.job_index, job.submission_id, cls, False)
            return park(f"{what}; this class is not retried (retry.on.{cls}.retry)")
        if failures >= int(rule.get("max_attempts") or 1):
            return park(f"{what}, {failures} time(s) in {job.attempts} attempt(s) (retry.on.{cls}.max_attempts)")
        if job.attempts >= self.max_total:
            return park(f"{what}; {job.attempts} attempts in all (retry.max_total_attempts)")
        notes: List[str] = []
        refused = (self._more_time(rule, data, notes) or self._more_memory(rule, job, data, notes)
                   or self._exclude(rule, job, data, notes))
        if refused:
            return park(f"{what}; {refused}")
        if rule.get("restage"):
            notes.append("inputs staged again")
        data["changes"] = f"after {cls}: " + ("; ".join(notes) if notes else "resubmitted unchanged")
        return RetryDecision(job.job_index, job.submission_id, cls, True, adjust=json.dumps(data, sort_keys=True))

    @staticmethod
    def _early(job: FailedJob, limit_s: int) -> bool:
        """It ran well short of its time limit (a job that reaches it runs the limit, or a little more)."""
        return job.elapsed_s is not None and limit_s > 0 and job.elapsed_s < EARLY_SHARE * limit_s

    @staticmethod
    def _grow(current: int, factor: float, top: Optional[int]) -> Optional[int]:
        """``current`` times ``factor``, capped at ``top``; None when that is no more than ``current``."""
        new = math.ceil(current * float(factor))
        new = min(new, top) if top else new
        return new if new > current else None

    def _more_time(self, rule: Dict[str, Any], data: Dict[str, Any], notes: List[str]) -> Optional[str]:
        if not rule.get("more_walltime"):
            return None
        current = int(data.get("walltime_s") or self.walltime_s)
        new = self._grow(current, rule["more_walltime"], int(self.limits.get("max_walltime_s") or 0) or None)
        if new is None:
            return f"the time limit is already the partition's maximum ({format_duration(current)})"
        data["walltime_s"] = new
        notes.append(f"time limit {format_duration(current)} -> {format_duration(new)}")
        return None

    def _more_memory(self, rule: Dict[str, Any], job: FailedJob, data: Dict[str, Any],
                     notes: List[str]) -> Optional[str]:
        if not rule.get("more_memory"):
            return None
        top = int(self.limits.get("memory_per_node_bytes") or 0) or None
        current = int(data.get("mem_bytes") or job.max_rss_bytes or top or 0)
        if not current:
            return None   # nothing known to grow from: resubmit unchanged
        new = self._grow(current, rule["more_memory"], top)
        if new is None:
            return f"it already had a node's whole memory ({format_size(current)})"
        data["mem_bytes"] = new
        notes.append(f"memory {format_size(current)} -> {format_size(new)}")
        return None

    def _exclude(self, rule: Dict[str, Any], job: FailedJob, data: Dict[str, Any], notes: List[str]) -> Optional[str]:
        if not rule.get("exclude_node") or not job.node:
            return None
        excluded = [n for n in data.get("exclude", []) if n != job.node] + [job.node]
        nodes = int(self.limits.get("nodes") or 0)
        if nodes and len(excluded) >= nodes:
            excluded = [job.node]   # never exclude the whole partition: forget the older ones
        data["exclude"] = excluded[-MAX_EXCLUDED:]
        notes.append(f"not on {job.node}")
        return None

    # -- the campaign ----------------------------------------------------------------------
    def decisions(self, store: StateStore, campaign_id: int,
                  job_indices: Optional[Sequence[int]] = None) -> List[RetryDecision]:
        return [self.decide(job) for job in store.failed_jobs(campaign_id, job_indices)]

    def apply(self, store: StateStore, campaign_id: int, job_indices: Optional[Sequence[int]] = None,
              dry_run: bool = False) -> Tuple[List[int], List[int]]:
        """Decide for every failed job and write it; returns (requeued, parked) plan job indices.

        A cancelled job that is not retried is neither: it stays failed for the operator."""
        decisions = self.decisions(store, campaign_id, job_indices)
        if not dry_run and decisions:   # an operator's cancellation is only classed (it stays failed)
            store.apply_retry(campaign_id, decisions)
        return ([d.job_index for d in decisions if d.requeue],
                [d.job_index for d in decisions if not d.requeue and d.reason])
