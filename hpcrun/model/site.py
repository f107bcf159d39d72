"""The site profile: where a campaign runs. Owned by site staff.

Profiles are layered with ``extends:`` (see :mod:`hpcrun.model.profiles`); this module
only describes the merged result.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hpcrun.model.fields import AbsPath, Count, Duration, EnvVars, Line, Name, Size
from hpcrun.model.kinds import RUNTIMES, BufferSystem, SchedulerKind

# What site staff write as a program or its options is trusted code (it runs as written);
# every other profile value is data and untrusted like a spec value (docs/security.md).
TRUSTED: Dict[str, Any] = {"x-hpcrun-trusted": "code"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Partition(Strict):
    slurm_partition: Optional[Name] = Field(None, description=(
        "the scheduler's partition name; omitted when null (e.g. NERSC selects nodes by QOS and "
        "constraint)"))
    nodes: int = Field(ge=1, description="nodes in the partition")
    cores_per_node: int = Field(ge=1, description="physical cores per node")
    cpus_per_node: Optional[int] = Field(None, ge=1, description="logical CPUs (default: cores)")
    memory_per_node: Size
    max_walltime: Duration
    max_nodes_per_job: Optional[int] = Field(None, ge=1)
    qos: List[Name] = Field(default_factory=list, description="QOS allowed here (empty: any)")
    default_qos: Optional[Name] = None
    constraint: Optional[Line] = Field(None, description="node feature constraint (e.g. haswell)")
    exclusive: bool = Field(True, description="request whole nodes")
    charge_per: Literal["core-hour", "node-hour"] = Field("core-hour", description=(
        "what the site charges for: allocated core-hours, or node-hours (NERSC)"))
    charge_factor: float = Field(1.0, gt=0, description=(
        "the site's units per core-hour or node-hour (a machine charge factor)"))

    @property
    def cpus(self) -> int:
        return self.cpus_per_node or self.cores_per_node


class NodeLocal(Strict):
    path: AbsPath = Field(description="node-local directory for caches (payload copy, DB socket)")
    size: Size
    type: Literal["ssd", "nvme", "hdd", "tmpfs", "xfs-loop"] = "ssd"


class ShifterSettings(Strict):
    per_node_cache: bool = Field(True, description="site allows perNodeCache volumes")
    per_node_cache_max: Optional[Size] = Field(None, description="largest perNodeCache size")
    cache_mount: AbsPath = Field("/dbcache", description="where the cache appears in the container")
    volume_source: AbsPath = Field(description="an existing path used as the perNodeCache source")
    modules: List[Name] = Field(default_factory=list, description="default --module list")
    command: Line = Field("shifter", json_schema_extra=TRUSTED)


class ApptainerSettings(Strict):
    command: Line = Field("apptainer", json_schema_extra=TRUSTED)
    cachedir: Optional[AbsPath] = None
    tmpdir: Optional[AbsPath] = None
    exec_options: List[Line] = Field(default_factory=list, json_schema_extra=TRUSTED)
    binds: List[Line] = Field(default_factory=list, description="site binds (src[:dst[:ro]])")


class PodmanHpcSettings(Strict):
    command: Line = Field("podman-hpc", json_schema_extra=TRUSTED)
    run_options: List[Line] = Field(default_factory=list, json_schema_extra=TRUSTED)


class SarusSettings(Strict):
    """Sarus ``run`` of an image pulled beforehand with ``sarus pull``."""

    command: Line = Field("sarus", description="the sarus program", json_schema_extra=TRUSTED)
    run_options: List[Line] = Field(default_factory=list, description="extra sarus run options",
                                    json_schema_extra=TRUSTED)


class CharliecloudSettings(Strict):
    """Charliecloud ``ch-run`` of an image directory; every path appears at the same place
    inside the container as outside, so the job's variables and arguments stay valid."""

    command: Line = Field("ch-run", description="the ch-run program", json_schema_extra=TRUSTED)
    options: List[Line] = Field(default_factory=list, description=(
        "extra ch-run options for every command (e.g. --unset-env=LD_LIBRARY_PATH)"), json_schema_extra=TRUSTED)
    binds: List[Line] = Field(default_factory=list, description=(
        "site binds SRC[:DST] (DST defaults to SRC); hpcrun's own paths under a bind with "
        "DST = SRC need no bind of their own"))
    burst_buffer_root: Optional[AbsPath] = Field(None, description=(
        "directory under which the burst-buffer system mounts job buffers ($DW_JOB_STRIPED "
        "etc.), bound at the same path; needed by campaigns with a burst buffer"))
    private_tmp: bool = Field(False, description=(
        "ch-run --private-tmp: /tmp in the container is a private tmpfs instead of the host's"))
    home: Optional[AbsPath] = Field(None, description=(
        "HOME inside the container (default: the job's run directory; ch-run's "
        "/home/$USER does not exist in most images)"))

    @field_validator("binds")
    @classmethod
    def _binds(cls, value: List[str]) -> List[str]:
        for bind in value:
            parts = bind.split(":")
            if len(parts) > 2 or not all(p.startswith("/") for p in parts):
                raise ValueError(f"'{bind}' is not SRC or SRC:DST with absolute paths (ch-run "
                                 "binds are read-write and take no options)")
            if any(c.isspace() for c in bind) or "$" in bind:
                raise ValueError(f"'{bind}' contains a blank or '$'; write the literal path")
        return value


class Containers(Strict):
    shifter: Optional[ShifterSettings] = None
    apptainer: Optional[ApptainerSettings] = None
    podman_hpc: Optional[PodmanHpcSettings] = Field(None, alias="podman-hpc")
    charliecloud: Optional[CharliecloudSettings] = None
    sarus: Optional[SarusSettings] = None
    none: bool = Field(True, description="jobs may run without a container")

    def offered(self) -> List[str]:
        names = [n for n in RUNTIMES if n != "none" and getattr(self, n.replace("-", "_"), None) is not None]
        return names + (["none"] if self.none else [])


class Pool(Strict):
    name: Name
    granularity: Size = Field(description="capacity is rounded up to a multiple of this")
    max_per_job: Optional[Size] = None
    total: Optional[Size] = None
    default: bool = False


class BurstBufferSettings(Strict):
    system: BufferSystem = "none"
    directive: Line = Field("DW", description="directive word without '#' (slurm-lua: Directive=)")
    pools: List[Pool] = Field(default_factory=list)
    pool_required: bool = Field(False, description="always emit pool= (slurm-lua needs it)")
    stage_from: List[AbsPath] = Field(default_factory=list, description=(
        "path prefixes that stage-in may read from (empty: anywhere)"))

    @model_validator(mode="after")
    def _pools(self) -> BurstBufferSettings:
        if self.system == "none" and self.pools:
            raise ValueError("pools are listed but the burst-buffer system is 'none'")
        if self.system != "none" and not self.pools:
            raise ValueError(f"burst-buffer system '{self.system}' needs at least one pool")
        if sum(1 for p in self.pools if p.default) > 1:
            raise ValueError("only one pool can be the default")
        return self

    def pool(self, name: Optional[str]) -> Optional[Pool]:
        if name is None:
            for p in self.pools:
                if p.default:
                    return p
            return self.pools[0] if self.pools else None
        return next((p for p in self.pools if p.name == name), None)


class Quota(Strict):
    """What the site allows one user on a filesystem: hpcrun plan notes a campaign that needs more than half
    of it and refuses one that cannot fit (docs/operations.md#the-footprint-on-shared-filesystems)."""

    files: Optional[Count] = Field(None, description=(
        "entries (files and directories: inodes) allowed, e.g. 10M (powers of 1000)"))
    bytes: Optional[Size] = Field(None, description="bytes allowed, e.g. 20TB")

    @field_validator("files", "bytes")
    @classmethod
    def _positive(cls, value: Optional[int]) -> Optional[int]:
        if value == 0:
            raise ValueError("a quota of 0 allows nothing; leave the key out where there is no quota")
        return value


class Filesystem(Strict):
    path: AbsPath = Field(description="mount point (the longest that holds a path is its filesystem)")
    type: Literal["lustre", "gpfs", "nfs", "xfs", "ext4", "tmpfs", "other"] = "other"
    quota: Optional[Quota] = Field(None, description=(
        "the user's quota here, {files: 10M, bytes: 20TB}: the plan's footprint is checked against it"))


class SchedulerSettings(Strict):
    """The scheduler's settings table: which backend writes and follows the jobs."""

    kind: SchedulerKind = Field("slurm", description="one of the registered schedulers")
    cluster: Optional[Name] = Field(None, description=(
        "the cluster's name as the scheduler knows it (Slurm: ClusterName, reached with --clusters); "
        "absent: the cluster this login node talks to"))
    min_poll_interval: Duration = Field(60, description=(
        "the shortest interval between two scheduler polls of one campaign that the site accepts "
        "(status --wait, submit --follow); a shorter --interval is raised to it"))


class Launcher(Strict):
    command: Optional[Line] = Field(None, description=(
        "program that starts the job's tasks; default: the scheduler's own launcher"), json_schema_extra=TRUSTED)
    options: List[Line] = Field(default_factory=list, description="added to every task launch",
                                json_schema_extra=TRUSTED)
    single_node: Literal["batch", "step"] = Field("batch", description=(
        "how a one-node job starts its database server and chains: 'batch' as processes of the batch "
        "step (no scheduler step: no RPC to the controller per job), 'step' with the launcher as today "
        "(where the site needs a step per task: MPI programs started through PMI, per-step accounting or "
        "cgroups). Jobs of several nodes always use the launcher"))


class Prologue(Strict):
    modules: List[Line] = Field(default_factory=list)
    env: EnvVars = Field(default_factory=dict)


class ToolPaths(Strict):
    python: Line = Field("python3", description=(
        "Python 3 on the compute nodes (runs bin/hpcrun-checksum.py for adler32 checksums, and a late-bound "
        "pilot's agent: 3.7 or later)"),
        json_schema_extra=TRUSTED)
    xrdadler32: Optional[Line] = Field(None, description=(
        "XRootD's xrdadler32; when set, jobs compute adler32 checksums with it instead of Python"),
        json_schema_extra=TRUSTED)
    darshan_lib: Optional[AbsPath] = None
    darshan_module: Optional[Line] = None
    ior: Optional[Line] = Field(None, json_schema_extra=TRUSTED)
    ior_module: Optional[Line] = None


class IotuneRecommended(Strict):
    """What ``hpcrun iotune run --apply`` writes; job scripts export it (HPCRUN_IO_*)."""

    transfer_size: Size = Field(description="recommended bytes per I/O call")
    writers_per_node: int = Field(1, ge=1, description="recommended concurrent writers per node")
    target: Optional[Line] = Field(None, description="where it was measured (bb, scratch, node-local, a path)")
    bandwidth_mib_s: Optional[float] = Field(None, ge=0, description="bandwidth measured at that point")
    operation: Optional[Literal["write", "read"]] = Field(None, description="operation it was chosen for")
    measured: Optional[Line] = Field(None, description="date of the sweep (ISO 8601 text)")
    sweep: Optional[Line] = Field(None, description="results directory of the sweep")


class IotuneSettings(Strict):
    """Targets and engines for ``hpcrun iotune`` (IOR and Darshan come from ``tools``)."""

    scratch: Optional[AbsPath] = Field(None, description=(
        "directory the 'scratch' target writes under (default: filesystems.scratch.path)"))
    node_local: Optional[AbsPath] = Field(None, description=(
        "directory the 'node-local' target writes under (default: node_local.path)"))
    fio: Line = Field("fio", description="the fio binary", json_schema_extra=TRUSTED)
    mpirun: List[Line] = Field(default_factory=lambda: ["mpirun"], description=(
        "MPI launcher for IOR with --local (argv; batch jobs use launcher)"), json_schema_extra=TRUSTED)
    mpi_launch_options: List[Line] = Field(default_factory=list, description=(
        "added to the batch job's launcher for MPI programs (IOR), e.g. --mpi=pmix where the site's "
        "MPI starts under the launcher through PMIx"), json_schema_extra=TRUSTED)
    recommended: Optional[IotuneRecommended] = None


class NodeCache(Strict):
    """Staged URL inputs kept on each node for later jobs (docs/xrootd.md#node-caches)."""

    path: AbsPath = Field(description=(
        "node-local directory the user's cache lives under (hpcrun.cache.<user>, 0700); {node} is the "
        "node's name, for nodes that share a filesystem"))
    max_size: Size = Field(description="the user's cache on one node is trimmed to this, least recently used first")
    index: Optional[AbsPath] = Field(None, description=(
        "directory on a filesystem the login and compute nodes share where each node's job writes what the "
        "cache holds (default: ~/.hpcrun/node-caches/<cluster or profile>)"))


class ExportSettings(Strict):
    """How the supervisor sends outputs to ``outputs.export`` from here (docs/xrootd.md#exports)."""

    streams: int = Field(4, ge=1, le=64, description="copies the supervisor runs at once")
    backoff: Duration = Field(30, description="wait before the second attempt; doubled each time")
    max_backoff: Duration = Field(600, description="the longest wait between two attempts")
    timeout: Duration = Field(6 * 3600, description="one copy is stopped after this long")


class XrootdSettings(Strict):
    """How jobs read ``root://`` inputs here (docs/xrootd.md)."""

    access: Literal["stage", "stream"] = Field("stage", description=(
        "stage: the job copies each input with xrdcp to node-local storage (checksum verified, "
        "retried) before the chains start; stream: the chains get the URL as {input}"))
    cache: Optional[Line] = Field(None, description=(
        "an XCache endpoint, root://HOST:PORT: inputs are read through it (streamed or staged)"))
    stage_dir: Optional[AbsPath] = Field(None, description=(
        "where staged inputs land (default: the job's burst buffer or work directory)"))
    retries: int = Field(3, ge=0, le=20, description="extra xrdcp attempts per file on a transient error")
    request_timeout: Duration = Field(60, description=(
        "XRD_REQUESTTIMEOUT of the job's client (its default waits 30 min)"))
    connection_retry: int = Field(10, ge=1, le=100, description="XRD_CONNECTIONRETRY of the job's client")
    connection_window: Duration = Field(3, description="XRD_CONNECTIONWINDOW of the job's client")
    plan_timeout: Duration = Field(10, description="request timeout when hpcrun plan asks a server")
    plan_parallel: int = Field(4, ge=1, le=64, description="xrdfs processes hpcrun plan runs at once")
    xrdcp: Line = Field("xrdcp", description="the xrdcp program on the nodes", json_schema_extra=TRUSTED)
    xrdfs: Line = Field("xrdfs", description="the xrdfs program where hpcrun plan runs",
                        json_schema_extra=TRUSTED)
    node_cache: Optional[NodeCache] = Field(None, description=(
        "keep staged inputs on the nodes (private, LRU-bounded, verified before reuse) instead of deleting them"))
    local_paths: Dict[str, AbsPath] = Field(default_factory=dict, description=(
        "URL prefix -> the local path the nodes mount it under (root://se.example.org//alice/: /lustre/alice/): "
        "a staged input there is read in place when its size (and checksum) match what its server reported, "
        "else copied from the server; reads only"))
    parallel_copies: int = Field(4, ge=1, le=64, description="inputs of one job copied in at once (stage)")

    @field_validator("local_paths")
    @classmethod
    def _local_paths(cls, value: Dict[str, str]) -> Dict[str, str]:
        import re
        for prefix, path in value.items():
            if not re.match(r"^root://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?//", prefix):
                raise ValueError(f"'{prefix}' is not the prefix of a root:// URL; give root://HOST[:PORT]//PATH/")
            if not prefix.endswith("/") or not path.endswith("/"):
                raise ValueError(f"'{prefix}': '{path}': end both with '/' (a prefix must not match a longer name)")
        return value

    @field_validator("cache")
    @classmethod
    def _cache(cls, value: Optional[str]) -> Optional[str]:
        import re
        if value is not None and not re.match(r"^root://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?/?$", value):
            raise ValueError(f"'{value}' is not an XRootD endpoint; give root://HOST:PORT")
        return value.rstrip("/") if value else value


class AccountingSettings(Strict):
    records: bool = Field(True, description=(
        "the scheduler keeps accounting records of finished jobs; false: status follows the queue only"))
    check_budget: bool = Field(True, description=(
        "plan asks the scheduler for the account's limits and usage (sshare, sacctmgr)"))
    enforce_budget: bool = Field(False, description=(
        "a plan that needs more than the account has left is refused (default: a note)"))
    charge_unit: Name = Field("core-hours", description="the name of the site's charging unit")


class SiteProfile(Strict):
    """A site profile after ``extends`` layering has been applied."""

    name: Name
    description: Optional[str] = None
    extends: Optional[str] = Field(None, description="profile this one overrides")
    partitions: Dict[str, Partition]
    default_partition: Name
    node_local: Optional[NodeLocal] = None
    containers: Containers = Field(default_factory=Containers)
    burst_buffer: BurstBufferSettings = Field(default_factory=BurstBufferSettings)
    filesystems: Dict[str, Filesystem] = Field(default_factory=dict)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings, description=(
        "the batch system's settings table"))
    launcher: Launcher = Field(default_factory=Launcher)
    prologue: Prologue = Field(default_factory=Prologue)
    tools: ToolPaths = Field(default_factory=ToolPaths)
    iotune: IotuneSettings = Field(default_factory=IotuneSettings)
    xrootd: XrootdSettings = Field(default_factory=XrootdSettings, description=(
        "how jobs read root:// inputs (stream or stage, an XCache endpoint, client timeouts)"))
    exports: ExportSettings = Field(default_factory=ExportSettings, description=(
        "how the supervisor copies outputs to outputs.export (parallel streams, backoff)"))
    max_array_size: int = Field(1001, ge=0, description="Slurm MaxArraySize (0: no arrays)")
    array_throttle: Optional[int] = Field(None, ge=1, description="default array %N")
    max_queued_jobs: Optional[int] = Field(None, ge=1, description=(
        "per-user limit on queued jobs (MaxSubmitJobs; array tasks count one each): "
        "hpcrun submit leaves the rest pending for a later submit"))
    accounting: Union[bool, AccountingSettings] = Field(True, description=(
        "the scheduler keeps accounting records of finished jobs; false: status follows the queue only; "
        "or a table (records, check_budget, enforce_budget, charge_unit)"))
    signal_before_timeout: Duration = Field(120, description="--signal=B:USR1@<this>")
    template: Optional[Name] = Field(None, description="site job template (templates/<name>.sh.j2)",
                                     json_schema_extra=TRUSTED)
    db_port_base: int = Field(20000, ge=1024, le=55535, description=(
        "TCP database servers listen on db_port_base + (job id mod 10000)"))

    @property
    def keeps_records(self) -> bool:
        return self.accounting if isinstance(self.accounting, bool) else self.accounting.records

    @property
    def budget(self) -> AccountingSettings:
        """The accounting table (``accounting: true|false`` gives its defaults)."""
        a = self.accounting
        return a if isinstance(a, AccountingSettings) else AccountingSettings(records=a)

    @field_validator("default_partition")
    @classmethod
    def _default_partition(cls, value: str, info: ValidationInfo) -> str:
        partitions = info.data.get("partitions")
        if partitions is not None and value not in partitions:
            raise ValueError(f"default_partition '{value}' is not one of the partitions: "
                             f"{', '.join(sorted(partitions)) or '(none)'}")
        return value
