"""Command-line commands of the sweep side of ``hpcrun iotune``: ``run``, ``collect`` and
``history``, registered onto the ``iotune`` group that hpcrun/cli.py creates. Parse options,
call the library, print; nothing else."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import click

from hpcrun.errors import InputError, Problem
from hpcrun.iotune.engines import names as engine_names
from hpcrun.model.kinds import RUNTIMES

CL = "<command line>"


def _split(values: Tuple[str, ...]) -> List[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _ints(values: Tuple[str, ...], option: str) -> Optional[List[int]]:
    if not values:
        return None
    out = []
    for v in _split(values):
        if not v.isdigit():
            raise InputError([Problem(CL, None, option, f"'{v}' is not a whole number; give e.g. 1,4,16")])
        out.append(int(v))
    return out


def _targets(values: Tuple[str, ...]) -> Optional[List[str]]:
    """--target may repeat; a value is split on commas unless it is a path (paths may hold commas)."""
    out: List[str] = []
    for value in values:
        out += [value] if value.startswith("/") else [v.strip() for v in value.split(",") if v.strip()]
    return out or None


def overrides(opts: Dict[str, Any]) -> Dict[str, Any]:
    ops = [op for op in ("write", "read") if opts[op]]
    layout = None if opts["file_per_process"] is None else (
        "file-per-process" if opts["file_per_process"] else "shared-file")
    container = None
    if opts["container"] or opts["image"]:
        container = {"runtime": opts["container"] or "none"}
        if opts["image"]:
            container["image"] = opts["image"]
    return {
        "name": opts["name"], "transfer_sizes": _split(opts["transfer_size"]) or None,
        "block_sizes": _split(opts["block_size"]) or None, "writers": _ints(opts["writers"], "--writers"),
        "nodes": _ints(opts["nodes"], "--nodes"), "apis": _split(opts["api"]) or None, "layout": layout,
        "targets": _targets(opts["target"]), "reps": opts["reps"], "operations": ops or None,
        "engine": opts["engine"], "darshan": True if opts["darshan"] else None,
        "direct": True if opts["direct"] else None, "walltime": opts["walltime"],
        "partition": opts["partition"], "container": container,
    }


def load_profile_or_local(name: Optional[str], local: bool) -> Any:
    """The named profile; with --local and no --profile, a bare one for this node."""
    from hpcrun.model.profiles import load_profile

    if name:
        return load_profile(name)
    if not local:
        raise InputError([Problem(CL, None, "--profile", (
            "a batch sweep needs a site profile (--profile NAME or PATH; `hpcrun profiles list` shows "
            "them); only --local may go without one"))])
    from hpcrun.model.profiles import LoadedProfile
    from hpcrun.model.site import SiteProfile
    from hpcrun.model.yamlsrc import Located

    data = {"name": "this-node", "partitions": {"local": {
        "nodes": 1, "cores_per_node": os.cpu_count() or 1, "memory_per_node": 0,
        "max_walltime": "365d"}}, "default_partition": "local"}
    return LoadedProfile(SiteProfile.model_validate(data), Located(data, "<no profile>", {}), [])


def results_table(results: Dict[str, Any]) -> Any:
    """One row per point and operation; api, nodes and block only when the sweep varies them."""
    from rich.table import Table

    from hpcrun.units import format_size

    rows = results["results"]
    varying = [k for k in ("api", "nodes", "block") if len({r[k] for r in rows}) > 1]
    table = Table("point", "target", *varying, "writers", "transfer", "op", "MiB/s", "min..max", "note",
                  title=f"{results['name']}: {results['engine']['name']} {results['engine']['version']} "
                        f"on {results['environment'].get('node') or '?'}")
    for r in rows:
        if r.get("error"):
            bw, span, note = "-", "", f"[red]{r['error']}[/]"
        else:
            bw = f"{r['bw_mib_mean']:.1f}"
            span = f"{r['bw_mib_min']:.1f}..{r['bw_mib_max']:.1f}" if r["reps"] > 1 else ""
            note = f"[yellow]{r['darshan_warning']}[/]" if r.get("darshan_warning") else ""
        extra = [format_size(r[k]) if k == "block" else str(r[k]) for k in varying]
        table.add_row(r["id"], r["target"], *extra, str(r["writers"]), format_size(r["transfer"]),
                      r["operation"], bw, span, note)
    return table


def _show(results: Dict[str, Any], as_json: bool, extra: Dict[str, Any]) -> None:
    from hpcrun.cli import out

    if as_json:
        click.echo(json.dumps(dict(results, **extra), indent=1))
        return
    out.print(results_table(results))
    rec = results["recommendation"]
    for t, per_op in rec["per_target"].items():
        for choice in per_op.values():
            if choice and len(rec["per_target"]) > 1:
                out.print(f"  {t}: {choice['text']}", highlight=False)
    if rec.get("overall"):
        out.print(f"[bold]recommendation[/] ({rec['operation']}): {rec['overall']['text']}", highlight=False)
    else:
        out.print("[red]no point succeeded; no recommendation[/]")
    for key, value in extra.items():
        if value:
            out.print(f"{key.replace('_', ' ')}: {value}", highlight=False)


def _finish(sweep_dir: Path, results: Dict[str, Any], apply_to: Optional[Path], as_json: bool) -> None:
    from hpcrun.iotune import history
    from hpcrun.iotune.apply import apply
    from hpcrun.iotune.plot import plot
    from hpcrun.iotune.sweeps.outdir import PLOT, RESULTS, write_json

    write_json(sweep_dir / RESULTS, results)
    try:
        plotted = plot(results, sweep_dir / PLOT)
    except Exception as exc:  # noqa: BLE001 - a plot must never cost the results
        from hpcrun.cli import err

        err.print(f"warning: no plot: {type(exc).__name__}: {exc}", highlight=False, markup=False)
        plotted = False
    history.append(results, str(sweep_dir))
    applied = None
    if apply_to is not None:
        path, _ = apply(apply_to, results["recommendation"], results["environment"].get("date") or
                        results["collected"], str(sweep_dir))
        applied = str(path)
    _show(results, as_json, {"results_file": str(sweep_dir / RESULTS),
                             "plot_file": str(sweep_dir / PLOT) if plotted else None,
                             "history_file": str(history.path()), "applied_to": applied})


def register(group: click.Group) -> None:
    """Add ``run``, ``collect`` and ``history`` to the ``hpcrun iotune`` group."""
    from hpcrun.cli import reported

    for add in (_run_command, _collect_command, _history_command):
        add(group, reported)


def _run_command(group: click.Group, reported: Callable[..., Any]) -> None:
    @group.command("run")
    @click.argument("preset", required=False)
    @click.option("--transfer-size", multiple=True, help="bytes per I/O call, comma-separated (64k,1m,4m,16m)")
    @click.option("--block-size", multiple=True, help="bytes per writer, comma-separated (default: from transfers)")
    @click.option("--writers", multiple=True, help="writers per node, comma-separated (1,4,16)")
    @click.option("--nodes", multiple=True, help="node counts, comma-separated (IOR only beyond 1)")
    @click.option("--api", multiple=True, help="posix, mpiio, hdf5 (comma-separated; fio: posix only)")
    @click.option("--file-per-process/--shared-file", "file_per_process", default=None,
                  help="one file per writer (default) or one shared file")
    @click.option("--target", multiple=True, help="bb, scratch, node-local or an absolute PATH (repeatable)")
    @click.option("--reps", type=int, default=None, help="repetitions of each point")
    @click.option("--write", "write", is_flag=True, help="measure writes (default: writes and reads)")
    @click.option("--read", "read", is_flag=True, help="measure reads (default: writes and reads)")
    @click.option("--engine", type=click.Choice(["auto", *engine_names()]), default=None)
    @click.option("--darshan", is_flag=True, help="run every point under Darshan (profile tools.darshan_lib)")
    @click.option("--direct", is_flag=True, help="O_DIRECT I/O (not on tmpfs)")
    @click.option("--walltime", default=None, help="time limit of the sweep job (30m, '01:00:00')")
    @click.option("--partition", default=None, help="partition (default: the profile's)")
    @click.option("--container", type=click.Choice(RUNTIMES), default=None, help="container runtime")
    @click.option("--image", default=None, help="container image")
    @click.option("--name", default=None, help="sweep name (default: the preset's, or 'sweep')")
    @click.option("--profile", "profile_name", default=None, help="site profile name or YAML path")
    @click.option("--local", is_flag=True, help="run the sweep now on this node")
    @click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
                  help="sweep directory (default ./<name>.iotune); on a filesystem compute nodes see")
    @click.option("--submit", is_flag=True, help="submit the rendered job to the scheduler")
    @click.option("--force", is_flag=True, help="replace a sweep directory that was already submitted")
    @click.option("--apply", "apply_to", type=click.Path(path_type=Path), default=None,
                  help="with --local: write the recommendation into this site profile YAML")
    @click.option("--json", "as_json", is_flag=True, help="print JSON")
    @reported
    def run_cmd(preset: Optional[str], profile_name: Optional[str], local: bool, out_dir: Optional[Path],
                submit: bool, force: bool, apply_to: Optional[Path], as_json: bool, **opts: Any) -> None:
        """Measure bandwidth over transfer sizes, writers and targets (PRESET: iobench/<name>.yaml or a path).

        Default: render a batch job into --out (submit it with --submit, then `hpcrun iotune
        collect DIR`). --local: run it now on this node and print the results.
        """
        from hpcrun.iotune.sweeps.plan import plan_sweep
        from hpcrun.iotune.sweeps.presets import load_sweep

        if local and submit:
            raise InputError([Problem(CL, None, "--submit", "--local runs the sweep now; --submit is for batch jobs")])
        if apply_to is not None and not local:
            raise InputError([Problem(CL, None, "--apply", (
                "a batch sweep has no results yet; use `hpcrun iotune collect DIR --apply PROFILE` "
                "when it has ended"))])
        sweep, src = load_sweep(preset, overrides(opts))
        loaded = load_profile_or_local(profile_name, local)
        plan = plan_sweep(sweep, src, loaded.profile, loaded.source, loaded.files, local)
        if local:
            _run_local(plan, out_dir, force, apply_to, as_json)
        else:
            _render_batch(plan, out_dir, force, submit, as_json)



def _collect_command(group: click.Group, reported: Callable[..., Any]) -> None:
    @group.command("collect")
    @click.argument("sweep_dir", type=click.Path(path_type=Path, file_okay=False))
    @click.option("--apply", "apply_to", type=click.Path(path_type=Path), default=None,
                  help="write the recommendation into this site profile YAML")
    @click.option("--json", "as_json", is_flag=True, help="print JSON")
    @reported
    def collect_cmd(sweep_dir: Path, apply_to: Optional[Path], as_json: bool) -> None:
        """Gather the results of a sweep job that has ended: table, results.json, plot, history."""
        from hpcrun.iotune.collect import NotFinished, collect, finished
        from hpcrun.iotune.sweeps.outdir import SUBMITTED, read_manifest

        sweep_dir = Path(os.path.abspath(sweep_dir))
        manifest = read_manifest(sweep_dir)
        state = None
        if not finished(sweep_dir) and (sweep_dir / SUBMITTED).is_file():
            state = _job_state(sweep_dir / SUBMITTED)
            if state is None or state not in _terminal():
                raise NotFinished([Problem(str(sweep_dir), None, "DIR", (
                    f"the sweep job has not ended yet (job state {state or 'unknown'}); run collect again "
                    "when it has"))])
        results = collect(sweep_dir, manifest, state)
        _finish(sweep_dir, results, apply_to, as_json)



def _history_command(group: click.Group, reported: Callable[..., Any]) -> None:
    @group.command("history")
    @click.option("--name", default=None, help="only sweeps with this name")
    @click.option("--json", "as_json", is_flag=True, help="print JSON")
    @reported
    def history_cmd(name: Optional[str], as_json: bool) -> None:
        """Sweeps collected so far (oldest first), with their recommendation."""
        from rich.table import Table

        from hpcrun.cli import out
        from hpcrun.iotune import history

        rows = [h for h in history.read() if name is None or h.get("name") == name]
        if as_json:
            click.echo(json.dumps(rows, indent=1))
            return
        table = Table("date", "sweep", "engine", "node", "targets", "recommendation", "dir",
                      title=str(history.path()))
        from hpcrun.units import format_size

        for h in rows:
            overall = (h.get("recommendation") or {}).get("overall")
            short = "-"
            if overall:
                rec = overall["recommended"]
                short = (f"{format_size(rec['transfer'])} x {rec['writers']} on {rec['target']}: "
                         f"{rec['bw_mib_mean']:.1f} MiB/s ({overall['operation']})")
            table.add_row(str((h.get("environment") or {}).get("date") or h.get("collected")), str(h.get("name")),
                          f"{h['engine']['name']} {h['engine']['version']}" if h.get("engine") else "?",
                          str((h.get("environment") or {}).get("node")),
                          ", ".join(t["name"] for t in h.get("targets", [])),
                          short, str(h.get("dir")))
        out.print(table)


def _terminal() -> Any:
    from hpcrun.backends.scheduler.base import TERMINAL

    return TERMINAL


def _job_state(record: Path) -> Optional[str]:
    from hpcrun.backends.scheduler import DEFAULT, scheduler_for
    from hpcrun.backends.scheduler.base import SchedulerError

    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        return scheduler_for(data.get("scheduler", DEFAULT)).state_of(data["job_id"])
    except (OSError, ValueError, KeyError, SchedulerError):
        return None


def _default_dir(plan: Any, out_dir: Optional[Path]) -> Path:
    return out_dir if out_dir is not None else Path(f"{plan.sweep.name}.iotune")


def _run_local(plan: Any, out_dir: Optional[Path], force: bool, apply_to: Optional[Path], as_json: bool) -> None:
    from hpcrun.cli import err
    from hpcrun.iotune.collect import collect
    from hpcrun.iotune.sweeps import local, manifest
    from hpcrun.iotune.sweeps.manifest import SweepManifest
    from hpcrun.iotune.sweeps.outdir import MANIFEST, check, staging, write_json

    target = check(_default_dir(plan, out_dir), force)
    data = manifest.build(plan, str(target))
    total = len(plan.steps)
    done = [0]

    def progress(point: Any, step: Any) -> None:
        done[0] += 1
        if not as_json:
            err.print(f"[{done[0]}/{total}] {step.name}", highlight=False)

    import threading

    from hpcrun.iotune.plot import warm_up

    threading.Thread(target=warm_up, daemon=True).start()   # overlaps the engine runs
    with staging(target) as tmp:
        write_json(tmp / MANIFEST, data)
        local.run(plan, tmp, progress)
        results = collect(tmp, SweepManifest.from_dict(data))
    _finish(target, results, apply_to, as_json)


def _render_batch(plan: Any, out_dir: Optional[Path], force: bool, submit: bool, as_json: bool) -> None:
    import datetime as dt

    from hpcrun.backends.scheduler import scheduler_for
    from hpcrun.cli import out
    from hpcrun.iotune.sweeps import jobscript, manifest
    from hpcrun.iotune.sweeps.outdir import MANIFEST, SCRIPT, SUBMITTED, check, staging, write_json, write_text

    target = check(_default_dir(plan, out_dir), force)
    script = jobscript.render(plan, str(target))
    data = manifest.build(plan, str(target))
    with staging(target) as tmp:
        write_json(tmp / MANIFEST, data)
        write_text(tmp / SCRIPT, script, 0o755)
    job_id = None
    sched = scheduler_for(plan.profile.scheduler.kind)
    if submit:
        job_id = sched.submit(target / SCRIPT, name="iotune-" + plan.sweep.name)
        write_json(target / SUBMITTED, {"job_id": job_id, "script": SCRIPT, "scheduler": sched.name,
                                        "submitted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    summary = {"dir": str(target), "script": str(target / SCRIPT), "engine": plan.engine,
               "points": len(plan.points), "steps": len(plan.steps),
               "targets": [t.name for t in plan.targets], "bb_capacity_bytes": plan.bb_capacity or None,
               "job_id": job_id, "sweep_id": data["sweep_id"]}
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    out.print(f"sweep {plan.sweep.name}: {len(plan.points)} point(s), {len(plan.steps)} {plan.engine} run(s) "
              f"on {', '.join(t.name for t in plan.targets)}", highlight=False)
    if plan.bb_lines:
        out.print("burst buffer: " + plan.bb_lines[0], highlight=False)
    out.print(f"job script: {target / SCRIPT}", highlight=False)
    if job_id:
        out.print(f"submitted: job {job_id}; when it has ended: hpcrun iotune collect {target}", highlight=False)
    else:
        out.print(f"submit with: {sched.submit_command(str(target / SCRIPT))}  (or re-run with --submit)",
                  highlight=False)
