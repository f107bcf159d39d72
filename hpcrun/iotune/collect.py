"""Read a sweep directory's ``raw/`` outputs into results: one row per point and operation,
with the environment the sweep ran in. A point whose output is missing, empty or truncated
becomes a row with an ``error``; the other points are unaffected."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpcrun import __version__
from hpcrun.errors import InputError, Problem
from hpcrun.iotune import advice
from hpcrun.iotune.engines import Engine, engine_for
from hpcrun.iotune.points import EngineOutputError, Measurement
from hpcrun.iotune.sweeps.manifest import SweepManifest


class NotFinished(InputError):
    """The sweep job has not written its exit code yet."""


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _step_failure(raw: Path, step: Dict[str, Any]) -> Optional[str]:
    rc = _read(raw / f"{step['name']}.rc")
    if rc is None:
        return f"step {step['name']} did not run (no raw/{step['name']}.rc): the job ended before it"
    if rc != "0":
        err = (_read(raw / f"{step['name']}.err") or "").splitlines()
        last = f": {err[-1][:300]}" if err else ""
        return f"{step['name']} exited with code {rc}{last} (raw/{step['name']}.err)"
    return None


def _measure(engine: Engine, raw: Path, steps: List[Dict[str, Any]], operation: str
             ) -> Tuple[Optional[Measurement], Optional[str], Optional[str]]:
    """(measurement, error, engine version seen in the output)"""
    mine = [s for s in steps if operation in s["operations"]]
    if not mine:
        return None, "no step measured this operation", None
    parts: List[Measurement] = []
    version = None
    for step in mine:
        failure = _step_failure(raw, step)
        if failure:
            return None, failure, None
        try:
            found, seen = engine.measure(raw / step["result"], step["operations"], operation)
            parts.append(found)
            version = seen or version
        except EngineOutputError as exc:
            return None, f"{step['name']}: {exc} (raw/{step['result']})", None
    return engine.combine(parts), None, version


def _job_id(raw: Path) -> Optional[str]:
    """The sweep job's id (raw/job_id; sweeps written before it was named so: raw/slurm_job_id)."""
    return _read(raw / "job_id") or _read(raw / "slurm_job_id") or None


def finished(sweep_dir: Path) -> bool:
    return (sweep_dir / "raw" / "exit_code").is_file()


def collect(sweep_dir: Path, manifest: SweepManifest, job_state: Optional[str] = None) -> Dict[str, Any]:
    raw = sweep_dir / "raw"
    exit_code = _read(raw / "exit_code")
    if exit_code is None and job_state is None:
        raise NotFinished([Problem(str(sweep_dir), None, "DIR", (
            "the sweep has not finished: raw/exit_code is missing (the job is queued or running, or was "
            "never submitted); run collect again when it has ended"))])
    engine = engine_for(manifest.engine_name)
    steps = manifest.steps
    rows: List[Dict[str, Any]] = []
    seen_version = None
    for point in manifest.points:
        mine = [s for s in steps if s["point"] == point["id"]]
        for op in manifest.operations:
            m, error, version = _measure(engine, raw, mine, op)
            seen_version = seen_version or version
            row = dict(point)
            row["operation"] = op
            row.update({"bw_mib_mean": None, "bw_mib_max": None, "bw_mib_min": None, "iops_mean": None,
                        "reps": 0, "error": error})
            if m is not None:
                row.update({"bw_mib_mean": round(m.bw_mean, 3), "bw_mib_max": round(m.bw_max, 3),
                            "bw_mib_min": round(m.bw_min, 3),
                            "iops_mean": round(m.iops_mean, 3) if m.iops_mean is not None else None,
                            "reps": m.reps})
            logs = [s["darshan"] for s in mine if s.get("darshan") and op in s["operations"]]
            if logs:
                row["darshan"] = [f"raw/{log}" for log in logs]
                missing = [log for log in logs if not _has_log(raw / log)]
                if missing:
                    row["darshan_warning"] = (f"no Darshan log in raw/{missing[0]}: Darshan does not fail the "
                                              "run when it cannot write its log (or the library was not loaded)")
            rows.append(row)
    version_text = _read(raw / "engine-version") or ""
    engine_version = seen_version or engine.version(version_text)
    targets = []
    for t in manifest.targets:
        targets.append(dict(t, run_path=_read(raw / f"target-{t['index']}.path"),
                            fstype=_read(raw / f"target-{t['index']}.fstype") or "unknown"))
    return {
        "kind": "hpcrun-iotune-results", "schema": 1, "sweep_id": manifest.sweep_id,
        "name": manifest.name, "created": manifest.created,
        "collected": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hpcrun_version": __version__, "planned_with": manifest.hpcrun_version, "mode": manifest.mode,
        "engine": {"name": engine.name, "version": engine_version, "binary": manifest.engine_binary},
        "environment": {"node": _read(raw / "node"), "date": _read(raw / "started"),
                        "slurm_job_id": _job_id(raw), "profile": manifest.profile,
                        "exit_code": int(exit_code) if exit_code and exit_code.isdigit() else None,
                        "job_state": job_state},
        "targets": targets, "sweep": manifest.sweep, "results": rows,
        "recommendation": advice.recommend(rows, manifest.operations),
    }


def _has_log(path: Path) -> bool:
    if path.is_file():
        return path.stat().st_size > 0
    return path.is_dir() and any(p.name.endswith(".darshan") for p in path.iterdir())
