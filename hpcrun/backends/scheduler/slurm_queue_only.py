"""Slurm without accounting (no slurmdbd): jobs are followed in the queue alone.

The second scheduler, and the smallest: it is Slurm in every word it writes, but it never
runs sacct. ``status`` takes a job that left the queue as ended (with the job's own reason
file), ``iotune collect`` asks squeue for the sweep job's state, and the plan records
``accounting: false`` whatever the profile says.
"""

from __future__ import annotations

from typing import Collection, Dict, Mapping, Optional, Sequence

from hpcrun.backends.scheduler.base import Record, normalize_state, register
from hpcrun.backends.scheduler.slurm import Slurm, squeue_jobs


@register
class SlurmQueueOnly(Slurm):
    """Slurm whose accounting is not there to ask."""

    name = "slurm-queue-only"
    accounting = False

    def records(self, job_ids: Sequence[str], since: str, *, names: Sequence[str] = (),
                known: Optional[Mapping[str, str]] = None,
                in_flight: Optional[Collection[str]] = None) -> Dict[str, Record]:
        return {}

    def state_of(self, job_id: str) -> Optional[str]:
        rows = [q for q in squeue_jobs(job_ids=[job_id], expand=False, ended=True,
                                          cluster=self.cluster) if q.array_job_id == job_id]
        return normalize_state(rows[0].state) if rows else None
