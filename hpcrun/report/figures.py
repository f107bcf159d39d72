"""Campaign figures of merit from the state store: success rate, CPU efficiency, throughput.

The figures follow the STAR production at NERSC: an input *succeeded* when its job
completed and its QA passed (at least ``qa.min_event_fraction`` of the events in the
output); CPU efficiency is TotalCPU / (Elapsed x CPUs) as the scheduler's accounting reports them, summed over
every run that ended (a failed attempt used the CPUs too). Everything here is computed
from what ``hpcrun status`` recorded; nothing calls Slurm.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpcrun.backends.scheduler.base import TERMINAL, task_id
from hpcrun.store.records import ReportData, RunRow

# what the generated job's exit codes mean (docs/generated-job.md)
EXIT_LABELS = {3: "setup failed", 4: "payload copy failed", 5: "database never ready",
               6: "database died too often", 7: "chain failed", 8: "merge failed", 9: "QA failed",
               10: "time limit", 11: "input checksum mismatch", 13: "input transfer failed",
               14: "chain killed by a signal"}


@dataclass
class RunMetrics:
    """One completed run (job or array task)."""

    job: str
    slurm_id: str
    elapsed_s: float
    cpu_s: float
    cpus: int
    cpu_efficiency: Optional[float]
    input_bytes: int
    events: Optional[int]
    mb_per_s: Optional[float]
    events_per_s: Optional[float]
    walltime_per_event_s: Optional[float]
    max_rss_bytes: Optional[int]
    ended_at: Optional[str]
    req_mem_bytes: Optional[int] = None
    mem_efficiency: Optional[float] = None      # MaxRSS / requested memory, as seff reports it
    mb_per_s_per_core: Optional[float] = None   # input MB / elapsed / allocated CPUs
    events_per_s_per_core: Optional[float] = None


@dataclass
class Transfers:
    """The jobs' copies of remote inputs (``transfers.tsv``, one line per xrdcp attempt)."""

    files: int                                  # copies that succeeded
    bytes: int
    seconds: float                              # summed over the successful copies
    mb_per_s: Optional[float]                   # bytes / seconds: one copy's mean rate
    failed_attempts: int
    slowest_mb_per_s: Optional[float]
    # how each input came (local: read in place; server; cache: through XCache): inputs, bytes, seconds,
    # seconds per input, MB/s
    by_path: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # each job's staged MB / its stage-in wall time / its CPUs, the mean over jobs (copies overlap)
    mb_per_s_per_core: Optional[float] = None


@dataclass
class FailureGroup:
    reason: str
    count: int
    example: str


@dataclass
class CampaignReport:
    campaign: str
    generated_at: str
    inputs: Dict[str, int]                      # by store state
    inputs_total: int
    succeeded: int                              # done and QA passed
    success_rate: Optional[float]               # succeeded / inputs that finished (done, failed, parked)
    completion: Optional[float]                 # succeeded / all inputs
    cpu_efficiency: Optional[float]             # sum TotalCPU / sum Elapsed x CPUs, every ended run
    cpu_hours: float
    core_hours_allocated: float
    runs_ended: int
    runs_completed: int
    qa_passed: int
    qa_failed: int
    events_in: int
    events_out: int
    throughput_mb_per_s: Optional[float]        # all completed input bytes / campaign span
    throughput_events_per_s: Optional[float]
    mean_job_mb_per_s: Optional[float]
    mean_job_events_per_s: Optional[float]
    mean_walltime_per_event_s: Optional[float]
    span_s: Optional[float]                     # first start to last end
    failures: List[FailureGroup] = field(default_factory=list)
    attempts: Dict[int, int] = field(default_factory=dict)   # inputs by number of submissions
    runs: List[RunMetrics] = field(default_factory=list)
    timeline: List[Tuple[str, int]] = field(default_factory=list)  # (end time, completed so far)
    qa_timeline: List[Tuple[str, int]] = field(default_factory=list)  # (end time, QA passed so far)
    memory_efficiency: Optional[float] = None   # sum MaxRSS / sum requested memory, completed runs
    attempts_by_class: Dict[str, int] = field(default_factory=dict)  # failed attempts per retry-policy class
    retry_changes: List[Tuple[str, str, str]] = field(default_factory=list)  # (job, slurm id, what changed)
    finalize: Optional[Dict[str, Any]] = None   # the finalize job as `hpcrun status` shows it; None: no such job
    mb_per_s_per_core: Optional[float] = None   # completed runs: input MB / sum of elapsed x CPUs
    events_per_s_per_core: Optional[float] = None
    targets: Dict[str, float] = field(default_factory=dict)   # the spec's targets (mb_per_s_per_core ...)
    transfers: Optional[Transfers] = None       # None: no job copied remote inputs
    exports: Optional[Dict[str, Any]] = None    # outputs.export: files per state, bytes, MB/s, backlog, failures
    chain_endings: Dict[str, int] = field(default_factory=dict)   # chains.tsv: ok, failed, crashed, killed
    reclaimed: Dict[str, int] = field(default_factory=dict)  # leftovers removed by later jobs: dirs, bytes
    pilots: Optional[Dict[str, Any]] = None   # late binding: payload copies, core-seconds held and idle, CPU
    node_cache: Dict[str, Any] = field(default_factory=dict)  # xrootd.node_cache: hits, misses, hit ratio, bytes
    clusters: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # several clusters: each one's figures
    # inputs by how they ended: done, parked (a reason to read), cancelled by an operator (hpcrun cancel),
    # and the rest (in flight, pending, or failed awaiting the retry policy)
    outcome: Dict[str, int] = field(default_factory=dict)
    generations: List[Dict[str, Any]] = field(default_factory=list)   # planned more than once: each one's figures
    forecast: Optional[Dict[str, Any]] = None   # operate.campaign.forecast.Forecast.as_dict (made with the report)
    allocation: List[Dict[str, Any]] = field(default_factory=list)   # spent allocations (open or lately raised)

    def as_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["attempts"] = {str(k): v for k, v in self.attempts.items()}
        return data


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den > 0 else None


def _mean(values: List[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _iso(moment: Optional[dt.datetime]) -> Optional[str]:
    return moment.isoformat(timespec="seconds") if moment else None


def failure_label(run: RunRow) -> str:
    """A failure's group: the job's own exit code meaning where it has one, else Slurm's state."""
    state = run.slurm_state or "?"
    if state == "FAILED" and run.exit_code in EXIT_LABELS:
        return f"{EXIT_LABELS[run.exit_code]} (exit {run.exit_code})"
    if state == "FAILED" and run.exit_code is not None:
        return f"FAILED exit {run.exit_code}"
    return state


def build(campaign: str, data: ReportData, job_names: Dict[int, str]) -> CampaignReport:
    """Compute the report from the store's rows (see ``StateStore.report_rows``)."""
    inputs_by_state = Counter(i.state for i in data.inputs)
    latest_qa: Dict[int, Any] = {}
    for q in data.qa:  # in insertion order: the last outcome per input wins
        latest_qa[q.input_id] = q
    succeeded = sum(1 for i in data.inputs if i.state == "done"
                    and (i.id not in latest_qa or latest_qa[i.id].passed))
    finished = sum(inputs_by_state.get(s, 0) for s in ("done", "failed", "parked"))
    events_by_run: Dict[int, int] = {}
    for q in data.qa:
        if q.submission_id is not None and q.events_in is not None:
            events_by_run[q.submission_id] = events_by_run.get(q.submission_id, 0) + q.events_in
    planned_events: Dict[int, int] = {}
    for i in data.inputs:
        if i.job_index is not None and i.events is not None:
            planned_events[i.job_index] = planned_events.get(i.job_index, 0) + i.events

    ended = [r for r in data.runs if r.slurm_state in TERMINAL or r.slurm_state == "LOST"]
    cpu, alloc, span = _usage(ended)
    runs: List[RunMetrics] = []
    for r in ended:
        if r.slurm_state != "COMPLETED" or not r.elapsed_s:
            continue
        events = events_by_run.get(r.submission_id)
        if events is None and r.job_index is not None:
            events = planned_events.get(r.job_index)
        nbytes = r.input_bytes or 0
        runs.append(RunMetrics(
            job_names.get(r.job_index, f"#{r.job_index}") if r.job_index is not None else "?",
            task_id(r.job_id, r.array_index),
            r.elapsed_s, r.cpu_s or 0.0, r.alloc_cpus or 0,
            _ratio(r.cpu_s or 0.0, r.elapsed_s * (r.alloc_cpus or 0)),
            nbytes, events, nbytes / 1e6 / r.elapsed_s, events / r.elapsed_s if events else None,
            r.elapsed_s / events if events else None, r.max_rss_bytes, _iso(r.ended_at), r.req_mem_bytes,
            _ratio(r.max_rss_bytes or 0, r.req_mem_bytes or 0) if r.max_rss_bytes else None,
            _ratio(nbytes / 1e6, r.elapsed_s * (r.alloc_cpus or 0)),
            _ratio(events, r.elapsed_s * (r.alloc_cpus or 0)) if events else None))
    total_bytes = sum(m.input_bytes for m in runs)
    total_events = sum(m.events or 0 for m in runs)
    core_s = sum(m.elapsed_s * m.cpus for m in runs)

    groups: Dict[str, List[RunRow]] = {}
    for r in ended:
        if r.slurm_state != "COMPLETED":
            groups.setdefault(failure_label(r), []).append(r)
    failures = sorted((FailureGroup(label, len(rs), next((x.reason for x in rs if x.reason), "") or "")
                       for label, rs in groups.items()), key=lambda g: (-g.count, g.reason))

    qa_latest = list(latest_qa.values())
    report = CampaignReport(
        campaign=campaign, generated_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        inputs={s: inputs_by_state.get(s, 0) for s in ("pending", "submitted", "running", "done", "failed",
                                                       "parked")},
        inputs_total=len(data.inputs), succeeded=succeeded, success_rate=_ratio(succeeded, finished),
        completion=_ratio(succeeded, len(data.inputs)), cpu_efficiency=_ratio(cpu, alloc),
        cpu_hours=cpu / 3600, core_hours_allocated=alloc / 3600, runs_ended=len(ended),
        runs_completed=len(runs), qa_passed=sum(1 for q in qa_latest if q.passed),
        qa_failed=sum(1 for q in qa_latest if not q.passed),
        events_in=sum(q.events_in or 0 for q in qa_latest), events_out=sum(q.events_out or 0 for q in qa_latest),
        throughput_mb_per_s=_ratio(total_bytes / 1e6, span or 0.0),
        throughput_events_per_s=_ratio(total_events, span or 0.0) if total_events else None,
        mean_job_mb_per_s=_mean([m.mb_per_s for m in runs if m.mb_per_s is not None]),
        mean_job_events_per_s=_mean([m.events_per_s for m in runs if m.events_per_s is not None]),
        mean_walltime_per_event_s=_mean([m.walltime_per_event_s for m in runs
                                         if m.walltime_per_event_s is not None]),
        span_s=span, failures=failures, attempts=dict(sorted(Counter(i.attempts for i in data.inputs).items())),
        runs=runs, mb_per_s_per_core=_ratio(total_bytes / 1e6, core_s),
        events_per_s_per_core=_ratio(total_events, core_s) if total_events else None)
    _add_history(report, data, ended, latest_qa, job_names)
    report.clusters = per_cluster(ended)
    return report


def per_cluster(ended: List[RunRow]) -> Dict[str, Dict[str, Any]]:
    """Runs, success rate (completed runs / ended runs), CPU efficiency and throughput of each cluster,
    when the runs went to more than one (or a named) cluster; moves are not counted as runs."""
    by: Dict[str, List[RunRow]] = {}
    for r in ended:
        if r.failure_class != "moved":
            by.setdefault(r.cluster or "", []).append(r)
    if not by or list(by) == [""]:
        return {}
    out: Dict[str, Dict[str, Any]] = {}
    for name, rows in sorted(by.items()):
        done = [r for r in rows if r.slurm_state == "COMPLETED"]
        cpu, alloc, span = _usage(rows)
        out[name or "(default)"] = {
            "runs_ended": len(rows), "runs_completed": len(done), "success_rate": _ratio(len(done), len(rows)),
            "cpu_efficiency": _ratio(cpu, alloc), "cpu_hours": cpu / 3600,
            "throughput_mb_per_s": _ratio(sum(r.input_bytes or 0 for r in done) / 1e6, span or 0.0)}
    return out


def _usage(ended: List[RunRow]) -> Tuple[float, float, Optional[float]]:
    """CPU seconds used, core seconds allocated, and first start to last end (None: no times) of runs."""
    cpu = sum(r.cpu_s or 0.0 for r in ended)
    alloc = sum((r.elapsed_s or 0.0) * (r.alloc_cpus or 0) for r in ended)
    starts = [r.started_at for r in ended if r.started_at]
    ends = [r.ended_at for r in ended if r.ended_at]
    return cpu, alloc, (max(ends) - min(starts)).total_seconds() if starts and ends else None


def _cumulative(times: List[dt.datetime]) -> List[Tuple[str, int]]:
    return [(_iso(t) or "", k + 1) for k, t in enumerate(sorted(times))]


def _add_history(report: CampaignReport, data: ReportData, ended: List[RunRow], latest_qa: Dict[int, Any],
                 job_names: Dict[int, str]) -> None:
    """Progress over time, memory efficiency and the retry policy's classes and changes."""
    report.timeline = _cumulative([r.ended_at for r in ended if r.slurm_state == "COMPLETED" and r.ended_at])
    end_of = {r.submission_id: r.ended_at for r in ended}
    report.qa_timeline = _cumulative([t for q in latest_qa.values() if q.passed
                                      for t in [end_of.get(q.submission_id)] if t is not None])
    with_mem = [m for m in report.runs if m.max_rss_bytes and m.req_mem_bytes]
    report.memory_efficiency = _ratio(sum(m.max_rss_bytes or 0 for m in with_mem),
                                      sum(m.req_mem_bytes or 0 for m in with_mem))
    report.attempts_by_class = dict(Counter(r.failure_class for r in data.runs if r.failure_class).most_common())
    report.retry_changes = [(job_names.get(r.job_index, f"#{r.job_index}") if r.job_index is not None else "?",
                             task_id(r.job_id, r.array_index), r.changes) for r in data.runs if r.changes]


def transfers_of(rows: List[Tuple[int, float, int, str]],
                 jobs: Sequence[Tuple[int, float, int]] = ()) -> Optional[Transfers]:
    """(bytes, seconds, exit code, how it came) of every attempt, and (bytes, stage-in seconds, CPUs) of every
    job -> the copies' figures."""
    if not rows:
        return None
    ok = [(b, s, via) for b, s, rc, via in rows if rc == 0]
    copied = [(b, s) for b, s, via in ok if via != "local"]
    nbytes, secs = sum(b for b, _ in copied), sum(s for _, s in copied)
    rates = [b / 1e6 / s for b, s in copied if s > 0]
    paths: Dict[str, Dict[str, Any]] = {}
    for b, s, via in ok:
        p = paths.setdefault(via, {"inputs": 0, "bytes": 0, "seconds": 0.0})
        p["inputs"] += 1
        p["bytes"] += b
        p["seconds"] += s
    for p in paths.values():
        p["seconds_per_input"] = p["seconds"] / p["inputs"]
        p["mb_per_s"] = _ratio(p["bytes"] / 1e6, p["seconds"])
    per_core = [b / 1e6 / s / cpus for b, s, cpus in jobs if s > 0 and cpus > 0]
    return Transfers(files=len(copied), bytes=nbytes, seconds=secs, mb_per_s=_ratio(nbytes / 1e6, secs),
                     failed_attempts=len(rows) - len(ok), slowest_mb_per_s=min(rates) if rates else None,
                     by_path=paths, mb_per_s_per_core=_mean(per_core))


def against(value: Optional[float], target: Optional[float]) -> str:
    """``3.2 (target 12.5: not met)``: a figure next to the facility's target."""
    shown = "n/a" if value is None else f"{value:.3g}"
    if target is None:
        return shown
    verdict = "n/a" if value is None else ("met" if value >= target else "not met")
    return f"{shown} (target {target:g}: {verdict})"
