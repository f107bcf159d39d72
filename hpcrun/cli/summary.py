"""Human summaries of a plan (rich tables); the CLI only prints what this builds."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from rich.table import Table

from hpcrun.plan import footprint
from hpcrun.plan.values import Plan, chains_of, inputs_in
from hpcrun.units import format_capacity, format_duration, format_size


def plan_table(plan: Plan, out_dir: str) -> Table:
    plan = footprint.assessed(plan, out_dir, refuse=False)   # as written: its footprint and quota notes
    c = plan.campaign
    table = Table(title=f"hpcrun plan: {c.name} at {plan.profile.name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    chains = sorted(chains_of(plan.jobs))
    arrays = sum(1 for s in plan.scripts if s.array)
    rows = [
        ("plan directory", out_dir),
        ("partition / QOS", f"{plan.partition_name} / {plan.qos or '-'}"),
        ("container", c.container.runtime + (f" ({c.container.image})" if c.container.image else "")),
        ("inputs", f"{inputs_in(plan.jobs)} files, {format_size(plan.input_bytes)}"),
        ("jobs", f"{len(plan.jobs)} in {len(plan.scripts)} script(s)" + (f", {arrays} array(s)" if arrays else "")),
        ("nodes per job", str(c.jobs.nodes)),
        ("chains per node", ", ".join(map(str, chains[:5])) + (" ..." if len(chains) > 5 else "")),
        ("walltime per job", format_duration(c.walltime)),
        ("nodes in all", str(len(plan.jobs) * c.jobs.nodes)),
        ("core-hours (max)", f"{plan.core_hours:,.1f}"),
        ("database", f"{plan.database.server}, payload {format_size(plan.database.payload_bytes)}"
         if plan.database else "none"),
        ("burst buffer", (f"{plan.profile.burst_buffer.system}, pool {plan.pool.name}: "
                          f"{format_capacity(plan.bb_max)} max per job, "
                          f"{format_size(plan.bb_total)} in all") if plan.bb_system and plan.pool else "none"),
        ("bytes to stage in / out", f"{format_size(plan.stage_in_bytes)} / {format_size(plan.stage_out_bytes)}"),
        ("binding", binding_line(plan)),
        ("launch", launch_line(plan)),
        ("scheduler RPCs", rpc_line(plan)),
    ]
    if plan.others:
        rows.insert(1, ("clusters", "; ".join(
            f"{p.seat.name} ({p.profile.name}, partition {p.partition_name}, share {p.seat.share:g}"
            + (f", at most {p.seat.max_queued_jobs} queued" if p.seat.max_queued_jobs else "") + ")"
            for p in plan.all_clusters)))
    rows += footprint_rows(plan)
    for what, value in rows:
        table.add_row(what, value)
    for note in plan.notes:
        table.add_row("note", note)
    return table


def footprint_rows(plan: Plan) -> List[Tuple[str, str]]:
    """One row per filesystem the campaign writes to: files and bytes at its peak and end, and the quota."""
    if plan.footprint is None:
        return []
    return [(f"footprint {footprint.where_text(use)}", footprint.line(use)) for use in plan.footprint.filesystems]


def binding_line(plan: Plan) -> str:
    """Array tasks the scheduler starts, or pilots that claim the jobs (jobs.binding: late)."""
    p = plan.pilots
    if p is None:
        return "array: each job an array task the scheduler starts"
    return (f"late: up to {p.max_pilots} pilot(s) of {format_duration(p.walltime_s)}, each one node with {p.slots} "
            f"slot(s) of {p.chains} chain(s) ({p.cpus} CPUs), claiming jobs from {plan.campaign.name}'s queue; "
            f"drain {p.drain_s} s before the end, released after {p.idle_s} s idle; about {plan.pilot_count} "
            f"pilot(s) for {len(plan.jobs)} job(s) at {format_duration(p.input_s)} each, holding "
            f"{plan.core_hours:,.1f} core-hours, drain tail and idle time included")


def cluster_table(clusters: Dict[str, Dict[str, Any]]) -> Table:
    """Each cluster of a campaign on several: jobs per state and health (status)."""
    table = Table("cluster", "health", "since", "pending", "submitted", "running", "done", "failed", "parked",
                  "detail", title="clusters")
    for name, row in clusters.items():
        jobs = row.get("jobs", {})
        table.add_row(name, row["state"], (row.get("since") or "")[:19].replace("T", " "),
                      *(str(jobs.get(s, 0)) for s in ("pending", "submitted", "running", "done", "failed", "parked")),
                      row.get("detail") or "")
    return table


def cluster_submit_lines(clusters: Dict[str, Dict[str, Any]]) -> List[str]:
    """What a submit round found of each cluster and how many jobs it placed there."""
    out = []
    for name, row in clusters.items():
        room = "no limit" if row["room"] is None else f"room for {row['room']}"
        line = (f"cluster {name}: {row['state']}, {row['placed']} job(s) placed "
                f"({room}, {row['pending_there']} pending there)")
        out.append(line + (f" - {row['detail']}" if row["detail"] else ""))
    return out


def export_line(e: Dict[str, Any]) -> str:
    """The exports in one line: verified, waiting, given up (their outputs stay), the last error."""
    f = e["files"]
    text = (f"exports: {f['verified']} verified ({e['bytes'] / 1e9:.3g} GB, {e['mb_per_s']:.1f} MB/s), "
            f"{e['backlog']} waiting, {f['failed']} given up, {e['failed_attempts']} failed attempt(s)")
    if f["failed"]:
        text += ("; the outputs of those given up are kept in outputs.location (`hpcrun retry --exports` "
                 "tries them again)")
    if e["last_error"] and (f["failed"] or e["backlog"]):
        text += f"; last error: {e['last_error']}"
    return text


def status_extra_lines(report: Any) -> List[str]:
    """Outages of the scheduler's daemons and of the allocation (waited out), the forecast, the footprint."""
    from hpcrun.operate.campaign.forecast import line
    from hpcrun.operate.tracking.footprint import line as footprint_line

    lines = [o["line"] for o in report.outages]
    p = getattr(report, "pilots", None)
    if p:
        states = {s: sum(1 for x in p["pilots"] if x["state"] == s) for s in ("running", "draining", "idle")}
        lines.append(f"pilots: {len(p['pilots'])} ({states['running']} running inputs, {states['draining']} "
                     f"draining, {states['idle']} idle), {p['running']} input(s) in them, {p['waiting']} waiting in "
                     f"the queue, {p['fenced']} pilot(s) ended" + ("; paused: claiming nothing" if p["paused"] else ""))
        for x in p["pilots"][:20]:
            lines.append(f"  pilot {x['pilot']} on {x['node']}: {x['state']}, {x['inputs']}/{x['slots']} slot(s) busy"
                         + (f", ends {x['ends']}" if x["ends"] else ""))
    if report.forecast is not None:
        lines.append(line(report.forecast))
    lines += [footprint_line(f) for f in getattr(report, "footprint", None) or ()]   # made so far, per filesystem
    return lines


def launch_line(plan: Plan) -> str:
    """How each job starts its database server and chains, and why."""
    launch = plan.launch
    if launch.in_batch:
        return f"in the batch step, no launcher step: {launch.why}"
    return f"{launch.steps_per_job} launcher step(s) per job ({' '.join(plan.launcher)}): {launch.why}"


def rpc_line(plan: Plan) -> str:
    """What the campaign's first attempt asks of the controller, so a site can say yes before it starts."""
    r = plan.expected_rpcs
    return (f"{r['submissions']} submission(s) + {r['in_job_user']} from {r['steps']} job step(s) "
            f"(+{r['in_job_daemons']} from the nodes' step daemons) = {r['user_per_1000_inputs']} per 1000 "
            "inputs from your user; tracking adds a few per poll, not per input")


def show_batch(out: Any, dry_run: bool) -> Callable[[Any], None]:
    """One line a submission as it goes (``would submit`` in a dry run)."""
    def show(batch: Any) -> None:
        what = f"array tasks {batch.array_spec}" if batch.array_spec else "job"
        word = "would submit" if dry_run else "submitted"
        ident = (f": {batch.job_id} (name {batch.tag})" if batch.job_id else "") + (
            f" on cluster {batch.cluster}" if batch.cluster else "")
        out.print(f"{word} {batch.script.path} {what}, {batch.tasks} plan job(s){ident}", highlight=False)
    return show


def submit_summary(out: Any, report: Any) -> None:
    for tag, job_id in report.recovered:
        out.print(f"recovered job {job_id} ({tag}) submitted by a run that stopped before recording it",
                  highlight=False)
    for tag in report.released:
        out.print(f"released claim {tag}: Slurm never got it, its jobs are pending again", highlight=False)
    if report.queue:
        out.print(f"queue: {report.queue[0]} of at most {report.queue[1]} jobs queued for this user", highlight=False)
    for line in cluster_submit_lines(report.clusters):
        out.print(line, highlight=False, markup=False, emoji=False, soft_wrap=True)
    if not report.batches:
        out.print("nothing to submit: every job of this plan is done, in flight or parked"
                  if not report.left_pending else "nothing submitted now", highlight=False)
    if report.left_pending:
        out.print(f"{report.left_pending} job(s) left for a later submit (the queue limit, --limit, or claims "
                  "waiting to be settled); run submit again or use --follow", highlight=False)
    if report.finalize is not None:
        out.print(f"finalize: {report.finalize.message}", highlight=False, markup=False, emoji=False,
                  soft_wrap=True)
