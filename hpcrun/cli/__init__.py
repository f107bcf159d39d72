"""Command-line interface: parse arguments, call the library, print. Nothing else."""

from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import click
from rich.console import Console

from hpcrun import __version__
from hpcrun.errors import HpcrunError, InputError

out = Console()
err = Console(stderr=True)

# Leaving: the interpreter's last collection walks every object the command made (the store's and the models'
# classes: 0.13 s of a supervisor's exit, measured), to free what the process returns to the system anyway.
# Registered when the command line is loaded: it runs after the handlers registered later (the store's, the
# exports'). A file object left in a reference cycle would go unflushed: hpcrun's writers close or flush theirs.
atexit.register(gc.freeze)


def reported(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn hpcrun errors into a message and an exit code; never show a traceback."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except HpcrunError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            err.print("interrupted")
            sys.exit(130)
        except Exception as exc:  # a bug: say so plainly, keep the traceback for debugging
            if os.environ.get("HPCRUN_DEBUG"):
                traceback.print_exc()
            err.print(f"internal error: {type(exc).__name__}: {exc}. This is a bug in hpcrun; "
                      "set HPCRUN_DEBUG=1 to see the traceback.", highlight=False, markup=False)
            sys.exit(70)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcrun")
def main() -> None:
    """Plan and run large data-processing campaigns on Slurm."""


@main.command("plan")
@click.argument("spec", type=click.Path(path_type=Path))
@click.argument("show_args", nargs=-1, metavar="")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="plan directory (default: ./<campaign>.plan); should be on a filesystem "
                   "the compute nodes see")
@click.option("--json", "as_json", is_flag=True, help="print a JSON summary instead of a table")
@click.option("--diff", "want_diff", is_flag=True, help="show what changed against the previous plan")
@click.option("--apply", "apply_", is_flag=True,
              help="into a submitted plan directory: write the campaign's next generation (without it, only "
                   "say what it would change)")
@click.option("--reprocess", type=click.Choice(["none", "failed", "all"]), default="none", show_default=True,
              help="what a new generation runs again: nothing done (none), failed and parked inputs, or all")
@click.option("--force", is_flag=True, help="the same as --apply (kept for scripts written before generations)")
@click.option("--db", envvar="HPCRUN_STATE_DB", default=None, metavar="URL",
              help="campaign state database URL of a submitted plan (default: PLAN_DIR/state.db)")
@reported
def plan_cmd(spec: Path, show_args: Tuple[str, ...], out_dir: Optional[Path], as_json: bool, want_diff: bool,
             apply_: bool, reprocess: str, force: bool, db: Optional[str]) -> None:
    """Validate SPEC, expand it into jobs and write scripts and a manifest.

    `hpcrun plan show PLAN JOB` prints the script of one job (a name, a number, or job00042) as the
    scheduler gets it."""
    from hpcrun import api
    from hpcrun.cli.summary import plan_table

    if show_args or str(spec) == "show":
        if str(spec) != "show" or len(show_args) != 2:
            raise click.UsageError("hpcrun plan SPEC [options], or hpcrun plan show PLAN JOB")
        click.echo(api.job_script(show_args[0], show_args[1]), nl=False)
        return

    try:
        result = api.make_plan(spec, out_dir, force=force, diff=want_diff, apply=apply_, reprocess=reprocess, db=db)
    except InputError as exc:
        if not as_json:
            raise
        click.echo(json.dumps({"ok": False, "problems": [asdict(p) for p in exc.problems]}, indent=1))
        sys.exit(exc.exit_code)   # every problem, one by one (the text groups those of one cause)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
        return
    out.print(plan_table(result.value, result.plan_dir))
    for b in result.budgets:
        out.print(("note: " if b.short else "budget: ") + b.line(), highlight=False, markup=False)
    if result.change is not None:   # a new generation: the scripts' diff (before --apply, or asked), then counts
        if result.diff is not None:
            click.echo(result.diff or "no changes to the scripts against the previous generation\n", nl=False)
        _generation_lines(result.change)
    elif want_diff:
        if not result.previous:
            out.print(f"no previous plan in {result.plan_dir} to compare with: every file above is new",
                      highlight=False)
        elif result.diff:
            click.echo(result.diff, nl=False)
        else:
            out.print("no changes against the previous plan")


def _generation_lines(change: Any) -> None:
    """What a new generation does, in counts; whether it was written."""
    c = change
    click.echo(f"generation {c.number} (reprocess: {c.reprocess}): {c.will_run} input(s) will run under it "
               f"({c.added} added, {c.rerun} run again), {c.stay_done} stay done, {c.in_flight} in flight finish "
               f"under their own generation, {c.withdrawn} withdrawn (listed no more)")
    if c.applied:
        click.echo(f"written to {c.directory}; submit and the supervisor take it up at their next round")
    else:
        click.echo("nothing written: run again with --apply to make this generation")


DB_OPTION = click.option("--db", envvar="HPCRUN_STATE_DB", default=None, metavar="URL",
                         help="campaign state database URL (default: PLAN_DIR/state.db; env HPCRUN_STATE_DB)")


FINALIZE_AGAIN = click.option(
    "--finalize-again", is_flag=True,
    help="send one more finalize job (after the last one ended), after the work submitted since")


@main.command("submit")
@click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
@DB_OPTION
@click.option("--dry-run", is_flag=True, help="show what would be submitted; change nothing")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="submit at most this many plan jobs")
@click.option("--follow", is_flag=True, help="keep submitting as the queue drains until all work is submitted")
@click.option("--interval", type=float, default=None,
              help="seconds between --follow rounds (default 60; never below the site's scheduler.min_poll_interval)")
@click.option("--lock-timeout", type=float, default=600.0, show_default=True,
              help="seconds to wait for another submit of this campaign to finish")
@FINALIZE_AGAIN
@click.option("--json", "as_json", is_flag=True)
@reported
def submit_cmd(plan_dir: Path, db: Optional[str], dry_run: bool, limit: Optional[int], follow: bool,
               interval: Optional[float], lock_timeout: float, finalize_again: bool, as_json: bool) -> None:
    """Submit the work of PLAN_DIR that is neither done nor in flight, and record it; then the
    campaign's finalize job (spec `finalize:`) once every plan job has been submitted."""
    from hpcrun import api
    from hpcrun.backends.scheduler.base import SchedulerError
    from hpcrun.cli.summary import show_batch, submit_summary
    from hpcrun.operate.results import Batch
    from hpcrun.operate.submission.submit import follow as follow_submit

    show = None if as_json else show_batch(out, dry_run)
    if follow and not dry_run:
        def outage(exc: SchedulerError) -> None:
            err.print(f"{exc.words()}: waiting for it; the next round tries again", highlight=False,
                      markup=False, soft_wrap=True)
        sent: List[Batch] = []   # every round's, a round cut short by an outage too

        def sending(batch: Batch) -> None:
            sent.append(batch)
            if show:
                show(batch)
        reports = follow_submit(plan_dir, interval=interval, db=db, lock_timeout=lock_timeout, on_batch=sending,
                                finalize_again=finalize_again, on_outage=outage)
        report = reports[-1]
        report.batches = sent
    else:
        def waiting(holder: str) -> None:
            err.print(f"waiting for the submit lock held by {holder}", highlight=False)
        report = api.submit(plan_dir, db=db, dry_run=dry_run, limit=limit, lock_timeout=lock_timeout,
                            on_batch=show, on_wait=None if as_json else waiting, finalize_again=finalize_again).raw
        if dry_run and show:
            for b in report.batches:
                show(b)
    if as_json:
        click.echo(json.dumps(api.SubmitResult(report).to_dict(), indent=1))
    else:
        submit_summary(out, report)


def _status_table(report: Any, show_all: bool, max_rows: int = 50) -> None:
    from rich.table import Table

    counts = Table("state", "jobs", "inputs", title=f"campaign {report.campaign}")
    for state, n in report.counts.items():
        counts.add_row(state, str(n), str(report.inputs.get(state, 0)))
    for state in ("exporting", "export_failed"):
        if state in report.inputs:
            counts.add_row(state, "", str(report.inputs[state]))
    out.print(counts)
    if report.exports:
        from hpcrun.cli.summary import export_line

        out.print(export_line(report.exports), highlight=False, markup=False, emoji=False, soft_wrap=True)
    if report.clusters:
        from hpcrun.cli.summary import cluster_table

        out.print(cluster_table(report.clusters))
    fin = report.finalize
    if fin is not None:
        what = f"job {fin['job_id']} {fin['state'] or fin['status']}" if fin["job_id"] else fin["status"]
        extra = "".join(f", {k} {fin[v]}" for k, v in (("exit", "exit_code"), ("elapsed", "elapsed")) if fin[v])
        out.print(f"finalize (round {fin['round']}, after {fin['after']}): {what}{extra}"
                  + (f" - {fin['reason']}" if fin["reason"] else ""), highlight=False, markup=False, emoji=False,
                  soft_wrap=True)
    if report.paused:
        out.print(f"{report.paused}: new submissions are held (`hpcrun resume`)", highlight=False, markup=False,
                  emoji=False, soft_wrap=True)
    for g in report.generations:   # a campaign planned more than once: each generation's figures
        from hpcrun.operate.campaign.generations import figure_line

        out.print(figure_line(g), highlight=False, markup=False, emoji=False, soft_wrap=True)
    from hpcrun.cli.summary import status_extra_lines

    for line in status_extra_lines(report):   # outages, a spent allocation, the forecast
        out.print(line, highlight=False, markup=False, emoji=False, soft_wrap=True)
    sup = report.supervisor
    if sup is not None:
        out.print(f"supervisor {sup['holder']}: {sup['phase']}, round {sup['rounds']}, last heartbeat "
                  f"{sup['heartbeat_age_s']} s ago", highlight=False, markup=False, emoji=False, soft_wrap=True)
    rows = report.jobs
    if not rows:
        return
    table = Table("job", "status", "slurm id", "slurm state", "exit", "elapsed", "attempts", "reason")
    for r in rows[: None if show_all else max_rows]:
        table.add_row(r.job, r.status, r.slurm_id, r.state, r.exit_code, r.elapsed, str(r.attempts), r.reason)
    out.print(table)
    if not show_all and len(rows) > max_rows:
        out.print(f"... {len(rows) - max_rows} more; --all shows every job", highlight=False)


@main.command("status")
@click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
@DB_OPTION
@click.option("--wait", "wait_", is_flag=True, help="poll until nothing is in flight")
@click.option("--watch", is_flag=True, help="like --wait, with a live progress bar")
@click.option("--timeout", type=float, default=None, help="give up waiting after this many seconds")
@click.option("--interval", type=float, default=None, help=(
    "seconds between polls (default 60, doubling up to 10x while nothing changes; never below the "
    "site's scheduler.min_poll_interval)"))
@click.option("--all", "show_all", is_flag=True,
              help="list every job (also done and never submitted), in the table and in --json")
@click.option("--json", "as_json", is_flag=True)
@reported
def status_cmd(plan_dir: Path, db: Optional[str], wait_: bool, watch: bool, timeout: Optional[float],
               interval: Optional[float], show_all: bool, as_json: bool) -> None:
    """Poll Slurm once for every job in flight, record what changed, and summarise PLAN_DIR's campaign."""
    from hpcrun import api
    from hpcrun.operate.tracking.track import watch as watch_status

    if watch and not as_json:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=out) as bar:
            task = bar.add_task("jobs finished", total=None)

            def tick(rep: Any) -> None:
                bar.update(task, total=len(rep.jobs), completed=rep.finished,
                           description=", ".join(f"{n} {s}" for s, n in rep.counts.items() if n))
            report = watch_status(plan_dir, db=db, timeout=timeout, interval=interval, on_poll=tick,
                                  all_jobs=show_all)
    elif wait_ or watch:
        report = watch_status(plan_dir, db=db, timeout=timeout, interval=interval, all_jobs=show_all)
    else:
        report = api.status(plan_dir, db=db, all_jobs=show_all).raw
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=1))
        return
    _status_table(report, show_all)


@main.command("retry")
@click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
@DB_OPTION
@click.option("--max-attempts", type=click.IntRange(min=1), default=None,
              help="override the spec's retry.max_attempts")
@click.option("--cancelled/--no-cancelled", default=None, help="also retry cancelled jobs (default: the spec's)")
@click.option("--job", "jobs", multiple=True, help="only this plan job (repeatable)")
@click.option("--unpark", is_flag=True, help="give parked jobs (all, or --job) a fresh set of attempts")
@click.option("--dry-run", is_flag=True, help="show what would be retried or parked; change nothing")
@click.option("--exports", is_flag=True, help="only give the given-up exports (outputs.export) new attempts")
@FINALIZE_AGAIN
@click.option("--json", "as_json", is_flag=True)
@reported
def retry_cmd(plan_dir: Path, db: Optional[str], max_attempts: Optional[int], cancelled: Optional[bool],
              jobs: tuple, unpark: bool, dry_run: bool, exports: bool, finalize_again: bool, as_json: bool) -> None:
    """Resubmit failed, timed-out and node-failed jobs of PLAN_DIR; park those out of attempts."""
    from hpcrun import api
    from hpcrun.cli.summary import show_batch

    if exports:
        out.print(f"{api.rearm_exports(plan_dir, db=db)} given-up export(s) will be tried again by the supervisor")
        return
    report = api.retry(plan_dir, db=db, max_attempts=max_attempts, cancelled=cancelled, jobs=jobs, unpark=unpark,
                       dry_run=dry_run, on_batch=None if as_json else show_batch(out, False),
                       finalize_again=finalize_again).raw
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=1))
        return
    verb = "would retry" if dry_run else "retried"
    out.print(f"{verb} {len(report.requeued)} job(s)" + (f": {', '.join(report.requeued[:20])}" if report.requeued
                                                           else ""), highlight=False)
    if report.unparked:
        out.print(f"unparked {len(report.unparked)} job(s): {', '.join(report.unparked[:20])}", highlight=False)
    if report.parked:
        out.print(f"{'would park' if dry_run else 'parked'} {len(report.parked)} job(s) out of attempts: "
                  f"{', '.join(report.parked[:20])}; `hpcrun status` shows why, `hpcrun retry --unpark` "
                  "gives them new attempts", highlight=False)
    if report.submit is not None and report.submit.finalize is not None:
        out.print(f"finalize: {report.submit.finalize.message}", highlight=False, markup=False, emoji=False,
                  soft_wrap=True)


@main.command("report")
@click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
@DB_OPTION
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="report directory (default: PLAN_DIR/report): index.html, report.json, PNG plots")
@click.option("--poll", is_flag=True, help="poll Slurm first (as hpcrun status does)")
@click.option("--no-plots", is_flag=True, help="skip the PNG plots")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON (and write nothing)")
@reported
def report_cmd(plan_dir: Path, db: Optional[str], out_dir: Optional[Path], poll: bool, no_plots: bool,
               as_json: bool) -> None:
    """Success rate, CPU efficiency, throughput, failures and attempts of PLAN_DIR's campaign."""
    from rich.table import Table

    from hpcrun import api
    from hpcrun.report.html import merit_rows, write_report

    result = api.campaign_report(plan_dir, db=db, poll=poll)
    report, store = result.raw, result.store
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=1))
        return
    table = Table("figure", "value", title=f"campaign {report.campaign}")
    for label, value in merit_rows(report):
        table.add_row(label, value)
    out.print(table)
    if report.failures:
        fails = Table("failure", "runs", "example")
        for f in report.failures:
            fails.add_row(f.reason, str(f.count), f.example)
        out.print(fails)
    if report.retry_changes:
        changed = Table("job", "submission", "what the retry changed")
        for job, sid, change in report.retry_changes[-20:]:
            changed.add_row(job, sid, change)
        out.print(changed)
    from hpcrun.report.plots import missing
    why = "" if no_plots else missing()
    if why:
        err.print(f"warning: no plots in the report: {why}", highlight=False, markup=False)
    index = write_report(report, out_dir or Path(plan_dir) / "report", store, plots=not (no_plots or why))
    out.print(f"report: {index}", highlight=False)


@main.command("schema")
@click.argument("kind", type=click.Choice(["campaign", "profile"]))
@reported
def schema(kind: str) -> None:
    """Print the JSON Schema of a campaign spec or a site profile."""
    from hpcrun.model.site import SiteProfile
    from hpcrun.model.spec import Campaign

    model = Campaign if kind == "campaign" else SiteProfile
    click.echo(json.dumps(model.model_json_schema(by_alias=True), indent=1))


def _transfer_size(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[int]:
    from hpcrun.units import UnitError, parse_size

    if value is None:
        return None
    try:
        size = parse_size(value)
    except UnitError as exc:
        raise click.BadParameter(str(exc)) from None
    if size <= 0:
        raise click.BadParameter("a transfer size must be positive")
    return size


class SweepByDefault(click.Group):
    """``hpcrun iotune --transfer-size 1m,4m ...`` is ``hpcrun iotune run --transfer-size ...``:
    a sweep is the group's default action when its first word is an option (not --help). Its sweep commands
    are registered when the group is first used: they import the I/O engines and the site model (pydantic),
    about a third of a second that every other command, `hpcrun run` first, does without."""

    registered = False

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)

    def _register(self) -> None:
        if not self.registered:
            from hpcrun.cli.iotune import register

            register(self)
            self.registered = True

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        self._register()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> List[str]:
        self._register()
        return super().list_commands(ctx)


@main.group("iotune", cls=SweepByDefault, invoke_without_command=True)
@click.pass_context
def iotune_group(ctx: click.Context) -> None:
    """I/O tuning: sweeps with fio or IOR, results and advice; Darshan log summaries.

    `hpcrun iotune --transfer-size 1m,4m ...` (options first) runs a sweep like `hpcrun iotune run`."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@iotune_group.command("darshan")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print JSON (one object per log) instead of a table")
@click.option("--best-transfer-size", "best", metavar="SIZE", callback=_transfer_size,
              help="say when a log's most common access size is more than 4x away from SIZE (e.g. 1MiB, 4M)")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="seconds allowed to read one log (each log is read in its own process)")
@reported
def iotune_darshan(logs: tuple, as_json: bool, best: Optional[int], timeout: float) -> None:
    """Summarise Darshan LOGs: bytes, access sizes, time in I/O, bandwidth, excluded paths.

    Exit code 0 when every log was summarised, 1 when some could not be read.
    """
    from hpcrun.iotune.readers.darshan import DarshanLogError, DarshanSummary, advise, summarise_many
    from hpcrun.iotune.readers.darshan_report import darshan_details, darshan_json, darshan_table

    results = summarise_many([str(p) for p in logs], timeout=timeout)
    failed = [r for r in results if isinstance(r, DarshanLogError)]
    if as_json:
        click.echo(json.dumps(darshan_json(results, best), indent=1))
    else:
        good = [r for r in results if isinstance(r, DarshanSummary)]
        if good:
            out.print(darshan_table(good))
        for s in good:
            out.print(darshan_details(s), highlight=False, soft_wrap=True)
            for warning in s.warnings:
                out.print(f"[yellow]warning:[/] {s.source}: {warning}", highlight=False, soft_wrap=True)
            tip = advise(s, best) if best else None
            if tip:
                out.print(f"[cyan]advice:[/] {tip}", highlight=False, soft_wrap=True)
    for exc in failed:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    if failed:
        sys.exit(1)


def _register_commands() -> None:
    from hpcrun.cli.campaign import register as register_campaign
    from hpcrun.cli.profiles import register as register_profiles
    from hpcrun.cli.team import register as register_team

    register_campaign(main, DB_OPTION, reported, out)
    register_team(main, DB_OPTION, reported, out)
    register_profiles(main, reported, out)


_register_commands()


if __name__ == "__main__":  # pragma: no cover
    main()
