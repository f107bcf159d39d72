"""What each job asks of the scheduler, as a neutral JobRequest (the backend writes the lines)."""

from __future__ import annotations

from typing import Optional, Tuple

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.backends.scheduler.base import JobRequest
from hpcrun.model.site import Partition, SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.values import ContainerPlan, ScriptPlan, chains_of

LOG_DIR = "logs"   # relative to the plan directory; the renderer makes it absolute


def finalize_name(campaign: str) -> str:
    """The finalize job's fixed job name: a restarted submitter finds it by this name."""
    return f"{campaign}.finalize"


def _site(campaign: Campaign, part: Partition, qos: Optional[str]) -> dict:
    """Where every job of the campaign runs and who pays."""
    return {"partition": part.slurm_partition, "qos": qos, "account": campaign.site.account,
            "reservation": campaign.site.reservation, "constraint": part.constraint}


def with_request(campaign: Campaign, profile: SiteProfile, part: Partition, qos: Optional[str],
                 container: ContainerPlan, script: ScriptPlan) -> ScriptPlan:
    """The script with its request: its nodes and tasks, time limit, array and options."""
    tasks = None if part.exclusive else min(max(chains_of(script.jobs)), part.cpus)
    request = JobRequest(
        name=campaign.name if script.array else script.jobs[0].name, nodes=campaign.jobs.nodes,
        walltime_s=campaign.walltime, signal_before_s=profile.signal_before_timeout, log_dir=LOG_DIR,
        comment="hpcrun:" + campaign.name, tasks_per_node=tasks, exclusive=part.exclusive,
        array=script.array, runtime_options=container.directives, extra=tuple(campaign.site.extra_sbatch),
        **_site(campaign, part, qos))
    # the fields spelled out: dataclasses.replace costs ten times more, and a plan makes one per job
    return ScriptPlan(script.name, script.jobs, script.array, script.bb_lines, request)


def finalize_request(campaign: Campaign, profile: SiteProfile, part: Partition,
                     qos: Optional[str]) -> Optional[JobRequest]:
    """One task on one node of the campaign's partition; no array, no burst buffer, no container."""
    fin = campaign.finalize
    if fin is None:
        return None
    return JobRequest(
        name=finalize_name(campaign.name), nodes=1, tasks=1, walltime_s=fin.walltime or campaign.walltime,
        signal_before_s=profile.signal_before_timeout, log_dir=LOG_DIR, comment="hpcrun:" + campaign.name,
        extra=tuple(campaign.site.extra_sbatch), **_site(campaign, part, qos))


def launcher(profile: SiteProfile) -> Tuple[str, ...]:
    """The profile's task launcher, or the scheduler's own."""
    own = profile.launcher.command
    command = (own,) if own else scheduler_for(profile.scheduler.kind).launch.command
    return tuple(command) + tuple(profile.launcher.options)


def task_env(profile: SiteProfile) -> dict:
    """The scheduler's per-task variables, which a container runtime must let through."""
    sched = scheduler_for(profile.scheduler.kind)
    return {"task_env": sched.task_env, "task_env_patterns": sched.task_env_patterns}
