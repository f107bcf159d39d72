"""Renderers: a Plan becomes text (job scripts, helper scripts, tasks table, manifest).

Jinja2 runs with StrictUndefined, so a misspelt variable in a template is an
error, never an empty string. Quoting is the default (``finalize``): every ``{{ value }}``
is written as one single-quoted shell word unless Python built it as :class:`Shell`
text (quoted words, vetted directive lines, one-line comments). Template fragments
(the macros of ``_shell.j2``) are inserted with ``{% call %}``, which is not quoted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import jinja2

from hpcrun import __version__
from hpcrun.backends.scheduler import JobRequest, scheduler_for
from hpcrun.model.retry import KILL_SIGNALS, effective_rules
from hpcrun.plan.commands import HDF5_HELPER
from hpcrun.plan.requests import finalize_name
from hpcrun.plan.values import Plan, ScriptPlan
from hpcrun.resources import site_template_dirs
from hpcrun.shell import Shell, comment, finalize, join, quote
from hpcrun.units import format_capacity


@dataclass(frozen=True)
class RenderedFile:
    path: str        # relative to the plan directory
    text: str
    executable: bool = False


def environment(search: Iterable[Path]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(p) for p in search]),
        undefined=jinja2.StrictUndefined, autoescape=False, trim_blocks=True,
        lstrip_blocks=True, keep_trailing_newline=True, auto_reload=False,
        # bash's ${#array[@]} would open a Jinja comment; use {## ... ##} for comments.
        comment_start_string="{##", comment_end_string="##}", finalize=finalize)
    env.filters["q"] = _q
    env.filters["comment"] = comment
    return env


def _q(value: object) -> Shell:
    """The explicit quoting filter of older site templates; quoting is now the default."""
    return value if isinstance(value, Shell) else quote(value)


def template_dirs(plan: Plan) -> List[Path]:
    """Site overrides first: a templates/ directory beside each profile file (child first)."""
    return site_template_dirs(list(plan.profile_files))


def scheduler_context(scheduler: str, request: Optional[JobRequest], array: bool = False) -> Dict[str, Any]:
    """A job's directive lines and identity lines in its scheduler's words (plus the names
    older site templates used for the options)."""
    assert request is not None
    sched = scheduler_for(scheduler)
    options = [Shell(o) for o in sched.options(request)]
    return {"directives": [Shell(f"{sched.directive} {o}") for o in options],
            "job_identity": [Shell(line) for line in sched.job_identity(array)], **sched.template_context(options)}


def _absolute_logs(request: Optional[JobRequest], plan_dir: str) -> Optional[JobRequest]:
    return None if request is None else request.but(log_dir=f"{plan_dir}/{request.log_dir}")


def _database_context(plan: Plan) -> Optional[Dict[str, Any]]:
    db = plan.database
    if db is None:
        return None
    return {
        "server": db.server, "client": db.client, "admin": db.admin, "payload": db.payload,
        "cache_dir": Shell(db.cache_dir), "networking": db.networking,
        "leading_options": Shell(db.leading_option), "options": join(db.options),
        "ready_timeout": db.ready_timeout, "max_restarts": db.max_restarts,
        "backoff": db.backoff, "check_query": db.check_query, "port_base": db.port_base,
        "host": db.host, "remove_cache": db.remove_cache, "wait_seconds": db.wait_seconds,
        "account": db.account, "account_sql": list(db.account_sql),
    }


def _shell_or_none(text: Optional[str]) -> Optional[Shell]:
    return None if text is None else Shell(text)


def node_key(campaign: str, plan_dir: str) -> str:
    """The short name of a campaign's node-local directories (hpcrun.<key>.*): a job reclaims
    leftovers with this key only, never another campaign's or a different plan's."""
    return hashlib.sha256(f"{campaign}\n{plan_dir}".encode()).hexdigest()[:10]


def common_context(plan: Plan, plan_dir: str) -> Dict[str, Any]:
    c = plan.campaign
    env: List[Tuple[str, str]] = sorted(plan.profile.prologue.env.items()) + sorted(c.software.env.items())
    tuned = plan.profile.iotune.recommended
    if tuned is not None:   # written by `hpcrun iotune --apply`; programs may read it
        env += [("HPCRUN_IO_TRANSFER_SIZE", str(tuned.transfer_size)),
                ("HPCRUN_IO_WRITERS_PER_NODE", str(tuned.writers_per_node))]
    modules = list(plan.profile.prologue.modules) + list(c.software.modules)
    qa = None
    if c.qa:
        qa = {"count_command": _shell_or_none(plan.commands.get("count_events")),
              "command": _shell_or_none(plan.commands.get("qa")),
              "hdf5_command": _shell_or_none(plan.commands.get("qa_hdf5")),
              "min_fraction": repr(c.qa.min_event_fraction)}
    sched = scheduler_for(plan.scheduler)
    prefix = plan.container.prefix
    return {
        "chain_env": sorted(c.chain.env.items()),
        "version": __version__, "campaign": c.name, "spec_file": comment(plan.spec_file),
        "profile_name": plan.profile.name, "plan_dir": plan_dir, "node_key": node_key(c.name, plan_dir),
        "release": c.software.release or "", "env": env, "modules": modules,
        "database": _database_context(plan), "merge": plan.commands.get("merge") is not None,
        "merge_command": _shell_or_none(plan.commands.get("merge")),
        "chain_command": Shell(plan.commands["chain"]),
        "qa": qa, "launcher": join(plan.launcher), "runtime_prefix": Shell(prefix),
        "runtime_prefix_batch": Shell((prefix + " ") if prefix else ""),
        "runtime_setup": [Shell(line) for line in plan.container.setup_lines],
        "db_launch": Shell(" ".join([join(plan.launcher), *sched.launch_options(
            '"$HPCRUN_NODES"', '"$HPCRUN_NODES"', "1")])),
        "chain_launch": Shell(" ".join([join(plan.launcher), *sched.launch_options(
            '"$HPCRUN_NODES"', '"$HPCRUN_NCHAINS"', '"$HPCRUN_CHAINS_PER_NODE"', overcommit=plan.chain_overcommit)])),
        "launch_log": Shell(f'"$HPCRUN_RUNDIR/chains/{sched.launch.log_name}"'),
        "task_identity": [Shell(line) for line in sched.task_identity()],
        "node_identity": [Shell(line) for line in sched.node_identity()],
        "input_dir_expr": Shell(plan.input_dir_expr or '""'), "work_dir_expr": Shell(plan.work_dir_expr),
        "out_dir_expr": Shell(plan.out_dir_expr),
        "cleanup_workdir": plan.cleanup_workdir, "part": "whole",
        "killed_statuses": Shell(" | ".join(str(128 + n) for n in sorted(KILL_SIGNALS))),
        "body_path": quote(f"{plan_dir}/{plan.seat.subdir}{BODY_PATH}"),
        # a campaign's other clusters: their own helpers, and run records that job ids cannot mix up
        "cluster": plan.seat.name or "",
        "db_helper": Shell(f'"$HPCRUN_PLAN_DIR/{plan.seat.subdir}bin/hpcrun-db.sh"'),
        "chain_helper": Shell(f'"$HPCRUN_PLAN_DIR/{plan.seat.subdir}bin/hpcrun-chain.sh"'),
        "rundir_expr": Shell(f'"$HPCRUN_PLAN_DIR/run/$HPCRUN_JOB/{run_prefix(plan.seat.name)}'
                             '${HPCRUN_JOB_ID:-local}"'),
        "checksum": _checksum_context(plan),
        "remote": _remote_context(plan),
        **_staged_names(plan),
    }


def _staged_names(plan: Plan) -> Dict[str, bool]:
    """Where a staged input lands under the input directory: the job copies URL inputs to
    ``<stem>/<file name>`` (inputs of one job may share a file name, as ALICE's AliAOD.root do);
    a burst buffer's stage-in lands them by file name (refused at plan time when two would clash)."""
    return {"staged_by_stem": plan.remote is not None and plan.remote.access == "stage"}


def _remote_context(plan: Plan) -> Optional[Dict[str, Any]]:
    r = plan.remote
    if r is None:
        return None
    return {"access": r.access, "cache": quote(r.cache) if r.cache else None, "xrdcp": Shell(r.xrdcp),
            "retries": r.retries, "client_env": [(name, quote(value)) for name, value in r.client_env],
            "private_stage": r.private_stage,
            "node_cache": None if r.node_cache is None else {
                "dir": Shell(r.node_cache.dir_expr), "max_bytes": r.node_cache.max_bytes,
                "index": quote(r.node_cache.index)}}


def _checksum_context(plan: Plan) -> Optional[Dict[str, Any]]:
    cs = plan.checksum
    if cs is None or not any(v for j in plan.jobs for v in j.checksums) or (
            plan.remote is not None and plan.remote.access == "stream"):
        return None  # nothing to verify: the job has no checksum step
    return {"algo": cs.algo, "tool": cs.tool, "command": Shell(cs.command), "hint": cs.hint}


BODY_PATH = "bin/hpcrun-job.sh"


def shared_body(plan: Plan) -> bool:
    """Jobs with scripts of their own (not array tasks) are a directive header each, then
    one shared body: the scheduler must read the directives at submission, not the steps."""
    return any(s.array is None for s in plan.scripts)


def render_body(env: jinja2.Environment, template: str, plan: Plan, common: Dict[str, Any]) -> str:
    """The steps every per-job header runs (its index comes from the header)."""
    ctx = dict(common)
    ctx.update({"directives": [], "job_identity": [Shell(line) for line in
                                                   scheduler_for(plan.scheduler).job_identity(False)],
                "bb_lines": [], "is_array": False, "first_index": None, "part": "body",
                "script_label": comment("the steps shared by the job scripts of this plan"),
                "comment_lines": []})
    return env.get_template(template).render(ctx)


def render_script(env: jinja2.Environment, template: str, plan: Plan, script: ScriptPlan,
                  common: Dict[str, Any], plan_dir: str) -> str:
    first = script.jobs[0]
    if script.array:
        label = f"array {script.name}: jobs {first.index + 1}..{script.jobs[-1].index + 1}"
        comments = []
    else:
        label = f"job {first.index + 1} of {len(plan.jobs)}"
        comments = [comment("inputs: " + " ".join(i.path for i in first.inputs[:20])
                            + (" ..." if len(first.inputs) > 20 else ""))]
        if first.bb_capacity:
            comments.append(comment(f"burst buffer: {format_capacity(first.bb_capacity)} "
                                    f"(needed {first.bb_needed} bytes)"))
    ctx = dict(common)
    ctx.update(scheduler_context(plan.scheduler, _absolute_logs(script.request, plan_dir), script.array is not None))
    ctx.update({
        "bb_lines": [Shell(line) for line in script.bb_lines], "is_array": script.array is not None,
        "first_index": first.index, "script_label": comment(label), "comment_lines": comments,
        "part": "whole" if script.array is not None else "header",
    })
    return env.get_template(template).render(ctx)


def script_path(plan: Plan, stem: str) -> str:
    """Where a job script lives in the plan directory (the scheduler names the suffix); a campaign's
    other clusters have theirs in clusters/<name>/jobs/."""
    return f"{plan.seat.subdir}jobs/{stem}{scheduler_for(plan.scheduler).script_suffix}"


def run_prefix(cluster: Optional[str]) -> str:
    """What precedes the job id in run/<job>/<id>: job ids repeat across clusters, so a named
    cluster's are ``<cluster>-<id>``."""
    return f"{cluster}-" if cluster else ""


def render_finalize(env: jinja2.Environment, plan: Plan, common: Dict[str, Any], plan_dir: str) -> str:
    c = plan.campaign
    assert c.finalize is not None
    ctx = dict(common)
    ctx.update(scheduler_context(plan.scheduler, _absolute_logs(plan.finalize_request, plan_dir)))
    ctx.update({"after": c.finalize.after, "job_name": finalize_name(c.name), "outdir": c.outputs.location,
                "finalize_command": Shell(plan.commands["finalize"])})
    return env.get_template("finalize.sh.j2").render(ctx)


def tasks_table(plan: Plan) -> str:
    rows = []
    for job in plan.jobs:
        sums = job.checksums or (None,) * len(job.inputs)
        for item, output, checksum in zip(job.inputs, job.outputs, sums):
            events = "-" if item.events is None else str(item.events)
            rows.append(f"{job.index}\t{job.name}\t{job.chains_per_node}\t{item.path}\t{events}"
                        f"\t{item.stem}\t{output}\t{checksum or '-'}")
    return "\n".join(rows) + "\n"


def _file_digest(paths: Sequence[Path]) -> str:
    """sha256 over the files a plan was made from: the state store refuses a changed campaign."""
    h = hashlib.sha256()
    for path in paths:
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(str(path).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def manifest(plan: Plan, plan_dir: str, digests: Dict[str, str]) -> Dict[str, Any]:
    data = _manifest(plan, plan_dir, digests)
    if not plan.others and not plan.seat.name:
        return data
    # several clusters (or one named): each one's scripts and limits, before the (long, last) job list
    jobs = data.pop("jobs")
    data["digests"]["profile"] = _file_digest([f for p in plan.all_clusters for f in p.profile_files])
    data["move_pending_after_s"] = plan.move_pending_after
    data["clusters"] = [_cluster_entry(p, digests) for p in plan.all_clusters]
    data["jobs"] = jobs
    return data


def _cluster_entry(plan: Plan, digests: Dict[str, str]) -> Dict[str, Any]:
    """One cluster of the campaign as submit and track need it (the manifest's ``clusters``)."""
    return {
        "name": plan.seat.name, "profile": plan.profile.name, "share": plan.seat.share,
        "max_queued_jobs": plan.seat.max_queued_jobs, "site_max_queued_jobs": plan.profile.max_queued_jobs,
        "scheduler": plan.scheduler, "accounting": plan.accounting, "partition": plan.partition_name,
        "min_poll_interval": plan.profile.scheduler.min_poll_interval, "run_prefix": run_prefix(plan.seat.name),
        "capacity_jobs": plan.capacity_jobs,
        "scripts": [{"path": script_path(plan, s.name), "array": s.array,
                     "jobs": [s.jobs[0].index, s.jobs[-1].index], "sha256": digests[script_path(plan, s.name)]}
                    for s in plan.scripts],
    }


def _manifest(plan: Plan, plan_dir: str, digests: Dict[str, str]) -> Dict[str, Any]:
    c = plan.campaign
    return {
        "hpcrun_version": __version__, "campaign": c.name, "spec_file": plan.spec_file,
        "profile": plan.profile.name, "profile_files": [str(p) for p in plan.profile_files],
        "partition": plan.partition_name, "qos": plan.qos, "container": c.container.runtime,
        "burst_buffer": plan.bb_system or "none",
        "walltime_seconds": c.walltime, "nodes_per_job": c.jobs.nodes,
        "checksum": c.inputs.checksum, "node_key": node_key(c.name, plan_dir),
        "totals": {
            "jobs": len(plan.jobs), "scripts": len(plan.scripts),
            "inputs": sum(len(j.inputs) for j in plan.jobs),
            "input_bytes": plan.input_bytes, "estimated_output_bytes": plan.output_bytes,
            "nodes": len(plan.jobs) * c.jobs.nodes, "core_hours": round(plan.core_hours, 2),
            "node_hours": round(plan.node_hours, 2), "bb_capacity_bytes": plan.bb_total,
            "bb_max_per_job_bytes": plan.bb_max, "stage_in_bytes": plan.stage_in_bytes,
            "stage_out_bytes": plan.stage_out_bytes,
        },
        "notes": plan.notes,
        "digests": {"spec": _file_digest([Path(plan.spec_file)]), "profile": _file_digest(plan.profile_files)},
        "submit": {
            "throttle": c.jobs.throttle or plan.profile.array_throttle,
            "max_attempts": c.retry.max_attempts, "retry_cancelled": c.retry.cancelled,
            "max_queued_jobs": plan.profile.max_queued_jobs, "accounting": plan.accounting,
            "scheduler": plan.scheduler, "min_poll_interval": plan.profile.scheduler.min_poll_interval,
            "max_total_attempts": c.retry.max_total_attempts, "retry": effective_rules(c.retry),
            "limits": {"max_walltime_s": plan.partition.max_walltime,
                       "memory_per_node_bytes": plan.partition.memory_per_node, "nodes": plan.partition.nodes},
        },
        "events": None if c.events is None else {
            "command": list(c.events.command), "on": list(c.events.on), "stall_after_s": c.events.stall_after,
            "timeout_s": c.events.timeout},
        "targets": {} if c.targets is None else c.targets.model_dump(exclude_none=True),
        "inputs_remote": None if plan.remote is None else {"access": plan.remote.access, "cache": plan.remote.cache},
        "export": _export_entry(plan),
        "locality": None if plan.locality_wait is None or plan.remote is None or plan.remote.node_cache is None
        else {"index": plan.remote.node_cache.index, "wait_s": plan.locality_wait},
        "finalize": None if c.finalize is None else {
            "path": script_path(plan, "finalize"), "sha256": digests[script_path(plan, "finalize")],
            "job_name": finalize_name(c.name),
            "after": c.finalize.after},
        "scripts": [
            {"name": s.name, "path": script_path(plan, s.name), "array": s.array,
             "jobs": [s.jobs[0].index, s.jobs[-1].index], "sha256": digests[script_path(plan, s.name)]}
            for s in plan.scripts],
        "jobs": [
            {"index": j.index, "name": j.name, "chains_per_node": j.chains_per_node,
             "inputs": [i.path for i in j.inputs], "input_sizes": [i.size for i in j.inputs],
             "input_events": [i.events for i in j.inputs],
             "checksums": list(j.checksums) or [None] * len(j.inputs), "input_bytes": j.input_bytes,
             "events": j.events, "outputs": list(j.outputs), "bb_capacity_bytes": j.bb_capacity}
            for j in plan.jobs],
    }


def _export_entry(plan: Plan) -> Optional[Dict[str, Any]]:
    """What the supervisor needs to send outputs on: from where, to where, how (absent: no export)."""
    e = plan.export
    if e is None:
        return None
    return {"to": e.to, "location": plan.campaign.outputs.location, "streams": e.streams,
            "max_attempts": e.max_attempts, "backoff_s": e.backoff_s, "max_backoff_s": e.max_backoff_s,
            "timeout_s": e.timeout_s, "copy": list(e.copy), "ask": list(e.ask),
            "client_env": [list(kv) for kv in e.client_env]}


def render_all(plan: Plan, plan_dir: str) -> List[RenderedFile]:
    """Every file of a plan directory except the manifest (which needs their digests)."""
    return list(iter_rendered(plan, plan_dir))


def iter_rendered(plan: Plan, plan_dir: str) -> Iterator[RenderedFile]:
    """render_all one file at a time, so a caller can write each and drop its text: the first
    cluster's files, then each other cluster's scripts and helpers (the shared ones once)."""
    seen = set()
    for p in plan.all_clusters:
        for f in _iter_cluster(p, plan_dir):
            if f.path not in seen:
                seen.add(f.path)
                yield f


def _iter_cluster(plan: Plan, plan_dir: str) -> Iterator[RenderedFile]:
    env = environment(template_dirs(plan))
    common = common_context(plan, plan_dir)
    template = f"{plan.profile.template}.sh.j2" if plan.profile.template else "job.sh.j2"
    own = plan.seat.subdir
    if shared_body(plan):
        yield RenderedFile(own + BODY_PATH, render_body(env, template, plan, common), True)
    for s in plan.scripts:
        yield RenderedFile(script_path(plan, s.name), render_script(env, template, plan, s, common, plan_dir), True)
    if plan.campaign.finalize is not None and not own:   # the finalize job runs on the first cluster
        yield RenderedFile(script_path(plan, "finalize"), render_finalize(env, plan, common, plan_dir), True)
    yield RenderedFile(own + "bin/hpcrun-chain.sh", env.get_template("hpcrun-chain.sh.j2").render(common), True)
    if plan.database:
        yield RenderedFile(own + "bin/hpcrun-db.sh", env.get_template("hpcrun-db.sh.j2").render(common), True)
    if plan.hdf5_helper:
        yield RenderedFile(HDF5_HELPER, env.get_template("hpcrun-hdf5.py.j2").render(common), True)
    if plan.checksum and plan.checksum.helper and common["checksum"]:
        yield RenderedFile("bin/hpcrun-checksum.py",
                           env.get_template("hpcrun-checksum.py.j2").render(common), True)
    yield RenderedFile("tasks.tsv", tasks_table(plan))


def manifest_text(plan: Plan, plan_dir: str, digests: Dict[str, str]) -> str:
    return manifest_json(manifest(plan, plan_dir, digests))


def manifest_json(data: Dict[str, Any]) -> str:
    """JSON with one script / one job per line: json.dumps(indent=...) runs the pure-Python
    encoder (about 4x slower, ~200 MB more at 100k jobs); one line per entry keeps --diff
    readable."""
    parts = []
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            body = ",\n  ".join(map(json.dumps, value))
            parts.append(f" {json.dumps(key)}: [\n  {body}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: " + json.dumps(value, indent=1).replace("\n", "\n "))
    return "{\n" + ",\n".join(parts) + "\n}\n"

