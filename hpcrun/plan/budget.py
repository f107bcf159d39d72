"""Will the campaign fit in the account's allocation? The plan's need against the scheduler's limits.

The need is what the scheduler will count: CPUs it allocates (whole nodes on an exclusive partition,
one per chain on a shared one) times the walltime, and again at the walltime the retry policy may
escalate a job to (``time_limit``: ``more_walltime`` per attempt, up to the partition's maximum). The
account's limits and usage come from the scheduler (``Scheduler.allocation``): ``cpu`` TRES-minutes
are compared with the CPU-minutes, ``billing`` with the site's charge (the profile's ``charge_per`` x
``charge_factor``, which should mirror its billing weights). Nothing here is in the manifest: an
account's usage changes by the hour, so it is checked at each ``plan``, never recorded as the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional, Tuple

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.backends.scheduler.base import Allocation, SchedulerError
from hpcrun.errors import InputError, Problem
from hpcrun.model.retry import effective_rules
from hpcrun.plan.values import Plan
from hpcrun.units import format_duration


@dataclass(frozen=True)
class Budget:
    """One cluster's answer: what the plan needs and what the account has left (None: not checked)."""

    cluster: Optional[str]
    account: Optional[str]
    unit: str
    need: float                         # TRES-minutes (cpu) at the walltime
    need_escalated: float               # ... at the walltime retries may escalate to
    escalated_walltime_s: int
    tres: str = "cpu"
    left: Optional[float] = None        # TRES-minutes left under the tightest limit
    limit: Optional[int] = None
    per_job_limit: Optional[int] = None
    per_job_need: float = 0.0
    unchecked: str = ""                 # why the scheduler was not asked, or did not answer
    notes: Tuple[str, ...] = field(default_factory=tuple)
    charge: Tuple[float, float] = (0.0, 0.0)   # the site's charge at the walltime and escalated, in ``unit``

    @property
    def short(self) -> bool:
        return self.left is not None and self.need > self.left

    def as_dict(self) -> dict:
        return {"cluster": self.cluster, "account": self.account, "tres": self.tres, "unit": self.unit,
                "need_minutes": round(self.need, 1), "need_escalated_minutes": round(self.need_escalated, 1),
                "escalated_walltime_s": self.escalated_walltime_s,
                "left_minutes": None if self.left is None else round(self.left, 1), "limit_minutes": self.limit,
                "short": self.short, "checked": not self.unchecked, "why_unchecked": self.unchecked or None,
                "charge": round(self.charge[0], 2), "charge_escalated": round(self.charge[1], 2),
                "line": self.line()}

    def line(self) -> str:
        where = f"account {self.account or '(default)'}" + (f" on cluster {self.cluster}" if self.cluster else "")
        need = (f"the plan needs {self.need:,.0f} {self.tres}-minutes at its walltime, {self.need_escalated:,.0f} "
                f"at the {format_duration(self.escalated_walltime_s)} retries may escalate to (a charge of "
                f"{self.charge[0]:,.1f} {self.unit}, {self.charge[1]:,.1f} escalated)")
        if self.unchecked:
            return f"could not check the budget of {where}: {self.unchecked}; {need}"
        if self.left is None:
            text = f"{where}: no {self.tres}-minute limit (GrpTRESMins); {need}"
        else:
            left, used = max(0.0, self.left), (self.limit or 0) - self.left
            text = (f"{where} has {left:,.0f} of {self.limit:,} {self.tres}-minutes left ({used:,.0f} used; "
                    f"GrpTRESMins); {need}"
                    + (f": {self.need - left:,.0f} more than is left" if self.short else
                       f": {self.need_escalated - left:,.0f} more than is left if every job escalates"
                       if self.need_escalated > left else ""))
        return "; ".join((text, *self.notes))


def escalated_walltime(plan: Plan) -> int:
    """The longest time limit a job may get from the retry policy's time_limit rule."""
    rule = effective_rules(plan.campaign.retry)["time_limit"]
    walltime = int(plan.campaign.walltime)
    factor = float(rule.get("more_walltime") or 1.0)
    if not rule.get("retry", True) or factor <= 1.0:
        return walltime
    grown = walltime * factor ** max(0, int(rule.get("max_attempts") or 1) - 1)
    return int(min(grown, plan.partition.max_walltime))


def _compare(plan: Plan, alloc: Allocation, base: Budget) -> Budget:
    """cpu limits against the CPU-minutes; a billing limit against the charge in the site's units."""
    tres, need, esc = "cpu", base.need, base.need_escalated
    left = alloc.left("cpu")
    if left is None and alloc.left("billing") is not None:
        tres, left = "billing", alloc.left("billing")
        need, esc = plan.charge() * 60, plan.charge(base.escalated_walltime_s) * 60
    notes: List[str] = []
    per_job = dict(alloc.per_job).get(tres)
    one_job = need / max(1, len(plan.jobs))
    if per_job is not None and one_job > per_job:
        notes.append(f"one job needs {one_job:,.0f} {tres}-minutes, more than MaxTRESMins allows ({per_job:,})")
    return Budget(base.cluster, alloc.account, base.unit, need, esc, base.escalated_walltime_s, tres,
                  None if left is None else left[0], None if left is None else left[1], per_job, one_job,
                  notes=tuple(notes), charge=base.charge)


def check_one(plan: Plan) -> Budget:
    walltime = escalated_walltime(plan)
    need = plan.cpu_minutes
    base = Budget(plan.seat.name, plan.campaign.site.account, plan.profile.budget.charge_unit, need,
                  need * walltime / max(1, plan.campaign.walltime), walltime,
                  charge=(plan.charge(), plan.charge(walltime)))
    if not plan.profile.budget.check_budget:
        return replace(base, unchecked="the site profile says not to (accounting.check_budget)")
    if not plan.accounting:
        return replace(base, unchecked="the scheduler keeps no accounting here")
    try:
        alloc = scheduler_for(plan.scheduler, plan.seat.name).allocation(plan.campaign.site.account)
    except SchedulerError as exc:
        return replace(base, unchecked=str(exc).splitlines()[0])
    return _compare(plan, alloc, base)


def check(plan: Plan) -> List[Budget]:
    """Each cluster's budget; with ``accounting.enforce_budget``, a shortfall is refused (exit 2)."""
    budgets = [check_one(p) for p in plan.all_clusters]
    refused = [(p, b) for p, b in zip(plan.all_clusters, budgets) if b.short and p.profile.budget.enforce_budget]
    if refused:
        raise InputError([Problem(
            *_where_set(p), "accounting.enforce_budget",
            f"the campaign does not fit in its allocation: {b.line()}. Lower the campaign (fewer inputs, a "
            "shorter walltime), ask for more allocation, give another site.account, or set "
            "accounting.enforce_budget: false in the site profile to plan anyway")
            for p, b in refused])
    return budgets


def _where_set(plan: Plan) -> Tuple[str, Optional[int]]:
    """The profile file (and line) that sets enforce_budget: the layer that says it last."""
    for path in reversed(plan.profile_files):
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        hit = next((n for n, text in enumerate(lines, 1) if "enforce_budget" in text), None)
        if hit is not None:
            return str(path), hit
    return (str(plan.profile_files[0]) if plan.profile_files else plan.profile.name), None
