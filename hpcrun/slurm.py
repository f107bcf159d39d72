"""Slurm client: run sbatch/sacct/squeue/scontrol and parse what they print.

Nothing else in hpcrun calls Slurm commands. ``SBATCH_*`` variables are removed
from sbatch's environment because they silently override the script's own
``#SBATCH`` lines (hpc-reference §8.1).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import HpcrunError

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED"}
TRANSIENT = ("Socket timed out", "Unable to contact slurm controller", "Slurm temporarily unable",
             "Resource temporarily unavailable", "Connection refused")
# for sbatch only errors that prove the controller never took the job: after a timeout the job
# may exist, and submitting again would duplicate it
NOT_REACHED = ("Unable to contact slurm controller", "Connection refused")


class SlurmError(HpcrunError):
    """A Slurm command failed; the message carries its output verbatim."""

    exit_code = 3


@dataclass
class JobState:
    job_id: str            # as sacct prints it: 123 or 123_4 for an array task
    raw_id: str            # the unique numeric id (SLURM_JOB_ID inside the job)
    name: str
    state: str             # first word of State (e.g. CANCELLED, not "CANCELLED by 1001")
    exit_code: str
    reason: str
    elapsed: str
    start: str
    end: str
    nodes: str

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def _env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SBATCH_")}


def _run(argv: Sequence[str], retries: int = 3, cwd: Optional[Path] = None,
         transient: Sequence[str] = TRANSIENT) -> subprocess.CompletedProcess:
    """Run a Slurm command, retrying transient controller errors with backoff."""
    delay = 1.0
    for attempt in range(retries + 1):
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, env=_env(), cwd=cwd,
                                  timeout=120)
        except FileNotFoundError:
            raise SlurmError(f"'{argv[0]}' was not found: is Slurm installed and on PATH?") from None
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after 120 s")
        if proc.returncode == 0 or not any(t in proc.stderr for t in transient) or attempt == retries:
            return proc
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def sbatch(script: Path, extra: Iterable[str] = ()) -> str:
    """Submit a script; return its job id. sbatch's rejection is shown verbatim."""
    proc = _run(["sbatch", "--parsable", *extra, str(script)], cwd=script.parent, transient=NOT_REACHED)
    if proc.returncode != 0:
        raise SlurmError(f"sbatch rejected {script}:\n{proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id for {script}: {proc.stdout!r}")
    return job_id


SACCT_FIELDS = "JobID,JobIDRaw,JobName%64,State,ExitCode,Reason,Elapsed,Start,End,NodeList"


def parse_sacct(text: str) -> List[JobState]:
    rows = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 10:
            continue
        job_id, raw, name, state, exit_code, reason, elapsed, start, end, nodes = parts
        if "." in job_id:  # a step row
            continue
        rows.append(JobState(job_id, raw, name, state.split(" ")[0].rstrip("+"), exit_code, reason,
                             elapsed, start, end, nodes))
    return rows


def sacct(job_ids: Sequence[str], since: str = "now-30days") -> List[JobState]:
    """One sacct call for all jobs (allocation rows only)."""
    if not job_ids:
        return []
    proc = _run(["sacct", "-X", "-n", "-P", "-S", since, "-E", "now", "-j", ",".join(job_ids),
                 "-o", SACCT_FIELDS.replace("%64", "")])
    if proc.returncode != 0:
        raise SlurmError(f"sacct failed: {proc.stderr.strip()}")
    return parse_sacct(proc.stdout)


def squeue_states(job_ids: Sequence[str]) -> Dict[str, Tuple[str, str]]:
    """State and reason (e.g. a burst-buffer stage-in failure text) of queued jobs, keyed by
    job id as squeue prints it (pending array tasks as ``123_[0-9%2]``)."""
    if not job_ids:
        return {}
    proc = _run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%R"])
    out: Dict[str, Tuple[str, str]] = {}
    if proc.returncode != 0:
        return out
    for line in proc.stdout.splitlines():
        job_id, state, reason = (line.split("|", 2) + ["", ""])[:3]
        out[job_id.strip()] = (state.strip(), reason.strip())
    return out


def scontrol_job(job_id: str) -> Dict[str, str]:
    proc = _run(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode != 0:
        return {}
    fields: Dict[str, str] = {}
    for m in re.finditer(r"(\w+)=(.*?)(?= \w+=|$)", proc.stdout.strip()):
        fields[m.group(1)] = m.group(2)
    return fields
