"""Inputs grouped into jobs, and jobs into scripts (arrays where the scheduler allows)."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.checks import Checks
from hpcrun.plan.intake import placeholders as ph
from hpcrun.plan.intake.inputs import InputItem
from hpcrun.plan.job.buffer import BufferChoice, Sizing, bb_lines
from hpcrun.plan.job.checksums import Assigned
from hpcrun.plan.job.listed import Listed, ListedJobs, one_input_jobs
from hpcrun.plan.values import Job, ScriptPlan, bb_capacities, chains_of
from hpcrun.shell import quote


def name_width(n_inputs: int) -> int:
    return max(5, len(str(n_inputs)))


def group_jobs(campaign: Campaign, items: Sequence[InputItem], sums: Assigned, cpus: int,
               buffer: BufferChoice, checks: Checks, notes: List[str],
               outputs: Optional[Sequence[str]] = None, first: int = 0) -> Sequence[Job]:
    """One job per ``files_per_job`` inputs, with its chains, outputs (named here unless the output
    check named them already, input by input) and buffer size; numbered from ``first`` (a later
    generation's jobs follow the earlier ones')."""
    js = campaign.jobs
    sizing = Sizing()
    width = name_width(len(items))
    per, pattern, name = js.files_per_job, campaign.outputs.pattern, campaign.name
    fixed = None if js.chains_per_node == "auto" else int(js.chains_per_node)
    if (outputs is None or len(outputs) != len(items)) and not isinstance(items, Listed):
        outputs = ph.output_names(pattern, [i.stem for i in items], [i.path for i in items])
    sized = buffer.writer is not None    # jobs without a buffer need no sizing (10^5 calls saved)
    named = name.replace("%", "%%") + f".%0{width}d"   # camp.00042, without a per-job format spec
    jobs: Sequence[Job]
    if isinstance(items, Listed):   # made from the list file block by block when read (streamable)
        assert fixed is not None
        jobs = ListedJobs(items, fixed, named, pattern)
    elif per == 1 and fixed is not None and not sized:   # one input per job: the usual, at 10^5-10^6 jobs
        jobs = one_input_jobs(first, items, pattern, fixed, named, outputs, sums.values)
    else:
        assert outputs is not None
        jobs = [_job(campaign, sizing, buffer, cpus, fixed, index, named % (index + 1),
                     tuple(items[start:start + per]), tuple(outputs[start:start + per]),
                     tuple(sums.values[start:start + per]))
                for index, start in enumerate(range(0, len(items), per), start=first)]
    sizing.report(buffer, checks, notes)
    if js.overcommit and max(chains_of(jobs), default=0) > cpus:
        notes.append(f"chains overcommit the {cpus} CPUs per node (jobs.overcommit: true).")
    return jobs


def _job(campaign: Campaign, sizing: Sizing, buffer: BufferChoice, cpus: int, fixed: Optional[int], index: int,
         name: str, group: Tuple[InputItem, ...], outputs: Tuple[str, ...], sums: Tuple[Optional[str], ...]) -> Job:
    """One job of several inputs, or with chains from its bytes, or with a buffer to size."""
    in_bytes = sum(i.size for i in group)
    chains = fixed
    if chains is None:
        assert campaign.jobs.bytes_per_chain
        chains = max(1, min(cpus, math.ceil(in_bytes / campaign.jobs.bytes_per_chain)))
    needed, capacity = sizing.size(buffer, campaign, index, in_bytes) if buffer.writer is not None else (None, None)
    return Job(index, name, group, outputs, chains, needed, capacity, sums)


def data_dirs(campaign: Campaign, buffer: BufferChoice) -> Tuple[str, str, str, str]:
    """Shell text of where a job finds its inputs, writes chain parts and merged outputs, and
    the work directory on the filesystem when there is no buffer."""
    out_loc = quote(campaign.outputs.location)
    workdir = campaign.outputs.workdir or campaign.outputs.location.rstrip("/") + "/.hpcrun-work"
    root_var, bbspec = buffer.root_var, buffer.spec
    if root_var and bbspec:
        input_dir = f'"${{{root_var}%/}}"/in' if bbspec.stage_inputs else ""
        work_dir = f'"${{{root_var}%/}}"/work'
        out_dir = f'"${{{root_var}%/}}"/out' if bbspec.stage_outputs else out_loc
        return input_dir, work_dir, out_dir, workdir
    return "", quote(workdir) + '/"${HPCRUN_JOB}"', out_loc, workdir


def scripts_of(campaign: Campaign, profile: SiteProfile, jobs: Sequence[Job], buffer: BufferChoice,
               checks: Checks, notes: List[str]) -> List[ScriptPlan]:
    """Arrays unless each job needs its own stage lines (or arrays are off)."""
    js = campaign.jobs
    # a pilot's claims copy their own inputs in: the array scripts carry no buffer lines at all
    late = js.binding == "late"
    per_job_lines = bool(buffer.writer and buffer.spec and buffer.spec.stage_inputs) and not late
    use_arrays = js.array == "always" or (js.array == "auto" and not per_job_lines and (
        len(jobs) > 1 or js.binding == "late") and profile.max_array_size > 0)
    if js.array == "always" and per_job_lines:
        checks.spec_error(("jobs", "array"), (
            "job arrays share one script, but burst_buffer.stage_inputs needs per-job #DW "
            "stage_in lines; set stage_inputs: false or array: auto."))
    if use_arrays and profile.max_array_size < 1:
        checks.spec_error(("jobs", "array"), f"site profile '{profile.name}' disables job arrays.")
    checks.raise_if_any()
    if use_arrays:
        return _array_scripts(campaign, profile, jobs, BufferChoice() if late else buffer, notes)
    if js.throttle and len(jobs) > 1:
        notes.append(f"jobs.throttle ({js.throttle}) applies to job arrays; these {len(jobs)} "
                     "jobs have their own scripts, so the scheduler's queue limits apply instead.")
    width = name_width(sum(len(j.inputs) for j in jobs))
    return [ScriptPlan(f"job{job.index + 1:0{width}d}", (job,), None,
                       tuple(bb_lines(buffer, campaign, job, job.bb_capacity or 0))) for job in jobs]


def _array_scripts(campaign: Campaign, profile: SiteProfile, jobs: Sequence[Job], buffer: BufferChoice,
                   notes: List[str]) -> List[ScriptPlan]:
    throttle = campaign.jobs.throttle or profile.array_throttle
    # late binding: the queue's submissions are not the scheduler's arrays (its MaxArraySize does not apply), and
    # one submission of the whole campaign keeps the queue's backlog at its bounded number of chunks
    size = max(1, len(jobs)) if campaign.jobs.binding == "late" else profile.max_array_size
    scripts = []
    for c in range(math.ceil(len(jobs) / size)):
        chunk = jobs[c * size:(c + 1) * size]   # a tuple, or a view of streamed jobs
        spec_array = f"0-{len(chunk) - 1}" + (f"%{throttle}" if throttle else "")
        lines = bb_lines(buffer, campaign, None, max(bb_capacities(chunk), default=0))
        scripts.append(ScriptPlan(f"array{c + 1:03d}", chunk, spec_array, tuple(lines)))
    capacities = bb_capacities(jobs)
    if buffer.writer is not None and capacities and (len(set(capacities)) > 1 or len(capacities) < len(jobs)):
        notes.append("array tasks share one #DW jobdw line sized for the largest task.")
    return scripts
