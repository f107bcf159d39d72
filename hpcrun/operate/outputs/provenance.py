"""The provenance record of each output that passed QA in a job that completed: what made it.

Recorded by the poll that sees the job end, from three witnesses: the job's own run records
(``outputs.tsv``: each output's size and checksum, summed on the node; ``payload.id``: the conditions
payload's identity), the scheduler's accounting (cluster, job id, array task, node, start, end, exit
code) and the campaign's generation (spec and profile digests, release, container, outputs location).
``outputs.provenance: sidecar`` also writes ``<output>.prov.json`` beside the output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from hpcrun import __version__
from hpcrun.errors import InputError, Problem
from hpcrun.operate.outputs.qa_rows import read_or_empty
from hpcrun.operate.plandir import has_store, open_plan_store, read_manifest
from hpcrun.store.records import ActiveSubmission, GenerationRecord, ProvenanceRow, QaResult
from hpcrun.store.store import StateStore

COMPLETED = "COMPLETED"
SIDECAR_SUFFIX = ".prov.json"
FIELDS = ("output", "size", "checksum", "inputs", "generation", "release", "runtime", "image", "image_digest",
          "payload", "payload_identity", "spec_digest", "profile_digest", "cluster", "job_id", "array_task",
          "pilot", "slot", "node", "started_at", "ended_at", "exit_code",
          "hpcrun_version")   # the CSV's columns, in order


def record_outcomes(store: StateStore, campaign_id: int, job_dir: Callable[[ActiveSubmission, str], str],
                    qa: Sequence[QaResult], ended: Sequence[Tuple[ActiveSubmission, str]]) -> int:
    """The QA outcomes, then a provenance record for each passed output of a completed job; how many."""
    if not qa:
        return 0
    store.record_qa(qa)
    passed = [r for r in qa if r.passed and r.submission_id is not None]
    if not passed:
        return 0
    runs = store.run_facts(sorted({r.submission_id for r in passed if r.submission_id is not None}))
    inputs = store.input_facts(sorted({r.input_id for r in passed}))
    gens = {g.number: g for g in store.generations(campaign_id)}
    dirs = {a.id: job_dir(a, raw) for a, raw in ended}
    measured: Dict[str, Tuple[Dict[str, Tuple[Optional[int], Optional[str]]], Dict[str, Optional[str]]]] = {}
    rows: List[ProvenanceRow] = []
    for r in passed:
        run = runs.get(r.submission_id or -1)
        if run is None or run["state"] != COMPLETED:
            continue   # a job that failed reruns: its outputs are not the campaign's
        run_dir = dirs.get(r.submission_id or -1)
        if run_dir is not None and run_dir not in measured:   # a job of several outputs: its files read once
            measured[run_dir] = (_outputs(run_dir), {name: read_or_empty(os.path.join(run_dir, f"{name}.id")) or None
                                                     for name in ("payload", "image")})
        sums, ids = measured.get(run_dir or "", ({}, {}))
        rows.append(_row(r, dict(run, **_claim(run, run_dir)), inputs.get(r.input_id, {}),
                         gens.get(run["generation"]), sums, ids))
    store.record_provenance(campaign_id, rows)
    for row in rows:
        if gens.get(row.generation) is not None and gens[row.generation].details.get("sidecar"):
            write_sidecar(row.record)
    return len(rows)


def _claim(run: Dict[str, Any], run_dir: Optional[str]) -> Dict[str, Optional[str]]:
    """Late binding: the pilot job and its slot that ran the input, from the claim's id (``pilot.slot.n``,
    the name of its run directory); an array task's are None (the job ran it alone)."""
    name = os.path.basename(run_dir or "")
    parts = name.split(".")
    if str(run.get("job_id") or "").startswith("L") and len(parts) == 3:
        return {"pilot": parts[0], "slot": parts[1]}
    return {"pilot": None, "slot": None}


def _outputs(run_dir: str) -> Dict[str, Tuple[Optional[int], Optional[str]]]:
    """What the job measured of its outputs: name -> (size, algo:checksum)."""
    found: Dict[str, Tuple[Optional[int], Optional[str]]] = {}
    for line in read_or_empty(os.path.join(run_dir, "outputs.tsv")).splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            found[parts[0]] = (int(parts[1]) if parts[1].isdigit() else None, parts[2] or None)
    return found


def _row(r: QaResult, run: Dict[str, Any], source: Dict[str, Any], gen: Optional[GenerationRecord],
         sums: Dict[str, Tuple[Optional[int], Optional[str]]], ids: Dict[str, Optional[str]]) -> ProvenanceRow:
    details = gen.details if gen is not None else {}
    location = str(details.get("outputs") or "").rstrip("/")
    path = f"{location}/{r.output_path}" if location and not r.output_path.startswith("/") else r.output_path
    size, checksum = sums.get(os.path.basename(r.output_path), (None, None))
    image = details.get("image")
    record = {
        "output": path, "size": size, "checksum": checksum,
        "inputs": [{"path": source.get("path"), "checksum": source.get("checksum")}],
        "generation": run["generation"], "release": details.get("release"), "runtime": details.get("runtime"),
        "image": image, "image_digest": image_digest(image) or ids.get("image"),
        "payload": details.get("payload"),
        "payload_identity": ids.get("payload"),
        "spec_digest": gen.spec_digest if gen else None, "profile_digest": gen.profile_digest if gen else None,
        "cluster": run["cluster"], "job_id": run["job_id"], "array_task": run["array_task"],
        "pilot": run["pilot"], "slot": run["slot"], "node": run["node"],
        "started_at": run["started_at"], "ended_at": run["ended_at"], "exit_code": run["exit_code"],
        "events_in": r.events_in, "events_out": r.events_out,
        "hpcrun_version": details.get("hpcrun_version") or __version__, "recorded_by": __version__,
    }
    return ProvenanceRow(r.input_id, run["generation"], path, size, checksum, record)


def image_digest(image: Optional[str]) -> Optional[str]:
    """The digest an image reference pins (``name@sha256:...``); a tag or a file says nothing certain."""
    if image and "@sha256:" in image:
        return "sha256:" + image.rsplit("@sha256:", 1)[1]
    return None


def write_sidecar(record: Dict[str, Any]) -> Optional[str]:
    """``<output>.prov.json`` beside the output, written whole (a temporary name, then renamed); the
    reason when it could not be (the record in the store stands either way)."""
    target = record["output"] + SIDECAR_SUFFIX
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, target)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return str(exc)
    return None


# -- the catalogue export -----------------------------------------------------------------------

def as_json_lines(texts: Iterable[str]) -> Iterator[str]:
    """One JSON array, one record (as stored: a JSON object) a line, written as it is read (10^6 records
    in bounded memory)."""
    first = True
    for text in texts:
        yield ("[\n" if first else ",\n") + text
        first = False
    yield "[]\n" if first else "\n]\n"


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        value = json.dumps(value, sort_keys=True)
    return str(value)


def as_csv_rows(records: Iterable[Dict[str, Any]]) -> Iterator[List[str]]:
    """The header, then one row per record (inputs: their paths and checksums as JSON)."""
    yield list(FIELDS)
    for rec in records:
        yield [csv_cell(rec.get(k)) for k in FIELDS]


def outputs_of(plan_dir: Any, db: Optional[str] = None, generation: Optional[int] = None,
               raw: bool = False) -> Iterator[Any]:
    """The provenance records of a plan's outputs (of one generation), read a page at a time. Checked
    before the first record: a plan directory without a store, or a generation it does not have, is
    refused (InputError) rather than listed as empty. ``raw``: each record's JSON text as stored."""
    plan_dir = Path(plan_dir)
    manifest = read_manifest(plan_dir, jobs=False)
    if not has_store(plan_dir, db):
        raise InputError([Problem(str(plan_dir), None, "", (
            "has no campaign store: nothing was submitted from it, so no output was recorded (give --db "
            "or $HPCRUN_STATE_DB when its campaign keeps its state in a database server)"))])
    store = open_plan_store(plan_dir, db)
    try:
        campaign = store.get_campaign(manifest.campaign)
        known = [g.number for g in store.generations(campaign.id)] or [1]
    except BaseException:
        store.close()
        raise
    if generation is not None and generation not in known:
        store.close()
        raise InputError([Problem("--generation", None, "--generation", (
            f"campaign '{campaign.name}' has no generation {generation}; it has {', '.join(map(str, known))}"))])
    return _stream(store, campaign.id, generation, raw)


def _stream(store: StateStore, campaign_id: int, generation: Optional[int], raw: bool) -> Iterator[Any]:
    try:
        yield from (store.provenance_texts if raw else store.provenance)(campaign_id, generation)
    finally:
        store.close()
