"""Planner: campaign spec + site profile -> jobs and scripts (no text rendering here).

Every cross-check that needs both files lives here and reports all problems at
once, pointing at the spec key (and naming the profile value it conflicts with).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hpcrun.backends.burstbuffer.base import BufferRequest, Stage, Writer, writer_for
from hpcrun.backends.container.base import Apptainer, Bind, Runtime, runtime_for
from hpcrun.errors import InputError, Problem
from hpcrun.model.site import Partition, Pool, SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.model.yamlsrc import Located
from hpcrun.plan import checks as carried
from hpcrun.plan import placeholders as ph
from hpcrun.plan.checksums import assign as assign_checksums
from hpcrun.plan.inputs import InputItem, expand
from hpcrun.shell import quote
from hpcrun.units import format_capacity, format_duration, format_size, round_up

SOCKET_MAX = 107
_BLANK_OR_DOLLAR = re.compile(r"[\s$\x00-\x1f\x7f]")
DB_CACHE_HEADROOM = 1.25  # payload copy + logs + temp tables


@dataclass(frozen=True)
class Job:
    index: int
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


@dataclass(frozen=True)
class ScriptPlan:
    name: str                      # file stem in the plan directory
    jobs: Tuple[Job, ...]
    array: Optional[str]           # --array value, None for a single job
    bb_lines: Tuple[str, ...]      # #DW/#BB lines (already checked)


@dataclass
class DatabasePlan:
    server: str
    client: str
    admin: str
    payload: str
    payload_bytes: int
    cache_dir: str                 # shell text; may contain ${SLURM_JOB_ID}
    socket: str
    networking: str
    options: List[str]
    ready_timeout: int
    max_restarts: int
    backoff: int
    check_query: str


@dataclass(frozen=True)
class ChecksumPlan:
    """How the job verifies its inputs: one algorithm per plan, one tool computing it."""

    algo: str                      # adler32 or md5
    tool: str                      # the program, for the job's "is it there" check
    command: str                   # shell words; the file name is appended
    helper: bool                   # bin/hpcrun-checksum.py is part of the plan
    hint: str                      # where to fix a missing tool


@dataclass
class Plan:
    campaign: Campaign
    spec_file: str
    profile: SiteProfile
    profile_files: List[Path]
    partition_name: str
    partition: Partition
    qos: Optional[str]
    runtime: Runtime
    bb: Optional[Writer]
    pool: Optional[Pool]
    jobs: List[Job]
    scripts: List[ScriptPlan]
    database: Optional[DatabasePlan]
    input_dir_expr: str            # shell text: where a job finds its inputs
    work_dir_expr: str             # shell text: where chain parts go
    out_dir_expr: str              # shell text: where merged outputs are written
    notes: List[str] = field(default_factory=list)
    commands: Dict[str, str] = field(default_factory=dict)  # rendered shell words
    checksum: Optional[ChecksumPlan] = None  # None: inputs.checksum is none

    @property
    def cores_per_job(self) -> int:
        return self.campaign.jobs.nodes * self.partition.cores_per_node

    @property
    def core_hours(self) -> float:
        return len(self.jobs) * self.cores_per_job * self.campaign.walltime / 3600.0

    @property
    def node_hours(self) -> float:
        return len(self.jobs) * self.campaign.jobs.nodes * self.campaign.walltime / 3600.0

    @property
    def input_bytes(self) -> int:
        return sum(j.input_bytes for j in self.jobs)

    @property
    def output_bytes(self) -> int:
        return int(self.input_bytes * self.campaign.outputs.size_ratio)

    @property
    def stage_in_bytes(self) -> int:
        bb = self.campaign.burst_buffer
        return self.input_bytes if (self.bb and bb and bb.stage_inputs) else 0

    @property
    def stage_out_bytes(self) -> int:
        bb = self.campaign.burst_buffer
        return self.output_bytes if (self.bb and bb and bb.stage_outputs) else 0

    @property
    def bb_total(self) -> int:
        return sum(j.bb_capacity or 0 for j in self.jobs)

    @property
    def bb_max(self) -> int:
        return max((j.bb_capacity or 0 for j in self.jobs), default=0)


class _Checks:
    """Collects problems with their spec/profile positions."""

    def __init__(self, spec: Located, profile: Located):
        self.spec, self.profile = spec, profile
        self.problems: List[Problem] = []

    def spec_error(self, path: Sequence[object], message: str) -> None:
        file, line = self.spec.where(tuple(path))
        self.problems.append(Problem(file, line, ".".join(str(p) for p in path), message))

    def profile_error(self, path: Sequence[object], message: str) -> None:
        file, line = self.profile.where(tuple(path))
        self.problems.append(Problem(file, line, ".".join(str(p) for p in path), message))

    def raise_if_any(self) -> None:
        if self.problems:
            raise InputError(self.problems)


def _dir_size(path: str) -> Optional[int]:
    if os.path.isfile(path):
        return os.path.getsize(path)
    if not os.path.isdir(path):
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def plan(campaign: Campaign, spec_src: Located, profile: SiteProfile, profile_src: Located,
         profile_files: List[Path]) -> Plan:
    checks = _Checks(spec_src, profile_src)
    spec_dir = Path(spec_src.file).resolve().parent

    # ---- partition, QOS, walltime, nodes --------------------------------------------------
    pname = campaign.site.partition or profile.default_partition
    partition = profile.partitions.get(pname)
    if partition is None:
        checks.spec_error(("site", "partition"), (
            f"partition '{pname}' is not in site profile '{profile.name}'; valid: "
            + ", ".join(sorted(profile.partitions)) + "."))
        checks.raise_if_any()
    assert partition is not None
    qos = campaign.site.qos or partition.default_qos
    if campaign.site.qos and partition.qos and campaign.site.qos not in partition.qos:
        checks.spec_error(("site", "qos"), (
            f"QOS '{campaign.site.qos}' is not allowed on partition '{pname}'; valid: "
            + ", ".join(partition.qos) + "."))
    if campaign.walltime > partition.max_walltime:
        checks.spec_error(("walltime",), (
            f"walltime {format_duration(campaign.walltime)} exceeds the maximum "
            f"{format_duration(partition.max_walltime)} of partition '{pname}' "
            f"(profile '{profile.name}')."))
    max_nodes = min(partition.nodes, partition.max_nodes_per_job or partition.nodes)
    if campaign.jobs.nodes > max_nodes:
        checks.spec_error(("jobs", "nodes"), (
            f"{campaign.jobs.nodes} nodes per job, but partition '{pname}' allows at most "
            f"{max_nodes}."))

    carried.check_sbatch_values(campaign, profile, pname, checks.spec_error, checks.profile_error)

    # ---- container runtime -----------------------------------------------------------------
    offered = profile.containers.offered()
    rt_name = campaign.container.runtime
    if rt_name not in offered:
        checks.spec_error(("container", "runtime"), (
            f"site profile '{profile.name}' does not offer container runtime '{rt_name}'; "
            f"it offers: {', '.join(offered)}."))
        checks.raise_if_any()

    # ---- inputs and chains -----------------------------------------------------------------
    try:
        items = expand(campaign.inputs, spec_src, spec_dir)
    except InputError as exc:
        checks.problems.extend(exc.problems)
        items = []
    inputs_key = next(k for k in ("files", "glob", "list_file") if getattr(campaign.inputs, k))
    carried.check_table_values(items, inputs_key, checks.spec_error)
    sums = assign_checksums(campaign.inputs, spec_src, spec_dir, [i.path for i in items])
    checks.problems.extend(sums.problems)
    cpus = partition.cpus
    js = campaign.jobs
    if isinstance(js.chains_per_node, int) and js.chains_per_node > cpus and not js.overcommit:
        checks.spec_error(("jobs", "chains_per_node"), (
            f"{js.chains_per_node} chains per node but nodes of partition '{pname}' have "
            f"{cpus} CPUs; lower it or set jobs.overcommit: true."))

    # ---- commands and placeholders ---------------------------------------------------------
    commands: Dict[str, str] = {}
    _command(checks, commands, "chain", ("chain", "command"), campaign.chain.command, ph.CHAIN)
    if campaign.merge:
        _command(checks, commands, "merge", ("merge", "command"), campaign.merge.command, ph.MERGE)
    if campaign.qa and campaign.qa.count_events:
        _command(checks, commands, "count_events", ("qa", "count_events"),
                 campaign.qa.count_events, ph.COUNT)
    if campaign.qa and campaign.qa.command:
        _command(checks, commands, "qa", ("qa", "command"), campaign.qa.command, ph.QA)
    _check_finalize(checks, commands, campaign, partition, pname, profile.name)
    bad = ph.check([campaign.outputs.pattern], ph.PATTERN, allow_env=False)
    if bad:
        checks.spec_error(("outputs", "pattern"), bad)
    elif "/" in ph.expand_pattern(campaign.outputs.pattern, stem="x", name="x"):
        checks.spec_error(("outputs", "pattern"), "the output name pattern cannot contain '/'.")
    else:
        stage_inputs = bool(campaign.burst_buffer and campaign.burst_buffer.stage_inputs)
        groups = [items[s:s + js.files_per_job] for s in range(0, len(items), js.files_per_job)]
        carried.check_output_names(campaign.outputs.pattern, groups, stage_inputs, checks.spec_error)
    used = ph.used(campaign.chain.command)
    if used & {"db_socket", "db_port", "db_host"} and campaign.database is None:
        checks.spec_error(("chain", "command"), (
            "the chain command uses a database placeholder but the spec has no 'database' section."))
    if campaign.database and campaign.database.networking == "socket" and "db_port" in used:
        checks.spec_error(("chain", "command"), (
            "{db_port} is used but database.networking is 'socket'; set it to 'tcp' or use {db_socket}."))
    needs_events = used & {"first_event", "last_event", "nevents"}
    if needs_events and items and any(i.events is None for i in items):
        missing = next(i.path for i in items if i.events is None)
        checks.spec_error(("chain", "command"), (
            f"the chain command uses {{{sorted(needs_events)[0]}}} but the number of events of "
            f"'{missing}' is unknown; give inputs.events or EVENTS in the list file, or slice "
            "with {chain} and {nchains} in the program."))
    multi_chain = js.nodes > 1 or js.chains_per_node == "auto" or js.chains_per_node != 1
    if multi_chain and campaign.merge is None:
        checks.spec_error(("jobs", "chains_per_node"), (
            "more than one chain writes parts of each output, so a 'merge' command is needed."))
    if campaign.qa and campaign.qa.count_events is None and campaign.qa.command is None:
        checks.spec_error(("qa",), "qa needs count_events (for min_event_fraction) or a command.")
    if campaign.qa and campaign.qa.command and campaign.qa.count_events is None and (
            ph.used(campaign.qa.command) & {"events_in", "events_out"}):
        checks.spec_error(("qa", "command"), (
            "{events_in} and {events_out} are counted with qa.count_events, which is not given."))

    # ---- burst buffer ----------------------------------------------------------------------
    bbspec = campaign.burst_buffer
    bbset = profile.burst_buffer
    writer = None
    pool = None
    if bbspec is not None:
        if bbset.system == "none":
            checks.spec_error(("burst_buffer",), (
                f"site profile '{profile.name}' has no burst buffer (system: none); remove the "
                "burst_buffer section or choose a site that has one."))
        else:
            writer = writer_for(bbset.system, bbset.directive, bbset.pool_required)
            pool = bbset.pool(bbspec.pool)
            if pool is None:
                checks.spec_error(("burst_buffer", "pool"), (
                    f"pool '{bbspec.pool}' does not exist at '{profile.name}'; valid: "
                    + ", ".join(p.name for p in bbset.pools) + "."))
            if "private" in bbspec.access_mode and "striped" not in bbspec.access_mode and (
                    bbspec.stage_inputs or bbspec.stage_outputs or bbspec.stage_in or bbspec.stage_out):
                checks.spec_error(("burst_buffer", "access_mode"), (
                    "DataWarp cannot stage in or out of a private-only buffer; use striped or "
                    "striped,private, or turn staging off."))
            if (js.nodes > 1 and bbspec.access_mode == "private"):
                checks.spec_error(("burst_buffer", "access_mode"), (
                    "with several nodes, chain outputs must be visible to the merge step; use "
                    "striped or striped,private."))
            for kind in ("stage_in", "stage_out"):
                for i, item in enumerate(getattr(bbspec, kind)):
                    fs_side = item.source if kind == "stage_in" else item.destination
                    bb_side = item.destination if kind == "stage_in" else item.source
                    fs_key = "source" if kind == "stage_in" else "destination"
                    bb_key = "destination" if kind == "stage_in" else "source"
                    if not fs_side.startswith("/"):
                        checks.spec_error(("burst_buffer", kind, i, fs_key), (
                            f"'{fs_side}' must be an absolute path on the parallel filesystem."))
                    if bb_side.startswith("/") or ".." in bb_side.split("/"):
                        checks.spec_error(("burst_buffer", kind, i, bb_key), (
                            f"'{bb_side}' is a path inside the job's burst buffer; write it "
                            "relative to the buffer (e.g. in/calib), without '..'."))
                    carried.check_dw_values([(("burst_buffer", kind, i, fs_key), fs_side),
                                             (("burst_buffer", kind, i, bb_key), bb_side)], checks.spec_error)
                    if kind == "stage_in" and bbset.stage_from and not any(
                            fs_side.startswith(pref.rstrip("/") + "/") for pref in bbset.stage_from):
                        checks.spec_error(("burst_buffer", kind, i, "source"), (
                            f"'{fs_side}' cannot be staged in at '{profile.name}': stage-in reads "
                            "only from " + ", ".join(bbset.stage_from) + "."))
            if bbspec.stage_inputs and bbset.stage_from:
                bad_inputs = [i.path for i in items if not any(
                    i.path.startswith(pref.rstrip("/") + "/") for pref in bbset.stage_from)]
                if bad_inputs:
                    checks.spec_error(("burst_buffer", "stage_inputs"), (
                        f"'{bad_inputs[0]}' (and {len(bad_inputs) - 1} more) cannot be staged in at "
                        f"'{profile.name}': stage-in reads only from " + ", ".join(bbset.stage_from)
                        + "; copy them to scratch first or set stage_inputs: false."))
            if bbspec.stage_inputs:
                blank = next((i.path for i in items if _BLANK_OR_DOLLAR.search(i.path)), None)
                if blank is not None:
                    carried.check_dw_values([(("inputs", inputs_key), blank)], checks.spec_error)
            if bbspec.stage_outputs:
                carried.check_dw_values([(("outputs", "location"), campaign.outputs.location)],
                                        checks.spec_error)
            if bbspec.capacity != "auto" and bbspec.capacity < 1:
                checks.spec_error(("burst_buffer", "capacity"), (
                    "a burst buffer of 0 bytes holds nothing; give a size or 'auto'."))

    # ---- database --------------------------------------------------------------------------
    db_plan = None
    if campaign.database is not None:
        db = campaign.database
        size = db.size
        if size is None:
            size = _dir_size(db.payload)
            if size is None:
                checks.spec_error(("database", "payload"), (
                    f"'{db.payload}' does not exist here, so its size is unknown; give "
                    "database.size."))
                size = 0
        cache_bytes = int(size * DB_CACHE_HEADROOM) + 2**30
        runtime = runtime_for(campaign.container, profile, node_cache_size=cache_bytes)
        cache_dir = runtime.node_cache_dir()
        if cache_dir is None:
            if profile.node_local is None:
                checks.profile_error(("node_local",), (
                    f"the campaign starts a database server, which needs node-local storage, but "
                    f"site profile '{profile.name}' has no node_local section."))
            else:
                if cache_bytes > profile.node_local.size:
                    checks.spec_error(("database", "size" if db.size else "payload"), (
                        f"the payload ({format_size(size)}) plus headroom needs "
                        f"{format_size(cache_bytes)} of node-local storage but "
                        f"{profile.node_local.path} at '{profile.name}' holds "
                        f"{format_size(profile.node_local.size)}."))
                cache_dir = (quote(profile.node_local.path.rstrip("/") or "/")
                             + '/hpcrun.${SLURM_JOB_ID}.${SLURMD_NODENAME}')
        else:
            shifter = profile.containers.shifter
            if shifter and shifter.per_node_cache_max and cache_bytes > shifter.per_node_cache_max:
                checks.spec_error(("database", "size" if db.size else "payload"), (
                    f"the payload ({format_size(size)}) plus headroom needs a perNodeCache of "
                    f"{format_size(cache_bytes)} but '{profile.name}' allows at most "
                    f"{format_size(shifter.per_node_cache_max)}."))
        if cache_dir is not None:
            worst = cache_dir.replace("${SLURM_JOB_ID}", "9" * 10).replace(
                "${SLURMD_NODENAME}", "n" * 16).replace("'", "")
            if len(worst) + len("/mysqld.sock") > SOCKET_MAX:
                checks.profile_error(("node_local", "path"), (
                    f"the DB socket path could reach {len(worst) + 12} characters; servers refuse "
                    f"more than {SOCKET_MAX}. Use a shorter node-local path."))
        server = db.server or ("mariadbd" if db.engine == "mariadb" else "mysqld")
        client = "mariadb" if db.engine == "mariadb" else "mysql"
        admin = "mariadb-admin" if db.engine == "mariadb" else "mysqladmin"
        db_plan = DatabasePlan(
            server=server, client=client, admin=admin, payload=db.payload, payload_bytes=size,
            cache_dir=cache_dir or "", socket=(cache_dir or "") + "/mysqld.sock",
            networking=db.networking, options=list(db.options), ready_timeout=db.ready_timeout,
            max_restarts=db.restart.max_restarts, backoff=db.restart.backoff,
            check_query=db.check_query)
    else:
        runtime = runtime_for(campaign.container, profile)

    if rt_name == "apptainer" and profile.containers.apptainer:
        drops_env = Apptainer.CLEARS_ENV
        opts = list(profile.containers.apptainer.exec_options)
        for i, opt in enumerate(opts):
            if opt in drops_env:
                checks.profile_error(("containers", "apptainer", "exec_options", i), (
                    f"'{opt}' clears the environment, but hpcrun passes each task its input, "
                    "slice and database socket through HPCRUN_* variables; remove it."))
        for i, opt in enumerate(campaign.container.options):
            if opt in drops_env:
                checks.spec_error(("container", "options", i), (
                    f"'{opt}' clears the environment, but hpcrun passes each task its input, "
                    "slice and database socket through HPCRUN_* variables; remove it."))
    # ---- what the chosen runtime can do -----------------------------------------------------
    if campaign.container.modules and not runtime.modules:
        checks.spec_error(("container", "modules"), (
            f"modules are Shifter's --module option; container runtime '{rt_name}' has none "
            "(put what the job needs into the image, or load it with software.modules)."))
    if not runtime.per_node_cache:
        for i, opt in enumerate(campaign.container.options):
            if "pernodecache" in opt.lower():
                checks.spec_error(("container", "options", i), (
                    f"a perNodeCache size only means something for Shifter; with '{rt_name}' the "
                    "database payload is copied to the profile's node_local storage, whose size "
                    "is node_local.size."))
    if rt_name == "shifter":
        shifter = profile.containers.shifter
        if runtime.node_cache_dir() is not None:
            for i, opt in enumerate(campaign.container.options):
                if "pernodecache" in opt.lower():
                    checks.spec_error(("container", "options", i), (
                        "hpcrun already gives each node a perNodeCache for the database payload, "
                        "sized from database.size (or the payload) and mounted at "
                        f"{runtime.node_cache_dir()}; a second one here would be stacked on it. "
                        "Remove this option; give database.size to change the cache's size."))
        if db_plan and shifter and not shifter.per_node_cache and profile.node_local is None:
            checks.profile_error(("containers", "shifter", "per_node_cache"), (
                "perNodeCache is off and there is no node_local storage for the payload."))

    checks.raise_if_any()

    # ---- jobs ------------------------------------------------------------------------------
    pattern = campaign.outputs.pattern
    root_var = writer.root_var(bbspec.access_mode) if (writer and bbspec) else None
    jobs: List[Job] = []
    rounded = 0
    rounding_example = ""
    too_big: List[str] = []
    too_small = ""
    width = max(5, len(str(len(items))))
    for index, start in enumerate(range(0, len(items), js.files_per_job)):
        group = tuple(items[start:start + js.files_per_job])
        in_bytes = sum(i.size for i in group)
        if js.chains_per_node == "auto":
            assert js.bytes_per_chain
            chains = max(1, min(cpus, math.ceil(in_bytes / js.bytes_per_chain)))
        else:
            chains = int(js.chains_per_node)
        outputs = tuple(ph.expand_pattern(pattern, stem=i.stem, name=os.path.basename(i.path))
                        for i in group)
        needed = capacity = None
        if writer and bbspec and pool:
            if bbspec.capacity == "auto":
                # inputs + chain parts + merged outputs (parts stay until the job ends)
                out_bytes = in_bytes * campaign.outputs.size_ratio
                needed = int(math.ceil((in_bytes + 2 * out_bytes) * bbspec.safety_factor))
            else:
                needed = int(bbspec.capacity)
                floor = _bb_floor(in_bytes, campaign.outputs.size_ratio, bbspec.stage_inputs,
                                  bbspec.stage_outputs)
                if needed < floor and not too_small:
                    too_small = (f"job {index + 1} stages and writes {format_size(floor, binary=False)} "
                                 f"in its buffer ({_bb_floor_parts(in_bytes, campaign, bbspec)})")
            needed = max(needed, 1)
            capacity = round_up(needed, pool.granularity)
            if capacity != needed:
                rounded += 1
                rounding_example = rounding_example or (
                    f"{format_size(needed, binary=False)} -> {format_capacity(capacity)}")
            limit = min(x for x in (pool.max_per_job, pool.total, 2**63) if x)
            if capacity > limit:
                too_big.append(f"job {index + 1} needs {format_capacity(capacity)}")
        jobs.append(Job(index, f"{campaign.name}.{index + 1:0{width}d}", group, outputs, chains,
                        needed, capacity, tuple(sums.values[start:start + js.files_per_job])))
    notes: List[str] = list(sums.notes)
    if rounded and pool:
        notes.append(f"burst-buffer capacity rounded up to the {format_capacity(pool.granularity)} "
                     f"granularity of pool '{pool.name}' for {rounded} job(s), e.g. {rounding_example}.")
    if too_big and pool:
        checks.spec_error(("burst_buffer", "capacity"), (
            f"{too_big[0]} ({len(too_big)} job(s) in all), more than the "
            f"{format_capacity(min(x for x in (pool.max_per_job, pool.total, 2**63) if x))} that pool "
            f"'{pool.name}' can give one job (its max_per_job and total); use fewer files_per_job or "
            "a smaller safety_factor."))
    if too_small and bbspec is not None:
        checks.spec_error(("burst_buffer", "capacity"), (
            f"capacity {format_size(int(bbspec.capacity), binary=False)} is too small: {too_small}. A job "
            "that fills its buffer fails and can leave the burst-buffer node needing repair; use "
            "capacity: auto or at least that much."))
    if js.overcommit and any(j.chains_per_node > cpus for j in jobs):
        notes.append(f"chains overcommit the {cpus} CPUs per node (jobs.overcommit: true).")
    checks.raise_if_any()

    # ---- where data lives inside the job ---------------------------------------------------
    out_loc = quote(campaign.outputs.location)
    workdir = campaign.outputs.workdir or campaign.outputs.location.rstrip("/") + "/.hpcrun-work"
    if root_var and bbspec:
        input_dir = f'"${{{root_var}%/}}"/in' if bbspec.stage_inputs else ""
        work_dir = f'"${{{root_var}%/}}"/work'
        out_dir = f'"${{{root_var}%/}}"/out' if bbspec.stage_outputs else out_loc
    else:
        input_dir, work_dir, out_dir = "", quote(workdir) + '/"${HPCRUN_JOB}"', out_loc

    runtime.binds = _binds(campaign, profile, items, db_plan, root_var, workdir)
    runtime.env_names = sorted(set(profile.prologue.env) | set(campaign.software.env)
                               | set(campaign.chain.env))
    found, rt_notes = runtime.problems()
    notes.extend(rt_notes)
    for problem in found:
        report = checks.spec_error if problem.where == "spec" else checks.profile_error
        report(problem.path, problem.message)
    checks.raise_if_any()

    # ---- scripts: arrays unless each job needs its own stage lines -----------------------
    per_job_lines = bool(writer and bbspec and bbspec.stage_inputs)
    use_arrays = js.array == "always" or (js.array == "auto" and not per_job_lines and len(jobs) > 1
                                          and profile.max_array_size > 0)
    if js.array == "always" and per_job_lines:
        checks.spec_error(("jobs", "array"), (
            "job arrays share one script, but burst_buffer.stage_inputs needs per-job #DW "
            "stage_in lines; set stage_inputs: false or array: auto."))
    if use_arrays and profile.max_array_size < 1:
        checks.spec_error(("jobs", "array"), f"site profile '{profile.name}' disables job arrays.")
    checks.raise_if_any()
    throttle = js.throttle or profile.array_throttle
    scripts: List[ScriptPlan] = []
    if use_arrays:
        size = profile.max_array_size
        nchunks = math.ceil(len(jobs) / size)
        for c in range(nchunks):
            chunk = tuple(jobs[c * size:(c + 1) * size])
            spec_array = f"0-{len(chunk) - 1}" + (f"%{throttle}" if throttle else "")
            bb_lines = _bb_lines(writer, bbspec, pool, campaign, None, root_var,
                                 max(j.bb_capacity or 0 for j in chunk))
            scripts.append(ScriptPlan(f"array{c + 1:03d}", chunk, spec_array, tuple(bb_lines)))
        if any(j.bb_capacity for j in jobs) and len({j.bb_capacity for j in jobs}) > 1:
            notes.append("array tasks share one #DW jobdw line sized for the largest task.")
    else:
        if js.throttle and len(jobs) > 1:
            notes.append(f"jobs.throttle ({js.throttle}) applies to job arrays; these {len(jobs)} "
                         "jobs have their own scripts, so Slurm's queue limits apply instead.")
        for job in jobs:
            bb_lines = _bb_lines(writer, bbspec, pool, campaign, job, root_var, job.bb_capacity or 0)
            scripts.append(ScriptPlan(f"job{job.index + 1:0{width}d}", (job,), None, tuple(bb_lines)))

    return Plan(campaign=campaign, spec_file=spec_src.file, profile=profile,
                profile_files=profile_files, partition_name=pname, partition=partition, qos=qos,
                runtime=runtime, bb=writer, pool=pool, jobs=jobs, scripts=scripts,
                database=db_plan, input_dir_expr=input_dir, work_dir_expr=work_dir,
                out_dir_expr=out_dir, notes=notes, commands=commands,
                checksum=_checksum_plan(campaign.inputs.checksum, profile))


def _bb_floor(in_bytes: int, size_ratio: float, stage_inputs: bool, stage_outputs: bool) -> int:
    """Bytes a job certainly puts into its buffer: staged inputs, chain parts, merged outputs."""
    out_bytes = in_bytes * size_ratio
    return int(math.ceil((in_bytes if stage_inputs else 0) + out_bytes * (2 if stage_outputs else 1)))


def _bb_floor_parts(in_bytes: int, campaign: Campaign, bbspec) -> str:  # type: ignore[no-untyped-def]
    out = format_size(int(in_bytes * campaign.outputs.size_ratio), binary=False)
    parts = [f"inputs {format_size(in_bytes, binary=False)}"] if bbspec.stage_inputs else []
    parts.append(f"chain parts {out}")
    if bbspec.stage_outputs:
        parts.append(f"merged outputs {out}")
    return " + ".join(parts)


def _checksum_plan(algo: str, profile: SiteProfile) -> Optional[ChecksumPlan]:
    """md5sum for md5; for adler32 the profile's xrdadler32 when it names one, else the
    plan's own bin/hpcrun-checksum.py run by the profile's Python."""
    if algo == "none":
        return None
    if algo == "md5":
        return ChecksumPlan("md5", "md5sum", "md5sum --", False,
                            "md5sum (GNU coreutils) must be on PATH on the compute nodes")
    if profile.tools.xrdadler32:
        return ChecksumPlan("adler32", profile.tools.xrdadler32, quote(profile.tools.xrdadler32),
                            False, "set tools.xrdadler32 in the site profile, or remove it to "
                            "use Python")
    python = profile.tools.python
    return ChecksumPlan("adler32", python,
                        f'{quote(python)} "$HPCRUN_PLAN_DIR/bin/hpcrun-checksum.py" adler32',
                        True, "set tools.python in the site profile")


def _binds(campaign: Campaign, profile: SiteProfile, items: List[InputItem],
           db_plan: Optional[DatabasePlan], root_var: Optional[str], workdir: str) -> List[Bind]:
    """Host paths a container needs to see (Apptainer, podman-hpc and Charliecloud bind them)."""
    plan_dir = '"${HPCRUN_PLAN_DIR}"'
    binds = [Bind(plan_dir, plan_dir, origin=("plan",))]
    if db_plan is not None:
        binds.append(Bind(quote(db_plan.payload), quote(db_plan.payload), read_only=True,
                          path=db_plan.payload, origin=("spec", "database", "payload")))
        if profile.node_local is not None and db_plan.cache_dir.startswith(quote(profile.node_local.path)):
            binds.append(Bind(quote(profile.node_local.path), quote(profile.node_local.path),
                              path=profile.node_local.path, origin=("profile", "node_local", "path")))
    bb = campaign.burst_buffer
    # the job creates these before any container starts; only bind what the job uses
    used = [] if root_var else [(workdir, "workdir" if campaign.outputs.workdir else "location")]
    if not (root_var and bb and bb.stage_outputs):
        used.append((campaign.outputs.location, "location"))
    for path, key in used:
        binds.append(Bind(quote(path), quote(path), path=path, origin=("spec", "outputs", key)))
    if root_var:
        var = f'"${{{root_var}}}"'
        binds.append(Bind(var, var, origin=("bb",)))
    if not (root_var and bb and bb.stage_inputs):
        parents = sorted({os.path.dirname(i.path) for i in items})
        if len(parents) > 20:
            parents = [os.path.commonpath(parents)]
        inputs_key = next(k for k in ("glob", "files", "list_file")
                          if getattr(campaign.inputs, k))
        binds += [Bind(quote(p), quote(p), read_only=True, path=p,
                       origin=("spec", "inputs", inputs_key)) for p in parents if p != "/"]
    seen = set()
    unique = []
    for b in binds:
        if b.source not in seen:
            seen.add(b.source)
            unique.append(b)
    return unique


def _check_finalize(checks: _Checks, commands: Dict[str, str], campaign: Campaign, partition: Partition,
                    pname: str, profile_name: str) -> None:
    """The finalize job's command and time limit (it runs on the campaign's partition)."""
    fin = campaign.finalize
    if fin is None:
        return
    _command(checks, commands, "finalize", ("finalize", "command"), fin.command, ph.FINALIZE)
    if fin.walltime is not None and fin.walltime > partition.max_walltime:
        checks.spec_error(("finalize", "walltime"), (
            f"finalize walltime {format_duration(fin.walltime)} exceeds the maximum "
            f"{format_duration(partition.max_walltime)} of partition '{pname}' (profile '{profile_name}')."))


def _command(checks: _Checks, commands: Dict[str, str], name: str, path: Tuple[str, ...],
             argv: List[str], allowed: set) -> None:
    bad = ph.check(argv, allowed)
    if bad:
        checks.spec_error(path, bad)
    else:
        commands[name] = ph.to_shell(argv)


def _bb_lines(writer: Optional[Writer], bbspec, pool: Optional[Pool], campaign: Campaign,
              job: Optional[Job], root_var: Optional[str], capacity: int) -> List[str]:
    if writer is None or bbspec is None or root_var is None:
        return []
    root = f"${root_var}/"
    stage_in = [Stage(s.source, root + s.destination, s.type) for s in bbspec.stage_in]
    stage_out = [Stage(root + s.source, s.destination, s.type) for s in bbspec.stage_out]
    if bbspec.stage_inputs and job is not None:
        stage_in = [Stage(i.path, f"{root}in/{os.path.basename(i.path)}", "file")
                    for i in job.inputs] + stage_in
    if bbspec.stage_outputs:
        stage_out = [Stage(f"{root}out", campaign.outputs.location, "directory")] + stage_out
    pool_name = bbspec.pool or (pool.name if (pool and writer.always_pool) else None)
    req = BufferRequest(capacity=capacity, access_mode=bbspec.access_mode, type=bbspec.type,
                        pool=pool_name, stage_in=stage_in, stage_out=stage_out,
                        persistent=list(bbspec.persistent), nodes=campaign.jobs.nodes)
    return writer.lines(req)
