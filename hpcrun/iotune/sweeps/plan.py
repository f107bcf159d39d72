"""Sweep + site profile -> a SweepPlan: engine, resolved targets, points and engine steps,
and for a batch job its scheduler request, burst-buffer lines and container runtime.
No text is rendered here; problems are reported together with the profile key involved.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hpcrun.backends.burstbuffer.base import BufferRequest, Writer, writer_for
from hpcrun.backends.container import Bind, Runtime, runtime_for
from hpcrun.backends.scheduler.base import JobRequest
from hpcrun.errors import HpcrunError, InputError, Problem
from hpcrun.iotune.engines import engine_for
from hpcrun.iotune.engines.base import registered
from hpcrun.iotune.points import DIR, RAW, Point, Step
from hpcrun.iotune.sweeps.presets import COMMAND_LINE, OPTIONS
from hpcrun.iotune.sweeps.sweep import Sweep
from hpcrun.model.site import Partition, SiteProfile
from hpcrun.model.yamlsrc import Located
from hpcrun.plan.job.requests import task_env
from hpcrun.shell import quote
from hpcrun.units import format_capacity, format_duration, round_up

BB_HEADROOM = 1.25
SUBDIR = "hpcrun-iotune"


@dataclass(frozen=True)
class Target:
    index: int
    name: str                  # as written in the sweep
    kind: str                  # bb | scratch | node-local | path
    path: Optional[str]        # literal parent directory (None for bb: known inside the job)
    profile_fstype: str        # from the profile's filesystems / node_local, or "burst-buffer"


@dataclass
class SweepPlan:
    sweep: Sweep
    profile: SiteProfile
    profile_files: List[Path]
    local: bool
    engine: str                          # fio | ior
    engine_bin: str
    targets: List[Target]
    points: List[Point]
    steps: List[Step]
    darshan_lib: Optional[str] = None
    partition_name: str = ""
    partition: Optional[Partition] = None
    runtime: Optional[Runtime] = None
    bb: Optional[Writer] = None
    bb_capacity: int = 0
    bb_lines: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def target_of(self, point: Point) -> Target:
        return next(t for t in self.targets if t.name == point.target)

    def steps_of(self, point: Point) -> List[Step]:
        return [s for s in self.steps if s.point == point.id]


class _Problems:
    def __init__(self, sweep_src: Located, profile_src: Located):
        self.sweep_src, self.profile_src = sweep_src, profile_src
        self.items: List[Problem] = []

    def sweep(self, key: str, message: str) -> None:
        file, line = self.sweep_src.where((key,))
        shown = OPTIONS.get(key, key) if file == COMMAND_LINE else key
        self.items.append(Problem(file, line, shown, message))

    def profile(self, path: Tuple[str, ...], message: str) -> None:
        file, line = self.profile_src.where(path)
        self.items.append(Problem(file, line, ".".join(path), message))

    def raise_if_any(self) -> None:
        if self.items:
            raise InputError(self.items)


def choose_engine(sweep: Sweep, profile: SiteProfile) -> Tuple[str, str]:
    """The named engine, or for ``--engine auto`` the first registered one present here
    (IOR when the profile names it or it is on PATH, else fio)."""
    if sweep.engine != "auto":
        chosen = engine_for(sweep.engine)
    else:
        chosen = next(e for e in registered().values() if e.present(profile))
    return chosen.name, chosen.binary(profile)


def _fstype(profile: SiteProfile, path: str) -> str:
    """The type the profile gives the longest filesystem/node-local prefix of ``path``."""
    found: List[Tuple[str, str]] = [(fs.path, fs.type) for fs in profile.filesystems.values()]
    if profile.node_local:
        found.append((profile.node_local.path, profile.node_local.type))
    best, kind = -1, "unknown"
    for root, fstype in found:
        root = root.rstrip("/")
        if (path.rstrip("/") == root or path.startswith(root + "/")) and len(root) > best:
            best, kind = len(root), fstype
    return kind


def _targets(sweep: Sweep, profile: SiteProfile, local: bool, engine: str,
             checks: _Problems) -> List[Target]:
    out: List[Target] = []
    for i, name in enumerate(sweep.targets):
        if name == "bb":
            if local:
                checks.sweep("targets", "the burst buffer exists only inside a batch job; drop --local "
                             "(render a job with --out DIR) or choose another target")
            elif profile.burst_buffer.system == "none":
                checks.profile(("burst_buffer", "system"), (
                    f"the sweep has a 'bb' target but site profile '{profile.name}' has no burst "
                    "buffer (system: none); remove the bb target or choose a site with one"))
            out.append(Target(i, name, "bb", None, "burst-buffer"))
            continue
        if name == "scratch":
            path = profile.iotune.scratch or (profile.filesystems["scratch"].path
                                              if "scratch" in profile.filesystems else None)
            if path is None:
                checks.profile(("iotune", "scratch"), (
                    f"the sweep has a 'scratch' target but site profile '{profile.name}' sets neither "
                    "iotune.scratch nor filesystems.scratch; add one or give the target as a path"))
                continue
            kind = "scratch"
        elif name == "node-local":
            path = profile.iotune.node_local or (profile.node_local.path if profile.node_local else None)
            if path is None:
                checks.profile(("iotune", "node_local"), (
                    f"the sweep has a 'node-local' target but site profile '{profile.name}' sets neither "
                    "iotune.node_local nor node_local.path; add one or give the target as a path"))
                continue
            kind = "node-local"
        else:
            path, kind = name, "path"
        why = engine_for(engine).path_problem(path)
        if why:
            checks.sweep("targets", f"{why}; choose a path without it")
        out.append(Target(i, name, kind, path, _fstype(profile, path)))
    return out


def _points(sweep: Sweep) -> List[Point]:
    points = []
    combos = itertools.product(sweep.targets, sweep.apis, sweep.nodes, sweep.writers, sweep.blocks(),
                               sorted(sweep.transfer_sizes))
    for n, (target, api, nodes, writers, block, transfer) in enumerate(combos, 1):
        points.append(Point(f"p{n:04d}", target, api, nodes, writers, transfer, block, sweep.layout))
    return points


def _darshan_env(lib: str, step_name: str, mpi: bool) -> Tuple[Tuple[Tuple[str, str], ...], str]:
    """LD_PRELOAD and where the log goes: one exact file for an MPI run (written at
    MPI_Finalize), a directory per step for fio's several non-MPI processes."""
    if mpi:
        log = f"darshan/{step_name}.darshan"
        return (("LD_PRELOAD", lib), ("DARSHAN_LOGFILE", f"{RAW}/{log}")), log
    log = f"darshan/{step_name}"
    return (("LD_PRELOAD", lib), ("DARSHAN_ENABLE_NONMPI", "1"), ("DARSHAN_LOGPATH", f"{RAW}/{log}")), log


def _steps(sweep: Sweep, points: List[Point], engine: str, engine_bin: str,
           darshan_lib: Optional[str]) -> List[Step]:
    runner = engine_for(engine)
    darshan = (lambda name, mpi: _darshan_env(darshan_lib, name, mpi)) if darshan_lib else None
    return [step for p in points for step in runner.steps(sweep, p, engine_bin, darshan)]


def plan_sweep(sweep: Sweep, sweep_src: Located, profile: SiteProfile, profile_src: Located,
               profile_files: List[Path], local: bool) -> SweepPlan:
    checks = _Problems(sweep_src, profile_src)
    engine, engine_bin = choose_engine(sweep, profile)
    try:
        engine_for(engine).check_sweep(sweep)
    except ValueError as exc:
        passed = [e.absent for e in registered().values() if e.name != engine and e.absent]
        why = "" if sweep.engine == engine else f" (the engine is {engine} because {'; '.join(passed)})"
        checks.sweep("apis" if sweep.apis != ["posix"] else "nodes", f"{exc}{why}")
    darshan_lib = None
    if sweep.darshan:
        darshan_lib = profile.tools.darshan_lib
        if darshan_lib is None:
            checks.profile(("tools", "darshan_lib"), (
                f"--darshan needs the Darshan runtime library, but site profile '{profile.name}' has no "
                "tools.darshan_lib (e.g. /opt/darshan/lib/libdarshan.so)"))
        elif local and not Path(darshan_lib).is_file():
            checks.profile(("tools", "darshan_lib"), (
                f"the Darshan library '{darshan_lib}' does not exist on this node; install Darshan or "
                "fix tools.darshan_lib"))
    if local:
        if sweep.container.runtime != "none":
            checks.sweep("container", "--local runs on this node without a container; containers are "
                         "for the batch job (drop --local)")
        if max(sweep.nodes) > 1:
            checks.sweep("nodes", "--local runs on this node only; use nodes: [1] or a batch job")
    targets = _targets(sweep, profile, local, engine, checks)
    checks.raise_if_any()
    points = _points(sweep)
    try:
        steps = _steps(sweep, points, engine, engine_bin, darshan_lib)
    except (ValueError, HpcrunError) as exc:    # the IOR grammar check refuses a combination
        checks.sweep("engine", f"IOR cannot run this sweep: {exc}")
        checks.raise_if_any()
        raise
    plan = SweepPlan(sweep, profile, profile_files, local, engine, engine_bin, targets, points, steps,
                     darshan_lib)
    if not local:
        _batch(plan, checks)
    return plan


def _batch(plan: SweepPlan, checks: _Problems) -> None:
    sweep, profile = plan.sweep, plan.profile
    pname = sweep.partition or profile.default_partition
    partition = profile.partitions.get(pname)
    if partition is None:
        checks.sweep("partition", f"partition '{pname}' is not in site profile '{profile.name}'; valid: "
                     + ", ".join(sorted(profile.partitions)))
        checks.raise_if_any()
    assert partition is not None
    plan.partition_name, plan.partition = pname, partition
    if sweep.walltime > partition.max_walltime:
        checks.sweep("walltime", f"{format_duration(sweep.walltime)} exceeds the maximum "
                     f"{format_duration(partition.max_walltime)} of partition '{pname}'")
    max_nodes = min(partition.nodes, partition.max_nodes_per_job or partition.nodes)
    if max(sweep.nodes) > max_nodes:
        checks.sweep("nodes", f"{max(sweep.nodes)} nodes, but partition '{pname}' allows at most {max_nodes}")
    offered = profile.containers.offered()
    if sweep.container.runtime not in offered:
        checks.sweep("container", f"site profile '{profile.name}' does not offer container runtime "
                     f"'{sweep.container.runtime}'; it offers: {', '.join(offered)}")
        checks.raise_if_any()
    plan.runtime = runtime_for(sweep.container, profile, **task_env(profile))
    binds = [Bind('"${HPCRUN_IOTUNE_OUT}"', '"${HPCRUN_IOTUNE_OUT}"')]
    for t in plan.targets:
        if t.path is not None:
            binds.append(Bind(quote(t.path), quote(t.path)))
    if plan.darshan_lib:
        binds.append(Bind(quote(plan.darshan_lib), quote(plan.darshan_lib), read_only=True))
    bb_points = [p for p in plan.points if p.target == "bb"]
    if bb_points and profile.burst_buffer.system != "none":
        bbset = profile.burst_buffer
        writer = writer_for(bbset.system, bbset.directive, bbset.pool_required)
        pool = bbset.pool(None)
        assert writer is not None and pool is not None
        need = max(1, math.ceil(max(p.bytes_written for p in bb_points) * BB_HEADROOM))
        capacity = round_up(need, pool.granularity)
        limit = min(x for x in (pool.max_per_job, pool.total, 2**63) if x)
        if capacity > limit:
            checks.sweep("block_sizes", f"the largest burst-buffer point writes more than pool '{pool.name}' "
                         f"gives one job ({format_capacity(capacity)} needed, {format_capacity(limit)} "
                         "allowed); use smaller blocks or fewer writers")
        plan.bb, plan.bb_capacity = writer, capacity
        plan.bb_lines = writer.lines(BufferRequest(
            capacity=capacity, access_mode="striped", type="scratch",
            pool=pool.name if writer.always_pool else None))
    if plan.bb is not None:
        var = f'"${{{plan.bb.root_var("striped")}}}"'
        binds.append(Bind(var, var))
    plan.runtime.binds = binds
    checks.raise_if_any()


def job_request(plan: SweepPlan, out_dir: str) -> JobRequest:
    """What the sweep job asks of the scheduler: the most nodes and writers of any point."""
    sweep, part = plan.sweep, plan.partition
    assert part is not None and plan.runtime is not None
    return JobRequest(
        name="iotune-" + sweep.name, nodes=max(sweep.nodes), walltime_s=sweep.walltime, signal_before_s=0,
        log_dir=out_dir + "/logs", comment="hpcrun:iotune:" + sweep.name, exclusive=part.exclusive,
        tasks_per_node=None if part.exclusive else min(max(sweep.writers), part.cpus),
        partition=part.slurm_partition, qos=part.default_qos, constraint=part.constraint,
        runtime_options=tuple(plan.runtime.directive_options()))


def target_root_expr(plan: SweepPlan, target: Target) -> str:
    """Shell text for the existing directory a target writes under (the job checks it)."""
    if target.kind == "bb":
        assert plan.bb is not None
        return f'"${{{plan.bb.root_var("striped")}%/}}"'
    assert target.path is not None
    return quote(target.path.rstrip("/") or "/")


def target_dir_expr(plan: SweepPlan, target: Target) -> str:
    """Shell text for the directory a batch job writes in for this target (made and removed by it)."""
    if target.kind == "bb":
        return target_root_expr(plan, target) + f"/{SUBDIR}"
    return target_root_expr(plan, target) + f'/{SUBDIR}."${{HPCRUN_JOB_ID:-$$}}"'


def placeholders() -> Dict[str, str]:
    return {DIR: "POINT_DIR", RAW: "RAW"}
