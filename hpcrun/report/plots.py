"""PNG plots of a campaign report (matplotlib, no display needed)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Dict, List

from hpcrun.report.figures import CampaignReport


def missing() -> str:
    """Why plots cannot be drawn here ('' when they can): matplotlib is an optional extra."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed: pip install 'hpcrun[plots]' (or use --no-plots)"
    return ""


def _figure():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    return plt, fig, ax


def _empty(ax, text: str) -> None:  # type: ignore[no-untyped-def]
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def completed_vs_time(report: CampaignReport, path: Path) -> None:
    """Cumulative completed jobs against time, as the STAR production monitor showed it."""
    plt, fig, ax = _figure()
    if report.timeline:
        times = [dt.datetime.fromisoformat(t) for t, _ in report.timeline]
        counts = [n for _, n in report.timeline]
        ax.step(times, counts, where="post")
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel("completed jobs")
        fig.autofmt_xdate()
    else:
        _empty(ax, "no completed jobs yet")
    ax.set_title(f"{report.campaign}: completed jobs")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _histogram(values: List[float], path: Path, title: str, xlabel: str, empty: str) -> None:
    plt, fig, ax = _figure()
    if values:
        ax.hist(values, bins=min(30, max(5, len(values))))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("jobs")
    else:
        _empty(ax, empty)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(report: CampaignReport, out_dir: Path) -> Dict[str, str]:
    """Write the three PNGs into ``out_dir``; returns {plot: file name}."""
    files = {"completed": "completed_vs_time.png", "efficiency": "cpu_efficiency.png",
             "walltime_per_event": "walltime_per_event.png"}
    completed_vs_time(report, out_dir / files["completed"])
    _histogram([r.cpu_efficiency for r in report.runs if r.cpu_efficiency is not None],
               out_dir / files["efficiency"], f"{report.campaign}: CPU efficiency per job",
               "TotalCPU / (Elapsed x CPUs)", "no completed jobs yet")
    _histogram([r.walltime_per_event_s for r in report.runs if r.walltime_per_event_s is not None],
               out_dir / files["walltime_per_event"], f"{report.campaign}: walltime per event",
               "seconds per event", "no event counts recorded (QA counts them)")
    return files
