"""The one-way flow: load -> validate -> plan (render and write live elsewhere).

A campaign on several clusters (``site.profile`` a list) is planned once per cluster's
profile; the first plan carries the others (``Plan.others``). Every cluster must accept
every job, and all of them must cut the inputs into the same jobs, so that any job can go
to any cluster at submission time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional, Tuple

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.bulk import bulk
from hpcrun.errors import InputError, Problem
from hpcrun.model.profiles import LoadedProfile, load_profile
from hpcrun.model.spec import Campaign, ClusterRef
from hpcrun.model.validate import build
from hpcrun.model.yamlsrc import Located, load_yaml
from hpcrun.plan.build import Plan, plan
from hpcrun.plan.values import ClusterSeat, Succession


def load_plan(spec_path: Path, succession: Succession = Succession()) -> Plan:
    """Validate the spec and its profile(s) together; all problems come in one InputError
    (``succession``: the plan of a later generation of the campaign)."""
    with bulk():
        return _load_plan(spec_path, succession)


def _load_plan(spec_path: Path, succession: Succession) -> Plan:
    if not Path(spec_path).is_file():
        raise InputError([Problem(str(spec_path), None, "", "the campaign spec does not exist")])
    src = load_yaml(spec_path)
    problems = []
    try:
        campaign = build(Campaign, src)
    except InputError as exc:
        problems.extend(exc.problems)
        campaign = None
    relative_to = Path(spec_path).resolve().parent
    if campaign is None:
        # the profile is loaded even when the spec has errors, so both are reported at once
        site = src.data.get("site")
        name = site.get("profile") if isinstance(site, dict) else None
        if isinstance(name, str):
            file, line = src.where(("site", "profile"))
            try:
                load_profile(name, (file, line, "site.profile"), relative_to=relative_to)
            except InputError as exc:
                problems.extend(exc.problems)
        raise InputError(problems)
    refs = campaign.site.clusters
    if isinstance(campaign.site.profile, str):
        file, line = src.where(("site", "profile"))
        loaded = load_profile(campaign.site.profile, (file, line, "site.profile"), relative_to=relative_to)
        problems, notes = _known_clusters([(refs[0], loaded)])
        made = plan(campaign, src, loaded.profile, loaded.source, loaded.files, succession)
        if problems:
            raise InputError(problems)
        return dataclasses.replace(made, seat=ClusterSeat(loaded.profile.scheduler.cluster),
                                   notes=made.notes + tuple(notes))
    return _several(campaign, src, refs, relative_to, succession)


def _where(src: Located, n: int, campaign: Campaign) -> Tuple[str, Optional[int], str]:
    item = campaign.site.profile[n] if isinstance(campaign.site.profile, list) else None
    path: Tuple = ("site", "profile", n) if isinstance(item, str) else ("site", "profile", n, "profile")
    file, line = src.where(path)
    return file, line, ".".join(str(p) for p in path)


def _several(campaign: Campaign, src: Located, refs: List[ClusterRef], relative_to: Path,
             succession: Succession) -> Plan:
    problems: List[Problem] = []
    loaded: List[Tuple[ClusterRef, LoadedProfile]] = []
    for n, ref in enumerate(refs):
        try:
            loaded.append((ref, load_profile(ref.profile, _where(src, n, campaign), relative_to=relative_to)))
        except InputError as exc:
            problems.extend(exc.problems)
    problems += _cluster_names(loaded)
    plans: List[Plan] = []
    for n, (ref, lp) in enumerate(loaded):
        name = lp.profile.scheduler.cluster
        seat = ClusterSeat(name, ref.share, ref.max_queued_jobs, "" if n == 0 else f"clusters/{name}/", len(refs) > 1)
        try:
            made = plan(campaign, src, lp.profile, lp.source, lp.files, succession)
        except InputError as exc:
            problems += [dataclasses.replace(p, message=f"on cluster '{name}' (profile {lp.profile.name}): "
                                             f"{p.message}") for p in exc.problems]
            continue
        plans.append(dataclasses.replace(made, seat=seat))
    unknown, notes = _known_clusters(loaded)
    problems += unknown
    if problems:
        raise InputError(problems)
    problems += _same_jobs(plans, src)
    if problems:
        raise InputError(problems)
    moves = campaign.site.move_pending_after
    return dataclasses.replace(plans[0], others=tuple(plans[1:]), move_pending_after=moves,
                               notes=plans[0].notes + tuple(notes))


def _cluster_names(loaded: List[Tuple[ClusterRef, LoadedProfile]]) -> List[Problem]:
    """Each profile of a list names its cluster, and no two name the same one."""
    problems = []
    seen: dict = {}
    for _ref, lp in loaded:
        name = lp.profile.scheduler.cluster
        file, line = lp.source.where(("scheduler", "cluster"))
        if name is None:
            problems.append(Problem(file, line, "scheduler.cluster", (
                f"profile {lp.profile.name} is one of several clusters of this campaign but names no cluster; "
                "set scheduler.cluster to the cluster's name as the scheduler knows it (Slurm: ClusterName)")))
        elif name in seen:
            problems.append(Problem(file, line, "scheduler.cluster", (
                f"profiles {seen[name]} and {lp.profile.name} both name cluster '{name}'; list each cluster once")))
        else:
            seen[name] = lp.profile.name
    return problems


def _known_clusters(loaded: List[Tuple[ClusterRef, LoadedProfile]]) -> Tuple[List[Problem], List[str]]:
    """Each named cluster is one the scheduler knows; a note for each it could not be asked about."""
    problems, notes = [], []
    for _ref, lp in loaded:
        name = lp.profile.scheduler.cluster
        if not name:
            continue
        known = scheduler_for(lp.profile.scheduler.kind).known_clusters()
        if known is None:
            notes.append(f"could not check that cluster '{name}' exists: the scheduler could not be asked "
                         "(the plan is written; submit will tell)")
        elif name not in known:
            file, line = lp.source.where(("scheduler", "cluster"))
            problems.append(Problem(file, line, "scheduler.cluster", (
                f"the scheduler knows no cluster '{name}'; it knows: {', '.join(sorted(known)) or '(none)'}")))
    return problems, notes


def _same_jobs(plans: List[Plan], src: Located) -> List[Problem]:
    first = [(j.name, tuple(i.path for i in j.inputs)) for j in plans[0].jobs]
    problems = []
    for p in plans[1:]:
        if [(j.name, tuple(i.path for i in j.inputs)) for j in p.jobs] != first:
            file, line = src.where(("jobs",))
            problems.append(Problem(file, line, "jobs", (
                f"cluster '{p.seat.name}' cuts the inputs into {len(p.jobs)} jobs and cluster "
                f"'{plans[0].seat.name}' into {len(plans[0].jobs)} (or groups them differently); every job must "
                "fit every cluster: set jobs.files_per_job and jobs.chains_per_node explicitly")))
    return problems
