"""``iotune.json``: everything ``collect`` needs to read a sweep's raw outputs later, written
when the sweep is planned (batch) or run (``--local``)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Dict

from hpcrun import __version__
from hpcrun.iotune.sweeps.plan import SweepPlan


def build(plan: SweepPlan, out_dir: str) -> Dict[str, Any]:
    now = dt.datetime.now(dt.timezone.utc)
    return {
        "kind": "hpcrun-iotune", "schema": 1,
        "sweep_id": f"{plan.sweep.name}-{now.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}",
        "created": now.isoformat(timespec="seconds"), "hpcrun_version": __version__,
        "mode": "local" if plan.local else "batch", "out_dir": out_dir,
        "profile": plan.profile.name, "profile_files": [str(p) for p in plan.profile_files],
        "engine": {"name": plan.engine, "binary": plan.engine_bin},
        "darshan_lib": plan.darshan_lib,
        "sweep": plan.sweep.model_dump(mode="json"),
        "targets": [{"index": t.index, "name": t.name, "kind": t.kind, "path": t.path,
                     "profile_fstype": t.profile_fstype} for t in plan.targets],
        "bb_capacity_bytes": plan.bb_capacity or None,
        "points": [p.as_dict() for p in plan.points],
        "steps": [s.as_dict() for s in plan.steps],
    }
