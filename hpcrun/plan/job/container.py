"""The container runtime at plan time: what the spec asks of it, what it must bind, and
its answers (directives, command prefix, setup lines) stored in the plan as data."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from hpcrun.backends.container import Bind, Runtime
from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.checks import Checks
from hpcrun.plan.intake.inputs import InputItem, parent_dirs
from hpcrun.plan.intake.remote import is_url
from hpcrun.plan.job.listed import Listed
from hpcrun.plan.values import ContainerPlan, DatabasePlan
from hpcrun.shell import quote

_CLEARS_ENV = ("clears the environment, but hpcrun passes each task its input, slice and database "
               "socket through HPCRUN_* variables; remove it.")


def check_runtime(campaign: Campaign, profile: SiteProfile, runtime: Runtime, db_plan: Optional[DatabasePlan],
                  checks: Checks) -> None:
    """Spec and profile options the chosen runtime cannot honour."""
    _check_env_options(campaign, profile, runtime, checks)
    rt_name = campaign.container.runtime
    if campaign.container.modules and not runtime.modules:
        checks.spec_error(("container", "modules"), (
            f"modules are Shifter's --module option; container runtime '{rt_name}' has none "
            "(put what the job needs into the image, or load it with software.modules)."))
    cache_options = [i for i, opt in enumerate(campaign.container.options) if "pernodecache" in opt.lower()]
    for i in cache_options:
        if not runtime.per_node_cache:
            checks.spec_error(("container", "options", i), (
                f"a perNodeCache size only means something for Shifter; with '{rt_name}' the "
                "database payload is copied to the profile's node_local storage, whose size "
                "is node_local.size."))
        elif runtime.node_cache_dir() is not None:
            checks.spec_error(("container", "options", i), (
                "hpcrun already gives each node a perNodeCache for the database payload, "
                "sized from database.size (or the payload) and mounted at "
                f"{runtime.node_cache_dir()}; a second one here would be stacked on it. "
                "Remove this option; give database.size to change the cache's size."))
    shifter = profile.containers.shifter
    if rt_name == "shifter" and db_plan and shifter and not shifter.per_node_cache and profile.node_local is None:
        checks.profile_error(("containers", "shifter", "per_node_cache"), (
            "perNodeCache is off and there is no node_local storage for the payload."))


def _check_env_options(campaign: Campaign, profile: SiteProfile, runtime: Runtime, checks: Checks) -> None:
    drops_env = runtime.CLEARS_ENV
    if not drops_env:
        return
    site = runtime.site_settings()
    for i, opt in enumerate(getattr(site, "exec_options", None) or ()):
        if opt in drops_env:
            checks.profile_error(("containers", runtime.name, "exec_options", i), f"'{opt}' {_CLEARS_ENV}")
    for i, opt in enumerate(campaign.container.options):
        if opt in drops_env:
            checks.spec_error(("container", "options", i), f"'{opt}' {_CLEARS_ENV}")


def container_plan(campaign: Campaign, profile: SiteProfile, runtime: Runtime, items: Sequence[InputItem],
                   db_plan: Optional[DatabasePlan], root_var: Optional[str], workdir: str,
                   checks: Checks, notes: List[str]) -> ContainerPlan:
    """Bind what the job uses, ask the runtime what is wrong, and store its answers."""
    runtime.binds = binds_of(campaign, profile, items, db_plan, root_var, workdir)
    runtime.env_names = sorted(set(profile.prologue.env) | set(campaign.software.env) | set(campaign.chain.env))
    found, rt_notes = runtime.problems()
    notes.extend(rt_notes)
    for problem in found:
        report = checks.spec_error if problem.where == "spec" else checks.profile_error
        report(problem.path, problem.message)
    return ContainerPlan(runtime=runtime.name, directives=tuple(runtime.directive_options()),
                         prefix=str(runtime.prefix()), setup_lines=tuple(runtime.setup_lines()),
                         node_cache_dir=runtime.node_cache_dir(),
                         image_id=None if runtime.image_id() is None else str(runtime.image_id()))


def binds_of(campaign: Campaign, profile: SiteProfile, items: Sequence[InputItem],
             db_plan: Optional[DatabasePlan], root_var: Optional[str], workdir: str) -> List[Bind]:
    """Host paths a container needs to see (Apptainer, podman-hpc and Charliecloud bind them)."""
    plan_dir = '"${HPCRUN_PLAN_DIR}"'
    binds = [Bind(plan_dir, plan_dir, origin=("plan",))]
    if db_plan is not None:
        binds.append(Bind(quote(db_plan.payload), quote(db_plan.payload), read_only=True,
                          path=db_plan.payload, origin=("spec", "database", "payload")))
        if profile.node_local is not None and db_plan.cache_dir.startswith(quote(profile.node_local.path)):
            binds.append(Bind(quote(profile.node_local.path), quote(profile.node_local.path),
                              path=profile.node_local.path, origin=("profile", "node_local", "path")))
    bb = campaign.burst_buffer
    # the job creates these before any container starts; only bind what the job uses
    used = [] if root_var else [(workdir, "workdir" if campaign.outputs.workdir else "location")]
    if not (root_var and bb and bb.stage_outputs):
        used.append((campaign.outputs.location, "location"))
    for path, key in used:
        binds.append(Bind(quote(path), quote(path), path=path, origin=("spec", "outputs", key)))
    if root_var:
        var = f'"${{{root_var}}}"'
        binds.append(Bind(var, var, origin=("bb",)))
    if not (root_var and bb and bb.stage_inputs):
        binds += _input_binds(campaign, items)
    x = profile.xrootd
    if x.access == "stage" and x.stage_dir and not isinstance(items, Listed) and any(is_url(i.path) for i in items):
        binds.append(Bind(quote(x.stage_dir), quote(x.stage_dir), path=x.stage_dir,
                          origin=("profile", "xrootd", "stage_dir")))
    seen = set()
    unique = []
    for b in binds:
        if b.source not in seen:
            seen.add(b.source)
            unique.append(b)
    return unique


def _input_binds(campaign: Campaign, items: Sequence[InputItem]) -> List[Bind]:
    # URLs are read over the network (streamed) or copied into a bound directory (staged)
    parents = sorted(items.parents if isinstance(items, Listed) else parent_dirs([i.path for i in items]))
    if len(parents) > 20:
        parents = [os.path.commonpath(parents)]
    inputs_key = next(k for k in ("glob", "files", "list_file") if getattr(campaign.inputs, k))
    return [Bind(quote(p), quote(p), read_only=True, path=p, origin=("spec", "inputs", inputs_key))
            for p in parents if p != "/"]
