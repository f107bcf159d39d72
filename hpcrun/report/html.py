"""Write a campaign report directory: report.json, the PNG plots and a static index.html.

The directory is written beside its final place and renamed into it, so a reader never
sees half a report.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import jinja2

from hpcrun import __version__
from hpcrun.operate.campaign.generations import figure_line
from hpcrun.report.figures import CampaignReport, against
from hpcrun.resources import templates_dir


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: Optional[float], unit: str = "", digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}{unit}"


def merit_rows(r: CampaignReport) -> List[Tuple[str, str]]:
    return [
        ("success rate (done and QA passed / finished inputs)", _pct(r.success_rate)),
        ("completion (succeeded / all inputs)", f"{r.succeeded} / {r.inputs_total} ({_pct(r.completion)})"),
        ("CPU efficiency (TotalCPU / Elapsed x CPUs, all ended runs)", _pct(r.cpu_efficiency)),
        ("CPU hours used / core hours allocated", f"{r.cpu_hours:.2f} / {r.core_hours_allocated:.2f}"),
        ("memory efficiency (MaxRSS / requested, completed runs)", _pct(r.memory_efficiency)),
        ("runs ended / completed", f"{r.runs_ended} / {r.runs_completed}"),
        ("QA passed / failed", f"{r.qa_passed} / {r.qa_failed}"),
        ("events in / out (QA)", f"{r.events_in} / {r.events_out}"),
        ("throughput, campaign (MB/s)", _num(r.throughput_mb_per_s)),
        ("throughput, campaign (events/s)", _num(r.throughput_events_per_s)),
        ("throughput, mean per job (MB/s)", _num(r.mean_job_mb_per_s)),
        ("throughput, mean per job (events/s)", _num(r.mean_job_events_per_s)),
        ("input MB/s per core, completed runs", against(r.mb_per_s_per_core, r.targets.get("mb_per_s_per_core"))),
        ("input events/s per core, completed runs", against(r.events_per_s_per_core,
                                                            r.targets.get("events_per_s_per_core"))),
        ("walltime per event, mean (s)", _num(r.mean_walltime_per_event_s)),
        ("campaign span, first start to last end (s)", _num(r.span_s, digits=6)),
    ] + ([("inputs done / parked / cancelled by an operator / not ended",
           " / ".join(str(r.outcome.get(k, 0)) for k in ("done", "parked", "cancelled_by_operator", "not_ended")))]
         if r.outcome else []) \
      + ([("failed attempts by class", ", ".join(f"{k} {n}" for k, n in r.attempts_by_class.items()))]
         if r.attempts_by_class else []) \
      + ([("finalize job (latest round)", _finalize_text(r.finalize))] if r.finalize else []) \
      + (_transfer_rows(r) if r.transfers else []) \
      + (_export_rows(r.exports) if r.exports else []) \
      + (_cache_rows(r.node_cache) if r.node_cache else []) \
      + ([("chains by ending (ok, failed, crashed, killed)", ", ".join(f"{k} {n}" for k, n in r.chain_endings.items()))]
         if r.chain_endings else []) \
      + ([("node-local leftovers reclaimed: directories, GB",
           f"{r.reclaimed['dirs']}, {r.reclaimed['bytes'] / 1e9:.3g}")] if r.reclaimed else []) \
      + pilot_rows(r.pilots) + cluster_rows(r) + allocation_rows(r) + forecast_rows(r.forecast) \
      + [(f"generation {g['number']}", figure_line(g).split(": ", 1)[1]) for g in r.generations]


def pilot_rows(p: Optional[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """Late binding: what the accounting cannot say (it sees the pilots, not the inputs in them)."""
    if not p:
        return []
    idle = p["idle_core_s"]
    return [
        ("pilots: count, inputs run in them, database payload copies",
         f"{p['pilots']}, {p['inputs_run']}, {p['payload_copies']}"),
        ("pilots: core-seconds held / busy (idle share)",
         f"{p['core_s_held']:,.0f} / {p['core_s_busy']:,.0f}"
         + (f" ({p['idle_share']:.1%} idle)" if p["idle_share"] is not None else "")),
        ("pilots: idle core-seconds at start / starved / drain tail",
         f"{idle['start']:,.0f} / {idle['starved']:,.0f} / {idle['drain_tail']:,.0f}"),
        ("pilots: inputs' CPU seconds / the pilots' own, as the accounting has it",
         f"{p['input_cpu_s']:,.1f} / {p['pilots_cpu_s']:,.1f}"),
    ]


def allocation_rows(r: CampaignReport) -> List[Tuple[str, str]]:
    """Each spent allocation (jobs the account's limit held), open or lately raised."""
    return [("allocation", o["line"]) for o in r.allocation]


def forecast_rows(f: Optional[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """The forecast's end, core-hours left and costs (docs/forecast.md), or why there is none yet."""
    if f is None:
        return []
    if not f["ready"]:
        return [("forecast", f["why"])]
    unit = f["cost_unit"]
    return [("forecast: end (95% interval)", f"{f['end']} ({f['end_low']} - {f['end_high']})"),
            ("forecast: core-hours spent / left (95% interval)",
             f"{f['core_hours_spent']:,.2f} / {f['core_hours_left']:,.2f} ({f['core_hours_left_low']:,.2f} - "
             f"{f['core_hours_left_high']:,.2f})" if f["remaining_s"] else f"{f['core_hours_spent']:,.2f} / 0"),
            (f"forecast: cost in all / per event / per GB ({unit})",
             f"{_num(f['cost_total'], digits=4)} / {_num(f['cost_per_event'])} / {_num(f['cost_per_gb'])}"),
            ("forecast made from", f"{f['runs_ended']} ended run(s), {_num(f['concurrency'])} at once, "
             f"{_num(f['seconds_per_input'])} job-seconds per input, {_pct(f['run_success_rate'])} of runs completed")]


def cluster_rows(r: CampaignReport) -> List[Tuple[str, str]]:
    """One row per cluster of a campaign on several: runs, success rate, CPU efficiency, throughput."""
    return [(f"cluster {name}: runs completed / ended, success rate, CPU efficiency, MB/s",
             f"{c['runs_completed']} / {c['runs_ended']}, {_pct(c['success_rate'])}, {_pct(c['cpu_efficiency'])}, "
             f"{_num(c['throughput_mb_per_s'])}") for name, c in r.clusters.items()]


def _transfer_rows(r: CampaignReport) -> List[Tuple[str, str]]:
    t = r.transfers
    assert t is not None
    return [("inputs copied in (xrdcp): files, GB, failed attempts",
             f"{t.files}, {t.bytes / 1e9:.3g}, {t.failed_attempts}"),
            ("copy rate, mean / slowest file (MB/s)", f"{_num(t.mb_per_s)} / {_num(t.slowest_mb_per_s)}")] + [
        (f"inputs {'read in place' if via == 'local' else 'through the cache' if via == 'cache' else 'from the server'}"
         f" ({via}): inputs, GB, seconds per input, MB/s",
         f"{p['inputs']}, {p['bytes'] / 1e9:.3g}, {_num(p['seconds_per_input'])}, {_num(p['mb_per_s'])}")
        for via, p in sorted(t.by_path.items())] + [
        ("stage-in MB/s per core (a job's MB / its stage-in time / its CPUs)",
         against(t.mb_per_s_per_core, r.targets.get("mb_per_s_per_core")))]


def _cache_rows(c: Dict[str, Any]) -> List[Tuple[str, str]]:
    return [("node caches: hits, misses, hit ratio", f"{c['hits']}, {c['misses']}, {_num(c['hit_ratio'])}"),
            ("GB read from node caches / from the origin",
             f"{c['bytes_from_cache'] / 1e9:.3g} / {c['bytes_from_origin'] / 1e9:.3g}")]


def _export_rows(e: Dict[str, Any]) -> List[Tuple[str, str]]:
    f = e["files"]
    rows = [("outputs exported: verified, waiting, given up", f"{f['verified']}, {e['backlog']}, {f['failed']}"),
            ("exported GB, MB/s, failed attempts", f"{e['bytes'] / 1e9:.3g}, {_num(e['mb_per_s'])}, "
                                                   f"{e['failed_attempts']}")]
    if e["last_error"] and (f["failed"] or e["backlog"]):
        rows.append(("last export error", e["last_error"]))
    return rows


def _finalize_text(f: Dict[str, Any]) -> str:
    what = f"job {f['job_id']} {f['state'] or f['status']}" if f["job_id"] else str(f["status"])
    return f"round {f['round']}, after {f['after']}: {what}" + (f" (exit {f['exit_code']})" if f["exit_code"] else "")


def render_html(report: CampaignReport, store: str, plots: Dict[str, str]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             comment_start_string="{##", comment_end_string="##}")
    return env.get_template("report.html.j2").render(r=report, merit=merit_rows(report), plots=plots,
                                                     store=store, version=__version__)


def write_report(report: CampaignReport, out_dir: Path, store: str, plots: bool = True) -> Path:
    """Write the report directory (replacing an earlier report there) and return its index.html."""
    out_dir = Path(os.path.abspath(out_dir))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        files: Dict[str, str] = {}
        if plots:
            from hpcrun.report.plots import write_plots
            files = write_plots(report, tmp)
        (tmp / "report.json").write_text(json.dumps(report.as_dict(), indent=1) + "\n", encoding="utf-8")
        (tmp / "index.html").write_text(render_html(report, store, files), encoding="utf-8")
        tmp.chmod(0o755)
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir / "index.html"
