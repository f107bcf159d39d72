"""A changed spec or profile planned into a submitted plan directory: the campaign's next generation.

The earlier generations' files stay where their jobs read them (generation 1 at the top of the plan
directory, generation N in ``generations/N/``), so a job queued or running under one never sees
another's scripts or task table. The new generation is written whole into its own directory first,
then the top-level ``manifest.json`` (what submit and the supervisor read) is replaced in one
rename: its script list holds the new generation's scripts and the earlier ones' (whose jobs may
still be retried), its job list the new generation's jobs. The store takes the generation up at
the next submit or supervisor round (``take_up``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from hpcrun.backends.late.pilots import Pilots
from hpcrun.errors import InputError, Problem
from hpcrun.operate.campaign.generations import GEN_DIR, generation_dir
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import clusters_of, open_plan_store, read_manifest
from hpcrun.plan.footprint import assessed
from hpcrun.plan.job.pilots import QUEUE_DIR
from hpcrun.plan.values import Plan, Succession
from hpcrun.render.manifest import manifest_json, server_key
from hpcrun.render.plandir import MANIFEST, write_plan
from hpcrun.render.treediff import diff_trees, tree_files
from hpcrun.store.base import _whoami
from hpcrun.store.records import Campaign
from hpcrun.store.rows.generations import IN_FLIGHT
from hpcrun.store.store import StateStore

REPROCESS = ("none", "failed", "all")
KEPT = {"none": ("done", "parked"), "failed": ("done",), "all": ()}   # states a generation leaves alone
SHARED = ("logs", "run", QUEUE_DIR)   # one for the whole plan directory: a generation's are links to them


@dataclass
class Change:
    """What planning a new generation does (``applied``: it was written)."""

    number: int
    reprocess: str
    stay_done: int = 0
    rerun: int = 0               # inputs done, failed or parked before that run again
    will_run: int = 0            # inputs in the new generation's jobs
    in_flight: int = 0           # inputs queued or running: they finish under their own generation
    added: int = 0
    withdrawn: int = 0
    applied: bool = False
    diff: Optional[str] = None
    directory: str = ""
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "diff"}


def _refuse(where: str, key: str, why: str) -> InputError:
    return InputError([Problem(where, None, key, why)])


def plan_generation(spec: Path, plan_dir: Path, load: Any, *, db: Optional[str], apply: bool,
                    reprocess: str, want_diff: bool) -> Tuple[Plan, Change]:
    """Plan the next generation of the campaign in ``plan_dir``; write it only when ``apply``.
    ``load(spec, succession)`` makes the plan (the caller's loader: plan/ is below this room)."""
    if reprocess not in REPROCESS:
        raise _refuse("--reprocess", "--reprocess", f"'{reprocess}' is not one of {', '.join(REPROCESS)}")
    previous = read_manifest(plan_dir, jobs=False)
    number = previous.generation.number + 1
    plan, campaign, states = _planned(spec, plan_dir, load, db, previous, number, reprocess)
    if apply:   # a quota it exceeds refuses it before the queue's waiting tasks are withdrawn
        assessed(plan, str(generation_dir(plan_dir, number)))
    if apply and previous.pilots and plan.campaign.name == previous.campaign and _check_pilots(plan, previous) \
            and _withdraw_waiting(plan_dir, db, previous, number):
        plan, campaign, states = _planned(spec, plan_dir, load, db, previous, number, reprocess)
    if plan.campaign.name != previous.campaign:
        raise _refuse(str(spec), "name", (
            f"names campaign '{plan.campaign.name}', but {plan_dir} holds campaign '{previous.campaign}'; a plan "
            "directory holds one campaign: keep its name to plan a new generation, or plan into a new directory"))
    _check_spellings(plan, states)
    _check_pilots(plan, previous)
    change = _counts(plan, states, number, reprocess)
    with open_plan_store(plan_dir, db) as store:
        _check_overwrites(plan, store, campaign, states)
    target = generation_dir(plan_dir, number)
    change.directory = str(target)
    if not apply:
        if want_diff:
            change.diff = _diff_only(plan, plan_dir, target, previous)
        return plan, change
    write_plan(plan, target, want_diff=False)
    _share_records(plan_dir, target)
    change.diff = _diff(generation_dir(plan_dir, number - 1), target) if want_diff else None
    _swap_manifest(plan_dir, target, previous, number, reprocess)
    change.applied = True
    with open_plan_store(plan_dir, db) as store:
        store.audit(campaign.id, "plan", f"planned generation {number} (reprocess: {reprocess}): "
                                         f"{change.will_run} input(s) to run, {change.added} added, "
                                         f"{change.withdrawn} withdrawn, {change.stay_done} stay done")
    return plan, change


def _planned(spec: Path, plan_dir: Path, load: Any, db: Optional[str], previous: Manifest, number: int,
             reprocess: str) -> Tuple[Plan, Campaign, Dict[str, str]]:
    """The generation planned over the inputs the campaign does not keep (done, or in flight)."""
    with open_plan_store(plan_dir, db) as store:
        campaign = store.get_campaign(previous.campaign)
        states = store.input_states(campaign.id)
        first = max(store.max_job_index(campaign.id), _last_index(previous)) + 1
    kept = KEPT[reprocess]
    exclude = frozenset(p for p, s in states.items() if s in kept or s in IN_FLIGHT)
    return load(spec, Succession(number, first, exclude, reprocess)), campaign, states


def _withdraw_waiting(plan_dir: Path, db: Optional[str], manifest: Manifest, number: int) -> int:
    """Late binding: the tasks no pilot has claimed yet are not in flight; each is taken out of the queue
    (one rename: one that fails was claimed meanwhile, and finishes under its own generation) and its
    inputs put back to pending, not counted as an attempt, to run under the new generation. How many."""
    sched = clusters_of(manifest)[0].sched
    if not isinstance(sched, Pilots):
        return 0
    moved = 0
    with open_plan_store(plan_dir, db) as store:
        campaign = store.get_campaign(manifest.campaign)
        late = {a.slurm_id: a for a in store.active_submissions(campaign.id) if (a.slurm_id or "").startswith("L")}
        for task in sorted(sched.q.withdraw(late)):
            moved += store.record_move(campaign.id, late[task].id, (
                f"withdrawn from the queue before any pilot claimed it: runs under generation {number}"))
        if moved:
            store.audit(campaign.id, "plan", f"{moved} input(s) waiting in the queue, claimed by no pilot, "
                                             f"withdrawn to run under generation {number}")
    return moved


def _last_index(manifest: Manifest) -> int:
    """The highest job index the manifest's scripts cover (-1: none)."""
    lasts = [int(s["jobs"][1]) for s in manifest.scripts if s.get("jobs")]
    return max(lasts, default=-1)


def _plan_paths(plan: Plan) -> Iterator[str]:
    for job in plan.jobs:
        for item in job.inputs:
            yield item.path


def _counts(plan: Plan, states: Dict[str, str], number: int, reprocess: str) -> Change:
    change = Change(number, reprocess)
    listed: Set[str] = set()
    for path in _plan_paths(plan):
        listed.add(path)
        state = states.get(path)
        change.will_run += 1
        if state is None:
            change.added += 1
        elif state in ("done", "failed", "parked"):
            change.rerun += 1
    for path, state in states.items():
        if state in IN_FLIGHT:
            change.in_flight += 1
        elif state == "done" and path not in listed:
            change.stay_done += 1
        elif state in ("pending", "failed") and path not in listed:
            change.withdrawn += 1
    return change


def _check_spellings(plan: Plan, states: Dict[str, str]) -> None:
    """An input the campaign has under another spelling (``/data/./a.raw``, ``/data//a.raw``) would be
    in two jobs, its old one and a new one, and its output written twice: refused."""
    known = {os.path.normpath(p): p for p in states if p.startswith("/")}
    twins = [(path, known[os.path.normpath(path)]) for path in _plan_paths(plan)
             if path not in states and path.startswith("/") and os.path.normpath(path) in known]
    if twins:
        path, old = twins[0]
        raise _refuse(plan.spec_file, "inputs", (
            f"{len(twins)} input(s) of this generation are inputs of the campaign under another spelling: {path} "
            f"is {old} ({states[old]}); it would be in two jobs (its own and a new one) and its output written "
            f"twice. List each input as the campaign has it ({old})"))


def _check_pilots(plan: Plan, previous: Manifest) -> bool:
    """Late binding: pilots already out run the new generation's inputs at their next claim, with the
    database server and container they started with; a generation that changes those, or the binding,
    is refused (a new campaign, or array binding, takes such a change)."""
    old, new = previous.pilots, plan.pilots
    if old is None and new is None:
        return False
    if old is None or new is None:
        raise _refuse(plan.spec_file, "jobs.binding", (
            "a campaign's binding (array or late) cannot change between generations: its jobs under way are "
            "bound one way; keep jobs.binding as it was, or plan the change as a new campaign"))
    held = str(old.get("server_key", ""))
    if held and held != server_key(plan):
        raise _refuse(plan.spec_file, "database", (
            "with jobs.binding: late every pilot starts the database server (its payload) and the container "
            "once for all the inputs it runs, and pilots already running take this generation's inputs; this "
            "generation changes database or container, which they cannot take up. Keep database and container "
            "as they were, or run the change as a new campaign (or with jobs.binding: array)"))
    return True


def _check_overwrites(plan: Plan, store: StateStore, campaign: Campaign, states: Dict[str, str]) -> None:
    """No output of the new generation may land on one an earlier generation made: one its provenance
    records name (any input's), or, for an input done before, its file on disk (a campaign from before
    provenance records)."""
    location = plan.campaign.outputs.location.rstrip("/")
    wanted: Dict[str, str] = {}
    for job in plan.jobs:
        for item, name in zip(job.inputs, job.outputs):
            wanted[f"{location}/{name}"] = item.path
    clash = store.recorded_outputs(campaign.id, list(wanted)) | {
        p for p, source in wanted.items() if states.get(source) == "done" and os.path.lexists(p)}
    if clash:
        shown = ", ".join(sorted(clash)[:3]) + (f" and {len(clash) - 3} more" if len(clash) > 3 else "")
        raise _refuse(plan.spec_file, "outputs.location", (
            f"this generation would write {len(clash)} output(s) onto outputs an earlier generation made "
            f"({shown}); an earlier generation's outputs are never overwritten: give outputs.location a "
            "directory of its own for this generation (for example one named after the release)"))


def _diff_only(plan: Plan, plan_dir: Path, target: Path, previous: Manifest) -> str:
    """The diff against the previous generation, rendered where the generation would go (so its paths are
    the real ones) and removed: nothing stays. The directory is no generation's yet (the manifest names
    the one before), so whatever an --apply that stopped short left there goes too."""
    made_parent = not target.parent.exists()
    try:
        write_plan(plan, target, want_diff=False, force=True)
        return _diff(generation_dir(plan_dir, previous.generation.number), target)
    finally:
        shutil.rmtree(target, ignore_errors=True)
        if made_parent:
            try:
                target.parent.rmdir()
            except OSError:
                pass


def _diff(old: Path, new: Path) -> str:
    skip_dirs, skip_top = ("logs", "run", "report", GEN_DIR, QUEUE_DIR), ("state.db", "state.db-wal", "state.db-shm",
                                                                "state.db.submit-lock", MANIFEST, "metrics.prom")
    return diff_trees(tree_files(old, skip_dirs, skip_top), tree_files(new, skip_dirs, skip_top))


def _share_records(plan_dir: Path, target: Path) -> None:
    """The generation's logs/ and run/ are the plan directory's (the supervisor reads them there)."""
    for name in SHARED:
        if os.path.islink(target / name):   # a generation written again (an --apply that stopped short)
            os.unlink(target / name)
        else:
            shutil.rmtree(target / name, ignore_errors=True)
        (plan_dir / name).mkdir(exist_ok=True)
        os.symlink(os.path.relpath(plan_dir / name, target), target / name)


def _prefixed(entry: Dict[str, Any], prefix: str, number: int) -> Dict[str, Any]:
    out = dict(entry, path=prefix + entry["path"], generation=number)
    if out.get("headers"):
        out["headers"] = prefix + out["headers"]
    return out


def _earlier(entries: Sequence[Mapping[str, Any]], number: int) -> List[Dict[str, Any]]:
    """The previous manifest's scripts, each tagged with its generation (a plan from before: ``number``)."""
    return [dict(e, generation=e.get("generation") or number) for e in entries]


def _swap_manifest(plan_dir: Path, target: Path, previous: Manifest, number: int, reprocess: str) -> None:
    """The top-level manifest becomes the new generation's, with every generation's scripts, in one rename."""
    prefix = f"{GEN_DIR}/{number}/"
    source = target / MANIFEST
    with open(source, encoding="utf-8") as f:
        text = f.read()
    cut = text.index('\n "jobs": [')
    head = json.loads(text[:cut].rstrip().rstrip(",") + "\n}")
    before = previous.generation.number
    head["scripts"] = _earlier(previous.scripts, before) + [
        _prefixed(s, prefix, number) for s in head["scripts"]]
    if head.get("clusters"):
        old = {c.name: c.scripts for c in previous.clusters}
        for c in head["clusters"]:
            c["scripts"] = _earlier(old.get(c["name"], []), before) + [
                _prefixed(s, prefix, number) for s in c.get("scripts", [])]
    if head.get("pilots") and previous.pilots:   # one queue for every generation (queue/ is shared)
        head["pilots"]["queue"] = previous.pilots["queue"]
    if head.get("finalize"):
        head["finalize"]["path"] = prefix + head["finalize"]["path"]
    head["generation"] = dict(head.get("generation") or {}, number=number, reprocess=reprocess,
                              directory=prefix.rstrip("/"), planned_by=_whoami(),
                              planned_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    top = manifest_json(head).rstrip().rstrip("}").rstrip() + "," + text[cut:]
    _archive_first(plan_dir, before)
    tmp = plan_dir / f".{MANIFEST}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(top)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, plan_dir / MANIFEST)


def _archive_first(plan_dir: Path, before: int) -> None:
    """Generation 1's manifest kept as ``generations/1/manifest.json`` (a hard link: the same bytes) before
    the top-level one is replaced: the jobs of every generation stay readable (exports of their outputs)."""
    if before != 1:
        return
    keep = plan_dir / GEN_DIR / "1" / MANIFEST
    if keep.exists():
        return
    keep.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(plan_dir / MANIFEST, keep)
    except OSError:   # a filesystem without hard links
        shutil.copyfile(plan_dir / MANIFEST, keep)


