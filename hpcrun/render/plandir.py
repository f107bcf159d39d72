"""Write a plan directory atomically and diff it against the previous one.

Everything is rendered in memory first, then written to a hidden sibling
directory that replaces the output directory only when complete, so an error
never leaves a half-written plan behind.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpcrun.backends.burstbuffer.base import grammar_checked
from hpcrun.backends.burstbuffer.grammar import check_script
from hpcrun.backends.scheduler import scheduler_for
from hpcrun.bulk import bulk
from hpcrun.errors import HpcrunError, InputError, Problem
from hpcrun.plan import checks as carried
from hpcrun.plan.footprint import assessed
from hpcrun.plan.job.pilots import PILOT_SCRIPT
from hpcrun.plan.values import Plan
from hpcrun.render.files import iter_rendered, render_all
from hpcrun.render.manifest import manifest_head, manifest_text, write_manifest
from hpcrun.render.scripts import TASKS_INDEX, TASKS_PATH, RenderedFile, task_rows_indexed
from hpcrun.render.treediff import diff_trees, tree_files

MANIFEST = "manifest.json"
SUBMITTED_MARKERS = ("submitted.json", "state.db")
# the campaign state store and its SQLite companions, and the last report: a re-plan keeps them
KEPT_FILES = ("state.db", "state.db-wal", "state.db-shm", "state.db.submit-lock", "report")


class InternalError(HpcrunError):
    exit_code = 70


@dataclass
class WriteResult:
    out_dir: Path
    files: List[RenderedFile]
    diff: Optional[str]
    manifest: dict             # its head: everything but the job list (which can be 10^6 entries)
    previous: bool = False     # a plan was already in the directory (what --diff compares with)


def _check_rendered(first: Plan, files: List[RenderedFile]) -> None:
    by_dir = {p.seat.subdir + "jobs": ("#" + p.profile.burst_buffer.directive,
                                        grammar_checked(p.profile.burst_buffer.system),
                                        scheduler_for(p.scheduler).directive) for p in first.all_clusters}
    pilots = {p.seat.subdir + PILOT_SCRIPT: by_dir[p.seat.subdir + "jobs"] for p in first.all_clusters}
    for f in files:
        rules = pilots.get(f.path) or by_dir.get(f.path.rpartition("/")[0])
        if rules is not None:
            prefix, grammar, directive = rules
            problems = check_script(f.text.splitlines(), prefix, grammar, job_directive=directive)
            if problems:
                raise InternalError(f"rendered {f.path} has invalid directives: {problems}; "
                                    "this is a bug in hpcrun or a site template")


def _check_out_dir(out_dir: Path, scheduler: str) -> None:
    why = carried.check_plan_dir(str(out_dir), scheduler)
    if why:
        raise InputError([Problem(str(out_dir).replace("\n", "\\n"), None, "--out",
                                  why + "; choose a directory whose path has neither.")])


def _render(plan: Plan, out_dir: Path) -> tuple:
    _check_out_dir(out_dir, plan.scheduler)
    plan_dir = str(out_dir)
    plan = assessed(plan, plan_dir)
    files = render_all(plan, plan_dir)
    _check_rendered(plan, files)
    digests = {f.path: hashlib.sha256(f.text.encode()).hexdigest() for f in files}
    return files, manifest_text(plan, plan_dir, digests), manifest_head(plan, plan_dir, digests)


def render_plan(plan: Plan, out_dir: Path) -> tuple:
    files, text, _data = _render(plan, out_dir)
    return files, text


def _check_target(out_dir: Path, force: bool) -> None:
    """The directory is new, empty, or an earlier plan that was not submitted (unless --force)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError([Problem(str(out_dir), None, "--out", "exists and is not a directory")])
    entries = [p.name for p in out_dir.iterdir()]
    if entries and MANIFEST not in entries:
        raise InputError([Problem(str(out_dir), None, "--out", (
            "is not empty and holds no hpcrun plan; choose a new or empty directory"))])
    if not force and any(m in entries for m in SUBMITTED_MARKERS):
        raise InputError([Problem(str(out_dir), None, "--out", (
            "holds a plan that was already submitted; re-planning would detach its jobs. "
            "Use a new directory, or --force if you really mean to replace it"))])


def _write_files(plan: Plan, plan_dir: str, tmp: Path) -> Tuple[List[RenderedFile], Dict[str, str]]:
    """Render and write every file into ``tmp``; their digests for the manifest (texts not kept)."""
    for sub in ("jobs", "bin", "logs", "run"):
        (tmp / sub).mkdir(parents=True)
    made = {"jobs", "bin", "logs", "run"}
    files: List[RenderedFile] = []
    digests: Dict[str, str] = {}
    rendered = iter_rendered(plan, plan_dir, tasks=False)   # the task table: with the manifest
    while True:
        # chunks, not one file at a time: alternating render and write per file is ~25%
        # slower (cache effects), a chunk keeps memory flat (500 x ~6 KB)
        chunk = list(itertools.islice(rendered, 500))
        if not chunk:
            return files, digests
        _check_rendered(plan, [f for f in chunk if f.chunks is None])
        for f in chunk:
            sub = os.path.dirname(f.path)
            if sub and sub not in made:
                os.makedirs(os.path.join(tmp, sub), exist_ok=True)
                made.add(sub)
            digest = _write_one(os.path.join(tmp, f.path), f)
            if digest is not None:
                digests[f.path] = digest
            files.append(RenderedFile(f.path, "", f.executable))


def _write_jobs(plan: Plan, head: Dict[str, Any], tmp: Path) -> None:
    """The manifest, the task table and its index from one pass over the jobs."""
    with open(tmp / MANIFEST, "w", encoding="utf-8") as out, open(tmp / TASKS_PATH, "w", encoding="utf-8") as tasks, \
            open(tmp / TASKS_INDEX, "w", encoding="ascii") as index:
        offset = [0]

        def write(jobs: Any) -> None:
            rows, lines, offset[0] = task_rows_indexed(jobs, offset[0])
            tasks.write(rows)
            index.write(lines)
        write_manifest(out, plan, head, write)
        if not plan.jobs:
            tasks.write("\n")


def _write_one(path: str, f: RenderedFile) -> Optional[str]:
    """Write one rendered file (whole or in its chunks); its sha256 when the manifest needs it."""
    digest = hashlib.sha256() if f.digest else None
    with open(path, "wb") as out:
        for piece in ((f.text,) if f.chunks is None else f.chunks):
            raw = piece.encode("utf-8")
            if digest is not None:
                digest.update(raw)
            out.write(raw)
        if f.executable:
            os.fchmod(out.fileno(), 0o755)
    return None if digest is None else digest.hexdigest()


def _swap_in(out_dir: Path, tmp: Path, old: Path) -> None:
    """Move the previous plan's logs, run records and state into the new one, then swap."""
    if out_dir.exists():
        # job logs and run records of the previous plan are kept, not thrown away
        for keep in ("logs", "run"):
            if (out_dir / keep).is_dir():
                (tmp / keep).rmdir()
                os.rename(out_dir / keep, tmp / keep)
        # and so is the campaign's state: a record is never lost by planning again
        for keep in KEPT_FILES:
            if os.path.lexists(out_dir / keep):
                os.rename(out_dir / keep, tmp / keep)
        os.rename(out_dir, old)
    os.rename(tmp, out_dir)


def _roll_back(out_dir: Path, tmp: Path, old: Path) -> None:
    """After a failure anywhere above: the previous plan, its records and state back in place."""
    if old.exists() and not out_dir.exists():
        os.rename(old, out_dir)
    for keep in ("logs", "run", *KEPT_FILES):
        if os.path.lexists(tmp / keep) and out_dir.is_dir() and not os.path.lexists(out_dir / keep):
            os.rename(tmp / keep, out_dir / keep)
    shutil.rmtree(tmp, ignore_errors=True)


def write_plan(plan: Plan, out_dir: Path, want_diff: bool = False, force: bool = False) -> WriteResult:
    """Write the plan directory atomically: built beside it, then renamed into place."""
    with bulk():
        return _write_plan(plan, out_dir, want_diff, force)


def _write_plan(plan: Plan, out_dir: Path, want_diff: bool, force: bool) -> WriteResult:
    out_dir = Path(os.path.abspath(out_dir))
    _check_out_dir(out_dir, plan.scheduler)
    recover_interrupted(out_dir)
    _check_target(out_dir, force)
    plan_dir = str(out_dir)
    plan = assessed(plan, plan_dir)   # its footprint where it goes: a quota it exceeds refuses it, nothing written
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{out_dir.name}.hpcrun-tmp-{_HOST}-{os.getpid()}"
    old = parent / f".{out_dir.name}.hpcrun-old-{_HOST}-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        files, digests = _write_files(plan, plan_dir, tmp)
        data = manifest_head(plan, plan_dir, digests)
        _write_jobs(plan, data, tmp)
        files.append(RenderedFile(TASKS_PATH, "", False))
        files.append(RenderedFile(TASKS_INDEX, "", False))
        previous = (out_dir / MANIFEST).is_file()
        diff = _diff_dirs(out_dir, tmp) if want_diff and previous else None
        _swap_in(out_dir, tmp, old)
    except BaseException:
        _roll_back(out_dir, tmp, old)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return WriteResult(out_dir, files, diff, data, previous)


_HOST = socket.gethostname().replace("/", "_") or "localhost"
STALE_OTHER_HOST = 24 * 3600   # a temporary directory of another login node is stale after a day


def _stale(path: Path, owner: str) -> bool:
    """A temporary directory of a plan run that died (killed, node rebooted); ``owner`` is
    the ``HOST-PID`` (older runs: ``PID``) in its name."""
    host, _, pid = owner.rpartition("-")
    if host and host != _HOST:
        try:
            return time.time() - path.stat().st_mtime > STALE_OTHER_HOST
        except OSError:
            return False
    try:
        os.kill(int(pid), 0)
    except ValueError:
        return True
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return int(pid) == os.getpid()


def recover_interrupted(out_dir: Path) -> None:
    """Finish or undo a plan run that was killed, so no record is lost and no debris stays.

    A run renders into ``.NAME.hpcrun-tmp-HOST-PID``, moves the kept files (state store,
    logs, run records) into it, renames the old plan to ``.NAME.hpcrun-old-HOST-PID`` and
    the new one into place. Killed before the last rename, the kept files are in the
    temporary directory: they go back (or the complete new plan goes into place), then the
    debris is removed.
    """
    parent = out_dir.parent
    if not parent.is_dir():
        return
    prefix = f".{out_dir.name}.hpcrun-"
    try:
        debris = [p for p in parent.iterdir() if p.name.startswith((prefix + "tmp-", prefix + "old-"))
                  and p.is_dir() and _stale(p, p.name[len(prefix) + 4:])]
    except OSError:
        return
    tmps = [p for p in debris if p.name.startswith(prefix + "tmp-")]
    olds = [p for p in debris if p.name.startswith(prefix + "old-")]
    if not out_dir.exists():
        done = next((t for t in tmps if (t / MANIFEST).is_file()), None)
        if done is not None:
            os.rename(done, out_dir)
            tmps.remove(done)
        elif olds:
            os.rename(olds[0], out_dir)
            olds.pop(0)
    for tmp in tmps:
        if out_dir.is_dir():
            for keep in ("logs", "run", *KEPT_FILES):
                if os.path.lexists(tmp / keep) and not _has_records(out_dir, keep):
                    if os.path.isdir(out_dir / keep) and not os.path.islink(out_dir / keep):
                        shutil.rmtree(out_dir / keep)
                    os.rename(tmp / keep, out_dir / keep)
        shutil.rmtree(tmp, ignore_errors=True)
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)


def _has_records(out_dir: Path, keep: str) -> bool:
    """Whether the plan directory already holds ``keep`` with something in it."""
    path = out_dir / keep
    if not os.path.lexists(path):
        return False
    return not path.is_dir() or any(path.iterdir())


def _diff_dirs(old_dir: Path, new_dir: Path) -> str:
    """The previous plan against the new one (records, logs and the store left out), in bounded memory."""
    skip_dirs, skip_top = ("logs", "run", "report"), KEPT_FILES
    return diff_trees(tree_files(old_dir, skip_dirs, skip_top), tree_files(new_dir, skip_dirs, skip_top))
