"""The Python API: what the command line does, as functions returning typed values.

For notebooks and scripts (``import hpcrun``)::

    import hpcrun
    check = hpcrun.validate("campaign.yaml")        # never raises for a bad spec: check.problems
    plan = hpcrun.make_plan("campaign.yaml", out="reco.plan")
    plan.submit()                                    # or hpcrun.submit("reco.plan")
    st = plan.status()                               # one poll of the scheduler
    st.to_pandas()                                   # one row per plan job (pandas optional)
    plan.report()                                    # shown as an HTML table in Jupyter
    hpcrun.open_plan("reco.plan").status()           # a plan directory written earlier

(``make_plan`` and ``campaign_report``, not ``plan`` and ``report``: those names are the
package's own subpackages.)

Every result has ``to_dict()`` (plain JSON-able data, what ``--json`` prints), ``rows()``
(its table, a list of dicts), ``to_pandas()`` and ``_repr_html_()``. Bad input raises
:class:`hpcrun.Error` (``.problems`` holds file, line, key and message of each). The CLI
calls these functions and only formats their results.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Union

from hpcrun.errors import HpcrunError, InputError, Problem

if TYPE_CHECKING:   # at run time imported where used: `import hpcrun` stays light
    from hpcrun.operate.manifest import Manifest

PathLike = Union[str, "os.PathLike[str]"]
Error = HpcrunError

__all__ = ["Error", "Validation", "PlanResult", "SubmitResult", "Status", "RetryResult", "Report",
           "IotuneResults", "validate", "make_plan", "open_plan", "submit", "status", "retry", "campaign_report",
           "outputs", "iotune_results"]


class _Result:
    """What every result offers: a dict, a table, a DataFrame and an HTML view."""

    title: str = ""

    def to_dict(self) -> Dict[str, Any]:
        raise NotImplementedError

    def rows(self) -> List[Dict[str, Any]]:
        """The tabular part (jobs, runs, points); empty when there is none."""
        return []

    def to_pandas(self) -> Any:
        """``rows()`` as a pandas DataFrame (pandas is optional: ``pip install pandas``)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("to_pandas() needs pandas, which hpcrun does not install: pip install pandas; "
                              "rows() gives the same table as a list of dicts") from None
        return pandas.DataFrame(self.rows())

    def summary(self) -> Dict[str, Any]:
        """The key figures shown above the table."""
        return {k: v for k, v in self.to_dict().items() if not isinstance(v, (list, dict))}

    def _repr_html_(self) -> str:
        """Every value escaped: specs and scheduler answers are untrusted text."""
        out = [f"<div class='hpcrun'><strong>{html.escape(self.title)}</strong>",
               "<table><tbody>"]
        out += [f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td style='text-align:left'>"
                f"{html.escape(_text(v))}</td></tr>" for k, v in self.summary().items()]
        out.append("</tbody></table>")
        rows = self.rows()
        if rows:
            cols = list(rows[0])
            out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr></thead>"
                       "<tbody>")
            for r in rows[:200]:
                out.append("<tr>" + "".join(f"<td>{html.escape(_text(r.get(c)))}</td>" for c in cols) + "</tr>")
            out.append("</tbody></table>")
            if len(rows) > 200:
                out.append(f"<p>... {len(rows) - 200} more rows: to_pandas() or rows() has them all</p>")
        out.append("</div>")
        return "\n".join(out)

    def __repr__(self) -> str:
        figures = ", ".join(f"{k}={_text(v)}" for k, v in list(self.summary().items())[:6])
        return f"<{type(self).__name__} {figures}>"


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


@dataclass(repr=False)
class Validation(_Result):
    """A spec checked against its site profile (nothing written)."""

    spec: str
    ok: bool
    problems: List[Dict[str, Any]] = field(default_factory=list)
    jobs: int = 0
    inputs: int = 0
    title = "hpcrun validate"

    def to_dict(self) -> Dict[str, Any]:
        return {"spec": self.spec, "ok": self.ok, "jobs": self.jobs, "inputs": self.inputs, "problems": self.problems}

    def rows(self) -> List[Dict[str, Any]]:
        return self.problems


@dataclass(repr=False)
class PlanResult(_Result):
    """A plan directory written: its manifest's totals, notes and scripts."""

    plan_dir: str
    manifest: Dict[str, Any]   # manifest.json as written (read from a directory: its job list read as gone through)
    diff: Optional[str] = None
    previous: bool = False
    value: Any = None   # the frozen hpcrun.plan.values.Plan it was written from
    change: Any = None  # a submitted plan directory's next generation: hpcrun.operate.campaign.replan.Change
    budgets: List[Any] = field(default_factory=list)   # each cluster's hpcrun.plan.budget.Budget (asked now)
    title = "hpcrun plan"

    @property
    def typed(self) -> Manifest:
        """The manifest as operate reads it (hpcrun.operate.manifest.Manifest)."""
        from hpcrun.operate.manifest import Manifest
        return Manifest.from_dict(self.manifest)

    def to_dict(self) -> Dict[str, Any]:
        m = self.typed
        out: Dict[str, Any] = {"campaign": m.campaign, "profile": m.profile, "partition": m.partition, "qos": m.qos,
                               "container": m.container, "burst_buffer": m.burst_buffer, "totals": dict(m.totals),
                               "notes": m.notes, "launch": dict(m.launch), "expected_rpcs": dict(m.expected_rpcs),
                               "pilots": None if m.pilots is None else dict(m.pilots), "footprint": m.footprint}
        out["plan_dir"] = self.plan_dir
        out["scripts"] = [s["path"] for s in m.scripts]
        if m.clusters:
            out["clusters"] = [{"name": c.name, "profile": c.profile, "share": c.share,
                                "max_queued_jobs": c.max_queued_jobs} for c in m.clusters]
        if self.diff is not None:
            out["diff"] = self.diff
        if self.change is not None:
            out["generation"] = self.change.to_dict()
        if self.budgets:
            out["budget"] = [b.as_dict() for b in self.budgets]
        return out

    def summary(self) -> Dict[str, Any]:
        m = self.typed
        return {"plan_dir": self.plan_dir, "campaign": m.campaign, "profile": m.profile,
                "partition": m.partition, **m.totals}

    def rows(self) -> List[Dict[str, Any]]:
        if self.value is None:   # opened from its directory: the manifest's job list
            return [{"job": j["name"], "inputs": len(j["inputs"]), "input_bytes": j["input_bytes"],
                     "first_input": j["inputs"][0] if j["inputs"] else None} for j in self.typed.jobs]
        return [{"job": j.name, "inputs": len(j.inputs), "input_bytes": j.input_bytes,
                 "first_input": j.inputs[0].path if j.inputs else None} for j in self.value.jobs]

    # the campaign's next steps, on this plan directory
    def submit(self, **options: Any) -> SubmitResult:
        return submit(self.plan_dir, **options)

    def status(self, **options: Any) -> Status:
        return status(self.plan_dir, **options)

    def retry(self, **options: Any) -> RetryResult:
        return retry(self.plan_dir, **options)

    def report(self, **options: Any) -> Report:
        return campaign_report(self.plan_dir, **options)


@dataclass(repr=False)
class SubmitResult(_Result):
    """What one submit did (or would do, with ``dry_run``)."""

    raw: Any  # hpcrun.operate.results.SubmitReport
    title = "hpcrun submit"

    def to_dict(self) -> Dict[str, Any]:
        r = self.raw
        return {"campaign": r.campaign, "store": r.store, "dry_run": r.dry_run,
                "submitted": self.rows(), "recovered": [{"tag": t, "job_id": j} for t, j in r.recovered],
                "released": r.released, "left_pending": r.left_pending,
                "finalize": r.finalize.as_dict() if r.finalize is not None else None, "clusters": r.clusters}

    def rows(self) -> List[Dict[str, Any]]:
        return [{"script": b.script.path, "job_id": b.job_id, "array": b.array_spec, "tag": b.tag, "jobs": b.jobs,
                 "cluster": b.cluster} for b in self.raw.batches]

    def summary(self) -> Dict[str, Any]:
        r = self.raw
        return {"campaign": r.campaign, "dry_run": r.dry_run, "batches": len(r.batches),
                "plan_jobs": sum(b.tasks for b in r.batches), "left_pending": r.left_pending}


@dataclass(repr=False)
class Status(_Result):
    """One poll of the scheduler: every plan job's state, recorded in the campaign's store."""

    raw: Any  # hpcrun.operate.tracking.track.StatusReport
    title = "hpcrun status"

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.raw.as_dict())

    def rows(self) -> List[Dict[str, Any]]:
        return [j.as_dict() for j in self.raw.jobs]

    def summary(self) -> Dict[str, Any]:
        r = self.raw
        return {"campaign": r.campaign, "in_flight": r.in_flight, "finished": r.finished,
                **{f"jobs {k}": v for k, v in r.counts.items()},
                "forecast end": (r.forecast or {}).get("end"), "held by the allocation": sum(
                    n for held in r.budget_held.values() for n in held.values())}

    @property
    def forecast(self) -> Optional[Dict[str, Any]]:
        """The campaign's forecast made with this poll (hpcrun.operate.campaign.forecast)."""
        return self.raw.forecast

    @property
    def footprint(self) -> List[Dict[str, Any]]:
        """Files and bytes made so far on each forecast filesystem, estimated (hpcrun.operate.tracking.footprint)."""
        return list(self.raw.footprint)


@dataclass(repr=False)
class RetryResult(_Result):
    raw: Any  # hpcrun.operate.retries.retry.RetryReport
    title = "hpcrun retry"

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.raw.as_dict())

    def summary(self) -> Dict[str, Any]:
        r = self.raw
        return {"campaign": r.campaign, "dry_run": r.dry_run, "requeued": len(r.requeued), "parked": len(r.parked),
                "unparked": len(r.unparked)}

    def rows(self) -> List[Dict[str, Any]]:
        r = self.raw
        return [{"job": j, "action": a} for a, names in (("requeued", r.requeued), ("parked", r.parked),
                                                         ("unparked", r.unparked)) for j in names]


@dataclass(repr=False)
class Report(_Result):
    """The campaign's figures of merit (success rate, CPU efficiency, throughput per core ...)."""

    raw: Any  # hpcrun.report.figures.CampaignReport
    store: str = ""
    title = "hpcrun report"

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.raw.as_dict())

    def figures(self) -> Dict[str, str]:
        """The report's figures as the CLI prints them (label -> text, targets included)."""
        from hpcrun.report.html import merit_rows
        return dict(merit_rows(self.raw))

    def summary(self) -> Dict[str, Any]:
        return self.figures()

    def rows(self) -> List[Dict[str, Any]]:
        from dataclasses import asdict
        return [asdict(m) for m in self.raw.runs]

    def write(self, out: Optional[PathLike] = None, plots: bool = True, plan_dir: Optional[PathLike] = None) -> Path:
        """Write the report directory (index.html, report.json, plots); returns index.html."""
        from hpcrun.report.html import write_report
        from hpcrun.report.plots import missing
        target = Path(out) if out is not None else Path(plan_dir or ".") / "report"
        return write_report(self.raw, target, self.store, plots=plots and not missing())


@dataclass(repr=False)
class IotuneResults(_Result):
    """A sweep's results: bandwidth per point and the recommendation."""

    data: Dict[str, Any]
    title = "hpcrun iotune"

    def to_dict(self) -> Dict[str, Any]:
        return self.data

    def summary(self) -> Dict[str, Any]:
        rec = self.data.get("recommendation") or {}
        overall = rec.get("overall") or {}
        return {"name": self.data.get("name"), "engine": (self.data.get("engine") or {}).get("name"),
                "points": len(self.data.get("results") or []), "recommendation": overall.get("text")}

    def rows(self) -> List[Dict[str, Any]]:
        return [dict(r) for r in self.data.get("results") or []]


# ---- the functions --------------------------------------------------------------------------

def validate(spec: PathLike) -> Validation:
    """Load and check SPEC against its site profile, as `hpcrun plan` does, without writing anything.
    Problems are returned, not raised (an unreadable spec too)."""
    from hpcrun.plan.load import load_plan
    from hpcrun.plan.values import inputs_in
    try:
        p = load_plan(Path(spec))
    except InputError as exc:
        return Validation(str(spec), False, [_problem(x) for x in exc.problems])
    return Validation(str(spec), True, [], len(p.jobs), inputs_in(p.jobs))


def _problem(p: Problem) -> Dict[str, Any]:
    return {"file": p.file, "line": p.line, "key": p.key, "message": p.message}


def make_plan(spec: PathLike, out: Optional[PathLike] = None, *, force: bool = False,
              diff: bool = False, apply: bool = False, reprocess: str = "none", db: Optional[str] = None) -> PlanResult:
    """Validate SPEC, expand it and write the plan directory (default ``./<campaign>.plan``).

    Into a directory whose campaign was submitted, the plan is the campaign's next generation: what it
    would change is returned (``change``, with the scripts' diff) and nothing is written unless ``apply``
    (or ``force``)."""
    from hpcrun.operate.campaign.generations import submitted_store
    from hpcrun.operate.campaign.replan import plan_generation
    from hpcrun.plan import budget
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan
    budgets: List[Any] = []

    def checked(path: Path, *succession: Any) -> Any:   # the account's budget asked before anything is written
        p = load_plan(path, *succession)
        budgets[:] = budget.check(p)
        return p

    target = Path(out) if out is not None else None
    if target is not None and submitted_store(Path(os.path.abspath(target)), db):
        where = Path(os.path.abspath(target))
        applying = apply or force
        p, change = plan_generation(Path(spec), where, checked, db=db, apply=applying,
                                    reprocess=reprocess, want_diff=diff or not applying)
        from hpcrun.operate.manifest import read_json
        manifest = read_json(where) if change.applied else _head_of(p, where)
        return PlanResult(str(where), manifest, change.diff, True, p, change, budgets)
    p = checked(Path(spec))
    if target is None:
        target = Path(f"{p.campaign.name}.plan")
        if submitted_store(Path(os.path.abspath(target)), db):
            return make_plan(spec, target, force=force, diff=diff, apply=apply, reprocess=reprocess, db=db)
    written = write_plan(p, target, want_diff=diff, force=force)
    return PlanResult(str(written.out_dir), written.manifest, written.diff, written.previous, p, budgets=budgets)


def _head_of(p: Any, where: Path) -> Dict[str, Any]:
    """The manifest head a plan would have (nothing written)."""
    from hpcrun.render.manifest import manifest_head
    return manifest_head(p, str(where), _NoDigests())


class _NoDigests(dict):
    """Script digests of a plan not written: not known."""

    def __missing__(self, key: str) -> str:
        return ""


def open_plan(plan_dir: PathLike) -> PlanResult:
    """A plan directory written earlier (its manifest), to submit, follow and report on."""
    from hpcrun.operate.manifest import read_json
    path = Path(os.path.abspath(plan_dir))
    return PlanResult(str(path), read_json(path, jobs=True))


def job_script(plan_dir: PathLike, job: str) -> str:
    """The script of one plan job, byte for byte what the scheduler is (or was) handed: its file,
    or its header rendered at submission (``jobs.script_files``)."""
    from hpcrun.operate.plandir import read_manifest
    from hpcrun.operate.submission.headers import job_script as find
    path = Path(os.path.abspath(plan_dir))
    return find(path, read_manifest(path, jobs=False), job)


def submit(plan_dir: PathLike, *, dry_run: bool = False, limit: Optional[int] = None, db: Optional[str] = None,
           lock_timeout: float = 600.0, finalize_again: bool = False, on_batch: Any = None,
           on_wait: Any = None) -> SubmitResult:
    """Submit the work of PLAN_DIR that is neither done nor in flight, and record it."""
    from hpcrun.operate.submission.submit import submit as do_submit
    return SubmitResult(do_submit(Path(plan_dir), db=db, dry_run=dry_run, limit=limit, lock_timeout=lock_timeout,
                                  on_batch=on_batch, on_wait=on_wait, finalize_again=finalize_again))


def status(plan_dir: PathLike, *, db: Optional[str] = None, all_jobs: bool = True) -> Status:
    """Poll the scheduler once for every job in flight, record what changed, and summarise."""
    from hpcrun.operate.tracking.track import poll
    return Status(poll(Path(plan_dir), db=db, all_jobs=all_jobs, with_forecast=True))


def retry(plan_dir: PathLike, *, dry_run: bool = False, max_attempts: Optional[int] = None,
          cancelled: Optional[bool] = None, jobs: Sequence[str] = (), unpark: bool = False,
          db: Optional[str] = None, finalize_again: bool = False, on_batch: Any = None) -> RetryResult:
    """Resubmit failed, timed-out and node-failed jobs; park those out of attempts."""
    from hpcrun.operate.retries.retry import retry as do_retry
    return RetryResult(do_retry(Path(plan_dir), db=db, max_attempts=max_attempts, cancelled=cancelled,
                                jobs=tuple(jobs), unpark=unpark, dry_run=dry_run, on_batch=on_batch,
                                finalize_again=finalize_again))


def rearm_exports(plan_dir: PathLike, *, db: Optional[str] = None) -> int:
    """Given-up exports (outputs.export) back to waiting with a fresh set of attempts; how many."""
    from hpcrun.operate.plandir import open_plan_store, read_manifest
    from hpcrun.operate.submission.submit import register
    with open_plan_store(Path(plan_dir), db) as store:
        campaign = register(store, read_manifest(Path(plan_dir)))
        count = store.rearm_exports(campaign.id)
        store.audit(campaign.id, "retry", f"re-armed {count} given-up export(s)")
        return count


def campaign_report(plan_dir: PathLike, *, db: Optional[str] = None, poll: bool = False) -> Report:
    """The campaign's figures from its store (``poll``: one scheduler poll first)."""
    from hpcrun.report.gather import campaign_report
    raw, store = campaign_report(Path(plan_dir), db=db, poll=poll)
    return Report(raw, store)


def outputs(plan_dir: PathLike, *, db: Optional[str] = None, generation: Optional[int] = None
            ) -> Iterator[Dict[str, Any]]:
    """The provenance record of every output that passed QA (of one ``generation``), streamed: what made
    it (inputs and their checksums, release, container, payload identity, job, node, times, digests)."""
    from hpcrun.operate.outputs.provenance import outputs_of
    return outputs_of(Path(plan_dir), db=db, generation=generation)


def logs(plan_dir: PathLike, name: str, *, db: Optional[str] = None) -> List[Any]:
    """Every input ``name`` names (its path, file name or job's name): state, the scheduler's or the
    pilots' logs of its jobs, and each run's records, from its directory or folded (``InputLogs``)."""
    from hpcrun.operate.outputs.runlogs import input_logs
    return input_logs(Path(plan_dir), name, db=db)


def forecast(plan_dir: PathLike, *, db: Optional[str] = None) -> Dict[str, Any]:
    """The campaign's forecast from its store now (no scheduler call): end with its 95% interval,
    core-hours and cost left, cost per event and per GB (docs/forecast.md); ``ready`` False before any
    run has ended, with ``why``."""
    from hpcrun.operate.campaign.forecast import of_store
    from hpcrun.report.gather import open_campaign
    with open_campaign(Path(os.path.abspath(plan_dir)), db) as (manifest, store, campaign):
        return of_store(store, campaign.id, manifest).as_dict()


def iotune_results(sweep_dir: PathLike) -> IotuneResults:
    """The results of a sweep directory (its results.json, written by `hpcrun iotune` or `collect`)."""
    from hpcrun.iotune.sweeps.outdir import RESULTS
    path = Path(sweep_dir) / RESULTS
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError([Problem(str(path), None, "", (
            f"cannot read the sweep's results ({exc.strerror}): run `hpcrun iotune collect {sweep_dir}` "
            "once its job has ended"))]) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError([Problem(str(path), exc.lineno, "", f"not JSON: {exc.msg}")]) from None
    if not isinstance(data, dict) or data.get("kind") != "hpcrun-iotune-results":
        raise InputError([Problem(str(path), None, "kind", "not an hpcrun iotune results file")])
    return IotuneResults(data)
