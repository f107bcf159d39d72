"""The store's records as Python values: what goes in and what comes out."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from hpcrun.backends.scheduler.base import task_id


@dataclass(frozen=True)
class Campaign:
    id: int
    name: str
    spec_digest: str
    profile_digest: str
    created_at: dt.datetime


@dataclass(frozen=True)
class GenerationRecord:
    """One planning of a campaign: its digests, what it reruns, and what made its outputs (``details``:
    release, container, outputs location ...), who planned it and when."""

    number: int
    spec_digest: str
    profile_digest: str
    reprocess: str = "none"
    details: Dict[str, Any] = field(default_factory=dict)
    planned_by: str = "?"
    planned_at: Optional[dt.datetime] = None
    applied_at: Optional[dt.datetime] = None


@dataclass(frozen=True)
class ProvenanceRow:
    """What made one output that passed QA (``record``: the whole of it, as JSON)."""

    input_id: int
    generation: int
    output_path: str
    size: Optional[int]
    checksum: Optional[str]
    record: Dict[str, Any]


@dataclass(frozen=True)
class NewInput:
    """An input file to register; size and checksum may be filled in once known."""

    path: str
    size: Optional[int] = None
    checksum: Optional[str] = None
    checksum_algo: Optional[str] = None
    job_index: Optional[int] = None      # the plan job that processes it
    events: Optional[int] = None
    job_name: Optional[str] = None
    generation: Optional[int] = None     # the campaign's generation whose job it is in

    def __post_init__(self) -> None:
        if (self.checksum is None) != (self.checksum_algo is None):
            raise ValueError(f"{self.path}: checksum and checksum_algo go together")


@dataclass(frozen=True)
class InputRecord:
    id: int
    campaign_id: int
    path: str
    size: Optional[int]
    checksum: Optional[str]
    checksum_algo: Optional[str]
    state: str
    attempts: int
    last_reason: Optional[str]
    claim_token: Optional[str]
    last_submission_id: Optional[int]
    job_index: Optional[int]
    events: Optional[int]
    claimed_at: Optional[dt.datetime]


@dataclass(frozen=True)
class Claim:
    """Inputs moved from pending to submitted for one submitter; ``token`` identifies the claim."""

    token: str
    claimed_by: str
    inputs: Tuple[InputRecord, ...]

    @property
    def ids(self) -> List[int]:
        return [i.id for i in self.inputs]


@dataclass(frozen=True)
class NewSubmission:
    """One job (or one array task) that the scheduler accepted, and the claimed inputs it processes."""

    job_id: str
    script_path: str
    script_digest: str
    tag: str
    input_ids: Sequence[int] = ()
    array_index: Optional[int] = None
    claim_token: Optional[str] = None
    submitted_at: Optional[dt.datetime] = None
    changes: Optional[str] = None       # what a retry changed against the script (the retry policy's words)
    cluster: Optional[str] = None       # the cluster that took it (None: the login node's own)
    script_text: Optional[str] = None   # a script rendered at submission: its exact text (by script_digest)
    generation: Optional[int] = None    # the campaign's generation whose script it ran


class NewStateChange(NamedTuple):
    """One observation of a submission's state (from the scheduler's accounting or its queue); a
    tuple: a poll of a large campaign makes 10^5 at once (a frozen dataclass costs five times more)."""

    submission_id: int
    slurm_state: str
    observed_at: Optional[dt.datetime] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    node: Optional[str] = None
    elapsed_s: Optional[float] = None
    cpu_s: Optional[float] = None
    max_rss_bytes: Optional[int] = None
    reason: Optional[str] = None
    alloc_cpus: Optional[int] = None
    started_at: Optional[dt.datetime] = None
    ended_at: Optional[dt.datetime] = None
    req_mem_bytes: Optional[int] = None


@dataclass(frozen=True)
class JobState:
    """A plan job as the store sees it (its inputs share one state)."""

    job_index: int
    state: str
    attempts: int
    last_reason: Optional[str]
    slurm_job_id: Optional[str]
    array_index: Optional[int]
    slurm_state: Optional[str]
    inputs: int
    input_bytes: Optional[int]
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    elapsed_s: Optional[float] = None
    slurm_reason: Optional[str] = None
    job_name: Optional[str] = None
    cluster: Optional[str] = None     # of the latest submission
    cancel_requested_by: Optional[str] = None   # an operator's hpcrun cancel of the latest submission

    @property
    def slurm_id(self) -> Optional[str]:
        return None if self.slurm_job_id is None else task_id(self.slurm_job_id, self.array_index)


@dataclass(frozen=True)
class RunRow:
    """One submission (a Slurm job or array task) with its last observation."""

    submission_id: int
    job_id: str
    array_index: Optional[int]
    job_index: Optional[int]
    input_bytes: Optional[int]
    inputs: Optional[int]
    submitted_at: dt.datetime
    slurm_state: Optional[str]
    exit_code: Optional[int]
    signal: Optional[int]
    elapsed_s: Optional[float]
    cpu_s: Optional[float]
    alloc_cpus: Optional[int]
    max_rss_bytes: Optional[int]
    started_at: Optional[dt.datetime]
    ended_at: Optional[dt.datetime]
    node: Optional[str]
    reason: Optional[str]
    req_mem_bytes: Optional[int] = None
    failure_class: Optional[str] = None    # the retry policy's class of this attempt's failure
    changes: Optional[str] = None          # what this attempt changed against its script (a retry)
    cluster: Optional[str] = None          # the cluster it ran on (None: the login node's own)


@dataclass(frozen=True)
class RunSpan:
    """A run that started, for the forecast: ended_at None while it runs."""

    state: str
    started_at: dt.datetime
    ended_at: Optional[dt.datetime]
    elapsed_s: Optional[float]
    alloc_cpus: Optional[int]
    inputs: int
    failure_class: Optional[str] = None


@dataclass(frozen=True)
class RunSample:
    """The newest runs that ended and that run now (at most a sample of each), and how many there are."""

    spans: List[RunSpan]
    ended: int          # runs that ended, in all
    running: int        # runs running now, in all


@dataclass(frozen=True)
class InputTotals:
    """The inputs a campaign lists now (withdrawn ones left out)."""

    count: int
    bytes: int
    events: Optional[int]      # None: some inputs' events are not known
    left: int                  # pending, in flight, or failed awaiting a retry
    done: int


@dataclass(frozen=True)
class OutputBytes:
    """The outputs whose size the store recorded (their provenance rows): the inputs they are of, their bytes."""

    inputs: int
    bytes: int


@dataclass(frozen=True)
class InputRow:
    id: int
    job_index: Optional[int]
    path: str
    size: Optional[int]
    events: Optional[int]
    state: str
    attempts: int
    last_reason: Optional[str]


@dataclass(frozen=True)
class QaRow:
    input_id: int
    submission_id: Optional[int]
    events_in: Optional[int]
    events_out: Optional[int]
    passed: bool


@dataclass(frozen=True)
class ReportData:
    runs: List[RunRow]
    inputs: List[InputRow]
    qa: List[QaRow]


class ActiveSubmission:
    """A submission in flight as a poll reads it. A plain class with slots, not a frozen dataclass: a
    poll makes 10^5 of them (a fifth of the cost), and the poller that keeps them between polls sets
    ``last_state`` to what it just recorded."""
    __slots__ = ("id", "job_id", "array_index", "last_state", "submitted_at", "job_index", "job_name", "cluster",
                 "slurm_id")

    def __init__(self, id: int, job_id: str, array_index: Optional[int], last_state: Optional[str],
                 submitted_at: dt.datetime, job_index: Optional[int], job_name: Optional[str] = None,
                 cluster: Optional[str] = None):
        self.id, self.job_id, self.array_index, self.last_state = id, job_id, array_index, last_state
        self.submitted_at, self.job_index, self.job_name = submitted_at, job_index, job_name
        self.cluster = cluster   # job ids are per cluster: (cluster, job_id) is the key
        # computed once, when made: a poll asks for it several times for each of up to 10^5 submissions
        self.slurm_id = job_id if array_index is None else f"{job_id}_{array_index}"   # task_id(), inline

    def __repr__(self) -> str:
        return (f"ActiveSubmission(id={self.id}, slurm_id={self.slurm_id!r}, last_state={self.last_state!r}, "
                f"job_index={self.job_index}, cluster={self.cluster!r})")


@dataclass(frozen=True)
class StateChangeRecord:
    id: int
    submission_id: int
    observed_at: dt.datetime
    slurm_state: str
    exit_code: Optional[int]
    signal: Optional[int]
    node: Optional[str]
    elapsed_s: Optional[float]
    cpu_s: Optional[float]
    max_rss_bytes: Optional[int]
    reason: Optional[str]


@dataclass(frozen=True)
class QaResult:
    input_id: int
    output_path: str
    passed: bool
    events_in: Optional[int] = None
    events_out: Optional[int] = None
    submission_id: Optional[int] = None
    checked_at: Optional[dt.datetime] = None


@dataclass(frozen=True)
class FinalizeRecord:
    """One round of the campaign's finalize job; ``job_id`` None: not (known to be) submitted yet."""

    id: int
    campaign_id: int
    round: int
    tag: str
    after: str
    created_at: dt.datetime
    job_id: Optional[str]
    script_digest: Optional[str]
    dependency: Optional[str]
    submitted_at: Optional[dt.datetime]
    last_state: Optional[str]
    last_observed_at: Optional[dt.datetime]
    exit_code: Optional[int]
    elapsed_s: Optional[float]
    started_at: Optional[dt.datetime]
    ended_at: Optional[dt.datetime]
    reason: Optional[str]


@dataclass(frozen=True)
class Outage:
    """A daemon of a cluster that did not answer (``controller`` or ``accounting``), and since when."""

    cluster: Optional[str]
    daemon: str
    detail: str
    since: dt.datetime
    checked_at: dt.datetime
    ended_at: Optional[dt.datetime] = None

    @property
    def open(self) -> bool:
        return self.ended_at is None

    def within(self, now: dt.datetime, seconds: float) -> bool:
        """Still open, or ended less than ``seconds`` before ``now``."""
        return self.ended_at is None or (now - self.ended_at).total_seconds() < seconds

    def text(self, daemon_name: Optional[str] = None) -> str:
        """``accounting (slurmdbd) of cluster beta not answering since 12:03:04 UTC (3 min)``."""
        where = f"cluster {self.cluster}" if self.cluster else "the cluster"
        seconds = ((self.ended_at or dt.datetime.now(dt.timezone.utc)) - self.since).total_seconds()
        took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
        name = daemon_name or self.daemon
        if self.daemon == "allocation":   # not a daemon: the account's allocation, spent (operate/tracking/budget.py)
            if self.open:
                return f"the allocation on {where} spent since {self.since:%Y-%m-%d %H:%M:%S} UTC ({took})"
            return f"the allocation on {where} was raised at {self.ended_at:%H:%M:%S} UTC after {took}"
        if self.daemon == "slow":   # not a daemon: the scheduler's commands answer slowly (operate/tracking/outages.py)
            if self.open:
                return f"the scheduler of {where} slow since {self.since:%Y-%m-%d %H:%M:%S} UTC ({took}): {self.detail}"
            return (f"the scheduler of {where} answered at its usual pace again at {self.ended_at:%H:%M:%S} UTC "
                    f"after {took}")
        if self.open:
            return f"{name} of {where} not answering since {self.since:%Y-%m-%d %H:%M:%S} UTC ({took})"
        return f"{name} of {where} answered again at {self.ended_at:%H:%M:%S} UTC after {took}"

    def as_dict(self) -> Dict[str, Any]:
        return {"cluster": self.cluster, "daemon": self.daemon, "detail": self.detail,
                "since": self.since.isoformat(), "checked_at": self.checked_at.isoformat(),
                "ended_at": self.ended_at.isoformat() if self.ended_at else None,
                "seconds": round(((self.ended_at or dt.datetime.now(dt.timezone.utc)) - self.since).total_seconds())}


@dataclass(frozen=True)
class ClusterHealth:
    """One cluster of a campaign as last seen: up, down (its controller does not answer) or in maintenance."""

    name: Optional[str]
    state: str
    detail: str
    since: dt.datetime
    checked_at: dt.datetime

    def as_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "state": self.state, "detail": self.detail,
                "since": self.since.isoformat(), "checked_at": self.checked_at.isoformat()}


@dataclass(frozen=True)
class SupervisorRecord:
    """Who supervises a campaign (``hpcrun run``), since when, and when it was last seen alive."""

    holder: str                # user@host:pid
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    rounds: int
    phase: str                 # running | finished | stopped
    note: Optional[str]
    poll_interval_s: Optional[float]

    def age_s(self, now: Optional[dt.datetime] = None) -> float:
        return ((now or dt.datetime.now(dt.timezone.utc)) - self.heartbeat_at).total_seconds()


@dataclass(frozen=True)
class FailedJob:
    """A failed plan job as the retry policy sees it: how its last attempt ended and what came before."""

    job_index: int
    attempts: int
    submission_id: Optional[int]
    state: Optional[str]
    exit_code: Optional[int]
    node: Optional[str]
    max_rss_bytes: Optional[int]
    reason: Optional[str]
    adjust: Optional[str]                 # JSON of the changes its last submission carried
    past_classes: Dict[str, int] = field(default_factory=dict)   # failure class -> earlier failures of it
    cancel_requested_by: Optional[str] = None   # who asked hpcrun to cancel its last submission (hpcrun cancel)
    elapsed_s: Optional[float] = None           # how long its last attempt ran (accounting)


@dataclass(frozen=True)
class RetryDecision:
    """What the policy decided for one failed job."""

    job_index: int
    submission_id: Optional[int]
    failure_class: str
    requeue: bool
    adjust: Optional[str] = None          # JSON for the next submission (requeue)
    reason: Optional[str] = None          # why it was parked (park)


@dataclass(frozen=True)
class ExportRecord:
    """One output sent on to outputs.export (hpcrun_export)."""

    input_id: int
    source: str
    dest: str
    state: str                      # pending | verified | failed
    attempts: int
    bytes: Optional[int] = None
    checksum: Optional[str] = None
    seconds: Optional[float] = None
    last_error: Optional[str] = None
    next_at: Optional[dt.datetime] = None


@dataclass(frozen=True)
class ExportSummary:
    """A campaign's exports in figures: files per state, what was verified, what failed."""

    files: Dict[str, int]           # pending, verified, failed
    bytes: int                      # verified at the destination
    seconds: float                  # the verified copies' time
    failed_attempts: int
    last_error: Optional[str] = None

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def backlog(self) -> int:
        return self.files.get("pending", 0)

    def as_dict(self) -> Dict[str, Any]:
        return {"files": dict(self.files), "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "mb_per_s": round(self.mb_per_s, 3), "backlog": self.backlog,
                "failed_attempts": self.failed_attempts, "last_error": self.last_error}
