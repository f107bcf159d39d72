"""The manifest: the one contract between plan and operate, as JSON text.

Written in a stream: the head (campaign, totals, scripts, clusters, ...) is a small dict,
the job list is encoded one job per line and written in chunks, so a plan of 10^6 inputs
never holds the job entries or the whole text at once. ``manifest()`` builds the complete
dict for callers that want it (tests, small plans); both give the same text.
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring_ascii as _json_str  # type: ignore[attr-defined]
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Sequence

from hpcrun import __version__
from hpcrun.model.retry import effective_rules
from hpcrun.plan.footprint import assessed
from hpcrun.plan.job.pilots import PILOT_SCRIPT, QUEUE_DIR
from hpcrun.plan.job.requests import finalize_name
from hpcrun.plan.values import Footprint, Job, Plan, index_range, inputs_in
from hpcrun.render.headers import ARRAY_TABLE_NAME, ARRAY_TEMPLATE_NAME, TABLE_NAME, TEMPLATE_NAME
from hpcrun.render.scripts import node_key, pilot_prefix, run_prefix, script_path

JOBS_PER_WRITE = 2000   # job lines encoded and written together: flat memory, few write calls


def _file_digest(paths: Sequence[Path]) -> str:
    """sha256 over the files a plan was made from: the state store refuses a changed campaign."""
    h = hashlib.sha256()
    for path in paths:
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(str(path).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def manifest_head(plan: Plan, plan_dir: str, digests: Dict[str, str]) -> Dict[str, Any]:
    """Everything but the job list (which ``job_entry`` gives one job at a time); the plan's footprint where it
    goes with its quota notes, whoever asks (write_plan refuses a quota exceeded before this is called)."""
    plan = assessed(plan, plan_dir, refuse=False)
    data = _head(plan, plan_dir, digests)
    if plan.others or plan.seat.name:
        # several clusters (or one named): each one's scripts and limits, before the (long, last) job list
        data["digests"]["profile"] = _file_digest([f for p in plan.all_clusters for f in p.profile_files])
        data["move_pending_after_s"] = plan.move_pending_after
        data["clusters"] = [_cluster_entry(p, digests) for p in plan.all_clusters]
    return data


def manifest(plan: Plan, plan_dir: str, digests: Dict[str, str]) -> Dict[str, Any]:
    """The whole manifest as a dict (the job list included)."""
    data = manifest_head(plan, plan_dir, digests)
    data["jobs"] = [job_entry(j) for j in plan.jobs]
    return data


def job_entry(j: Job) -> Dict[str, Any]:
    return {"index": j.index, "name": j.name, "chains_per_node": j.chains_per_node,
            "inputs": [i.path for i in j.inputs], "input_sizes": [i.size for i in j.inputs],
            "input_events": [i.events for i in j.inputs],
            "checksums": list(j.checksums) or [None] * len(j.inputs), "input_bytes": j.input_bytes,
            "events": j.events, "outputs": list(j.outputs), "bb_capacity_bytes": j.bb_capacity}


def _json_value(v: Any) -> str:
    return "null" if v is None else (_json_str(v) if isinstance(v, str) else int.__repr__(v))


def _json_list(values: Any) -> str:
    return "[" + ", ".join(map(_json_value, values)) + "]"


def job_line(j: Job) -> str:
    """``json.dumps(job_entry(j))``, written out: the same text at a third of the cost
    (10^5 to 10^6 of them per plan); a test holds the two equal on hostile values."""
    inputs = j.inputs
    if len(inputs) == 1 and len(j.outputs) == 1:   # one input per job (the usual): no lists, no calls
        i = inputs[0]
        events = "null" if i.events is None else int.__repr__(i.events)
        size = int.__repr__(i.size)
        checksum = j.checksums[0] if j.checksums else None
        capacity = j.bb_capacity
        return (f'{{"index": {j.index}, "name": {_json_str(j.name)}, "chains_per_node": {j.chains_per_node}, '
                f'"inputs": [{_json_str(i.path)}], "input_sizes": [{size}], "input_events": [{events}], '
                f'"checksums": [{"null" if checksum is None else _json_str(checksum)}], '
                f'"input_bytes": {size}, "events": {events}, "outputs": [{_json_str(j.outputs[0])}], '
                f'"bb_capacity_bytes": {"null" if capacity is None else int.__repr__(capacity)}}}')
    return (f'{{"index": {j.index}, "name": {_json_str(j.name)}, "chains_per_node": {j.chains_per_node}, '
            f'"inputs": {_json_list([i.path for i in inputs])}, '
            f'"input_sizes": {_json_list([i.size for i in inputs])}, '
            f'"input_events": {_json_list([i.events for i in inputs])}, '
            f'"checksums": {_json_list(j.checksums or [None] * len(inputs))}, '
            f'"input_bytes": {j.input_bytes}, "events": {_json_value(j.events)}, '
            f'"outputs": {_json_list(j.outputs)}, "bb_capacity_bytes": {_json_value(j.bb_capacity)}}}')


def charge_entry(plan: Plan) -> Dict[str, Any]:
    """The site's units per CPU-hour the scheduler allocates (forecasts price what runs used)."""
    part = plan.partition
    per = part.charge_factor / (part.cpus if part.charge_per == "node-hour" else 1)
    return {"unit": plan.profile.budget.charge_unit, "per_core_hour": per}


def _cluster_entry(plan: Plan, digests: Dict[str, str]) -> Dict[str, Any]:
    """One cluster of the campaign as submit and track need it (the manifest's ``clusters``)."""
    return {
        "name": plan.seat.name, "profile": plan.profile.name, "share": plan.seat.share,
        "max_queued_jobs": plan.seat.max_queued_jobs, "site_max_queued_jobs": plan.profile.max_queued_jobs,
        "scheduler": plan.scheduler, "accounting": plan.accounting, "partition": plan.partition_name,
        "min_poll_interval": plan.profile.scheduler.min_poll_interval, "run_prefix": run_prefix(plan.seat.name),
        "capacity_jobs": plan.capacity_jobs, "charge": charge_entry(plan),
        "scripts": [{k: v for k, v in s.items() if k != "name"} for s in script_entries(plan, digests)],
    }


def _pilots_entry(plan: Plan, plan_dir: str) -> Optional[Dict[str, Any]]:
    """Late binding: where the queue is, the pilots' script and shape (the pilots scheduler reads it)."""
    p = plan.pilots
    if p is None:
        return None
    caps = [n for n in (plan.profile.max_queued_jobs, plan.seat.max_queued_jobs) if n]
    return {"queue": f"{plan_dir}/{QUEUE_DIR}", "script": f"{plan_dir}/{PILOT_SCRIPT}", "name": p.name,
            "slots": p.slots, "chains": p.chains, "cpus": p.cpus, "max_pilots": p.max_pilots,
            "max_queued": min(caps) if caps else None, "lease_s": p.lease_s, "input_s": p.input_s,
            "input_limit_s": p.input_limit_s, "walltime_s": p.walltime_s, "drain_s": p.drain_s,
            "idle_s": p.idle_s, "server_key": server_key(plan),
            "seats": [_pilot_seat(c, plan_dir) for c in plan.all_clusters] if plan.others else None,
            "move_after_s": plan.move_pending_after, "outputs": plan.campaign.outputs.location.rstrip("/")}


def _pilot_seat(plan: Plan, plan_dir: str) -> Dict[str, Any]:
    """One cluster's pilots on a campaign with several: its script, its caps and share, its pilots' id prefix."""
    p = plan.pilots
    assert p is not None
    caps = [n for n in (plan.profile.max_queued_jobs, plan.seat.max_queued_jobs) if n]
    return {"cluster": plan.seat.name, "script": f"{plan_dir}/{plan.seat.subdir}{PILOT_SCRIPT}",
            "max_pilots": p.max_pilots, "max_queued": min(caps) if caps else None, "share": plan.seat.share,
            "prefix": pilot_prefix(plan), "walltime_s": p.walltime_s}


def server_key(plan: Plan) -> str:
    """What a pilot starts once for every input it runs (database server and payload, container): a
    generation that changes it cannot be run by the pilots already out (generations.py refuses it)."""
    c = plan.campaign.container
    db = plan.database
    held = [c.runtime, c.image, list(c.options), None if db is None else [db.server, db.payload, list(db.options)]]
    return hashlib.sha256(json.dumps(held).encode()).hexdigest()[:16]


def _head(plan: Plan, plan_dir: str, digests: Dict[str, str]) -> Dict[str, Any]:
    c = plan.campaign
    return {
        "hpcrun_version": __version__, "campaign": c.name, "spec_file": plan.spec_file,
        "profile": plan.profile.name, "profile_files": [str(p) for p in plan.profile_files],
        "partition": plan.partition_name, "qos": plan.qos, "container": c.container.runtime,
        "burst_buffer": plan.bb_system or "none",
        "walltime_seconds": c.walltime, "nodes_per_job": c.jobs.nodes,
        "checksum": c.inputs.checksum, "node_key": node_key(c.name, plan_dir),
        "totals": {
            "jobs": len(plan.jobs), "scripts": len(plan.scripts),
            "inputs": inputs_in(plan.jobs),
            "input_bytes": plan.input_bytes, "estimated_output_bytes": plan.output_bytes,
            "nodes": len(plan.jobs) * c.jobs.nodes, "core_hours": round(plan.core_hours, 2),
            "node_hours": round(plan.node_hours, 2), "bb_capacity_bytes": plan.bb_total,
            "bb_max_per_job_bytes": plan.bb_max, "stage_in_bytes": plan.stage_in_bytes,
            "stage_out_bytes": plan.stage_out_bytes,
        },
        "notes": plan.notes,
        "launch": {"in_batch": plan.launch.in_batch, "why": plan.launch.why,
                   "steps_per_job": plan.launch.steps_per_job},
        "expected_rpcs": plan.expected_rpcs,
        "footprint": footprint_entry(plan.footprint),
        "pilots": _pilots_entry(plan, plan_dir),
        "charge": charge_entry(plan),
        "digests": {"spec": _file_digest([Path(plan.spec_file)]), "profile": _file_digest(plan.profile_files)},
        "submit": {
            "throttle": c.jobs.throttle or plan.profile.array_throttle,
            "max_attempts": c.retry.max_attempts, "retry_cancelled": c.retry.cancelled,
            "max_queued_jobs": plan.profile.max_queued_jobs, "accounting": plan.accounting,
            "scheduler": plan.scheduler, "min_poll_interval": plan.profile.scheduler.min_poll_interval,
            "max_total_attempts": c.retry.max_total_attempts, "retry": effective_rules(c.retry),
            "limits": {"max_walltime_s": plan.partition.max_walltime,
                       "memory_per_node_bytes": plan.partition.memory_per_node, "nodes": plan.partition.nodes},
        },
        "events": None if c.events is None else {
            "command": list(c.events.command), "on": list(c.events.on), "stall_after_s": c.events.stall_after,
            "timeout_s": c.events.timeout},
        "targets": {} if c.targets is None else c.targets.model_dump(exclude_none=True),
        "inputs_remote": None if plan.remote is None else {"access": plan.remote.access, "cache": plan.remote.cache},
        "export": _export_entry(plan),
        "locality": None if plan.locality_wait is None or plan.remote is None or plan.remote.node_cache is None
        else {"index": plan.remote.node_cache.index, "wait_s": plan.locality_wait},
        "finalize": None if c.finalize is None else {
            "path": script_path(plan, "finalize"), "sha256": digests[script_path(plan, "finalize")],
            "job_name": finalize_name(c.name),
            "after": c.finalize.after},
        "generation": {"number": plan.succession.number, "reprocess": plan.succession.reprocess,
                       "first_index": plan.succession.first_index},
        "provenance": _provenance_entry(plan),
        "scripts": script_entries(plan, digests),
    }


def footprint_entry(fp: Optional[Footprint]) -> Optional[Dict[str, Any]]:
    """The forecast of files and bytes per filesystem (plan/footprint.py), for `plan --json` and for status to
    hold what was made against."""
    if fp is None:
        return None

    def figures(files: int, nbytes: int) -> Dict[str, int]:
        return {"files": files, "bytes": nbytes}

    return {"running": fp.running, "filesystems": [
        {"name": u.name, "path": u.path, "type": u.type,
         "quota": None if u.quota_files is None and u.quota_bytes is None else
         {"files": u.quota_files, "bytes": u.quota_bytes},
         "peak": figures(*u.peak), "end": figures(*u.end),
         "parts": [{"part": p.part, "peak": figures(p.peak_files, p.peak_bytes),
                    "end": figures(p.end_files, p.end_bytes)} for p in u.parts]}
        for u in fp.filesystems]}


def _provenance_entry(plan: Plan) -> Dict[str, Any]:
    """What a provenance record takes from the plan: the software, where outputs land, how they are summed."""
    c = plan.campaign
    return {"release": c.software.release, "runtime": c.container.runtime, "image": c.container.image,
            "outputs": c.outputs.location, "checksum": output_checksum(c.inputs.checksum),
            "sidecar": c.outputs.provenance == "sidecar",
            "payload": None if c.database is None else c.database.payload}


def output_checksum(inputs_algo: str) -> str:
    """The outputs are summed with the spec's algorithm (sha256 when the spec names none)."""
    return "sha256" if inputs_algo == "none" else inputs_algo


def script_entries(plan: Plan, digests: Dict[str, str]) -> List[Dict[str, Any]]:
    """The plan's scripts for submit: one per array or per-job file, or one for all the jobs whose
    scripts are rendered at submission (its template, and the table of what varies per job); arrays
    rendered at submission keep an entry each, naming the shared template and table."""
    own = plan.seat.subdir
    table = f"{own}jobs/{TABLE_NAME}"
    arrays = f"{own}jobs/{ARRAY_TABLE_NAME}"
    if arrays in digests:   # each array its own entry (its jobs, its spec), all from one template and table
        template = f"{own}jobs/{ARRAY_TEMPLATE_NAME}"
        return [{"name": s.name, "path": template, "array": s.array, "jobs": list(index_range(s.jobs)),
                 "sha256": digests[template], "headers": arrays, "headers_sha256": digests[arrays]}
                for s in plan.scripts]
    if table in digests:
        template = f"{own}jobs/{TEMPLATE_NAME}"
        return [{"name": "job", "path": template, "array": None,
                 "jobs": [index_range(plan.scripts[0].jobs)[0], index_range(plan.scripts[-1].jobs)[0]],
                 "sha256": digests[template], "headers": table, "headers_sha256": digests[table]}]
    return [{"name": s.name, "path": script_path(plan, s.name), "array": s.array,
             "jobs": list(index_range(s.jobs)), "sha256": digests[script_path(plan, s.name)]}
            for s in plan.scripts]


def _export_entry(plan: Plan) -> Optional[Dict[str, Any]]:
    """What the supervisor needs to send outputs on: from where, to where, how (absent: no export)."""
    e = plan.export
    if e is None:
        return None
    return {"to": e.to, "location": plan.campaign.outputs.location, "streams": e.streams,
            "max_attempts": e.max_attempts, "backoff_s": e.backoff_s, "max_backoff_s": e.max_backoff_s,
            "timeout_s": e.timeout_s, "copy": list(e.copy), "ask": list(e.ask),
            "client_env": [list(kv) for kv in e.client_env]}


def manifest_text(plan: Plan, plan_dir: str, digests: Dict[str, str]) -> str:
    return "".join(manifest_chunks(plan, manifest_head(plan, plan_dir, digests)))


def write_manifest(out: IO[str], plan: Plan, head: Dict[str, Any],
                   each: Optional[Callable[[List[Job]], object]] = None) -> None:
    """The manifest, written in pieces; ``each`` is given every piece's jobs (the task table is written
    from them: jobs made from a list file block by block are then made once, not twice)."""
    for chunk in manifest_chunks(plan, head, each):
        out.write(chunk)


def manifest_chunks(plan: Plan, head: Dict[str, Any],
                    each: Optional[Callable[[List[Job]], object]] = None) -> Iterator[str]:
    """The manifest's text in pieces: the head, then the jobs ``JOBS_PER_WRITE`` at a time."""
    parts = [_entry(key, value) for key, value in head.items()]
    jobs = plan.jobs
    if not jobs:
        yield "{\n" + ",\n".join(parts + [' "jobs": []']) + "\n}\n"
        return
    yield "{\n" + ",\n".join(parts) + ',\n "jobs": [\n  '
    for start in range(0, len(jobs), JOBS_PER_WRITE):
        piece = list(jobs[start:start + JOBS_PER_WRITE])
        if each is not None:
            each(piece)
        yield (",\n  " if start else "") + ",\n  ".join(map(job_line, piece))
    yield "\n ]\n}\n"


def _entry(key: str, value: Any) -> str:
    if isinstance(value, list) and value and isinstance(value[0], dict):
        body = ",\n  ".join(map(json.dumps, value))
        return f" {json.dumps(key)}: [\n  {body}\n ]"
    return f" {json.dumps(key)}: " + json.dumps(value, indent=1).replace("\n", "\n ")


def manifest_json(data: Dict[str, Any]) -> str:
    """JSON with one script / one job per line: json.dumps(indent=...) runs the pure-Python
    encoder (about 4x slower, ~200 MB more at 100k jobs); one line per entry keeps --diff
    readable."""
    parts: List[str] = [_entry(key, value) for key, value in data.items()]
    return "{\n" + ",\n".join(parts) + "\n}\n"
