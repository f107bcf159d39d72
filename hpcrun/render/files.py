"""Every file of a plan directory but the manifest, one at a time (each written and dropped)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, List

from hpcrun.backends.late import agent, direct, layout, runs
from hpcrun.plan.job.commands import HDF5_HELPER
from hpcrun.plan.job.pilots import AGENT_DIRECT, AGENT_LAYOUT, AGENT_RUNS, AGENT_SCRIPT, PILOT_SCRIPT
from hpcrun.plan.values import Plan
from hpcrun.render.headers import at_submission, header_files
from hpcrun.render.scripts import (
    BODY_PATH,
    TASKS_INDEX,
    TASKS_PATH,
    RenderedFile,
    common_context,
    environment,
    render_body,
    render_finalize,
    render_pilot,
    render_script,
    script_path,
    shared_body,
    tasks_chunks,
    tasks_index_chunks,
    template_dirs,
)


def render_all(plan: Plan, plan_dir: str) -> List[RenderedFile]:
    """Every file of a plan directory except the manifest (which needs their digests), whole."""
    return [f if f.chunks is None else RenderedFile(f.path, "".join(f.chunks), f.executable)
            for f in iter_rendered(plan, plan_dir)]


def iter_rendered(plan: Plan, plan_dir: str, tasks: bool = True) -> Iterator[RenderedFile]:
    """render_all one file at a time, so a caller can write each and drop its text: the first
    cluster's files, then each other cluster's scripts and helpers (the shared ones once), then
    the task table (unless the caller writes it beside the manifest, from the same pass over the jobs)."""
    seen = set()
    for p in plan.all_clusters:
        for f in _iter_cluster(p, plan_dir):
            if f.path not in seen:
                seen.add(f.path)
                yield f
    if tasks:
        yield RenderedFile(TASKS_PATH, "", chunks=tasks_chunks(plan), digest=False)
        yield RenderedFile(TASKS_INDEX, "", chunks=tasks_index_chunks(plan), digest=False)


def _agent_files(own: str) -> Iterator[RenderedFile]:
    """The pilot's agent and the queue's protocol it shares with the supervisor, shipped as they are in hpcrun
    (standard library only: a compute node needs python3, not hpcrun)."""
    yield RenderedFile(own + AGENT_SCRIPT, Path(agent.__file__).read_text(), True)
    yield RenderedFile(own + AGENT_LAYOUT, Path(layout.__file__).read_text(), False)
    yield RenderedFile(own + AGENT_RUNS, Path(runs.__file__).read_text(), False)
    yield RenderedFile(own + AGENT_DIRECT, Path(direct.__file__).read_text(), False)


def _iter_cluster(plan: Plan, plan_dir: str) -> Iterator[RenderedFile]:
    env = environment(template_dirs(plan))
    common = common_context(plan, plan_dir)
    template = f"{plan.profile.template}.sh.j2" if plan.profile.template else "job.sh.j2"
    own = plan.seat.subdir
    if shared_body(plan):
        yield RenderedFile(own + BODY_PATH, render_body(env, template, plan, common), True)
    headers = header_files(env, template, plan, common, plan_dir) if at_submission(plan) else None
    if headers is not None:
        yield from headers
    else:
        for s in plan.scripts:
            yield RenderedFile(script_path(plan, s.name), render_script(env, template, plan, s, common, plan_dir), True)
    if plan.campaign.finalize is not None and not own:   # the finalize job runs on the first cluster
        yield RenderedFile(script_path(plan, "finalize"), render_finalize(env, plan, common, plan_dir), True)
    if plan.pilots is not None:   # each cluster's pilots: its own directives, running its own copies of the scripts
        yield RenderedFile(own + PILOT_SCRIPT, render_pilot(env, plan, common, plan_dir), True)
        yield from _agent_files(own)
    yield RenderedFile(own + "bin/hpcrun-chain.sh", env.get_template("hpcrun-chain.sh.j2").render(common), True)
    if plan.database:
        yield RenderedFile(own + "bin/hpcrun-db.sh", env.get_template("hpcrun-db.sh.j2").render(common), True)
    if plan.hdf5_helper:
        yield RenderedFile(HDF5_HELPER, env.get_template("hpcrun-hdf5.py.j2").render(common), True)
    if plan.checksum and plan.checksum.helper:   # inputs verified, or outputs summed for their provenance
        yield RenderedFile("bin/hpcrun-checksum.py",
                           env.get_template("hpcrun-checksum.py.j2").render(common), True)
