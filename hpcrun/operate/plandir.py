"""A plan directory as operate sees it: its manifest (the one contract with ``hpcrun plan``)
and its campaign store. Status, retry, report and submit open it here, not through each other."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hpcrun.backends.scheduler import DEFAULT, Scheduler, scheduler_for
from hpcrun.errors import InputError, Problem
from hpcrun.store.mounts import DB_NAME
from hpcrun.store.store import StateStore, open_store

_JOBS_KEY = '\n "jobs": ['   # the manifest's last key, at the top level (a string holds no raw newline)
_HEAD_BLOCK = 1 << 16


class ManifestJobs(Sequence[Dict[str, Any]]):
    """The manifest's job list, read line by line each time it is gone through (hpcrun writes one job
    a line): submitting, retrying or supervising a 10^6-job plan held the list parsed whole, 1.5 GB,
    where each caller only goes through it once."""

    def __init__(self, path: Path, offset: int, count: int, fd: int):
        # the file as it was when its head was read: a new generation's manifest renamed over it meanwhile
        # is read at the caller's next round (an open descriptor keeps this one readable until then)
        self.path, self.offset, self.total, self._fd = path, offset, count, fd

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except (OSError, AttributeError):
            pass

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        seen = 0
        with os.fdopen(os.dup(self._fd), "rb") as f:
            f.seek(self.offset)
            for line in f:
                text = line.strip()
                if text == b"]":
                    break
                try:
                    yield json.loads(text[:-1] if text.endswith(b",") else text)
                except ValueError as exc:
                    raise self._broken(f"job line {seen + 1} cannot be read: {exc}") from None
                seen += 1
        if seen != self.total:
            raise self._broken(f"lists {seen} jobs where its totals say {self.total}")

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return list(itertools.islice(self, *k.indices(self.total)))
        if not -self.total <= k < self.total:
            raise IndexError(k)
        return next(itertools.islice(self, k % self.total, None))

    def _broken(self, why: str) -> InputError:
        return InputError([Problem(str(self.path), None, "jobs", f"{why}; the plan directory was edited or is "
                                                                 "incomplete: plan the campaign again")])


def _head(path: Path, fd: int) -> Optional[Tuple[Dict[str, Any], Optional[int]]]:
    """The manifest without its (last, up to 10^6 entries long) ``jobs`` list, read only up to that
    list's first line (a poll of a 10^6-job plan reads its first few hundred KB, not 300 MB), and the
    list's byte offset when that line is one whole job (hpcrun's layout; None: another, e.g. an older
    hpcrun's, to be parsed whole). None when the file has no such list."""
    text = ""
    cut = -1
    with os.fdopen(os.dup(fd), encoding="utf-8", newline="") as f:   # no newline translation: offsets are the file's
        f.seek(0)
        while True:
            block = f.read(_HEAD_BLOCK)
            seen = len(text)
            text += block
            if cut < 0:
                cut = text.find(_JOBS_KEY, max(0, seen - len(_JOBS_KEY)))
            start = cut + len(_JOBS_KEY)
            if cut >= 0 and (text.find("\n", start + 1) >= 0 or not block):
                break   # the list's first line is in: enough to tell the layout
            if not block:
                return None
    try:
        head: Dict[str, Any] = json.loads(text[:cut].rstrip().rstrip(",") + "\n}")
    except ValueError:
        return None
    end = text.find("\n", start + 1)
    first = text[start + 1:end if end >= 0 else len(text)].strip()
    try:
        whole_job = text[start:start + 1] == "\n" and isinstance(json.loads(first.rstrip(",")), dict)
    except ValueError:   # "jobs": [] on one line, or a job over several lines
        whole_job = False
    return head, len(text[:start + 1].encode("utf-8")) if whole_job else None


def _from_head(path: Path, jobs: bool) -> Optional[Dict[str, Any]]:
    """The manifest from its head: without the job list, or with it as a ManifestJobs (None: parse it whole)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        found = _head(path, fd)
        if found is None:
            return None
        head, offset = found
        if not jobs:
            return head
        count = head.get("totals", {}).get("jobs")
        if offset is None or not isinstance(count, int) or count < 1:
            return None
        head["jobs"] = ManifestJobs(path, offset, count, fd)
        fd = -1   # the job list's now
        return head
    finally:
        if fd >= 0:
            os.close(fd)


def read_manifest(plan_dir: Path, jobs: bool = True) -> Dict[str, Any]:
    """The plan's manifest; ``jobs=False`` skips reading the per-job list (a status poll needs none),
    else the list is a :class:`ManifestJobs` where the layout allows, read as it is gone through."""
    path = plan_dir / "manifest.json"
    try:
        data: Dict[str, Any] = _from_head(path, jobs) or json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([Problem(str(plan_dir), None, "", (
            "is not a plan directory (no manifest.json); create one with `hpcrun plan SPEC --out DIR`"))]) from None
    except (OSError, ValueError) as exc:
        raise InputError([Problem(str(path), None, "", f"cannot be read: {exc}")]) from None
    if "digests" not in data or "submit" not in data:
        raise InputError([Problem(str(path), None, "", (
            f"was written by hpcrun {data.get('hpcrun_version', '?')}, which did not record what submit needs; "
            "plan the campaign again with this hpcrun (`hpcrun plan SPEC --out DIR --force`)"))])
    return data


def manifest_id(plan_dir: Path) -> Tuple[int, int]:
    """Which manifest file is in place (a new generation renames another one over it)."""
    try:
        st = os.stat(plan_dir / "manifest.json")
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_mtime_ns)


STORE_ENV = "HPCRUN_STATE_DB"   # the campaign store's URL for every command and the Python API


def store_url(db: Optional[str] = None) -> Optional[str]:
    """The store a command was given: ``db``, else $HPCRUN_STATE_DB, else None (the plan's state.db)."""
    return db or os.environ.get(STORE_ENV) or None


def has_store(plan_dir: Path, db: Optional[str] = None) -> bool:
    """A store to open: a URL given, or the plan's own state.db (a plan never submitted has none)."""
    return store_url(db) is not None or (plan_dir / DB_NAME).exists()


def open_plan_store(plan_dir: Path, db: Optional[str] = None, **options: Any) -> StateStore:
    """The store of a plan: ``db`` or $HPCRUN_STATE_DB (a URL), else ``<plan_dir>/state.db``."""
    return open_store(store_url(db) or plan_dir, **options)


DEFAULT_POLL_S = 60.0      # a login node is shared: poll the scheduler once a minute unless told otherwise
BACKOFF = 2.0              # the interval doubles after a poll that saw no change ...
BACKOFF_LIMIT = 10.0       # ... up to ten times the chosen interval, and drops back on the next change


def poll_interval(manifest: Dict[str, Any], requested: Optional[float]) -> float:
    """The interval between polls: the request (default one minute), never below the site's minimum."""
    site_min = float(manifest.get("submit", {}).get("min_poll_interval") or 0)
    return max(DEFAULT_POLL_S if requested is None else requested, site_min)


def next_interval(base: float, current: float, changed: bool) -> float:
    """Back off while nothing changes; back to ``base`` as soon as something does."""
    return base if changed else min(current * BACKOFF, base * BACKOFF_LIMIT)


def scheduler_of(manifest: Dict[str, Any]) -> Scheduler:
    """The scheduler the plan was written for, talking to its first cluster (plans from before the
    registry: Slurm)."""
    clusters = manifest.get("clusters") or [{}]
    return scheduler_for(manifest.get("submit", {}).get("scheduler", DEFAULT), clusters[0].get("name"))


@dataclass
class ClusterInfo:
    """One cluster of a plan, as submit and track use it (the manifest's ``clusters``; a plan for one
    unnamed cluster has one of these made from its ``submit`` table)."""

    name: Optional[str]
    sched: Scheduler
    accounting: bool
    share: float = 1.0
    max_queued_jobs: Optional[int] = None        # the campaign's cap on this cluster
    site_max_queued_jobs: Optional[int] = None   # the site's per-user limit (MaxSubmitJobs)
    run_prefix: str = ""
    scripts: List[Dict[str, Any]] = field(default_factory=list)
    capacity_jobs: Optional[int] = None          # plan jobs its partition runs at once

    @property
    def label(self) -> str:
        return self.name or "(default)"


def clusters_of(manifest: Dict[str, Any]) -> List[ClusterInfo]:
    """Every cluster the plan may run on, the first one first."""
    submit = manifest.get("submit", {})
    kind = submit.get("scheduler", DEFAULT)
    if not manifest.get("clusters"):
        return [ClusterInfo(None, scheduler_for(kind), bool(submit.get("accounting", True)),
                            site_max_queued_jobs=submit.get("max_queued_jobs"), scripts=manifest.get("scripts", []))]
    return [ClusterInfo(c["name"], scheduler_for(c.get("scheduler", kind), c["name"]), bool(c.get("accounting", True)),
                        float(c.get("share") or 1.0), c.get("max_queued_jobs"), c.get("site_max_queued_jobs"),
                        c.get("run_prefix", ""), c.get("scripts", []), c.get("capacity_jobs"))
            for c in manifest["clusters"]]
