"""Renderers: a Plan becomes text (job scripts, helper scripts, tasks table, manifest).

Jinja2 runs with StrictUndefined, so a misspelt variable in a template is an
error, never an empty string. Quoting is the default (``finalize``): every ``{{ value }}``
is written as one single-quoted shell word unless Python built it as :class:`Shell`
text (quoted words, vetted directive lines, one-line comments). Template fragments
(the macros of ``_shell.j2``) are inserted with ``{% call %}``, which is not quoted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import jinja2

from hpcrun import __version__
from hpcrun.backends.late.direct import DIRECT_MARK
from hpcrun.backends.late.runs import SUMS
from hpcrun.backends.scheduler import JobRequest, scheduler_for
from hpcrun.backends.scheduler.base import Scheduler
from hpcrun.model.failures import KILL_SIGNALS
from hpcrun.plan.job.pilots import BEAT_S, QUEUE_DIR, claims_base
from hpcrun.plan.job.requests import finalize_name
from hpcrun.plan.values import Job, Plan, ScriptPlan, has_checksums, index_range
from hpcrun.render.direct import recipe as direct_recipe
from hpcrun.resources import site_template_dirs, templates_dir
from hpcrun.shell import Shell, comment, finalize, join, quote
from hpcrun.units import format_capacity


@dataclass(frozen=True)
class RenderedFile:
    path: str        # relative to the plan directory
    text: str
    executable: bool = False
    chunks: Optional[Iterator[str]] = None   # the text in pieces instead (a long table: flat memory)
    digest: bool = True    # the manifest records its sha256 (tasks.tsv: not needed, 10^5 lines not hashed)


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
    launch = _launch_context(plan, sched)
    ctx = {
        "tasks_base": plan.succession.first_index, "index_width": INDEX_WIDTH,
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
        **launch,
        **_chain_here(plan, launch["chain_inline"]),
        "node_identity": [Shell(line) for line in sched.node_identity()],
        "input_dir_expr": Shell(plan.input_dir_expr or '""'), "work_dir_expr": Shell(plan.work_dir_expr),
        "out_dir_expr": Shell(plan.out_dir_expr),
        "cleanup_workdir": plan.cleanup_workdir, "part": "whole", "work_dir_made": _work_dir_made(plan),
        "killed_statuses": Shell(" | ".join(str(128 + n) for n in sorted(KILL_SIGNALS))),
        "body_path": quote(f"{plan_dir}/{plan.seat.subdir}{BODY_PATH}"),
        # a campaign's other clusters: their own helpers, and run records that job ids cannot mix up
        "cluster": plan.seat.name or "",
        "db_helper": Shell(f'"$HPCRUN_PLAN_DIR/{plan.seat.subdir}bin/hpcrun-db.sh"'),
        "chain_helper": Shell(f'"$HPCRUN_PLAN_DIR/{plan.seat.subdir}bin/hpcrun-chain.sh"'),
        # (a claim's id names its pilot, whose id names its cluster: no prefix for late binding)
        "rundir_expr": Shell(f'"$HPCRUN_PLAN_DIR/run/$HPCRUN_JOB/{run_prefix(None if plan.pilots else plan.seat.name)}'
                             '${HPCRUN_JOB_ID:-local}"'),
        "checksum": _checksum_context(plan),
        "provenance": _provenance_context(plan), "generation": plan.succession.number,
        "remote": _remote_context(plan), "late": plan.pilots is not None, "claim_copies": _claim_copies(plan),
        "agent_sums": _agent_sums(plan),
        **_staged_names(plan),
    }
    # the inputs run by the pilot's agent, where they need nothing more of the script
    ctx["direct"], ctx["direct_mark"] = direct_recipe(plan, ctx), Shell(DIRECT_MARK)
    return ctx


def _claim_copies(plan: Plan) -> Optional[Dict[str, Any]]:
    """Late binding with a burst buffer: a claim copies its inputs into the pilot's buffer and its outputs
    out of it (where the array tasks' #DW stage lines would)."""
    p = plan.pilots
    if p is None or p.bb_root is None:
        return None
    bb = plan.campaign.burst_buffer
    return {"inputs": bool(bb and bb.stage_inputs),
            "out": None if plan.copy_out_expr is None else Shell(plan.copy_out_expr)}


def _agent_sums(plan: Plan) -> Optional[Dict[str, str]]:
    """Late binding with the outputs written straight to the claim's own directory: the pilot's agent sums them
    (a thread of its own, no process per output) with the provenance's algorithm where it knows it; else the job
    does. The job script says so to the agent (templates/_shell.j2), so a pilot runs any generation's script."""
    if plan.pilots is None:
        return None
    base, algo = claims_base(plan.campaign), _provenance_context(plan)["algo"]
    if algo not in SUMS or plan.out_dir_expr != quote(base) + '/"${HPCRUN_JOB_ID}"':
        return None
    return {"algo": algo, "base": base}


def _chain_here(plan: Plan, inline: bool) -> Dict[str, Any]:
    """Whether a pilot's input runs its single chain in its own shell (sourced, no fork: issue 55), where its
    chain is read by the job's shell at all (``inline``), and the names the chain sets that stay the call's own
    (``local -x`` keeps a value such as PATH until the chain's own export; the names are checked by the model).
    Only hpcrun's own chain script is written to be sourced: a site's copy of it runs as a process."""
    if not inline or not _shipped(plan, "hpcrun-chain.sh.j2"):
        return {"chain_here": False, "rows_spared": False, "chain_kept": Shell(":")}
    names = [n for n, _ in sorted(plan.campaign.chain.env.items())]
    if plan.campaign.database is not None:
        names += ["HPCRUN_DB_SOCKET", "HPCRUN_DB_DEFAULTS", "HPCRUN_DB_USER"]
    kept = " ".join(f'{n}="${{{n}-}}"' for n in names)
    # no inputs.tsv only where the job's chains block is hpcrun's own, which gives the chain its rows: a site's
    # job template (or its copy of one of hpcrun's) may run the chain as a process, which reads the file
    spared = plan.profile.template is None and all(_shipped(plan, n) for n in ("job.sh.j2", "base.sh.j2", "_shell.j2"))
    return {"chain_here": True, "rows_spared": spared, "chain_kept": Shell(f"local -x {kept}" if kept else ":")}


def _work_dir_made(plan: Plan) -> bool:
    """Whether a job makes its work directory (``HPCRUN_WORKDIR``): where something may use it. It holds chain
    parts for a merge, staged inputs, a container's bind, and whatever a command names ``{workdir}``; a spec that
    sets ``outputs.workdir``, an environment value or runtime line naming ``HPCRUN_WORKDIR``, or a site's own
    template may use it too. Otherwise nothing does, and two directories an input (a claim's two levels) are two
    metadata operations to make and two to remove (issue 55)."""
    texts = [*plan.commands.values(), *plan.container.setup_lines,
             *(v for _, v in plan.campaign.chain.env.items()), *(v for _, v in plan.campaign.software.env.items()),
             *(v for _, v in plan.profile.prologue.env.items())]
    return bool("merge" in plan.commands or plan.input_dir_expr or plan.container.runtime != "none"
                or plan.bb_system or (plan.pilots is not None and plan.pilots.bb_root is not None)
                or plan.campaign.outputs.workdir or any("WORKDIR" in t for t in texts)
                or plan.profile.template is not None
                or not all(_shipped(plan, t.name) for t in templates_dir().glob("*.j2")))


def _shipped(plan: Plan, name: str) -> bool:
    """Whether the template ``name`` a plan renders is hpcrun's own, not a site's copy found first."""
    shipped = templates_dir() / name
    found = next((d / name for d in template_dirs(plan) if (d / name).is_file()), shipped)
    return found.resolve() == shipped.resolve()


def _launch_context(plan: Plan, sched: Scheduler) -> Dict[str, Any]:
    """How the job starts its database servers and chains: the launcher's steps, or processes of the
    batch step (launch_in_batch, defined by the job when ``in_batch``). A pilot's inputs share its
    node's CPUs: none binds its tasks to CPUs it would then share with the other slots."""
    if plan.launch.in_batch:
        return {"in_batch": True, "node_cpus": Shell('""' if plan.pilots is not None else sched.node_cpus),
                # a pilot's input with no container: each chain is a fork of the claim's shell that reads the
                # chain's steps (no bash started per input); a container runs them inside as before
                "chain_inline": plan.pilots is not None and not plan.container.prefix,
                "db_launch": Shell("launch_in_batch 1"), "chain_launch": Shell('launch_in_batch "$HPCRUN_NCHAINS"'),
                "launch_log": Shell('"$HPCRUN_RUNDIR/chains/launch.log"'),
                "task_identity": [Shell(line) for line in sched.batch_task_identity()]}
    return {
        "in_batch": False, "chain_inline": False,
        "db_launch": Shell(" ".join([join(plan.launcher), *sched.launch_options(
            '"$HPCRUN_NODES"', '"$HPCRUN_NODES"', "1")])),
        "chain_launch": Shell(" ".join([join(plan.launcher), *sched.launch_options(
            '"$HPCRUN_NODES"', '"$HPCRUN_NCHAINS"', '"$HPCRUN_CHAINS_PER_NODE"', overcommit=plan.chain_overcommit)])),
        "launch_log": Shell(f'"$HPCRUN_RUNDIR/chains/{sched.launch.log_name}"'),
        "task_identity": [Shell(line) for line in sched.task_identity()]}


def _staged_names(plan: Plan) -> Dict[str, bool]:
    """Where a staged input lands under the input directory: by file name, or ``<stem>/<file name>``
    where inputs of one job share a file name (as ALICE's AliAOD.root do; the job then renames each
    copy on its own, not all in one call); a burst buffer's stage-in lands them by file name (refused
    at plan time when two would clash)."""
    by_stem = plan.remote is not None and plan.remote.access == "stage" and _names_repeat(plan)
    return {"staged_by_stem": by_stem}


def _names_repeat(plan: Plan) -> bool:
    """Some job holds two inputs of one file name (jobs of one input never do: not looked at)."""
    if plan.campaign.jobs.files_per_job == 1:
        return False
    for job in plan.jobs:
        names = [i.path.rsplit("/", 1)[-1] for i in job.inputs]
        if len(set(names)) < len(names):
            return True
    return False


def _remote_context(plan: Plan) -> Optional[Dict[str, Any]]:
    r = plan.remote
    if r is None:
        return None
    return {"access": r.access, "cache": quote(r.cache) if r.cache else None, "xrdcp": Shell(r.xrdcp),
            "retries": r.retries, "client_env": [(name, quote(value)) for name, value in r.client_env],
            "private_stage": r.private_stage, "parallel": r.parallel,
            "local_paths": list(r.local_paths),   # quoted by the template's finalize
            "node_cache": None if r.node_cache is None else {
                "dir": Shell(r.node_cache.dir_expr), "max_bytes": r.node_cache.max_bytes,
                "index": quote(r.node_cache.index)}}


def _provenance_context(plan: Plan) -> Dict[str, Any]:
    """How the job sums its outputs: the spec's algorithm with the inputs' tool, else sha256sum."""
    cs = plan.checksum
    image_id = None if plan.container.image_id is None else Shell(plan.container.image_id)
    if cs is None:
        return {"algo": "sha256", "command": Shell("sha256sum --"), "image_id": image_id}
    return {"algo": cs.algo, "command": Shell(cs.command), "image_id": image_id}


def _checksum_context(plan: Plan) -> Optional[Dict[str, Any]]:
    cs = plan.checksum
    if cs is None or not has_checksums(plan.jobs) or (
            plan.remote is not None and plan.remote.access == "stream"):
        return None  # nothing to verify: the job has no checksum step
    # bulk: sums several files in one call (the plan's helper, md5sum); xrdadler32 takes one file
    return {"algo": cs.algo, "tool": cs.tool, "command": Shell(cs.command), "hint": cs.hint,
            "bulk": cs.helper or cs.algo == "md5"}


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
    if script.array:
        lo, hi = index_range(script.jobs)
        label = f"array {script.name}: jobs {lo + 1}..{hi + 1}"
        return render_job(env, template, plan, common, plan_dir, script.request, script.bb_lines, lo,
                          label, [], True)
    first = script.jobs[0]
    return render_job(env, template, plan, common, plan_dir, script.request, script.bb_lines, first.index,
                      f"job {first.index + 1} of {len(plan.jobs)}", job_comments(first), False)


def job_comments(job: Job) -> List[str]:
    """The comment lines of a job's own script: its inputs, its buffer (one line each, made safe)."""
    comments: List[str] = [comment("inputs: " + " ".join(i.path for i in job.inputs[:20])
                        + (" ..." if len(job.inputs) > 20 else ""))]
    if job.bb_capacity:
        comments.append(comment(f"burst buffer: {format_capacity(job.bb_capacity)} "
                                f"(needed {job.bb_needed} bytes)"))
    return comments


CLAIM_IDENTITY = ("export HPCRUN_NODES=1",)   # the claim id and job index: per input, from the claim's loop


def render_job(env: jinja2.Environment, template: str, plan: Plan, common: Dict[str, Any], plan_dir: str,
               request: Optional[JobRequest], bb_lines: Sequence[str], first_index: object, label: str,
               comments: Sequence[str], array: bool) -> str:
    """A job script (an array's whole script, or a job's header) from what varies between jobs. A
    late-bound plan's array scripts are run by its pilots: their identity is the claim's."""
    ctx = dict(common)
    ctx.update(scheduler_context(plan.scheduler, _absolute_logs(request, plan_dir), array))
    if plan.pilots is not None:
        ctx["job_identity"] = [Shell(line) for line in CLAIM_IDENTITY]
    ctx.update({
        "bb_lines": [Shell(line) for line in bb_lines], "is_array": array,
        "first_index": first_index, "script_label": comment(label), "comment_lines": list(comments),
        "part": "whole" if array else "header",
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


def render_pilot(env: jinja2.Environment, plan: Plan, common: Dict[str, Any], plan_dir: str) -> str:
    """The pilot: a one-node job that claims the plan's jobs from the queue and runs their array script."""
    p = plan.pilots
    assert p is not None
    ctx = dict(common)
    ctx.update(scheduler_context(plan.scheduler, _absolute_logs(p.request, plan_dir), True))
    ctx.update({"queue": quote(f"{plan_dir}/{QUEUE_DIR}"), "slots": p.slots, "idle_s": p.idle_s,
                "beat_s": BEAT_S, "walltime_s": p.walltime_s, "drain_s": p.drain_s,
                "claim_signal_before": p.signal_before_s, "input_s": p.input_s,
                "steal_s": plan.locality_wait or 0, "bb_lines": [Shell(line) for line in p.bb_lines],
                "bb_root": Shell(p.bb_root) if p.bb_root else None,
                "bb_capacity": quote(format_capacity(p.bb_capacity) if p.bb_capacity else ""),
                "pilot_prefix": quote(pilot_prefix(plan)), "seat_dir": quote(plan.seat.subdir),
                "in_batch": True, "node_cpus": Shell('""'), "db_launch": Shell("launch_in_batch 1"),
                "python": quote(plan.profile.tools.python)})
    return env.get_template("pilot.sh.j2").render(ctx)


def pilot_prefix(plan: Plan) -> str:
    """What precedes a pilot's job id in its queue names (and so in its claims' ids and run records): job ids
    repeat across a campaign's clusters, so each names its cluster there."""
    return f"{plan.seat.name}-" if plan.seat.several and plan.seat.name else ""


def render_finalize(env: jinja2.Environment, plan: Plan, common: Dict[str, Any], plan_dir: str) -> str:
    c = plan.campaign
    assert c.finalize is not None
    ctx = dict(common)
    ctx.update(scheduler_context(plan.scheduler, _absolute_logs(plan.finalize_request, plan_dir)))
    ctx.update({"after": c.finalize.after, "job_name": finalize_name(c.name), "outdir": c.outputs.location,
                "finalize_command": Shell(plan.commands["finalize"])})
    return env.get_template("finalize.sh.j2").render(ctx)


TASKS_PATH = "tasks.tsv"
TASKS_INDEX = "tasks.idx"   # a fixed-width line a job: the byte offset of its first row in tasks.tsv
INDEX_WIDTH = 20            # digits of an offset (the line is one more, its newline)


def tasks_chunks(plan: Plan, per_chunk: int = 2000) -> Iterator[str]:
    """tasks.tsv, one row per input, ``per_chunk`` jobs' rows at a time."""
    jobs = plan.jobs
    for start in range(0, len(jobs), per_chunk):
        yield task_rows(jobs[start:start + per_chunk])
    if not jobs:
        yield "\n"


def tasks_index_chunks(plan: Plan, per_chunk: int = 2000) -> Iterator[str]:
    """tasks.idx for tasks.tsv as tasks_chunks writes it."""
    offset = 0
    jobs = plan.jobs
    for start in range(0, len(jobs), per_chunk):
        _rows, index, offset = task_rows_indexed(jobs[start:start + per_chunk], offset)
        yield index


def task_rows_indexed(jobs: Iterable[Job], offset: int) -> Tuple[str, str, int]:
    """The rows of these jobs, the index lines of their offsets (the first at ``offset`` bytes into tasks.tsv),
    and the offset after them: a job finds its rows with two reads at known places, whatever the plan's size
    (a scan of tasks.tsv cost every job O(jobs))."""
    rows: List[str] = []
    index: List[str] = []
    for job in jobs:
        text = task_rows((job,))
        index.append(f"{offset:0{INDEX_WIDTH}d}\n")
        rows.append(text)
        offset += len(text.encode("utf-8"))
    return "".join(rows), "".join(index), offset


def task_rows(jobs: Iterable[Job]) -> str:
    """The rows of tasks.tsv of these jobs: one per input (job index, job name, chains, path, events, stem,
    output, checksum, size in bytes)."""
    rows: List[str] = []
    for job in jobs:
        if len(job.inputs) == 1 and len(job.outputs) == 1:   # the usual: one input, one row, one format
            i = job.inputs[0]
            rows.append(f"{job.index}\t{job.name}\t{job.chains_per_node}\t{i.path}\t"
                        f"{'-' if i.events is None else i.events}\t{i.stem}\t{job.outputs[0]}\t"
                        f"{(job.checksums[0] if job.checksums else None) or '-'}\t{i.size}\n")
            continue
        sums = job.checksums or (None,) * len(job.inputs)
        head = f"{job.index}\t{job.name}\t{job.chains_per_node}\t"
        for item, output, checksum in zip(job.inputs, job.outputs, sums):
            events = "-" if item.events is None else str(item.events)
            rows.append(f"{head}{item.path}\t{events}\t{item.stem}\t{output}\t{checksum or '-'}\t{item.size}\n")
    return "".join(rows)
