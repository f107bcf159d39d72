"""Render a SweepPlan into its batch job script (templates/iotune.sh.j2).

Python turns every word into shell text here: literal parts are single-quoted
(:func:`hpcrun.shell.quote`); the two run-time placeholders become ``"$POINT_DIR"`` and
``"$RAW"``. The template only lays the words out.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from hpcrun import __version__
from hpcrun.backends.burstbuffer.base import grammar_checked
from hpcrun.backends.burstbuffer.grammar import check_script
from hpcrun.backends.scheduler import scheduler_for
from hpcrun.errors import HpcrunError
from hpcrun.iotune.engines import engine_for
from hpcrun.iotune.points import DIR, RAW, Point, Step
from hpcrun.iotune.sweeps.plan import SweepPlan, job_request, target_dir_expr, target_root_expr
from hpcrun.plan.job.requests import launcher
from hpcrun.render.scripts import environment, scheduler_context
from hpcrun.resources import site_template_dirs
from hpcrun.shell import Shell, comment, quote
from hpcrun.units import format_size

TEMPLATE = "iotune.sh.j2"
_VARS = {DIR: '"$POINT_DIR"', RAW: '"$RAW"'}


def word(text: str) -> Shell:
    """One shell word; placeholders become double-quoted variable references."""
    out: List[str] = []
    literal = ""
    i = 0
    while i < len(text):
        hit = next((k for k in _VARS if text.startswith(k, i)), None)
        if hit is None:
            literal += text[i]
            i += 1
            continue
        if literal:
            out.append(quote(literal))
            literal = ""
        out.append(_VARS[hit])
        i += len(hit)
    if literal or not out:
        out.append(quote(literal))
    return Shell("".join(out))


def words(argv: Sequence[str]) -> Shell:
    return Shell(" ".join(word(w) for w in argv))


def label(point: Point) -> str:
    return (f"target {point.target}, {point.api}, {point.nodes} node(s) x {point.writers} writer(s), "
            f"transfer {format_size(point.transfer)}, block {format_size(point.block)}, {point.layout}")


def step_words(plan: SweepPlan, step: Step) -> Shell:
    """launcher, container prefix, Darshan variables and the engine argv, as shell text."""
    parts: List[str] = []
    assert plan.runtime is not None
    if step.ranks is not None:
        nodes, per_node = step.ranks
        parts += [quote(w) for w in launcher(plan.profile)]
        parts += [quote(w) for w in plan.profile.iotune.mpi_launch_options]
        parts += scheduler_for(plan.profile.scheduler.kind).launch_options(
            str(nodes), str(nodes * per_node), str(per_node), step=False,
            overcommit=bool(plan.partition and per_node > plan.partition.cpus))
    prefix = plan.runtime.prefix()
    if prefix:
        parts.append(prefix)
    if step.env:
        if plan.runtime.name == "shifter":
            # Shifter drops LD_* from the environment it passes in; --env= sets them inside
            parts += [word(f"--env={k}={v}") for k, v in step.env]
        else:
            parts += ["env"] + [word(f"{k}={v}") for k, v in step.env]
    parts.append(words(step.argv))
    return Shell(" ".join(parts))


def context(plan: SweepPlan, out_dir: str) -> Dict[str, Any]:
    version_argv = engine_for(plan.engine).version_argv(plan.engine_bin)
    env = sorted(plan.profile.prologue.env.items())
    targets = []
    for t in plan.targets:
        points = []
        for p in plan.points:
            if p.target != t.name:
                continue
            points.append({"id": p.id, "label": comment(label(p)), "log": quote(f"{p.id}: {label(p)}"), "steps": [
                {"name": s.name, "stdout": quote(s.stdout), "words": step_words(plan, s),
                 "darshan_dir": quote(s.darshan) if s.darshan and not s.darshan.endswith(".darshan") else Shell("")}
                for s in plan.steps_of(p)]})
        # target paths hold no newline (validated), so a label is safe in a comment
        shown = t.name + (f" ({t.path})" if t.path and t.kind != "path" else "")
        targets.append({"index": t.index, "label": comment(shown), "root_expr": Shell(target_root_expr(plan, t)),
                        "dir_expr": Shell(target_dir_expr(plan, t)), "points": points})
    return {
        "version": __version__, "sweep_name": plan.sweep.name, "engine": plan.engine,
        "profile_name": plan.profile.name, "out_dir": quote(out_dir), "out_dir_shown": comment(out_dir),
        **scheduler_context(plan.profile.scheduler.kind, job_request(plan, out_dir)),
        "bb_lines": [Shell(line) for line in plan.bb_lines],
        "env": env, "modules": list(plan.profile.prologue.modules),
        "darshan_lib": quote(plan.darshan_lib) if plan.darshan_lib else Shell(""),
        "version_command": words(version_argv), "targets": targets, "points": plan.points,
    }


def render(plan: SweepPlan, out_dir: str) -> str:
    env = environment(site_template_dirs(plan.profile_files))
    text = env.get_template(TEMPLATE).render(context(plan, out_dir))
    bbset = plan.profile.burst_buffer
    problems = check_script(text.splitlines(), "#" + bbset.directive, grammar_checked(bbset.system),
                            job_directive=scheduler_for(plan.profile.scheduler.kind).directive)
    if problems:
        raise HpcrunError(f"the rendered sweep job has invalid directives: {problems}; this is a bug in "
                          "hpcrun or a site template")
    return text
