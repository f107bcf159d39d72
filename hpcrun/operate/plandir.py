"""A plan directory as operate sees it: its manifest (the one contract with ``hpcrun plan``)
and its campaign store. Status, retry, report and submit open it here, not through each other."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from hpcrun.backends.late.pilots import wrap
from hpcrun.backends.scheduler import Scheduler, scheduler_for
from hpcrun.operate.manifest import Manifest, ScriptEntry, manifest_id, read_manifest  # noqa: F401  (re-exported)
from hpcrun.store.locking.mounts import DB_NAME
from hpcrun.store.store import StateStore, open_store

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


SLOW_PAUSE_FACTOR = 4.0    # a slow scheduler: the pause is at least four times its slowest command ...
MAX_PAUSE_S = 600.0        # ... up to ten minutes (a throttled user's RPCs then refill)


def paced_interval(pause: float, slowest_s: float, slow_s: float) -> float:
    """The pause after a round whose slowest scheduler command took ``slowest_s``: lengthened while the
    scheduler is slow (``slow_s`` or more), never shortened."""
    if slowest_s < slow_s:
        return pause
    return max(pause, min(MAX_PAUSE_S, SLOW_PAUSE_FACTOR * slowest_s))


def poll_interval(manifest: Manifest, requested: Optional[float]) -> float:
    """The interval between polls: the request (default one minute), never below the site's minimum."""
    return max(DEFAULT_POLL_S if requested is None else requested, manifest.submit.min_poll_interval)


def next_interval(base: float, current: float, changed: bool) -> float:
    """Back off while nothing changes; back to ``base`` as soon as something does."""
    return base if changed else min(current * BACKOFF, base * BACKOFF_LIMIT)


def scheduler_of(manifest: Manifest) -> Scheduler:
    """The scheduler the plan was written for, talking to its first cluster (plans from before the
    registry: Slurm)."""
    kind = manifest.submit.scheduler
    return wrap(scheduler_for(kind, manifest.clusters[0].name if manifest.clusters else None),
                manifest.pilots, lambda name: scheduler_for(kind, name))


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
    scripts: List[ScriptEntry] = field(default_factory=list)
    capacity_jobs: Optional[int] = None          # plan jobs its partition runs at once

    @property
    def label(self) -> str:
        return self.name or "(default)"


def clusters_of(manifest: Manifest) -> List[ClusterInfo]:
    """Every cluster the plan may run on, the first one first."""
    sub = manifest.submit
    if manifest.pilots:   # late binding: tasks go to the queue (no cap); the pilots keep the site's caps
        return [ClusterInfo(None, wrap(scheduler_for(sub.scheduler), manifest.pilots,
                                       lambda name: scheduler_for(sub.scheduler, name)), True,
                            scripts=manifest.scripts)]
    if not manifest.clusters:
        return [ClusterInfo(None, scheduler_for(sub.scheduler), sub.accounting,
                            site_max_queued_jobs=sub.max_queued_jobs, scripts=manifest.scripts)]
    return [ClusterInfo(c.name, scheduler_for(c.scheduler, c.name), c.accounting, c.share, c.max_queued_jobs,
                        c.site_max_queued_jobs, c.run_prefix, c.scripts, c.capacity_jobs)
            for c in manifest.clusters]
