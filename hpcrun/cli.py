"""Command-line interface: parse arguments, call the library, print. Nothing else."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import click
import yaml
from rich.console import Console

from . import __version__
from .errors import HpcrunError

out = Console()
err = Console(stderr=True)


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
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="plan directory (default: ./<campaign>.plan); should be on a filesystem "
                   "the compute nodes see")
@click.option("--json", "as_json", is_flag=True, help="print a JSON summary instead of a table")
@click.option("--diff", "want_diff", is_flag=True, help="show what changed against the previous plan")
@click.option("--force", is_flag=True, help="replace a plan directory that was already submitted")
@reported
def plan_cmd(spec: Path, out_dir: Optional[Path], as_json: bool, want_diff: bool, force: bool) -> None:
    """Validate SPEC, expand it into jobs and write scripts and a manifest."""
    from .pipeline import load_plan
    from .plandir import write_plan
    from .summary import plan_json, plan_table

    plan = load_plan(spec)
    target = out_dir or Path(f"{plan.campaign.name}.plan")
    result = write_plan(plan, target, want_diff=want_diff, force=force)
    if as_json:
        click.echo(json.dumps(plan_json(result.manifest, str(result.out_dir), result.diff), indent=1))
        return
    out.print(plan_table(plan, str(result.out_dir)))
    if want_diff:
        if result.diff:
            click.echo(result.diff, nl=False)
        else:
            out.print("no changes against the previous plan")


@main.command("submit")
@click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--dry-run", is_flag=True, help="show what would be submitted")
@reported
def submit_cmd(plan_dir: Path, dry_run: bool) -> None:
    """Submit the scripts of PLAN_DIR that have not been submitted yet."""
    from .submit import submit

    def show(sub):  # type: ignore[no-untyped-def]
        what = f"array {sub.array}" if sub.array else "job"
        out.print(f"{'would submit' if dry_run else 'submitted'} {sub.script} ({what}): {sub.job_id}",
                  highlight=False)
    new = submit(plan_dir, dry_run=dry_run, progress=show)
    if not new:
        out.print("nothing to submit: every script of this plan has a recorded job id")


@main.command("status")
@click.argument("plan_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--wait", "wait_", is_flag=True, help="poll until every job has ended")
@click.option("--timeout", type=float, default=None, help="give up waiting after this many seconds")
@click.option("--json", "as_json", is_flag=True)
@reported
def status_cmd(plan_dir: Path, wait_: bool, timeout: Optional[float], as_json: bool) -> None:
    """Slurm state, exit code and failure reason of every job of PLAN_DIR."""
    from rich.table import Table

    from .status import collect, wait

    rows = wait(plan_dir, timeout=timeout) if wait_ else collect(plan_dir)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=1))
        return
    table = Table("job", "slurm id", "state", "exit", "elapsed", "reason")
    for r in rows:
        table.add_row(r.job, r.slurm_id, r.state, r.exit_code, r.elapsed, r.reason)
    out.print(table)
    counts: dict = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    out.print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no jobs submitted yet")


@main.group()
def profiles() -> None:
    """List, show and validate site profiles."""


@profiles.command("list")
@reported
def profiles_list() -> None:
    """Profiles on the search path (HPCRUN_PROFILE_PATH, ~/.config/hpcrun, shipped)."""
    from rich.table import Table

    from .profiles import available, load_profile

    table = Table("name", "extends", "description", "file")
    for name, ref in sorted(available().items()):
        try:
            loaded = load_profile(str(ref.path))
            table.add_row(name, loaded.profile.extends or "", loaded.profile.description or "", str(ref.path))
        except HpcrunError:
            table.add_row(name, "?", "[red]invalid: run hpcrun profiles validate[/]", str(ref.path))
    out.print(table)


@profiles.command("show")
@click.argument("name")
@click.option("--resolved", is_flag=True, help="print the merged profile after extends layering")
@reported
def profiles_show(name: str, resolved: bool) -> None:
    """Print a profile as written, or --resolved after layering."""
    from .profiles import load_profile, locate

    if not resolved:
        click.echo(locate(name).read_text(encoding="utf-8"), nl=False)
        return
    loaded = load_profile(name)  # validates the merged result
    click.echo(f"# {name} resolved from: " + " <- ".join(str(p) for p in loaded.files))
    click.echo("# values as written (sizes and durations keep their units)")
    click.echo(yaml.safe_dump(loaded.source.data, sort_keys=False), nl=False)


@profiles.command("validate")
@click.argument("names", nargs=-1)
@reported
def profiles_validate(names: tuple) -> None:
    """Validate profiles (all on the search path when no NAME is given)."""
    from .errors import InputError
    from .profiles import available, load_profile

    targets = list(names) or sorted(available())
    problems = []
    for name in targets:
        try:
            load_profile(name)
            out.print(f"[green]ok[/] {name}")
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)


@main.command("schema")
@click.argument("kind", type=click.Choice(["campaign", "profile"]))
@reported
def schema(kind: str) -> None:
    """Print the JSON Schema of a campaign spec or a site profile."""
    from .profile import SiteProfile
    from .spec import Campaign

    model = Campaign if kind == "campaign" else SiteProfile
    click.echo(json.dumps(model.model_json_schema(by_alias=True), indent=1))


@main.group("iotune", invoke_without_command=True)
@click.pass_context
def iotune_group(ctx: click.Context) -> None:
    """I/O sweeps with fio or IOR: bandwidth by transfer size, writers and target, and advice."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def _register_iotune() -> None:
    from .iotune.cli_sweep import register

    register(iotune_group)


_register_iotune()


if __name__ == "__main__":  # pragma: no cover
    main()
