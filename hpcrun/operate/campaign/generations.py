"""A campaign's generations as the store and the supervisor see them: where each one's files are, their
manifests, the record the store takes up and each one's figures.

Planning the next generation (``hpcrun plan --apply`` into a submitted plan directory) is replan.py's: it renders
(jinja2, the site model), which a supervisor never needs, so `hpcrun run` does not import it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from hpcrun.operate.manifest import MANIFEST, Manifest
from hpcrun.operate.metrics import Family
from hpcrun.operate.plandir import has_store, open_plan_store, read_manifest
from hpcrun.store.base import StateStoreError
from hpcrun.store.records import GenerationRecord
from hpcrun.store.store import StateStore

GEN_DIR = "generations"


def generation_dir(plan_dir: Path, number: int) -> Path:
    """Where generation ``number``'s files are (1: the top of the plan directory)."""
    return plan_dir if number <= 1 else plan_dir / GEN_DIR / str(number)


def submitted_store(plan_dir: Path, db: Optional[str]) -> Optional[str]:
    """The name of the campaign a store holds for this plan directory (None: never submitted)."""
    if not (plan_dir / MANIFEST).is_file() or not has_store(plan_dir, db):
        return None
    name = read_manifest(plan_dir, jobs=False).campaign
    with open_plan_store(plan_dir, db) as store:
        try:
            store.get_campaign(str(name))
        except StateStoreError:   # no such campaign: the store is empty, or another plan's
            return None
    return str(name)


def earlier_manifests(plan_dir: Path, manifest: Manifest) -> Iterator[Manifest]:
    """The manifests of the generations before ``manifest``'s (each read as it is reached)."""
    for number in range(1, manifest.generation.number):
        path = plan_dir / GEN_DIR / str(number)
        if (path / MANIFEST).is_file():
            yield read_manifest(path)


# -- the store takes a generation up -----------------------------------------------------------

def generation_record(manifest: Manifest) -> GenerationRecord:
    gen = manifest.generation
    return GenerationRecord(
        gen.number, manifest.spec_digest, manifest.profile_digest, gen.reprocess,
        dict(manifest.provenance, directory=gen.directory, hpcrun_version=manifest.hpcrun_version), gen.planned_by,
        dt.datetime.fromisoformat(gen.planned_at) if gen.planned_at else dt.datetime.now(dt.timezone.utc))


def figures(store: StateStore, campaign_id: int) -> List[Dict[str, Any]]:
    """Each generation's inputs by state and who planned it, for status, report, serve and the metrics;
    empty for a campaign planned once (its figures are the campaign's: no second query on its polls)."""
    gens = store.generations(campaign_id)
    if len(gens) <= 1:
        return []
    counts = store.counts_by_generation(campaign_id)
    return [{"number": g.number, "planned_by": g.planned_by, "planned_at": g.planned_at.isoformat(timespec="seconds")
             if g.planned_at else None, "reprocess": g.reprocess, "release": g.details.get("release"),
             "outputs": g.details.get("outputs"), "inputs": counts.get(g.number, {})} for g in gens]


def figure_line(g: Dict[str, Any]) -> str:
    """One generation in words (status, the supervisor's round)."""
    inputs = ", ".join(f"{n} {state}" for state, n in sorted(g["inputs"].items())) or "no inputs"
    return (f"generation {g['number']} (release {g['release'] or '-'}, reprocess {g['reprocess']}, planned by "
            f"{g['planned_by']} at {g['planned_at']}): {inputs}")


def metric_families(figs: Sequence[Dict[str, Any]]) -> List[Family]:
    """The metrics file's lines of each generation (none for a campaign planned once)."""
    if not figs:
        return []
    fam = Family("hpcrun_generation_inputs", "Input files per generation of the campaign and state.")
    for g in figs:
        for state, n in g["inputs"].items():
            fam.add(n, generation=str(g["number"]), state=state)
    return [fam]
