"""What a submit did: the batches it sent, what it recovered or released, the finalize job."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from hpcrun.backends.scheduler import Adjust


@dataclass(frozen=True)
class ScriptInfo:
    path: str          # relative to the plan directory
    sha256: str
    first: int
    last: int
    is_array: bool
    headers: Optional[str] = None   # rendered at submission: the table beside the template ``path``
    generation: int = 1             # the campaign's generation that planned it


@dataclass
class Batch:
    """One submission: a script and the plan jobs it runs."""

    script: ScriptInfo
    jobs: List[int]
    array_spec: Optional[str] = None
    job_id: Optional[str] = None
    tag: Optional[str] = None
    adjust: Optional[Adjust] = None     # a retry's changes to the script's request
    changes: Optional[str] = None       # the same in words, recorded with the submission
    cluster: Optional[str] = None       # the cluster it went to (several clusters)

    @property
    def tasks(self) -> int:
        return len(self.jobs)


@dataclass
class FinalizeAction:
    """What this submit did about the campaign's finalize job, and why."""

    action: str                    # submitted, recovered, would-submit, waiting, skipped, refused, earlier
    message: str
    job_id: Optional[str] = None
    round: Optional[int] = None
    dependency: Optional[str] = None

    def as_dict(self) -> Dict[str, Any]:
        return {"action": self.action, "message": self.message, "job_id": self.job_id, "round": self.round,
                "dependency": self.dependency}


@dataclass
class SubmitReport:
    campaign: str
    store: str
    batches: List[Batch] = field(default_factory=list)
    recovered: List[Tuple[str, str]] = field(default_factory=list)   # (tag, job id) found after a stop
    released: List[str] = field(default_factory=list)                # tags Slurm never got: back to pending
    left_pending: int = 0
    queue: Optional[Tuple[int, int]] = None                          # (queued now, max_queued_jobs)
    dry_run: bool = False
    finalize: Optional[FinalizeAction] = None                        # None: the spec has no finalize
    paused: Optional[str] = None                                     # "paused by ... at ...": nothing new went out
    clusters: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # several clusters: each one's standing
    spent: Optional[str] = None                                      # the allocation is spent: nothing new went out

    @property
    def submitted_jobs(self) -> int:
        return sum(b.tasks for b in self.batches if b.job_id)


def outcome_of(inputs: Dict[str, int], cancelled: int) -> Dict[str, int]:
    """Inputs done (verified at the export destination, or on their way there), parked, cancelled by an
    operator (``hpcrun cancel``), their export given up (outputs.export, only when some were), and not
    ended (pending, in flight, failed before the retry policy's decision): finished when the last is 0."""
    done = inputs.get("done", 0) + inputs.get("exporting", 0)
    parked, given_up = inputs.get("parked", 0), inputs.get("export_failed", 0)
    out = {"done": done, "parked": parked, "cancelled_by_operator": cancelled,
           "not_ended": sum(inputs.values()) - done - parked - cancelled - given_up}
    return {**out, "export_failed": given_up} if given_up else out


IN_FLIGHT = ("submitted", "running")


@dataclass
class JobRow:
    job: str                # the plan job's name
    index: int
    status: str             # the store's state: pending submitted running done failed parked
    state: str              # Slurm's last state ("" before submission)
    slurm_id: str
    exit_code: str
    elapsed: str
    attempts: int
    reason: str

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class StatusReport:
    campaign: str
    store: str
    jobs: List[JobRow] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)        # plan jobs per store state
    inputs: Dict[str, int] = field(default_factory=dict)        # inputs per store state
    observed: int = 0                                           # transitions recorded by this poll
    held: int = 0                                               # pending jobs held by a burst-buffer failure
    accounting_seconds: float = 0.0
    finalize: Optional[Dict[str, Any]] = None                   # the finalize job; None: the spec has none
    supervisor: Optional[Dict[str, Any]] = None                 # hpcrun run's heartbeat; None: never supervised
    paused: Optional[str] = None                                # "paused by USER@HOST at TIME": nothing new goes out
    clusters: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # several clusters: each one's jobs and health
    exports: Optional[Dict[str, Any]] = None                    # outputs.export figures (ExportSummary.as_dict)
    outages: List[Dict[str, Any]] = field(default_factory=list)  # daemons not answering (and lately back)
    outcome: Dict[str, int] = field(default_factory=dict)       # inputs done, parked, cancelled, not ended
    generations: List[Dict[str, Any]] = field(default_factory=list)  # a campaign planned more than once: each one's
    # jobs pending because the account's allocation is spent: cluster label ("" on one) -> reason -> jobs
    budget_held: Dict[str, Dict[str, int]] = field(default_factory=dict)
    forecast: Optional[Dict[str, Any]] = None                   # hpcrun.operate.campaign.forecast.Forecast.as_dict
    pilots: Optional[Dict[str, Any]] = None                     # late binding: the pilots and inputs in them
    footprint: List[Dict[str, Any]] = field(default_factory=list)  # files, bytes made per filesystem (est.)

    @property
    def finalize_in_flight(self) -> bool:
        """The finalize job is queued or running (and not stuck on a dependency that can never be met)."""
        f = self.finalize
        return bool(f and f["status"] in IN_FLIGHT and "DependencyNeverSatisfied" not in (f["reason"] or ""))

    @property
    def in_flight(self) -> int:
        return sum(self.counts.get(s, 0) for s in IN_FLIGHT)

    @property
    def finished(self) -> int:
        return sum(self.counts.get(s, 0) for s in ("done", "failed", "parked"))

    def as_dict(self) -> Dict[str, Any]:
        return {"campaign": self.campaign, "store": self.store, "counts": self.counts, "inputs": self.inputs,
                "in_flight": self.in_flight, "held": self.held, "finalize": self.finalize,
                "supervisor": self.supervisor, "paused": self.paused, "clusters": self.clusters,
                "exports": self.exports, "outages": self.outages, "outcome": self.outcome,
                "generations": self.generations, "budget_held": self.budget_held, "forecast": self.forecast,
                "pilots": self.pilots, "footprint": self.footprint,
                "jobs": [j.as_dict() for j in self.jobs]}


def adjust_of(text: Optional[str]) -> Tuple[Optional[Adjust], Optional[str]]:
    """The scheduler's Adjust and the change in words from a decision's JSON."""
    if not text:
        return None, None
    data = json.loads(text)
    adjust = Adjust(data.get("walltime_s"), data.get("mem_bytes"), tuple(data.get("exclude", ())),
                    tuple(data.get("nodelist", ())))
    return (adjust or None), (data.get("changes") or None)
