"""Late binding (jobs.binding: late): the pilots' shape, and what cannot be bound late.

A pilot is a one-node job of the real scheduler that runs ``slots`` of the plan's jobs at once, each
with the spec's chains, claiming them from the queue until the campaign is done. Its request is
planned here like a job's; what only works when the scheduler binds each job at submission is refused
with its key and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence, Tuple

from hpcrun.backends.late.queue import CLAIMS_DIR
from hpcrun.backends.scheduler.base import JobRequest
from hpcrun.model.site import Partition, SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.checks import Checks
from hpcrun.plan.job.buffer import BufferChoice, bb_lines, pool_limit
from hpcrun.plan.job.database import JOB_ID, NODE_KEY
from hpcrun.plan.job.requests import LOG_DIR
from hpcrun.plan.values import DatabasePlan, Job, bb_capacities
from hpcrun.shell import quote
from hpcrun.units import format_capacity

QUEUE_DIR = "queue"               # in the plan directory: the claims' meeting point
PILOT_SCRIPT = "bin/hpcrun-pilot.sh"
AGENT_SCRIPT = "bin/hpcrun-pilot.py"      # the pilot's agent (hpcrun/backends/late/agent.py, shipped as it is)
AGENT_LAYOUT = "bin/hpcrun_late_layout.py"   # the queue's protocol beside it (layout.py)
AGENT_RUNS = "bin/hpcrun_late_runs.py"       # a claim's runs of the job script (runs.py)
AGENT_DIRECT = "bin/hpcrun_late_direct.py"   # a claim's inputs run without bash, where its script says so (direct.py)
BEAT_S = 10                       # a pilot renews its lease this often
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
    bb_lines: Tuple[str, ...] = ()      # the pilot's own #DW jobdw (and shared stage_in) lines
    bb_capacity: Optional[int] = None   # bytes of that buffer: every slot's input at once
    bb_root: Optional[str] = None       # shell text: the buffer's directory, as the pilot's job sees it

    @property
    def cpus(self) -> int:
        return self.slots * self.chains


def pilot_plan(campaign: Campaign, profile: SiteProfile, part: Partition, qos: Optional[str],
               chains: int, checks: Checks) -> Optional[PilotPlan]:
    """The pilots of a late-bound campaign (None for array binding); refusals go to ``checks``."""
    js = campaign.jobs
    if js.binding != "late":
        return None
    _refusals(campaign, checks)
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


def _refusals(campaign: Campaign, checks: Checks) -> None:
    """What binds a job to its submission, and so cannot be claimed later by any pilot."""
    js = campaign.jobs
    if js.nodes > 1:
        checks.spec_error(("jobs", "nodes"), (
            f"a pilot holds one node, so an input of {js.nodes} nodes cannot be bound late; use "
            "jobs.binding: array for multi-node inputs"))
    if campaign.burst_buffer is not None and campaign.burst_buffer.stage_out:
        checks.spec_error(("burst_buffer", "stage_out"), (
            "an explicit stage_out is carried out when the job's buffer ends, and a pilot's buffer ends after "
            "every input it ran: no item would be one input's; write such files to the output directory "
            "(burst_buffer.stage_outputs) or use jobs.binding: array"))
    if js.array == "never":
        checks.spec_error(("jobs", "array"), (
            "pilots run the plan's array scripts; array: never cannot be bound late (use auto)"))


def with_buffer(pilots: PilotPlan, campaign: Campaign, buffer: BufferChoice, jobs: Sequence[Job],
                checks: Checks, notes: list) -> PilotPlan:
    """The pilot's own buffer: one ``#DW jobdw`` for the slots' inputs at once (each sized as its array task
    would be), the spec's shared stage_in items with it; the inputs' copies in and out are the claims' own."""
    if buffer.writer is None or buffer.spec is None or buffer.root_var is None:
        return pilots
    per_input = max(bb_capacities(jobs), default=0)
    capacity = per_input * pilots.slots
    if buffer.pool is not None and capacity > pool_limit(buffer.pool):
        checks.spec_error(("jobs", "pilot", "slots"), (
            f"a pilot's buffer holds the inputs of its {pilots.slots} slots at once: {pilots.slots} x "
            f"{format_capacity(per_input)} = {format_capacity(capacity)}, more than the "
            f"{format_capacity(pool_limit(buffer.pool))} pool '{buffer.pool.name}' gives one job; lower "
            "jobs.pilot.slots"))
    lines = bb_lines(buffer, campaign, None, capacity, own_staging=False)
    notes.append(
        f"late binding with a burst buffer: each pilot asks for one buffer of {format_capacity(capacity)} "
        f"({pilots.slots} slot(s) x {format_capacity(per_input)}), shared by the inputs it runs, in place of one "
        "per job; no #DW stage_in/stage_out lines per input: a claim copies its inputs in and its outputs out "
        "itself, checksummed, so a missing input fails that input (and is retried) instead of holding a job "
        "in the queue, and the copies take the pilot's walltime, not the burst-buffer service's.")
    return replace(pilots, bb_lines=tuple(lines), bb_capacity=capacity,
                   bb_root=f'"${{{buffer.root_var}%/}}"')


def claims_base(campaign: Campaign) -> str:
    """Where the claims' outputs wait, each in a directory named by its claim id, until they are placed."""
    return campaign.outputs.location.rstrip("/") + "/" + CLAIMS_DIR


def late_dirs(campaign: Campaign, workdir: str, db_plan: Optional[DatabasePlan], buffer: BufferChoice
              ) -> Tuple[str, str, str, Optional[str], Optional[DatabasePlan]]:
    """Where a claim reads, works and writes: directories of its own (in the pilot's buffer, if any), and
    outputs in a directory of its own, which the supervisor moves into place once the claim's commit is
    the one recorded (a fenced claim's never); with a buffer, the claim copies its outputs there itself
    (the fourth value).
    The database is the pilot's, so its node-local copy is named by the pilot's job id and node key (the
    pilot may be of an earlier generation than the input)."""
    private = quote(claims_base(campaign)) + '/"${HPCRUN_JOB_ID}"'
    input_dir, work_dir, out_dir, copy_out = "", quote(workdir) + '/"${HPCRUN_JOB}"/"${HPCRUN_JOB_ID}"', private, None
    if buffer.root_var and buffer.spec:
        mine = f'"${{{buffer.root_var}%/}}"/claims/"${{HPCRUN_JOB_ID}}"'
        input_dir = mine + "/in" if buffer.spec.stage_inputs else ""
        work_dir = mine + "/work"
        if buffer.spec.stage_outputs:
            out_dir, copy_out = mine + "/out", private
    if db_plan is not None:
        cache = db_plan.cache_dir.replace(JOB_ID, PILOT_ID).replace(NODE_KEY, PILOT_NODE_KEY)
        db_plan = replace(db_plan, cache_dir=cache, socket=cache + "/mysqld.sock")
    return input_dir, work_dir, out_dir, copy_out, db_plan
