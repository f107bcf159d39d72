"""A plan directory as operate sees it: its manifest (the one contract with ``hpcrun plan``)
and its campaign store. Status, retry, report and submit open it here, not through each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

from hpcrun.backends.scheduler import DEFAULT, Scheduler, scheduler_for
from hpcrun.errors import InputError, Problem
from hpcrun.store.store import StateStore, open_store


def _head(text: str) -> Optional[Dict[str, Any]]:
    """The manifest without its (last, possibly 100k entries long) ``jobs`` list, or None."""
    cut = text.rfind('\n "jobs": [')
    if cut < 0:
        return None
    try:
        head: Dict[str, Any] = json.loads(text[:cut].rstrip().rstrip(",") + "\n}")
    except ValueError:
        return None
    return head


def read_manifest(plan_dir: Path, jobs: bool = True) -> Dict[str, Any]:
    """The plan's manifest; ``jobs=False`` skips parsing the per-job list (a status poll needs none)."""
    path = plan_dir / "manifest.json"
    try:
        text = path.read_text(encoding="utf-8")
        data: Dict[str, Any] = (None if jobs else _head(text)) or json.loads(text)
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


def open_plan_store(plan_dir: Path, db: Optional[str] = None, **options: Any) -> StateStore:
    """The store of a plan: ``db`` (a URL) or ``<plan_dir>/state.db``."""
    return open_store(db or plan_dir, **options)


def scheduler_of(manifest: Dict[str, Any]) -> Scheduler:
    """The scheduler the plan was written for (plans from before the registry: Slurm)."""
    return scheduler_for(manifest.get("submit", {}).get("scheduler", DEFAULT))
