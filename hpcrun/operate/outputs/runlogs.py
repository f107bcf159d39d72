"""One input's logs and run records, wherever they are (``hpcrun logs``): what an operator reads first.

A run that failed keeps its directory ``run/<job>/<id>/`` whole; one that succeeded was folded into a
segment under ``run/folded/`` (folding.py). Both are shown the same way, with the scheduler's log of the
job (array mode: ``logs/<tag>-<job>_<task>.out``) or the pilot's log of the claim (late binding: the
section of ``run/pilots/<pilot>/claims/<slot>.log`` whose header names the claim).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpcrun.backends.late.runs import CLAIM_HEADER
from hpcrun.errors import InputError, Problem
from hpcrun.operate.outputs import folding
from hpcrun.operate.plandir import clusters_of, has_store, open_plan_store, read_manifest
from hpcrun.store.base import StateStoreError

SHOW_MAX = 4 * 1024 * 1024   # bytes shown of one file: its end (a 10 GB log must not fill the login node's memory)


@dataclass(frozen=True)
class RunRecord:
    """One run of the input's job: its id, where it is, and its files (relative path -> text)."""

    run_id: str
    where: str
    folded: bool
    files: Dict[str, str]

    def to_dict(self) -> Dict[str, Any]:
        return {"run_id": self.run_id, "where": self.where, "folded": self.folded, "files": self.files}


@dataclass(frozen=True)
class InputLogs:
    """An input, its state, the scheduler's (or the pilots') logs of its jobs and its runs' records."""

    input: str
    job: str
    state: str
    attempts: int
    last_reason: Optional[str]
    scheduler_logs: List[Tuple[str, str]] = field(default_factory=list)
    runs: List[RunRecord] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"input": self.input, "job": self.job, "state": self.state, "attempts": self.attempts,
                "last_reason": self.last_reason,
                "scheduler_logs": [{"path": p, "text": t} for p, t in self.scheduler_logs],
                "runs": [r.to_dict() for r in self.runs]}


def input_logs(plan_dir: Path, name: str, db: Optional[str] = None) -> List[InputLogs]:
    """Every input ``name`` names (a path, a file name or a plan job's name) with its logs and records."""
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir, jobs=False)
    if not has_store(plan_dir, db):
        raise InputError([Problem(str(plan_dir), None, "logs", "nothing was submitted from this plan directory "
                                  "yet: there are no logs (run `hpcrun submit` or `hpcrun run` first)")])
    with open_plan_store(plan_dir, db) as store:
        try:
            campaign = store.get_campaign(manifest.campaign)
        except StateStoreError:
            campaign = None
        found = store.input_history(campaign.id, name) if campaign is not None else []
    if not found:
        raise InputError([Problem(str(plan_dir), None, "logs", f"no input of campaign {manifest.campaign} is "
                                  f"named {name!r}: give an input's path, its file name, or its job's name "
                                  "(as `hpcrun status --all` lists them)")])
    jobs = {row["job"] for row in found if row["job"]}
    folded: Dict[str, Dict[str, folding.FoldedRun]] = {}
    for f in folding.indexed(str(plan_dir / "run")):   # one read of the index for every input named
        if f.job in jobs:
            folded.setdefault(f.job, {})[f.run_id] = f   # folded again after a failed sync: the last copy
    sched = clusters_of(manifest)[0].sched
    by_id = folding.logs_by_job_id(str(plan_dir / "logs"))   # one listing: failed and running jobs' logs
    return [_logs_of(plan_dir, row, folded.get(row["job"] or "", {}), sched, by_id) for row in found]


def _logs_of(plan_dir: Path, row: Dict[str, Any], folded: Dict[str, folding.FoldedRun], sched: Any,
             by_id: Dict[str, str]) -> InputLogs:
    job = row["job"] or ""
    runs = _runs(plan_dir / "run", job, folded) if job else []
    logs: List[Tuple[str, str]] = []
    if any(str(sub["job_id"]).startswith("L") for sub in row["submissions"]):   # late binding: claims pilot.slot.n
        logs.extend(claim_log(plan_dir, r.run_id) for r in runs if r.run_id.count(".") == 2)
    for sub in row["submissions"]:
        logs.extend(_scheduler_log(by_id, sub, sched))
    for run in runs:   # a successful array job's log was folded with its run
        if folding.SCHEDULER_LOG in run.files:
            logs.append((f"{run.where}: {folding.SCHEDULER_LOG}", run.files.pop(folding.SCHEDULER_LOG)))
    return InputLogs(row["path"], job, row["state"], int(row["attempts"] or 0), row["last_reason"], logs, runs)


def _runs(run_dir: Path, job: str, folded: Dict[str, folding.FoldedRun]) -> List[RunRecord]:
    """The job's runs: directories under run/<job>/ (one small listing), and those folded. A run in both (a
    crash while its directory was removed) is shown as one: the folded files, and what the directory holds."""
    out: List[RunRecord] = []
    here = run_dir / job
    try:
        ids = sorted(os.listdir(here))
    except OSError:
        ids = []
    for run_id in ids:
        if (here / run_id).is_dir():
            also = folded.get(run_id)
            files = {rel: _text(data) for rel, data in folding.read_run(also).items()} if also else {}
            files.update(_dir_files(here / run_id))
            out.append(RunRecord(run_id, str(here / run_id) + (" (also folded)" if also else ""), False, files))
    for run_id, f in folded.items():
        if run_id not in ids:
            files = {rel: _text(data) for rel, data in folding.read_run(f).items()}
            out.append(RunRecord(run_id, f"{f.segment} at byte {f.offset}", True, files))
    return out


def _dir_files(where: Path) -> Dict[str, str]:
    files: Dict[str, str] = {}
    for root, _dirs, names in os.walk(where):
        for n in sorted(names):
            path = Path(root) / n
            files[str(path.relative_to(where))] = _tail(path)
    return files


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > SHOW_MAX:
                f.seek(size - SHOW_MAX)
            return _text(f.read(SHOW_MAX), size)
    except OSError as exc:
        return f"(cannot be read: {exc.strerror})"


def _text(data: bytes, size: Optional[int] = None) -> str:
    size = len(data) if size is None else size
    cut = size - min(size, SHOW_MAX)
    text = data[-SHOW_MAX:].decode("utf-8", "replace")
    return (f"[... the first {cut} bytes are not shown ...]\n" if cut else "") + text


def _scheduler_log(by_id: Dict[str, str], sub: Dict[str, Any], sched: Any) -> List[Tuple[str, str]]:
    """The scheduler's log of one submission, while it is in logs/ (a job that failed, or runs; a successful
    one's is folded with its run). Late binding's inputs have none: the pilots' slot logs hold them."""
    job_id = str(sub["job_id"])
    found = None if job_id.startswith("L") else folding.scheduler_log(by_id, sched, job_id, sub["array_index"])
    return [] if found is None else [(found, _tail(Path(found)))]


def claim_log(plan_dir: Path, cid: str) -> Tuple[str, str]:
    """The lines of a slot's log from the header naming ``cid`` to the next header."""
    lines: List[str] = []
    pilot, slot, _n = cid.split(".")
    path = plan_dir / "run" / "pilots" / pilot / "claims" / f"{slot}.log"
    keep, size = False, 0
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(CLAIM_HEADER):
                    if keep:
                        break
                    keep = cid in line[len(CLAIM_HEADER):].split()
                if keep and size < SHOW_MAX:
                    lines.append(line)
                    size += len(line)
    except OSError as exc:
        return str(path), f"(cannot be read: {exc.strerror})"
    return str(path), "".join(lines)
