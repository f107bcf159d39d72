"""Where each job of a submitted plan stands: Slurm's view joined with the job's own record.

A generated job writes its failure reason (which chain failed, why the DB did not
answer) to ``run/<job>/<slurm id>/reason``; Slurm supplies state, exit code and the
pending reason (e.g. a burst-buffer stage-in error while the job is held).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import slurm
from .submit import read_manifest, read_record


@dataclass
class JobStatus:
    job: str          # hpcrun job name
    slurm_id: str     # 123 or 123_4
    state: str
    exit_code: str
    elapsed: str
    reason: str

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _job_names(manifest: Dict[str, Any]) -> Dict[int, str]:
    return {j["index"]: j["name"] for j in manifest["jobs"]}


def _run_reason(plan_dir: Path, job: str, raw_id: str) -> str:
    path = plan_dir / "run" / job / raw_id / "reason"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def collect(plan_dir: Path) -> List[JobStatus]:
    manifest = read_manifest(plan_dir)
    subs = read_record(plan_dir)
    names = _job_names(manifest)
    states = {s.job_id: s for s in slurm.sacct([s.job_id for s in subs])}
    pending = [sid for sid, s in states.items() if s.state == "PENDING"]
    queued = slurm.squeue_states([s.job_id for s in subs]) if pending or len(states) < len(subs) else {}
    reasons = {sid: reason for sid, (_state, reason) in queued.items()}
    out: List[JobStatus] = []
    for sub in subs:
        count = sub.last_job - sub.first_job + 1
        for k in range(count):
            job = names.get(sub.first_job + k, f"#{sub.first_job + k}")
            key = f"{sub.job_id}_{k}" if sub.array else sub.job_id
            st = states.get(key) or (states.get(sub.job_id) if sub.array else None)
            if st is None and sub.array:
                # tasks that have not started yet are one row: 123_[0-9%2]
                st = next((s for sid, s in states.items() if sid.startswith(f"{sub.job_id}_[")), None)
                if st is not None:
                    bracket = st.job_id
                    out.append(JobStatus(job, key, st.state, st.exit_code, st.elapsed,
                                         reasons.get(bracket) or reasons.get(key) or st.reason))
                    continue
            if st is None:
                # not in accounting yet: squeue knows it (a pending array is one 123_[...] row)
                q = queued.get(key) or next((v for sid, v in queued.items()
                                             if sid.startswith(f"{sub.job_id}_[")), None)
                state, reason = q if q else ("UNKNOWN", "not yet in accounting")
                out.append(JobStatus(job, key, state, "", "", reason))
                continue
            reason = _run_reason(plan_dir, job, st.raw_id) if st.state != "PENDING" else ""
            if not reason:
                reason = reasons.get(st.job_id) or reasons.get(sub.job_id) or ""
            if not reason and st.reason not in ("None", ""):
                reason = st.reason
            out.append(JobStatus(job, st.job_id, st.state, st.exit_code, st.elapsed, reason))
    return out


def needs_attention(status: JobStatus) -> bool:
    """A pending job that Slurm holds because of a burst-buffer failure will not start."""
    return status.state == "PENDING" and "burst_buffer" in status.reason


def wait(plan_dir: Path, timeout: Optional[float] = None, interval: float = 2.0) -> List[JobStatus]:
    """Poll until every job ended or is held for a human; returns the last statuses."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        rows = collect(plan_dir)
        if rows and all(r.state in slurm.TERMINAL or needs_attention(r) for r in rows):
            return rows
        if deadline is not None and time.monotonic() > deadline:
            return rows
        time.sleep(interval)
