"""Submit a plan directory to Slurm and record each job id as soon as sbatch returns.

The record (``submitted.json`` in the plan directory) is rewritten atomically after
every submission, so an interruption loses at most the job being submitted at
that moment; scripts already recorded are never submitted twice.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from . import slurm
from .errors import InputError, Problem

RECORD = "submitted.json"


@dataclass
class Submission:
    script: str
    job_id: str
    array: Optional[str]
    first_job: int
    last_job: int
    submitted_at: str


def read_manifest(plan_dir: Path) -> Dict[str, Any]:
    path = plan_dir / "manifest.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([Problem(str(plan_dir), None, "", (
            "is not a plan directory (no manifest.json); create one with `hpcrun plan SPEC --out DIR`"))]) from None
    except (OSError, ValueError) as exc:
        raise InputError([Problem(str(path), None, "", f"cannot be read: {exc}")]) from None


def read_record(plan_dir: Path) -> List[Submission]:
    path = plan_dir / RECORD
    if not path.exists():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    return [Submission(**s) for s in data["submissions"]]


def _write_record(plan_dir: Path, campaign: str, subs: List[Submission]) -> None:
    data = {"campaign": campaign, "user": getpass.getuser(),
            "submissions": [s.__dict__ for s in subs]}
    tmp = plan_dir / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, plan_dir / RECORD)


def submit(plan_dir: Path, dry_run: bool = False,
           progress: Optional[Callable[[Submission], None]] = None) -> List[Submission]:
    """Submit every script of the plan that has no recorded job id yet."""
    plan_dir = Path(os.path.abspath(plan_dir))
    manifest = read_manifest(plan_dir)
    done = read_record(plan_dir)
    recorded = {s.script for s in done}
    new: List[Submission] = []
    for script in manifest["scripts"]:
        if script["path"] in recorded:
            continue
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        if dry_run:
            job_id = "(dry-run)"
        else:
            job_id = slurm.sbatch(plan_dir / script["path"])
        sub = Submission(script["path"], job_id, script["array"], script["jobs"][0], script["jobs"][1], now)
        new.append(sub)
        if not dry_run:
            done.append(sub)
            _write_record(plan_dir, manifest["campaign"], done)
        if progress:
            progress(sub)
    return new
