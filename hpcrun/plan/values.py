"""The resolved plan: a frozen value holding every decision, so rendering only formats.

Nothing here is a live object: the container runtime, the burst-buffer system and the
database have been asked their questions at plan time and their answers are stored as
data (shell text where the answer is shell text, built in Python and vetted there).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Set, Tuple

from hpcrun.backends.scheduler.base import JobRequest

if TYPE_CHECKING:   # names for types alone: the supervisor reads these values without loading the spec's models
    from hpcrun.model.site import Partition, Pool, SiteProfile
    from hpcrun.model.spec import Campaign
    from hpcrun.plan.intake.inputs import InputItem


class Job(NamedTuple):
    """One job of the plan (a tuple: a plan makes 10^5-10^6 of them, three times faster than a
    frozen dataclass)."""

    index: int   # type: ignore[assignment]  # the field shadows tuple.index, which nothing calls
    name: str
    inputs: Tuple[InputItem, ...]
    outputs: Tuple[str, ...]          # merged output file name per input
    chains_per_node: int
    bb_needed: Optional[int] = None   # bytes before rounding
    bb_capacity: Optional[int] = None  # bytes after rounding to the pool granularity
    checksums: Tuple[Optional[str], ...] = ()  # "adler32:0a1b2c3d" or None, parallel to inputs

    @property
    def input_bytes(self) -> int:
        return sum(i.size for i in self.inputs)

    @property
    def events(self) -> Optional[int]:
        if any(i.events is None for i in self.inputs):
            return None
        return sum(i.events or 0 for i in self.inputs)


class StreamedJobs(Sequence[Job]):
    """A plan's jobs when they are not held: made again from their source whenever they are read (a
    large list file, block by block; a slice is a view). What the plan's totals and its scripts need
    of all of them is known without reading them: their jobs are alike (one input, the same chains,
    no checksums, no buffer) and numbered from 0 in order."""

    @property
    @abstractmethod
    def input_bytes(self) -> int: ...

    @property
    @abstractmethod
    def chains_per_node(self) -> int: ...

    @property
    @abstractmethod
    def first_index(self) -> int: ...

    @property
    @abstractmethod
    def last_index(self) -> int: ...


def chains_of(jobs: Sequence[Job]) -> Set[int]:
    """The chains per node the jobs use."""
    if isinstance(jobs, StreamedJobs):
        return {jobs.chains_per_node} if len(jobs) else set()
    return {j.chains_per_node for j in jobs}


def inputs_in(jobs: Sequence[Job]) -> int:
    return len(jobs) if isinstance(jobs, StreamedJobs) else sum(map(len, [j.inputs for j in jobs]))


def index_range(jobs: Sequence[Job]) -> Tuple[int, int]:
    """The first and last job's index (of a script's jobs)."""
    if isinstance(jobs, StreamedJobs):
        return jobs.first_index, jobs.last_index
    return jobs[0].index, jobs[-1].index


def has_checksums(jobs: Sequence[Job]) -> bool:
    return not isinstance(jobs, StreamedJobs) and any(v for j in jobs for v in j.checksums)


def bb_capacities(jobs: Sequence[Job]) -> List[int]:
    """The jobs' buffer capacities (streamed jobs have no buffer)."""
    return [] if isinstance(jobs, StreamedJobs) else [j.bb_capacity for j in jobs if j.bb_capacity]


@dataclass(frozen=True)
class ScriptPlan:
    name: str                      # file stem in the plan directory
    jobs: Sequence[Job]            # a tuple, or a view of StreamedJobs
    array: Optional[str]           # array spec ("0-9%4"), None for a single job
    bb_lines: Tuple[str, ...]      # #DW/#BB lines (already checked)
    request: Optional[JobRequest] = None   # what the job asks of the scheduler (set by the planner)


@dataclass(frozen=True)
class DatabasePlan:
    server: str
    client: str
    admin: str
    payload: str
    payload_bytes: int
    cache_dir: str                 # shell text; may contain ${HPCRUN_JOB_ID}
    socket: str
    networking: str
    options: Tuple[str, ...]       # server options after the leading one
    leading_option: str            # shell text: --no-defaults or the spec's --defaults-file=...
    ready_timeout: int
    max_restarts: int
    backoff: int
    check_query: str
    port_base: int
    host: str                      # 127.0.0.1 (tcp) or localhost (socket)
    remove_cache: bool             # the job removes its node-local copy (not a runtime volume)
    wait_seconds: int              # how long chains wait for the server, payload copy included
    account: str = ""              # tcp: the per-job account the chains use ("" in socket mode)
    account_sql: Tuple[str, ...] = ()  # tcp: the server's --init-file (password placeholder inside)


@dataclass(frozen=True)
class ChecksumPlan:
    """How the job verifies its inputs: one algorithm per plan, one tool computing it."""

    algo: str                      # adler32 or md5
    tool: str                      # the program, for the job's "is it there" check
    command: str                   # shell words; the file name is appended
    helper: bool                   # bin/hpcrun-checksum.py is part of the plan
    hint: str                      # where to fix a missing tool


@dataclass(frozen=True)
class NodeCachePlan:
    """Staged URL inputs kept on the nodes (the site's ``xrootd.node_cache``)."""

    dir_expr: str                  # shell text: the user's cache directory on the job's node
    max_bytes: int
    index: str                     # shared directory: one file per node listing what its cache holds


@dataclass(frozen=True)
class RemotePlan:
    """How jobs read URL inputs (root://), from the site's ``xrootd`` table."""

    access: str                    # stage (xrdcp in before the chains) or stream ({input} is the URL)
    cache: Optional[str]           # root://HOST:PORT every read goes through, or None
    xrdcp: str                     # shell words (the profile's, trusted)
    retries: int                   # extra attempts per file on a transient error
    client_env: Tuple[Tuple[str, str], ...]  # XRD_* variables bounding the client's waits
    private_stage: bool = False    # staged into the site's node-local stage_dir: 0700, held, reclaimed
    node_cache: Optional[NodeCachePlan] = None
    local_paths: Tuple[Tuple[str, str], ...] = ()   # (URL prefix, local path): read in place when it matches
    parallel: int = 1              # inputs of one job copied in at once


@dataclass(frozen=True)
class ExportPlan:
    """Where outputs go once they passed QA, and how the supervisor sends them (``outputs.export``)."""

    to: str                        # root://HOST[:PORT]//PATH or an absolute directory
    streams: int                   # copies at once
    max_attempts: int              # the failure class 'export': attempts before an output is given up
    backoff_s: float               # first wait, doubled per attempt up to max_backoff_s
    max_backoff_s: float
    timeout_s: float               # one copy
    copy: Tuple[str, ...] = ()     # the XRootD client's argv (profile, trusted); () for a directory
    ask: Tuple[str, ...] = ()
    client_env: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ContainerPlan:
    """What the container runtime answered at plan time."""

    runtime: str
    directives: Tuple[Tuple[str, Optional[str]], ...]  # scheduler options the runtime needs (option, value)
    prefix: str                    # shell words between the launcher and the command
    setup_lines: Tuple[str, ...]   # shell lines before the first container starts
    node_cache_dir: Optional[str]  # the runtime's own payload volume, if it has one
    image_id: Optional[str] = None  # shell words printing the image's id (provenance); None: not reported


@dataclass(frozen=True)
class LaunchPlan:
    """How a job starts its database server and chains, and what that costs the scheduler."""

    in_batch: bool                 # processes of the batch step; else one launcher step each
    why: str                       # said by `plan`: the profile's or spec's choice, or the nodes
    steps_per_job: int             # scheduler steps a job creates (0 in the batch step)
    user_rpcs_per_job: int         # controller RPCs those steps send from the job's user
    end_rpcs_per_job: int          # and from the node's step daemons as the steps end


@dataclass(frozen=True)
class Succession:
    """What an earlier generation of the campaign leaves to this one: its number, the first job index
    free (job indices and names never repeat across generations), and the inputs it does not run
    (done and not rerun, or in flight under an earlier generation)."""

    number: int = 1
    first_index: int = 0
    exclude: FrozenSet[str] = frozenset()
    reprocess: str = "none"


@dataclass(frozen=True)
class ClusterSeat:
    """Which cluster a plan's scripts are for, and its part of a campaign on several clusters."""

    name: Optional[str] = None           # the profile's scheduler.cluster (None: the login node's own)
    share: float = 1.0
    max_queued_jobs: Optional[int] = None
    subdir: str = ""                     # "" for the first cluster, clusters/<name>/ for the others
    several: bool = False                # one of a campaign's several clusters (its pilots' ids carry its name)


@dataclass(frozen=True)
class PartUse:
    """One part of what the campaign leaves on a filesystem (outputs, logs, run records, queue, plan directory):
    entries (files and directories) and bytes at the campaign's peak and at its end."""

    part: str
    peak_files: int
    peak_bytes: int
    end_files: int
    end_bytes: int


@dataclass(frozen=True)
class FilesystemUse:
    """What the campaign holds on one filesystem, against the profile's quota there (plan/footprint.py)."""

    name: Optional[str]            # the profile's filesystems.<name>; None: a path under no declared filesystem
    path: str                      # its mount point (undeclared: the campaign's own path there)
    type: Optional[str]
    parts: Tuple[PartUse, ...]
    quota_files: Optional[int] = None
    quota_bytes: Optional[int] = None

    @property
    def peak(self) -> Tuple[int, int]:
        """(files, bytes) at the peak: what the quota must hold."""
        return sum(p.peak_files for p in self.parts), sum(p.peak_bytes for p in self.parts)

    @property
    def end(self) -> Tuple[int, int]:
        """(files, bytes) once the campaign is done."""
        return sum(p.end_files for p in self.parts), sum(p.end_bytes for p in self.parts)


@dataclass(frozen=True)
class Footprint:
    """The campaign's forecast on the filesystems it writes to (the plan directory, the outputs location)."""

    filesystems: Tuple[FilesystemUse, ...]
    running: int                   # jobs (or claims) running at once at the peak


@dataclass(frozen=True)
class Plan:
    campaign: Campaign
    spec_file: str
    profile: SiteProfile
    profile_files: Tuple[Path, ...]
    partition_name: str
    partition: Partition
    qos: Optional[str]
    container: ContainerPlan
    bb_system: Optional[str]       # None: the campaign uses no burst buffer
    pool: Optional[Pool]
    jobs: Sequence[Job]            # a tuple, or StreamedJobs (a large list file's, never held)
    scripts: Tuple[ScriptPlan, ...]
    database: Optional[DatabasePlan]
    input_dir_expr: str            # shell text: where a job finds its inputs
    work_dir_expr: str             # shell text: where chain parts go
    out_dir_expr: str              # shell text: where merged outputs are written
    copy_out_expr: Optional[str] = None  # shell text: where a claim copies its buffer's outputs (late binding)
    notes: Tuple[str, ...] = ()
    commands: Dict[str, str] = field(default_factory=dict)  # rendered shell words
    checksum: Optional[ChecksumPlan] = None  # None: inputs.checksum is none
    chain_overcommit: bool = False  # chains outnumber the CPUs of a node (jobs.overcommit)
    cleanup_workdir: bool = False   # chain parts on the filesystem are removed after the merge
    scheduler: str = "slurm"        # the profile's registered scheduler
    accounting: bool = True         # the scheduler can be asked about ended jobs (profile and backend agree)
    launcher: Tuple[str, ...] = ()  # the task launcher and its site options (argv words)
    launch: LaunchPlan = LaunchPlan(False, "", 0, 0, 0)
    finalize_request: Optional[JobRequest] = None
    remote: Optional[RemotePlan] = None  # the inputs are URLs (root://): how jobs read them
    export: Optional[ExportPlan] = None  # outputs are sent on to outputs.export by the supervisor
    locality_wait: Optional[int] = None  # jobs.locality: prefer: seconds a job waits for its node
    hdf5_helper: bool = False       # bin/hpcrun-hdf5.py is part of the plan (built-in HDF5 merge or QA)
    seat: ClusterSeat = ClusterSeat()
    others: Tuple[Plan, ...] = ()  # the same jobs planned for the campaign's other clusters
    move_pending_after: Optional[int] = None  # seconds; None: jobs never move between clusters
    succession: Succession = Succession()     # the campaign's generation this plan makes
    pilots: Optional[Any] = None              # late binding: plan/job/pilots.py's PilotPlan
    # where the profile sets each filesystem quota (filesystems.<name>.quota.files: (file, line)), for refusals
    quota_lines: Dict[str, Tuple[str, Optional[int]]] = field(default_factory=dict)
    footprint: Optional[Footprint] = None     # set once the plan directory is known (plan/footprint.py assessed)

    @property
    def all_clusters(self) -> Tuple[Plan, ...]:
        return (self, *self.others)

    @cached_property
    def capacity_jobs(self) -> int:
        """Plan jobs the partition runs at once (whole nodes, or chains' CPUs side by side on a node)."""
        per_node = 1 if self.partition.exclusive else max(
            1, self.partition.cpus // max(1, max(chains_of(self.jobs), default=1)))
        return max(1, self.partition.nodes // max(1, self.campaign.jobs.nodes) * per_node)

    @cached_property
    def cpus_allocated(self) -> int:
        """CPUs the scheduler allocates to all the jobs together: whole nodes (every logical CPU) on an
        exclusive partition, one per task (chain) on a shared one."""
        nodes = self.campaign.jobs.nodes
        if self.partition.exclusive:
            return len(self.jobs) * nodes * self.partition.cpus
        return sum(len(s.jobs) * nodes * ((s.request.tasks_per_node if s.request else None) or 1)
                   for s in self.scripts)

    @cached_property
    def cores_allocated(self) -> int:
        """Cores the jobs hold: physical cores of whole nodes, or one per task on a shared partition."""
        if self.partition.exclusive:
            return len(self.jobs) * self.campaign.jobs.nodes * self.partition.cores_per_node
        return self.cpus_allocated

    @cached_property
    def pilot_count(self) -> int:
        """Late binding: the pilots the campaign's inputs need, each running ``slots`` inputs at a time of
        their expected time until its drain margin (0: array binding)."""
        p = self.pilots
        if p is None:
            return 0
        per_pilot = p.slots * max(1, (p.walltime_s - p.drain_s) // max(1, p.input_s))
        return -(-len(self.jobs) // per_pilot)

    def _held(self, cores: bool) -> int:
        """CPUs (or cores) the scheduler allocates: to every job, or to every pilot (late binding)."""
        p = self.pilots
        if p is None:
            return self.cores_allocated if cores else self.cpus_allocated
        per = (self.partition.cores_per_node if cores else self.partition.cpus) if self.partition.exclusive \
            else p.cpus
        return self.pilot_count * per

    def _held_s(self, walltime_s: Optional[float] = None) -> float:
        """How long each holds them: a job its walltime; a pilot its own, whole (its drain tail and any
        idle time included: the scheduler charges what a pilot holds, not what its inputs used)."""
        walltime = float(walltime_s or self.campaign.walltime)
        if self.pilots is None:
            return walltime
        return self.pilots.walltime_s * walltime / max(1, self.campaign.walltime)

    @property
    def core_hours(self) -> float:
        """Every job (or pilot) at its whole walltime: an upper bound of what the campaign is charged."""
        return self._held(True) * self._held_s() / 3600.0

    @property
    def cpu_minutes(self) -> float:
        """What an association's ``cpu`` TRES-minutes count for the campaign at its walltime."""
        return self._held(False) * self._held_s() / 60.0

    def charge(self, walltime_s: Optional[float] = None) -> float:
        """The site's charge (profile partition's charge_per x charge_factor) at ``walltime_s``."""
        hours = self._held_s(walltime_s) / 3600.0
        part = self.partition
        if part.charge_per == "node-hour":
            units = self.pilot_count if self.pilots is not None else len(self.jobs) * self.campaign.jobs.nodes
        else:
            units = self._held(True)
        return units * hours * part.charge_factor

    @cached_property
    def expected_rpcs(self) -> Dict[str, int]:
        """The controller RPCs the campaign's first attempt sends: one submission per script (and the
        finalize job), and its jobs' launcher steps; tracking is measured (benchmarks/scheduler_rpcs.py)."""
        jobs = len(self.jobs)
        # late binding: one array of pilots (more only as pilots end), none per input
        submissions = (1 if self.pilots is not None else len(self.scripts)) + (
            1 if self.finalize_request is not None else 0)
        in_job = jobs * self.launch.user_rpcs_per_job
        inputs = max(1, inputs_in(self.jobs))
        return {"submissions": submissions, "steps": jobs * self.launch.steps_per_job,
                "in_job_user": in_job, "in_job_daemons": jobs * self.launch.end_rpcs_per_job,
                "user_per_1000_inputs": round((submissions + in_job) * 1000 / inputs)}

    @property
    def node_hours(self) -> float:
        return len(self.jobs) * self.campaign.jobs.nodes * self.campaign.walltime / 3600.0

    @cached_property
    def input_bytes(self) -> int:
        if isinstance(self.jobs, StreamedJobs):
            return self.jobs.input_bytes
        return sum([i.size for j in self.jobs for i in j.inputs])

    @property
    def output_bytes(self) -> int:
        return int(self.input_bytes * self.campaign.outputs.size_ratio)

    @property
    def stage_in_bytes(self) -> int:
        bb = self.campaign.burst_buffer
        return self.input_bytes if (self.bb_system and bb and bb.stage_inputs) else 0

    @property
    def stage_out_bytes(self) -> int:
        bb = self.campaign.burst_buffer
        return self.output_bytes if (self.bb_system and bb and bb.stage_outputs) else 0

    @cached_property
    def bb_total(self) -> int:
        return sum(bb_capacities(self.jobs))

    @cached_property
    def bb_max(self) -> int:
        return max(bb_capacities(self.jobs), default=0)

