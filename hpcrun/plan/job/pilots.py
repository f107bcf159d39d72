"""Late binding (jobs.binding: late): the pilots' shape, and what cannot be bound late.

A pilot is a one-node job of the real scheduler that runs ``slots`` of the plan's jobs at once, each
with the spec's chains, claiming them from the queue until the campaign is done. Its request is
planned here like a job's; what only works when the scheduler binds each job at submission is refused
with its key and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

from hpcrun.backends.scheduler.base import JobRequest
from hpcrun.model.site import Partition, SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.checks import Checks
from hpcrun.plan.job.database import JOB_ID, NODE_KEY
from hpcrun.plan.job.requests import LOG_DIR
from hpcrun.plan.values import DatabasePlan
from hpcrun.shell import quote

QUEUE_DIR = "queue"               # in the plan directory: the claims' meeting point
PILOT_SCRIPT = "bin/hpcrun-pilot.sh"
BEAT_S = 10                       # a pilot renews its lease this often
CLAIMS_DIR = ".hpcrun-claims"     # under the output location: each claim's outputs until it commits
PILOT_ID = "${HPCRUN_PILOT_ID}"   # exported by the pilot: its job id
PILOT_NODE_KEY = "${HPCRUN_PILOT_NODE_KEY}"   # the pilot's node key (a later generation's jobs have their own)


@dataclass(frozen=True)
class PilotPlan:
    """Everything a pilot is and asks for, as plain values."""

    name: str                 # the pilots' job name (the supervisor finds them by it)
    walltime_s: int
    slots: int
    chains: int               # chains of each input (the spec's chains_per_node)
    max_pilots: int
    idle_s: int
    drain_s: int
    lease_s: int
    input_s: int              # the expected time of an input before any ran
    input_limit_s: int        # each input's own time limit (the campaign's walltime)
    signal_before_s: int      # an input's pre-timeout signal, as its array task would get it
    request: JobRequest

    @property
    def cpus(self) -> int:
        return self.slots * self.chains


def pilot_plan(campaign: Campaign, profile: SiteProfile, part: Partition, qos: Optional[str],
               several_clusters: bool, chains: int, checks: Checks) -> Optional[PilotPlan]:
    """The pilots of a late-bound campaign (None for array binding); refusals go to ``checks``."""
    js = campaign.jobs
    if js.binding != "late":
        return None
    _refusals(campaign, several_clusters, checks)
    pilot = js.pilot
    slots = pilot.slots or max(1, part.cpus // max(1, chains))
    if slots * chains > part.cpus and not js.overcommit:
        checks.spec_error(("jobs", "pilot", "slots"), (
            f"{slots} slots of {chains} chain(s) need {slots * chains} CPUs, but nodes of this partition have "
            f"{part.cpus}; lower jobs.pilot.slots to at most {max(1, part.cpus // chains)}"))
    if pilot.walltime > part.max_walltime:
        checks.spec_error(("jobs", "pilot", "walltime"), (
            f"{pilot.walltime} s is longer than the partition's limit of {part.max_walltime} s"))
    drain = int(pilot.drain_margin if pilot.drain_margin is not None else profile.signal_before_timeout)
    if drain >= pilot.walltime:
        checks.spec_error(("jobs", "pilot", "drain_margin"), (
            f"the drain signal {drain} s before the end leaves a {pilot.walltime}-s pilot no time to run; "
            "make jobs.pilot.walltime longer or drain_margin shorter"))
    if campaign.walltime + drain > pilot.walltime:
        checks.spec_error(("jobs", "pilot", "walltime"), (
            f"a pilot of {pilot.walltime} s cannot run one input of the campaign's walltime {campaign.walltime} s "
            f"before its drain margin of {drain} s; make jobs.pilot.walltime at least {campaign.walltime + drain} s"))
    name = f"{campaign.name}.pilot"
    request = JobRequest(
        name=name, nodes=1, walltime_s=int(pilot.walltime), signal_before_s=drain, log_dir=LOG_DIR,
        comment="hpcrun:" + campaign.name, tasks_per_node=None if part.exclusive else min(slots * chains, part.cpus),
        exclusive=part.exclusive, extra=tuple(campaign.site.extra_sbatch), partition=part.slurm_partition,
        qos=qos, account=campaign.site.account, reservation=campaign.site.reservation, constraint=part.constraint)
    return PilotPlan(name=name, walltime_s=int(pilot.walltime), slots=slots, chains=chains,
                     max_pilots=pilot.nodes or part.nodes, idle_s=int(pilot.idle_release), drain_s=drain,
                     lease_s=max(int(pilot.lease), 3 * BEAT_S),
                     input_s=int(pilot.input_time if pilot.input_time is not None else campaign.walltime),
                     input_limit_s=int(campaign.walltime), signal_before_s=int(profile.signal_before_timeout),
                     request=request)


def _refusals(campaign: Campaign, several_clusters: bool, checks: Checks) -> None:
    """What binds a job to its submission, and so cannot be claimed later by any pilot."""
    js = campaign.jobs
    if js.nodes > 1:
        checks.spec_error(("jobs", "nodes"), (
            f"a pilot holds one node, so an input of {js.nodes} nodes cannot be bound late; use "
            "jobs.binding: array for multi-node inputs"))
    if campaign.burst_buffer is not None:
        checks.spec_error(("burst_buffer",), (
            "burst-buffer directives (#DW/#BB stage_in and stage_out) are bound to a job at submission, "
            "before anyone knows which inputs a pilot will claim; remove burst_buffer or use jobs.binding: array"))
    if several_clusters:
        checks.spec_error(("site", "profile"), (
            "late binding runs on one cluster for now; list one profile, or use jobs.binding: array"))
    if js.array == "never":
        checks.spec_error(("jobs", "array"), (
            "pilots run the plan's array scripts; array: never cannot be bound late (use auto)"))


def late_dirs(campaign: Campaign, workdir: str, db_plan: Optional[DatabasePlan]
              ) -> Tuple[str, str, Optional[DatabasePlan]]:
    """Where a claim works and writes: its own work directory, and outputs in a directory of its own
    that the pilot renames into place only while it holds the claim (a fenced pilot moves nothing);
    the database is the pilot's, so its node-local copy is named by the pilot's job id and node key (the
    pilot may be of an earlier generation than the input)."""
    work_dir = quote(workdir) + '/"${HPCRUN_JOB}"/"${HPCRUN_JOB_ID}"'
    out_dir = quote(campaign.outputs.location.rstrip("/") + "/" + CLAIMS_DIR) + '/"${HPCRUN_JOB_ID}"'
    if db_plan is not None:
        cache = db_plan.cache_dir.replace(JOB_ID, PILOT_ID).replace(NODE_KEY, PILOT_NODE_KEY)
        db_plan = replace(db_plan, cache_dir=cache, socket=cache + "/mysqld.sock")
    return work_dir, out_dir, db_plan
