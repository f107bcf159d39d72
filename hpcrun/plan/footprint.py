"""The campaign's footprint on the site's filesystems, forecast at plan time and held against the quotas.

Sites count files as well as bytes: NERSC's scratch allows 20 TB and 10 M inodes per user, the Alliance's
scratch 1 M files. A campaign of 10^6 inputs can use up either before anyone reads its outputs, so ``hpcrun
plan`` says what the campaign will hold on each filesystem it writes to (the plan directory and the outputs
location), at its peak and at its end, part by part; it notes a campaign that needs more than half of a
profile quota (``filesystems.<name>.quota``) and refuses one that exceeds it, before anything is written.

The figures are a model of what a campaign leaves once each successful input's run directory, Slurm log and
work directory are folded away (issue 56). Its constants are named below, one comment each, so that they can
be tuned against what benchmarks/footprint.py counts on the test cluster. A failed input keeps its whole run
directory, so each failure adds RUN_DIR_ENTRIES to the end figures. ``evaluated`` is the model for given
counts: the forecast gives it everything done; status and the live page the store's counts so far
(operate/tracking/footprint.py), so what they show and what plan said are the same model.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple

from hpcrun.errors import InputError, Problem
from hpcrun.plan.values import FilesystemUse, Footprint, PartUse, Plan, inputs_in
from hpcrun.units import format_bytes, format_count

if TYPE_CHECKING:   # names for types alone (the supervisor's forecast loads no model)
    from hpcrun.model.site import SiteProfile
    from hpcrun.model.yamlsrc import Located

# --- entries (files and directories) -----------------------------------------------------------------------
# a running job's (late binding: claim's) run directory, run/<job>/ itself included: inputs.tsv, outputs.tsv,
# checksums, exit_code, chains.tsv, chains/ with each chain's rc, log and timeline, launch.log ...
RUN_DIR_ENTRIES = 12
# array mode: a running array task's Slurm log in logs/ (folded away once its job is recorded)
ARRAY_LOG_ENTRIES = 1
# array mode: a running job's work directory <outputs.workdir>/<job>/ (gone once its job is recorded)
WORK_DIR_ENTRIES = 1
# what stays of every successful job (or claim) once folded: a segment and its index for the supervisor, one
# pair more for a status, submit or retry process that recorded an end (folding.py)
FOLDED_FILES = 4
# the outputs location's own directory .hpcrun-work/ (chain parts before the merge)
OUTPUT_DIRS = 1
# late binding: .hpcrun-claims/ beside it (each claim's private output directory)
LATE_OUTPUT_DIRS = 1
# late binding: a running claim's work directory <outputs.workdir>/<job>/<claim>/ (two levels)
CLAIM_WORK_ENTRIES = 2
# late binding: a running claim's private output directory .hpcrun-claims/<claim>/
CLAIM_OUT_ENTRIES = 1
# late binding: a pilot's journal of its commits (queue/results/<pilot>) and the supervisor's ledger of them
# (queue/folded/<pilot>@...): a commit's queue/done/<task> is folded into it by the poll that records it
PER_PILOT_QUEUE_ENTRIES = 2
# late binding: queue/ and its fixed directories (backlog, ready, live, done, folded, arrays, staging ...)
QUEUE_DIRS = 17
# late binding: a pilot's own entries: its Slurm log, run/pilots/<pilot>/ with claims/, agent.tsv, pilot.tsv,
# db/ ... (its claims' run directories are folded into run/folded/ as an array job's are)
PER_PILOT_ENTRIES = 12
# of those, the pilot's Slurm log (shown as a log, the rest as run records)
PILOT_LOG_ENTRIES = 1
# late binding: a pilot's claim log per slot
PER_SLOT_ENTRIES = 1
# outputs.provenance: sidecar: <output>.prov.json beside each output
SIDECAR_ENTRIES = 1
# the plan directory: manifest.json, tasks.tsv, tasks.idx, jobs/, bin/, logs/, run/, bin/hpcrun-chain.sh
PLAN_DIR_ENTRIES = 8
# late binding: bin/hpcrun-pilot.sh, the agent bin/hpcrun-pilot.py and its three modules (the direct worker's too)
PILOT_FILES = 5
# a campaign on several clusters: clusters/ (once), then per other cluster clusters/<name>/, its jobs/, bin/ and
# bin/hpcrun-chain.sh
CLUSTERS_DIR = 1
CLUSTER_DIR_ENTRIES = 4
# the state store in the plan directory once submitted: state.db and its lock files
STORE_FILES = 3
# render/headers.py's SCRIPT_FILES_MAX: above this many jobs (jobs.script_files: auto), per-job or array scripts
# are rendered at submission from a template and its table (two files) instead of one file each
SCRIPTS_AS_FILES_MAX = 1000

# --- bytes (estimates: docs/operations.md says so) ------------------------------------------------------------
# the logs and run records an input leaves (its Slurm or claim log, chain logs, timelines, record), folded or not
LOG_BYTES_PER_INPUT = 16 * 1024
# a provenance sidecar <output>.prov.json
SIDECAR_BYTES = 2 * 1024
# late binding: a task's queue records
QUEUE_BYTES_PER_INPUT = 256
# the plan directory's manifest head and helpers
PLAN_DIR_BYTES = 48 * 1024
# late binding: the pilot's script, agent and modules
PILOT_BYTES = 64 * 1024
# an array script (the whole job), and a per-job script (a header running the shared body)
ARRAY_SCRIPT_BYTES = 16 * 1024
JOB_SCRIPT_BYTES = 2 * 1024
# an input's line in the manifest, tasks.tsv and tasks.idx
PLAN_BYTES_PER_INPUT = 256
# an input's rows in the state store (state.db)
STORE_BYTES_PER_INPUT = 2 * 1024

PARTS = ("outputs", "logs", "run records", "queue", "plan directory")
HALF = 0.5   # a campaign that needs more than this share of a quota gets a note


class _Use(NamedTuple):
    """What one part leaves under one path: entries and bytes at the peak and at the end."""

    path: str
    part: str
    peak_files: int
    peak_bytes: int
    end_files: int
    end_bytes: int


def quota_lines(profile: SiteProfile, src: Located) -> Dict[str, Tuple[str, Optional[int]]]:
    """Where the profile (or the layer of it that says so) sets each quota, for a refusal to point at."""
    out: Dict[str, Tuple[str, Optional[int]]] = {}
    for name, fs in profile.filesystems.items():
        for kind in ("files", "bytes"):
            if fs.quota is not None and getattr(fs.quota, kind) is not None:
                out[f"filesystems.{name}.quota.{kind}"] = src.where(("filesystems", name, "quota", kind))
    return out


def filesystem_of(profile: SiteProfile, path: str) -> Optional[str]:
    """The profile's filesystem holding ``path``: the one whose mount point is the longest prefix of it, both
    with their symbolic links resolved as far as they exist."""
    path = os.path.realpath(path)   # a link into scratch from home is on scratch
    best: Optional[str] = None
    longest = -1
    for name, fs in profile.filesystems.items():
        mount = os.path.realpath(fs.path)
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > longest:
            best, longest = name, len(mount)
    return best


def running_at_once(plan: Plan) -> int:
    """Jobs (late binding: claims) running at once at the peak, on all the campaign's clusters together: each
    array's throttle (%N), the pilots' slots, the site's cap on queued jobs and the partition's room."""
    return max(0, min(len(plan.jobs), sum(_running_on(p) for p in plan.all_clusters)))


def _running_on(p: Plan) -> int:
    caps = [c for c in (p.profile.max_queued_jobs, p.seat.max_queued_jobs) if c]
    if p.pilots is not None:
        return min([p.pilots.max_pilots, p.pilot_count, p.capacity_jobs, *caps]) * p.pilots.slots
    throttle = p.campaign.jobs.throttle or p.profile.array_throttle
    at_once = sum(min(throttle, len(s.jobs)) if s.array and throttle else len(s.jobs) for s in p.scripts)
    return min([at_once, p.capacity_jobs, *caps])


def forecast(plan: Plan, plan_dir: str) -> Footprint:
    """What the campaign holds on each filesystem it writes to, at its peak and at its end."""
    running = running_at_once(plan)
    return Footprint(_grouped(plan.profile, _uses(plan, plan_dir, running)), running)


class Shape(NamedTuple):
    """What the model needs of a plan: the Plan's at plan time, the manifest's when status asks."""

    late: bool          # late binding: pilots and a queue
    slots: int          # late binding: each pilot's slots
    sidecar: bool       # outputs.provenance: sidecar
    work_on_fs: bool    # chain parts are written on the filesystem (not in a burst buffer)


class Counts(NamedTuple):
    """What the campaign has made: at plan time, everything (at its peak with the most runs in flight, at its
    end with none); in status, what the store has recorded so far."""

    succeeded: int          # inputs done: their outputs, their run directories and logs folded away
    failed: int             # runs failed: each keeps its run directory (array mode: and its Slurm log)
    running: int            # runs in flight: a run directory, a work directory (and a log) each
    pilots: int             # late binding: pilots started
    tasks: int              # late binding: tasks done (their results folded into the queue's ledgers)
    output_bytes: int       # the outputs' bytes
    folded_bytes: Optional[int] = None   # the folded runs' bytes where known (else LOG_BYTES_PER_INPUT each)


# where a part is written: the outputs location, the running jobs' work directories, the plan directory
OUTPUTS_AT, WORK_AT, PLAN_AT = "outputs location", "work directory", "plan directory"


def shape_of(plan: Plan) -> Shape:
    """The model's view of a plan (status reads the same from the manifest: operate/tracking/footprint.py)."""
    p = plan.pilots
    return Shape(p is not None, p.slots if p is not None else 0, plan.campaign.outputs.provenance == "sidecar",
                 plan.bb_system is None)


def evaluated(shape: Shape, n: Counts) -> List[Tuple[str, str, int, int]]:
    """The model for these counts: (where, part, entries, bytes) for the outputs, logs, run records and queue,
    the same parts in the same order whatever the counts (the plan directory's own files are the plan's)."""
    sidecars = n.succeeded * SIDECAR_ENTRIES if shape.sidecar else 0
    dirs = OUTPUT_DIRS + (LATE_OUTPUT_DIRS + n.running * CLAIM_OUT_ENTRIES if shape.late else 0)
    made = [(OUTPUTS_AT, "outputs", n.succeeded + sidecars + dirs, n.output_bytes + sidecars * SIDECAR_BYTES)]
    if shape.work_on_fs:
        made.append((WORK_AT, "outputs", n.running * (CLAIM_WORK_ENTRIES if shape.late else WORK_DIR_ENTRIES), 0))
    folded = n.succeeded * LOG_BYTES_PER_INPUT if n.folded_bytes is None else n.folded_bytes
    log_bytes = folded + n.failed * LOG_BYTES_PER_INPUT
    run_dirs = (n.running + n.failed) * RUN_DIR_ENTRIES
    if not shape.late:
        return made + [(PLAN_AT, "logs", (n.running + n.failed) * ARRAY_LOG_ENTRIES, log_bytes),
                       (PLAN_AT, "run records", run_dirs + FOLDED_FILES, 0)]
    logs = n.pilots * (PILOT_LOG_ENTRIES + shape.slots * PER_SLOT_ENTRIES)   # a failed claim's log is its slot's
    records = n.pilots * (PER_PILOT_ENTRIES - PILOT_LOG_ENTRIES)
    queue = n.pilots * PER_PILOT_QUEUE_ENTRIES + QUEUE_DIRS
    return made + [(PLAN_AT, "logs", logs, log_bytes), (PLAN_AT, "run records", records + run_dirs + FOLDED_FILES, 0),
                   (PLAN_AT, "queue", queue, n.tasks * QUEUE_BYTES_PER_INPUT)]


def _uses(plan: Plan, plan_dir: str, running: int) -> List[_Use]:
    """Every part under the path it is written to (the plan: the first cluster's, holding the others)."""
    inputs = inputs_in(plan.jobs)   # once: a pass over 10^6 jobs
    out = plan.campaign.outputs
    at = {OUTPUTS_AT: out.location, WORK_AT: out.workdir or out.location.rstrip("/") + "/.hpcrun-work",
          PLAN_AT: plan_dir}
    whole = Counts(inputs, 0, running, plan.pilot_count, len(plan.jobs), plan.output_bytes)
    shape = shape_of(plan)
    peak, end = evaluated(shape, whole), evaluated(shape, whole._replace(running=0))
    return [_Use(at[where], part, pf, pb, ef, eb) for (where, part, pf, pb), (_, _, ef, eb) in zip(peak, end)] + [
        _plan_dir(plan, plan_dir, inputs)]


def _plan_dir(plan: Plan, plan_dir: str, inputs: int) -> _Use:
    """What ``hpcrun plan`` writes (every cluster's scripts and helpers) and the state store beside it."""
    files = PLAN_DIR_ENTRIES + STORE_FILES + (CLUSTERS_DIR if plan.others else 0)
    size = PLAN_DIR_BYTES + inputs * (PLAN_BYTES_PER_INPUT + STORE_BYTES_PER_INPUT)
    for p in plan.all_clusters:
        scripts, script_bytes = _scripts(p)
        files += scripts + (CLUSTER_DIR_ENTRIES if p is not plan else 0) + (1 if p.database else 0)
        size += script_bytes
        if p.pilots is not None:
            files, size = files + PILOT_FILES, size + PILOT_BYTES
    helpers = [plan.campaign.finalize is not None, plan.hdf5_helper,
               plan.checksum is not None and plan.checksum.helper]
    files += sum(helpers)
    return _Use(plan_dir, "plan directory", files, size, files, size)


def _scripts(p: Plan) -> Tuple[int, int]:
    """A cluster's job scripts as files, and their bytes: one file per script, or a template and its table where
    they are rendered at submission; per-job scripts share a body (bin/hpcrun-job.sh)."""
    scripts = p.scripts
    mode = p.campaign.jobs.script_files
    kinds = {s.array is None for s in scripts}
    body = 1 if True in kinds else 0
    as_files = not scripts or mode == "always" or len(kinds) > 1 or (
        mode == "auto" and len(p.jobs) <= SCRIPTS_AS_FILES_MAX)
    each = JOB_SCRIPT_BYTES if True in kinds else ARRAY_SCRIPT_BYTES
    if as_files:
        return body + len(scripts), body * ARRAY_SCRIPT_BYTES + len(scripts) * each
    return body + 2, (body + 1) * ARRAY_SCRIPT_BYTES + len(p.jobs) * PLAN_BYTES_PER_INPUT


def _grouped(profile: SiteProfile, uses: List[_Use]) -> Tuple[FilesystemUse, ...]:
    """The uses summed per filesystem of the profile (a path under none: per path, a path under another one
    of those joining it), each part once."""
    groups: Dict[Tuple[Optional[str], str], Dict[str, List[int]]] = {}
    for u in uses:
        name = filesystem_of(profile, u.path)
        key = (name, profile.filesystems[name].path) if name is not None else (None, _undeclared(groups, u.path))
        figures = groups.setdefault(key, {}).setdefault(u.part, [0, 0, 0, 0])
        for i, value in enumerate((u.peak_files, u.peak_bytes, u.end_files, u.end_bytes)):
            figures[i] += value
    out = []
    for (name, path), parts in groups.items():
        fs = profile.filesystems[name] if name is not None else None
        quota = fs.quota if fs is not None else None
        out.append(FilesystemUse(
            name, path, fs.type if fs is not None else None,
            tuple(PartUse(part, *parts[part]) for part in PARTS if part in parts and any(parts[part])),
            quota.files if quota is not None else None, quota.bytes if quota is not None else None))
    return tuple(out)


def _undeclared(groups: Dict[Tuple[Optional[str], str], Dict[str, List[int]]], path: str) -> str:
    """A path under no declared filesystem joins an earlier such path it lies under (a work directory under
    the outputs location), else stands for itself."""
    path = os.path.normpath(path)
    for name, known in groups:
        if name is None and (path == known or path.startswith(known.rstrip("/") + "/")):
            return known
    return path


def figures_text(files: int, nbytes: int) -> str:
    """``2.1 M files, 3.4 TB``: counts and bytes in the units sites give quotas in."""
    return f"{format_count(files)} files, {format_bytes(nbytes)}"


def where_text(use: FilesystemUse) -> str:
    """The filesystem as operators know it: its mount point and the profile's name for it."""
    return f"{use.path} ({use.name})" if use.name is not None else f"{use.path} (under no filesystem of the profile)"


def line(use: FilesystemUse) -> str:
    """One filesystem's forecast for the plan's summary: peak, end and the quota."""
    text = f"peak {figures_text(*use.peak)}; end {figures_text(*use.end)}"
    if use.name is None:
        return text + "; no quota known"
    quota = [_amount(kind, v) for kind, v in (("files", use.quota_files), ("bytes", use.quota_bytes)) if v]
    return text + ("; quota " + ", ".join(quota) if quota else "; no quota in the profile")


def _amount(kind: str, n: int) -> str:
    return f"{format_count(n)} files" if kind == "files" else format_bytes(n)


def findings(plan: Plan, fp: Footprint) -> Tuple[List[str], List[Problem]]:
    """A note for each quota the campaign needs more than half of, a problem for each it exceeds."""
    notes: List[str] = []
    problems: List[Problem] = []
    for use in fp.filesystems:
        for kind, limit, peak, end in (("files", use.quota_files, use.peak[0], use.end[0]),
                                       ("bytes", use.quota_bytes, use.peak[1], use.end[1])):
            if use.name is None or not limit or peak <= limit * HALF:
                continue
            key = f"filesystems.{use.name}.quota.{kind}"
            if peak <= limit:
                notes.append(f"the campaign needs more than half of the {kind} quota on {where_text(use)}: "
                             f"{_amount(kind, peak)} at its peak ({_amount(kind, end)} at its end) of "
                             f"{_amount(kind, limit)} ({key}); your other {kind} there count against it too")
                continue
            file, line_no = plan.quota_lines.get(key, (str(plan.profile_files[0]) if plan.profile_files
                                                       else plan.profile.name, None))
            problems.append(Problem(file, line_no, key, (
                f"the campaign cannot fit on {where_text(use)}: the plan's forecast is {_amount(kind, peak)} there "
                f"at its peak ({_parts_text(use, kind)}) and {_amount(kind, end)} at its end, more than the quota "
                f"of {_amount(kind, limit)}. Plan fewer inputs per campaign or generation, put more inputs in each "
                "job (jobs.files_per_job: fewer logs and run records), or write the outputs (outputs.location) and "
                "the plan directory (--out) to a filesystem with room")))
    return notes, problems


def _parts_text(use: FilesystemUse, kind: str) -> str:
    """Where the figure comes from, part by part (the parts that hold any)."""
    shown = [(p.part, p.peak_files if kind == "files" else p.peak_bytes) for p in use.parts]
    return ", ".join(f"{part} {_amount(kind, n).removesuffix(' files')}" for part, n in shown if n)


def assessed(plan: Plan, plan_dir: str, refuse: bool = True) -> Plan:
    """The plan with its footprint on every cluster's filesystems and a note for each quota it nears; an
    InputError (exit 2) for each quota it exceeds, unless ``refuse`` is false (a summary of a plan written)."""
    if plan.footprint is not None:
        return plan
    running = running_at_once(plan)
    uses = _uses(plan, plan_dir, running)
    made: List[Plan] = []
    notes: List[str] = []
    problems: List[Problem] = []
    for p in plan.all_clusters:   # the same paths, seen through each cluster's profile and its quotas
        fp = Footprint(_grouped(p.profile, uses), running)
        found_notes, found = findings(p, fp)
        notes += found_notes
        problems += found
        made.append(replace(p, footprint=fp))
    if problems and refuse:
        raise InputError(problems)
    first = made[0]
    added = tuple(n for n in dict.fromkeys(notes) if n not in first.notes)
    return replace(first, others=tuple(made[1:]), notes=first.notes + added)
