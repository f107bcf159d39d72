"""Gather a campaign's figures for a plan directory: the store's rows, named by the manifest.

Used by ``hpcrun report`` and by the live view (``hpcrun serve``); both read the store only.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from hpcrun.backends.late.figures import figures as pilot_figures
from hpcrun.backends.scheduler.base import SchedulerError
from hpcrun.errors import InputError, Problem
from hpcrun.operate.campaign import forecast
from hpcrun.operate.campaign.generations import figures as generation_figures
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.outputs import folding
from hpcrun.operate.plandir import clusters_of, has_store, open_plan_store, read_manifest
from hpcrun.operate.results import outcome_of
from hpcrun.operate.submission.finalize import finalize_summary
from hpcrun.operate.tracking.outages import ALLOCATION
from hpcrun.operate.tracking.outages import rows as outage_rows
from hpcrun.operate.tracking.track import poll as status_poll
from hpcrun.report.figures import CampaignReport, build, transfers_of
from hpcrun.store.base import StateStoreError
from hpcrun.store.records import Campaign
from hpcrun.store.store import StateStore


@contextmanager
def open_campaign(plan_dir: Path, db: Optional[str]) -> Iterator[Tuple[Manifest, StateStore, Campaign]]:
    """The manifest, the open store and the campaign of a plan; a clear refusal when it has no state."""
    manifest = read_manifest(plan_dir)
    if not has_store(plan_dir, db):
        raise InputError([Problem(str(plan_dir), None, "", (
            "has no campaign state yet (no state.db): start it with `hpcrun run` or `hpcrun submit`"))])
    with open_plan_store(plan_dir, db) as store:
        try:
            campaign = store.get_campaign(manifest.campaign)
        except StateStoreError:
            raise InputError([Problem(store.location, None, "", (
                f"has no campaign '{manifest.campaign}': start it with `hpcrun run` or `hpcrun submit`"))]) from None
        yield manifest, store, campaign


def report_of(manifest: Manifest, store: StateStore, campaign: Campaign,
              plan_dir: Optional[Path] = None) -> CampaignReport:
    report = build(campaign.name, store.report_rows(campaign.id), {j["index"]: j["name"] for j in manifest.jobs})
    report.finalize = finalize_summary(manifest, store, campaign.id)
    report.targets = dict(manifest.targets)
    report.outcome = outcome_of(report.inputs, store.operator_cancelled(campaign.id))
    report.generations = generation_figures(store, campaign.id)
    report.forecast = forecast.of_store(store, campaign.id, manifest).as_dict()
    report.allocation = [o for o in outage_rows(store.outages(campaign.id), clusters_of(manifest)[0].sched)
                         if o["daemon"] == ALLOCATION]
    exports = store.export_summary(campaign.id) if manifest.export else None
    if exports is not None:
        report.exports = exports.as_dict()
        if exports.failed_attempts:   # the class of failed copies to outputs.export (the job was not rerun)
            report.attempts_by_class["export"] = exports.failed_attempts
    if plan_dir is not None and manifest.inputs_remote:
        report.transfers = transfers_of(_transfer_rows(plan_dir), _stage_jobs(plan_dir))
    if plan_dir is not None:
        report.chain_endings = _chain_endings(plan_dir)
        report.reclaimed = _reclaimed(plan_dir)
        report.node_cache = _node_cache(plan_dir)
        if manifest.pilots:   # late binding: what the pilots held and copied (the accounting sees only them)
            _pilots_accounting(manifest)
            report.pilots = pilot_figures(Path(manifest.pilots["queue"]), plan_dir / "run",
                                          int(manifest.pilots.get("chains") or 1))
    return report


def _pilots_accounting(manifest: Manifest) -> None:
    """Pilots that ended after the supervisor's last round read from the accounting once (their CPU time);
    a report made where the scheduler does not answer shows what was kept."""
    sched = clusters_of(manifest)[0].sched
    refresh = getattr(sched, "refresh_accounting", None)
    if refresh is None:
        return
    try:
        refresh(dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1, seconds=2 * int(
            manifest.pilots.get("walltime_s") or 0) if manifest.pilots else 0))
    except SchedulerError:
        pass


def _tsv_lines(plan_dir: Path, pattern: str) -> Iterator[List[str]]:
    """The TAB-separated lines of the jobs' records matching ``pattern`` under run/ (bounded reads), those
    in run directories and those folded after success."""
    for _name, text in _records(plan_dir, pattern):
        for line in text.splitlines():
            yield line.split("\t")


def _records(plan_dir: Path, pattern: str) -> Iterator[Tuple[str, str]]:
    """(``job/id/file`` under run/, its text) of the records matching ``pattern``: in run directories, then
    folded, each file once (after a crash a directory may hold some of a folded run's files, its copy all of
    them: the directory's are read, the others from the copy; a run folded twice: its first copy)."""
    seen = set()
    for log in sorted((plan_dir / "run").glob(pattern)):
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                text = f.read(RECORD_READ_MAX)
        except OSError:
            continue
        name = str(log.relative_to(plan_dir / "run"))
        seen.add(name)
        yield name, text
    for name, data in folding.matching(str(plan_dir / "run"), pattern):
        if name not in seen:
            seen.add(name)
            yield name, data[:RECORD_READ_MAX].decode("utf-8", "replace")


def _chain_endings(plan_dir: Path) -> Dict[str, int]:
    """How the chains of every run ended (chains.tsv: chain, status, ending)."""
    counts: Counter = Counter(parts[2] for parts in _tsv_lines(plan_dir, "*/*/chains.tsv") if len(parts) >= 3)
    return dict(counts.most_common())


def _reclaimed(plan_dir: Path) -> Dict[str, int]:
    """Node-local directories of killed jobs that later jobs removed, and their bytes."""
    rows = [parts for parts in _tsv_lines(plan_dir, "*/*/reclaimed/*.tsv") if len(parts) >= 2]
    if not rows:
        return {}
    return {"dirs": len(rows), "bytes": sum(int(p[1]) for p in rows if p[1].isdigit())}


def _node_cache(plan_dir: Path) -> Dict[str, Any]:
    """What the nodes' caches gave the jobs (cache.tsv: event, URL, bytes, node): hits, misses, bytes."""
    counts: Counter = Counter()
    size: Counter = Counter()
    for parts in _tsv_lines(plan_dir, "*/*/cache.tsv"):
        if len(parts) >= 3 and parts[2].isdigit():
            counts[parts[0]] += 1
            size[parts[0]] += int(parts[2])
    if not counts:
        return {}
    looked = counts["hit"] + counts["miss"]
    return {"hits": counts["hit"], "misses": counts["miss"], "corrupt": counts["corrupt"], "evicted": counts["evict"],
            "hit_ratio": round(counts["hit"] / looked, 4) if looked else None,
            "bytes_from_cache": size["hit"], "bytes_from_origin": size["miss"]}


RECORD_READ_MAX = 4 * 1024 * 1024   # bytes read of one job record file (10^4 xrdcp attempts fit)


def _transfer_rows(plan_dir: Path) -> List[Tuple[int, float, int, str]]:
    """(bytes, seconds, exit code, how it came) of every copy attempt the plan's jobs logged (jobs of an
    older hpcrun logged no way: the server, or the cache)."""
    rows: List[Tuple[int, float, int, str]] = []
    for parts in _tsv_lines(plan_dir, "*/*/transfers.tsv"):
        if len(parts) >= 5 and parts[1].isdigit() and parts[2].isdigit() and parts[4].lstrip("-").isdigit():
            rows.append((int(parts[1]), int(parts[2]) / 1000, int(parts[4]), parts[6] if len(parts) >= 7 else "server"))
    return rows


def _stage_jobs(plan_dir: Path) -> List[Tuple[int, float, int]]:
    """(bytes staged, stage-in seconds, CPUs) of every job run that recorded its stage-in (stage.tsv)."""
    stages = {name.rsplit("/", 1)[0]: text for name, text in _records(plan_dir, "*/*/stage.tsv")}
    moved: Dict[str, int] = {}
    for name, text in _records(plan_dir, "*/*/transfers.tsv") if stages else ():
        rows = [line.split("\t") for line in text.splitlines()]
        moved[name.rsplit("/", 1)[0]] = sum(int(r[1]) for r in rows if len(r) >= 5 and r[1].isdigit() and r[4] == "0")
    out: List[Tuple[int, float, int]] = []
    for run, text in stages.items():
        if run not in moved:
            continue   # no copy log beside it: not a record of a stage-in
        try:
            span, cpus = text[:200].split("\t")[:2]
        except ValueError:
            continue
        if span.strip().isdigit() and cpus.strip().isdigit():
            out.append((moved[run], int(span) / 1000, int(cpus)))
    return out


def campaign_report(plan_dir: Union[str, Path], *, db: Optional[str] = None,
                    poll: bool = False) -> Tuple[CampaignReport, str]:
    """The report and the store location; ``poll`` records a fresh scheduler poll first."""
    plan_dir = Path(plan_dir).resolve()
    if poll and has_store(plan_dir, db):
        status_poll(plan_dir, db=db)
    with open_campaign(plan_dir, db) as (manifest, store, campaign):
        return report_of(manifest, store, campaign, plan_dir), store.location
