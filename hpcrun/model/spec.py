"""The campaign spec: what to run. Written by production operators.

Every model forbids unknown keys and coerces nothing silently (strict types), so a
typo is reported with a did-you-mean instead of being ignored.
"""

from __future__ import annotations

from typing import List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.model.fields import AbsPath, AutoInt, Command, Duration, EnvVars, Hdf5Path, InputPath, Line, Name, Size
from hpcrun.model.kinds import RuntimeKind
from hpcrun.model.retry import EventsSpec, RetrySpec


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _profile_ref(value: str) -> str:
    import re
    if not (re.match(r"^[A-Za-z][A-Za-z0-9_.-]*$", value) or value.endswith((".yaml", ".yml"))):
        raise ValueError(f"'{value}' is neither a profile name nor a path to a .yaml file")
    return value


class ClusterRef(Strict):
    """One of several clusters a campaign runs on: its profile and how much of the work it may take."""

    profile: Line = Field(description="site profile name or path; its scheduler.cluster names the cluster")
    share: float = Field(1.0, gt=0, description=(
        "weight of this cluster when several have room: queued work is kept in proportion to the shares"))
    max_queued_jobs: Optional[int] = Field(None, ge=1, description=(
        "at most this many of the campaign's jobs queued or running here (the profile's own limit still holds)"))

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        return _profile_ref(value)


class SiteRef(Strict):
    """Where the campaign runs: a site profile (or several clusters' profiles) and the Slurm account settings."""

    profile: Union[Line, List[Union[Line, ClusterRef]]] = Field(description=(
        "site profile name (see `hpcrun profiles list`) or a path to a profile .yaml file; or a list of them "
        "(each a name, a path or {profile, share, max_queued_jobs}): one per cluster the campaign may use"))
    move_pending_after: Optional[Duration] = Field(None, description=(
        "with several clusters: a job pending this long on one cluster is cancelled there (confirmed gone) "
        "and submitted to another; off by default"))
    partition: Optional[Name] = Field(None, description="partition; default: the profile's default")
    qos: Optional[Name] = Field(None, description="QOS; must be allowed on the partition")
    account: Optional[Name] = Field(None, description="account to charge")
    reservation: Optional[Name] = None
    extra_sbatch: List[Line] = Field(default_factory=list, description=(
        "extra Slurm batch options (e.g. '--exclude=nid00012'), each emitted as its own directive line"))

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: Union[str, List[Union[str, ClusterRef]]]) -> Union[str, List[Union[str, ClusterRef]]]:
        if isinstance(value, str):
            return _profile_ref(value)
        if not value:
            raise ValueError("the list of profiles is empty; name at least one")
        for item in value:
            if isinstance(item, str):
                _profile_ref(item)
        return value

    @property
    def clusters(self) -> List[ClusterRef]:
        """Every cluster's reference, a single profile as a list of one."""
        items = [self.profile] if isinstance(self.profile, str) else self.profile
        return [ClusterRef(profile=i) if isinstance(i, str) else i for i in items]

    @field_validator("extra_sbatch")
    @classmethod
    def _options(cls, value: List[str]) -> List[str]:
        slurm = scheduler_for("slurm")  # the key is Slurm's by name; the backend knows its options
        for opt in value:
            why = slurm.extra_problem(opt)
            if why:
                raise ValueError(why)
        return value


class ContainerSpec(Strict):
    """Container image and runtime; the runtime must be offered by the site profile."""

    runtime: RuntimeKind = "none"
    image: Optional[Line] = Field(None, description=(
        "shifter: docker:<repo>:<tag>; apptainer: path to a .sif; podman-hpc: image name; "
        "charliecloud: absolute path to an image directory"))
    options: List[Line] = Field(default_factory=list, description="extra runtime arguments")
    modules: List[Name] = Field(default_factory=list, description="Shifter modules (--module)")

    @model_validator(mode="after")
    def _image_needed(self) -> ContainerSpec:
        if self.runtime != "none" and not self.image:
            raise ValueError(f"container runtime '{self.runtime}' needs an 'image'")
        if self.runtime == "none" and self.image:
            raise ValueError("an image is given but runtime is 'none'; set runtime to "
                             "shifter, apptainer, podman-hpc or charliecloud")
        if self.runtime == "shifter" and self.image and ":" not in self.image:
            raise ValueError("a Shifter image names its type, e.g. docker:repo/name:tag")
        return self

    @field_validator("image")
    @classmethod
    def _charliecloud_image(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if info.data.get("runtime") == "charliecloud" and value and not value.startswith("/"):
            if ":" in value.split("/")[0]:
                raise ValueError(
                    f"'{value}' is a registry reference, but ch-run runs an unpacked image "
                    "directory; unpack it first (e.g. ch-image pull, then ch-convert to a "
                    "directory on a shared filesystem) and give that directory's absolute path")
            raise ValueError(f"'{value}' is not an absolute path; a Charliecloud image is "
                             "an image directory, e.g. /scratch/images/reco")
        return value


class SoftwareSpec(Strict):
    release: Optional[Line] = Field(None, description="software release, exported as HPCRUN_RELEASE")
    modules: List[Line] = Field(default_factory=list, description="environment modules to load")
    env: EnvVars = Field(default_factory=dict, description="environment variables")


class InputFile(Strict):
    path: InputPath
    size: Optional[Size] = None
    events: Optional[int] = Field(None, ge=0)
    checksum: Optional[Line] = Field(None, description=(
        "the file's checksum: adler32:<8 hex digits> or md5:<32 hex digits>"))

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, value: Optional[str]) -> Optional[str]:
        from hpcrun.model.checksum import syntax_error
        why = syntax_error(value) if value is not None else None
        if why:
            raise ValueError(why)
        return value


class InputsSpec(Strict):
    """Input files: an explicit list, a glob, and/or a list file (one path per line)."""

    files: List[Union[InputPath, InputFile]] = Field(default_factory=list, description=(
        "absolute paths or root://HOST[:PORT]//PATH URLs, or {path, size, events, checksum}"))
    glob: Optional[AbsPath] = None
    list_file: Optional[Line] = Field(None, description=(
        "file with one input per line: PATH-OR-URL [SIZE [EVENTS]]; relative to the spec file"))
    size: Optional[Size] = Field(None, description="size of each file when it cannot be stat'ed")
    events: Optional[int] = Field(None, ge=0, description="events per file when not listed")
    checksum: Literal["adler32", "md5", "none"] = Field("adler32", description=(
        "checksum each job verifies before processing its inputs; none: no verification"))
    checksum_catalog: Optional[Line] = Field(None, description=(
        "file of '<hex>  <path>' lines as md5sum or xrdadler32 write them; relative to the spec file"))
    stem: Line = Field("name", description=(
        "how each input's stem (its outputs', parts' and logs' name) is made: name (the file name up to its "
        "first dot), path (the part of the path that differs between inputs, joined with _), or a regular "
        "expression whose group (?P<stem>...) is searched in the path"))

    @field_validator("stem")
    @classmethod
    def _stem(cls, value: str) -> str:
        if value in ("name", "path"):
            return value
        import re
        try:
            pattern = re.compile(value)
        except re.error as exc:
            raise ValueError(f"'{value}' is neither name, path nor a regular expression ({exc})") from None
        if "stem" not in pattern.groupindex:
            raise ValueError(f"'{value}' has no group (?P<stem>...); give name, path, or a regular expression "
                             r"with one, e.g. '/AOD/(?P<stem>\d+)/'")
        return value

    @model_validator(mode="after")
    def _some(self) -> InputsSpec:
        if not self.files and not self.glob and not self.list_file:
            raise ValueError("give at least one of 'files', 'glob' or 'list_file'")
        return self


class PilotSpec(Strict):
    """Late binding: the pilots that claim inputs (jobs.binding: late)."""

    walltime: Duration = Field(3600, description=(
        "each pilot's own time limit (an input's is the campaign's walltime)"))
    slots: Optional[int] = Field(None, ge=1, description=(
        "inputs a pilot runs at once, each with chains_per_node chains (default: the node's CPUs / chains)"))
    nodes: Optional[int] = Field(None, ge=1, description=(
        "pilots (whole or shared nodes) at once at most (default: the partition's nodes)"))
    idle_release: Duration = Field(60, description="a pilot with nothing to claim this long exits")
    drain_margin: Optional[Duration] = Field(None, description=(
        "the pilot's drain signal this long before its end (default: the profile's signal_before_timeout)"))
    lease: Duration = Field(120, description=(
        "a pilot whose heartbeat (every 10 s) is silent this long is fenced: its claims go to other pilots"))
    input_time: Optional[Duration] = Field(None, description=(
        "each input's expected time before any has run (default: walltime); a pilot claims an input only "
        "when its time left covers this, later the longest recent input's time"))
    direct: bool = Field(True, description=(
        "the pilot's agent starts each input's program itself where the job needs nothing more of its script "
        "(one chain, no container, database, merge, QA, staging or burst buffer: docs/late-binding.md); "
        "false: every input through the job script"))


class JobsSpec(Strict):
    """How inputs map to jobs and chains."""

    files_per_job: int = Field(1, ge=1)
    nodes: int = Field(1, ge=1)
    chains_per_node: AutoInt = Field(1, description="chains per node, or 'auto'")
    bytes_per_chain: Optional[Size] = Field(None, description=(
        "with chains_per_node: auto, one chain per this many input bytes (1..CPUs per node)"))
    overcommit: bool = Field(False, description="allow more chains than CPUs per node")
    array: Literal["auto", "always", "never"] = Field("auto", description=(
        "auto: job arrays unless each job needs its own #DW stage lines"))
    throttle: Optional[int] = Field(None, ge=1, description="array %N: max tasks running at once")
    script_files: Literal["auto", "always", "never"] = Field("auto", description=(
        "job and array scripts as files in the plan directory (auto: up to 1000 jobs), else each "
        "job's or array's script is rendered at submission from one template and a table of lines"))
    locality: Literal["any", "prefer"] = Field("any", description=(
        "prefer: group inputs by the node whose cache holds them and ask for that node (the site's "
        "xrootd.node_cache); any: every node alike"))
    locality_wait: Duration = Field(600, description=(
        "with locality: prefer, a job still waiting for its node after this long is sent to any node"))
    binding: Literal["array", "late"] = Field("array", description=(
        "array: each job is an array task the scheduler starts; late: pilots (jobs.pilot) claim the jobs "
        "from a queue on the shared filesystem until the campaign is done"))
    pilot: PilotSpec = Field(default_factory=PilotSpec)

    @field_validator("chains_per_node")
    @classmethod
    def _chains(cls, value: Union[int, str]) -> Union[int, str]:
        if isinstance(value, int) and value < 1:
            raise ValueError("chains_per_node must be at least 1")
        return value

    @model_validator(mode="after")
    def _auto_needs_bytes(self) -> JobsSpec:
        if self.chains_per_node == "auto" and not self.bytes_per_chain:
            raise ValueError("chains_per_node: auto needs bytes_per_chain (e.g. 1GB)")
        return self


class RestartPolicy(Strict):
    max_restarts: int = Field(3, ge=0, description="restarts of a dead DB server before the job fails")
    backoff: Duration = Field(5, description="wait before each restart")


class DatabaseSpec(Strict):
    """Conditions-DB payload served by one DB server per node."""

    payload: AbsPath = Field(description="the server's data directory, copied to node-local storage")
    size: Optional[Size] = Field(None, description="payload size; measured when the path exists")
    engine: Literal["mysql", "mariadb"] = "mariadb"
    server: Optional[Line] = Field(None, description="server binary (default mariadbd or mysqld)")
    options: List[Line] = Field(default_factory=list, description="extra server options")
    ready_timeout: Duration = Field(300, description="how long to wait for the server to answer")
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    networking: Literal["socket", "tcp"] = "socket"
    check_query: Line = "SELECT 1"


class StageItem(Strict):
    source: Line
    destination: Line
    type: Literal["file", "directory", "list"] = "file"


class BurstBufferSpec(Strict):
    """Per-job burst buffer: capacity, mode, staging."""

    capacity: Union[Size, Literal["auto"]] = Field("auto", description=(
        "explicit size, or auto = (inputs + expected outputs) x safety_factor"))
    safety_factor: float = Field(1.5, ge=1.0)
    access_mode: Literal["striped", "private", "striped,private"] = "striped"
    type: Literal["scratch", "cache"] = "scratch"

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        if value == "cache":
            raise ValueError("type 'cache' (a transparent cache over the parallel filesystem, "
                             "$DW_JOB_STRIPED_CACHE) is not supported yet; use 'scratch' with staging")
        return value
    pool: Optional[Name] = None
    stage_inputs: bool = Field(True, description="stage each job's input files in")
    stage_outputs: bool = Field(True, description="stage merged outputs out to outputs.location")
    stage_in: List[StageItem] = Field(default_factory=list, description=(
        "extra items; the burst-buffer side is relative to the job buffer"))
    stage_out: List[StageItem] = Field(default_factory=list)
    persistent: List[Name] = Field(default_factory=list, description="persistent buffers to attach")

    @field_validator("capacity", mode="before")
    @classmethod
    def _cap(cls, value: object) -> object:
        if value == "auto":
            return value
        from hpcrun.units import parse_size
        return parse_size(value)  # type: ignore[arg-type]


class ChainSpec(Strict):
    command: Command = Field(description=(
        "argv with placeholders {input} {output} {chain} {nchains} {first_event} {nevents} "
        "{db_socket} {db_port} {workdir} {release}"))
    env: EnvVars = Field(default_factory=dict, description="variables exported for the chains")
    launch: Literal["auto", "step"] = Field("auto", description=(
        "'step': start the chains with the site's task launcher even in one-node jobs, as an MPI "
        "program started through PMI needs; 'auto': the site profile's launcher.single_node"))


class Hdf5Merge(Strict):
    """The built-in merge of per-chain HDF5 parts (needs h5py where the job runs it)."""

    datasets: List[Hdf5Path] = Field(min_length=1, description=(
        "datasets concatenated along their first axis in chain order; the first part's file, group "
        "and dataset attributes are kept"))


class MergeSpec(Strict):
    command: Optional[Command] = Field(None, description=(
        "argv with {parts} (one argument per chain part) and {output}"))
    hdf5: Optional[Hdf5Merge] = Field(None, description="the built-in HDF5 merge instead of a command")

    @model_validator(mode="after")
    def _one(self) -> MergeSpec:
        if (self.command is None) == (self.hdf5 is None):
            raise ValueError("give either 'command' or 'hdf5' (the built-in HDF5 merge)")
        return self


class Hdf5QA(Strict):
    """Built-in QA of HDF5 outputs (needs h5py where the job runs it)."""

    events_dataset: Optional[Hdf5Path] = Field(None, description=(
        "the dataset whose length (first axis) counts events, in inputs and outputs: used for "
        "min_event_fraction instead of count_events"))
    require: List[Hdf5Path] = Field(default_factory=list, description=(
        "datasets every output must hold (each output must also open as HDF5)"))


class QASpec(Strict):
    count_events: Optional[Command] = Field(None, description=(
        "prints the number of events in {file}; used for the event-fraction rule"))
    min_event_fraction: float = Field(0.98, ge=0.0, le=1.0)
    command: Optional[Command] = Field(None, description="extra check on {output}; non-zero fails QA")
    hdf5: Optional[Hdf5QA] = Field(None, description="built-in checks of HDF5 outputs")

    @model_validator(mode="after")
    def _count(self) -> QASpec:
        if self.count_events is not None and self.hdf5 is not None and self.hdf5.events_dataset:
            raise ValueError("give either count_events or hdf5.events_dataset to count events, not both")
        return self


class FinalizeSpec(Strict):
    """The campaign-level job that runs once after every plan job (e.g. a dataset merge, a QA summary)."""

    command: Command = Field(description=(
        "argv with {outdir} {output_list} {campaign} {plan_dir} {release}; runs in the batch shell"))
    walltime: Optional[Duration] = Field(None, description="time limit of the finalize job; default: walltime")
    after: Literal["any", "ok"] = Field("any", description=(
        "any: once every plan job has ended, whatever the outcome; ok: only if every one succeeded"))


class OutputsSpec(Strict):
    location: AbsPath = Field(description="where merged outputs land (parallel filesystem)")
    workdir: Optional[AbsPath] = Field(None, description=(
        "shared directory for chain outputs before the merge when there is no burst buffer "
        "(default: <location>/.hpcrun-work)"))
    pattern: Line = Field("{stem}.out", description="merged output name per input: {stem} {name}")
    size_ratio: float = Field(1.0, gt=0, description="expected output bytes per input byte")
    export: Optional[Line] = Field(None, description=(
        "where each output is sent once it passed QA, root://HOST[:PORT]//PATH or a directory on another "
        "filesystem; copied by the supervisor and verified (size and adler32 asked of the destination)"))
    provenance: Literal["store", "sidecar"] = Field("store", description=(
        "where each output's provenance record goes once it passed QA: the campaign store (`hpcrun outputs`), "
        "or also <output>.prov.json beside the output (sidecar), for catalogues that read files"))


class TargetsSpec(Strict):
    """The facility's throughput targets, shown next to the measured figures in `hpcrun report`."""

    mb_per_s_per_core: Optional[float] = Field(None, gt=0, description=(
        "input megabytes (10^6 bytes) per second per allocated core, e.g. 12.5"))
    events_per_s_per_core: Optional[float] = Field(None, gt=0, description=(
        "input events per second per allocated core"))


class Campaign(Strict):
    """A campaign spec (top level)."""

    name: Name
    description: Optional[str] = None
    site: SiteRef
    walltime: Duration
    container: ContainerSpec = Field(default_factory=ContainerSpec)
    software: SoftwareSpec = Field(default_factory=SoftwareSpec)
    inputs: InputsSpec
    jobs: JobsSpec = Field(default_factory=JobsSpec)
    retry: RetrySpec = Field(default_factory=RetrySpec)
    database: Optional[DatabaseSpec] = None
    burst_buffer: Optional[BurstBufferSpec] = None
    chain: ChainSpec
    merge: Optional[MergeSpec] = None
    qa: Optional[QASpec] = None
    finalize: Optional[FinalizeSpec] = None
    events: Optional[EventsSpec] = None
    outputs: OutputsSpec
    targets: Optional[TargetsSpec] = Field(None, description="throughput targets for the report")
