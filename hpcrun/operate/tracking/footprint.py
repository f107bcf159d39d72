"""The files and bytes a campaign has made so far on each filesystem of the plan's forecast (issue 56).

Status and the live page ask every minute, and a listing of a campaign's 10^6 entries is a storm on a Lustre
metadata server, so nothing here walks the outputs or the plan directory: the figures are the plan's own model
(plan/footprint.py ``evaluated``) given the store's counts (inputs done, runs failed and in flight, tasks done),
the outputs' sizes the store recorded (the rest at the plan's estimate), the pilots the queue's view already
read names, and the folded segments' real size (one listing of ``run/folded/``: a few files). They are
estimates, and are shown as such; a manifest without a forecast (planned before it) shows nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from hpcrun.backends.scheduler.base import INPUT_STATE_OF
from hpcrun.operate.manifest import FilesystemFootprint, Manifest
from hpcrun.operate.outputs.folding import FOLDED
from hpcrun.operate.results import StatusReport
from hpcrun.plan.footprint import OUTPUTS_AT, PLAN_AT, WORK_AT, Counts, Shape, evaluated, figures_text
from hpcrun.store.store import StateStore
from hpcrun.units import format_bytes, format_count

DONE = ("done", "exporting", "export_failed")   # an input whose outputs are made (exported or not)


class Seen(NamedTuple):
    """What the caller has read already: inputs and plan jobs per state; late binding: the queue's view."""

    inputs: Mapping[str, int]
    jobs: Mapping[str, int]
    pilots: Optional[Mapping[str, Any]] = None


def made_so_far(plan_dir: Path, manifest: Manifest, store: StateStore, campaign_id: int,
                seen: Seen) -> List[Dict[str, Any]]:
    """Each forecast filesystem: the files and bytes made so far (estimated), with the forecast's peak, end
    and quota beside them; empty for a plan made before the forecast."""
    fp = manifest.footprint
    if not fp or not fp.get("filesystems"):
        return []
    counts = store_counts(plan_dir, manifest, store, campaign_id, seen)
    return held(fp["filesystems"], evaluated(shape(manifest), counts))


def of_status(plan_dir: Path, manifest: Manifest, store: StateStore, campaign_id: int,
              report: StatusReport) -> List[Dict[str, Any]]:
    """``made_so_far`` from the counts a status poll has just read."""
    return made_so_far(plan_dir, manifest, store, campaign_id, Seen(report.inputs, report.counts, report.pilots))


def shape(manifest: Manifest) -> Shape:
    """The model's view of the plan, from the manifest (plan/footprint.py ``shape_of`` from the Plan)."""
    late = manifest.pilots is not None
    slots = int((manifest.pilots or {}).get("slots") or 1) if late else 0
    return Shape(late, slots, bool(manifest.provenance.get("sidecar")), manifest.burst_buffer == "none")


def store_counts(plan_dir: Path, manifest: Manifest, store: StateStore, campaign_id: int, seen: Seen) -> Counts:
    """What the campaign made, from the store's counts (and the queue's view of the pilots)."""
    succeeded = sum(int(seen.inputs.get(s, 0)) for s in DONE)
    failed = sum(n for state, n in store.runs_by_state(campaign_id).items() if INPUT_STATE_OF.get(state) == "failed")
    pilots = len(seen.pilots.get("pilots") or []) + int(seen.pilots.get("fenced") or 0) if seen.pilots else 0
    recorded = store.output_bytes(campaign_id)
    total = manifest.totals
    each = int(total.get("estimated_output_bytes") or 0) // max(1, int(total.get("inputs") or 1))
    outputs = recorded.bytes + max(0, succeeded - recorded.inputs) * each
    return Counts(succeeded, failed, int(seen.jobs.get("running", 0)), pilots, int(seen.jobs.get("done", 0)),
                  outputs, folded_bytes(plan_dir))


def folded_bytes(plan_dir: Path) -> Optional[int]:
    """The bytes of the folded runs' segments and indexes (one listing of a few files); None: nothing folded."""
    try:
        with os.scandir(plan_dir / "run" / FOLDED) as entries:
            return sum(e.stat().st_size for e in entries if e.is_file())
    except OSError:
        return None


def held(filesystems: List[FilesystemFootprint], made: List[Tuple[str, str, int, int]]) -> List[Dict[str, Any]]:
    """The model's figures put on the forecast's filesystems: the plan directory's where its part is, the
    outputs' where they stay at the end, the work directories' where the outputs part ends empty (else with
    the outputs); the plan directory's own files as the plan wrote them."""
    where: Dict[str, Optional[int]] = {PLAN_AT: _index(filesystems, "plan directory", lambda p: True)}
    where[OUTPUTS_AT] = _index(filesystems, "outputs", lambda p: p["end"]["files"] > 0)
    work = _index(filesystems, "outputs", lambda p: p["end"]["files"] == 0)
    where[WORK_AT] = work if work is not None else where[OUTPUTS_AT]
    now: List[Dict[str, List[int]]] = [{} for _ in filesystems]
    for place, part, files, nbytes in made:
        i = where.get(place)
        if i is not None:
            figures = now[i].setdefault(part, [0, 0])
            figures[0], figures[1] = figures[0] + files, figures[1] + nbytes
    for i, fs in enumerate(filesystems):
        for p in fs["parts"]:
            if p["part"] == "plan directory":
                now[i]["plan directory"] = [p["end"]["files"], p["end"]["bytes"]]
    return [_entry(fs, parts) for fs, parts in zip(filesystems, now)]


def _index(filesystems: List[FilesystemFootprint], part: str, test: Callable[[Any], bool]) -> Optional[int]:
    """The first filesystem holding ``part`` (one that passes ``test``)."""
    for i, fs in enumerate(filesystems):
        if any(p["part"] == part and test(p) for p in fs["parts"]):
            return i
    return None


def _entry(fs: FilesystemFootprint, parts: Dict[str, List[int]]) -> Dict[str, Any]:
    files, nbytes = sum(f for f, _ in parts.values()), sum(b for _, b in parts.values())
    return {"name": fs["name"], "path": fs["path"], "type": fs["type"], "estimated": True,
            "now": {"files": files, "bytes": nbytes}, "peak": fs["peak"], "end": fs["end"], "quota": fs["quota"],
            "parts": [{"part": k, "now": {"files": f, "bytes": b}} for k, (f, b) in parts.items() if f or b]}


def cells(entry: Mapping[str, Any]) -> Dict[str, str]:
    """One filesystem's figures as words: where, made so far, the forecast's end and peak, the quota."""
    quota = entry.get("quota") or {}
    limits = ([f"{format_count(quota['files'])} files"] if quota.get("files") else []) + (
        [format_bytes(quota["bytes"])] if quota.get("bytes") else [])
    return {"where": f"{entry['path']} ({entry['name']})" if entry["name"] else entry["path"],
            "now": "~" + figures_text(entry["now"]["files"], entry["now"]["bytes"]),
            "end": figures_text(entry["end"]["files"], entry["end"]["bytes"]),
            "peak": figures_text(entry["peak"]["files"], entry["peak"]["bytes"]), "quota": ", ".join(limits)}


def line(entry: Mapping[str, Any]) -> str:
    """``footprint /pscratch (scratch): now ~41.2 K files, 1.2 TB (est. ...) of 1 M files, 3.3 TB forecast ...``"""
    c = cells(entry)
    return (f"footprint {c['where']}: now {c['now']} (est. from the store's counts) of {c['end']} forecast at "
            f"the end (peak {c['peak']})" + (f"; quota {c['quota']}" if c["quota"] else ""))
