"""``hpcrun profiles``: list, show and validate site profiles; draft one from a live cluster
(``init --cluster``) and compare one with it (``check --live``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import click
import yaml

from hpcrun.errors import HpcrunError, InputError, Problem


def register(main: click.Group, reported: Any, out: Any) -> None:
    """Add the ``profiles`` group to the top-level group."""

    @main.group()
    def profiles() -> None:
        """List, show, validate, draft (from a live cluster) and check site profiles."""

    for add in (_list, _show, _validate, _init, _check):
        add(profiles, reported, out)


def _list(group: click.Group, reported: Any, out: Any) -> None:
    @group.command("list")
    @click.option("--json", "as_json", is_flag=True, help="print a JSON list instead of a table")
    @reported
    def profiles_list(as_json: bool) -> None:
        """Profiles on the search path (HPCRUN_PROFILE_PATH, ~/.config/hpcrun, shipped)."""
        from rich.table import Table

        from hpcrun.model.profiles import available, load_profile

        rows: List[Dict[str, Any]] = []
        for name, ref in sorted(available().items()):
            try:
                p = load_profile(str(ref.path)).profile
                rows.append({"name": name, "extends": p.extends, "description": p.description,
                             "file": str(ref.path), "valid": True, "partitions": sorted(p.partitions),
                             "default_partition": p.default_partition,
                             "containers": p.containers.offered(), "burst_buffer": p.burst_buffer.system,
                             "scheduler": p.scheduler.kind})
            except HpcrunError as exc:
                rows.append({"name": name, "file": str(ref.path), "valid": False, "error": str(exc)})
        if as_json:
            click.echo(json.dumps(rows, indent=1))
            return
        table = Table("name", "extends", "description", "file")
        for r in rows:
            if r["valid"]:
                table.add_row(str(r["name"]), str(r["extends"] or ""), str(r["description"] or ""), str(r["file"]))
            else:
                table.add_row(str(r["name"]), "?", "[red]invalid: run hpcrun profiles validate[/]", str(r["file"]))
        out.print(table)


def _show(group: click.Group, reported: Any, out: Any) -> None:
    @group.command("show")
    @click.argument("name")
    @click.option("--resolved", is_flag=True, help="print the merged profile after extends layering")
    @reported
    def profiles_show(name: str, resolved: bool) -> None:
        """Print a profile as written, or --resolved after layering."""
        from hpcrun.model.profiles import load_profile, locate

        if not resolved:
            click.echo(locate(name).read_text(encoding="utf-8"), nl=False)
            return
        loaded = load_profile(name)  # validates the merged result
        click.echo(f"# {name} resolved from: " + " <- ".join(str(p) for p in loaded.files))
        click.echo("# values as written (sizes and durations keep their units)")
        click.echo(yaml.safe_dump(loaded.source.data, sort_keys=False), nl=False)


def _validate(group: click.Group, reported: Any, out: Any) -> None:
    @group.command("validate")
    @click.argument("names", nargs=-1)
    @reported
    def profiles_validate(names: tuple) -> None:
        """Validate profiles (all on the search path when no NAME is given)."""
        from hpcrun.errors import InputError
        from hpcrun.model.profiles import available, load_profile

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


def _init(group: click.Group, reported: Any, out: Any) -> None:
    @group.command("init")
    @click.option("--cluster", "cluster", default=None, metavar="NAME",
                  help="the cluster to ask (Slurm: its ClusterName; default: the one this host talks to)")
    @click.option("--name", "name", default=None, help="the new profile's name (default: the cluster's)")
    @click.option("--out", "out_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
                  help="write the draft here (refused if the file exists); default: print it")
    @click.option("--scheduler", "kind", default="slurm", show_default=True, help="the scheduler to ask")
    @reported
    def profiles_init(cluster: Optional[str], name: Optional[str], out_file: Optional[Path], kind: str) -> None:
        """Draft a site profile from what the live scheduler says (partitions, node CPUs and memory,
        MaxTime, QOS, MaxArraySize, MaxSubmitJobs, burst-buffer pools); what it cannot know is marked TODO."""
        from hpcrun.backends.scheduler import scheduler_for
        from hpcrun.model.live import draft_profile

        facts = scheduler_for(kind, cluster).describe()
        text = draft_profile(facts, name, cluster)
        if out_file is None:
            click.echo(text, nl=False)
            return
        if out_file.exists():
            raise InputError([Problem(str(out_file), None, "--out", (
                "exists; choose a new file (a draft never overwrites a profile)"))])
        out_file.write_text(text, encoding="utf-8")
        out.print(f"wrote {out_file}: fill in the TODO lines, then `hpcrun profiles validate {out_file}`",
                  highlight=False, markup=False)


def _check(group: click.Group, reported: Any, out: Any) -> None:
    @group.command("check")
    @click.argument("name")
    @click.option("--live", is_flag=True, required=True, help="compare with the live cluster (required)")
    @click.option("--json", "as_json", is_flag=True)
    @reported
    def profiles_check(name: str, live: bool, as_json: bool) -> None:
        """List where profile NAME and its live cluster disagree; exit 1 when they do, 0 when they agree."""
        from hpcrun.backends.scheduler import scheduler_for
        from hpcrun.model.live import live_differences
        from hpcrun.model.profiles import load_profile

        profile = load_profile(name).profile
        facts = scheduler_for(profile.scheduler.kind, profile.scheduler.cluster).describe()
        found = live_differences(profile, facts)
        if as_json:
            click.echo(json.dumps({"profile": profile.name, "cluster": facts.name, "differences": found}, indent=1))
        elif found:
            out.print(f"profile {profile.name} and cluster {facts.name} disagree:", highlight=False, markup=False)
            for line in found:
                out.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        else:
            out.print(f"profile {profile.name} matches cluster {facts.name}", highlight=False, markup=False)
        if found:
            sys.exit(1)
