"""``iotune.json``: everything ``collect`` needs to read a sweep's raw outputs later, written
when the sweep is planned (batch) or run (``--local``), and read back once as a :class:`SweepManifest`."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List

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


@dataclass(frozen=True)
class SweepManifest:
    """A sweep directory's ``iotune.json`` (written by sweeps/manifest.py), read once for ``collect``:
    the only reader of its keys. Points, steps and targets stay the JSON's own dicts."""

    sweep_id: str
    created: str
    hpcrun_version: str
    mode: str
    profile: str
    engine_name: str
    engine_binary: str
    sweep: Dict[str, Any]
    points: List[Dict[str, Any]]
    steps: List[Dict[str, Any]]
    targets: List[Dict[str, Any]]

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> SweepManifest:
        engine = data.get("engine") or {}
        return cls(str(data.get("sweep_id", "")), str(data.get("created", "")), str(data.get("hpcrun_version", "")),
                   str(data.get("mode", "")), str(data.get("profile", "")), str(engine.get("name", "")),
                   str(engine.get("binary", "")), dict(data.get("sweep") or {}), list(data.get("points") or []),
                   list(data.get("steps") or []), list(data.get("targets") or []))

    @property
    def name(self) -> str:
        return str(self.sweep.get("name", ""))

    @property
    def operations(self) -> List[str]:
        return list(self.sweep.get("operations") or [])
