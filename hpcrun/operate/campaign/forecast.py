"""When will the campaign end, and what will the rest cost? A forecast from the runs so far.

The model (docs/forecast.md):

* ``mu``: job-seconds per input, the ended runs' elapsed time over the inputs they carried (a job of
  8 inputs on 8 chains counts its elapsed once, spread over its 8 inputs); ``sigma`` the spread of that
  figure between runs.
* ``p``: the share of ended runs that completed; each remaining input needs ``1/p`` runs on average.
* ``c``: how many run at once, measured: the job-seconds of every run over the last day (or since the
  first start) divided by that span, gaps between runs (queue waits, polls) included.
* The work left is ``W = inputs left x mu / p`` less what the running jobs have done; the end is
  ``now + W / c``. Its 95% interval adds the runs' own spread, the uncertainty of ``mu`` (``sigma /
  sqrt(n)``) and of ``p``: it narrows as runs end and as less is left.
* Core-hours: the ended runs' elapsed x allocated CPUs; what is left at the same CPUs per job-second.
  Cost is core-hours in the site's units (the manifest's ``charge``); per event and per GB over the
  campaign's inputs (spent plus left).

Before any run has ended there is nothing to measure, and the forecast says so instead of guessing.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpcrun.backends.late.figures import Held, held
from hpcrun.backends.scheduler.base import TERMINAL
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.metrics import Family
from hpcrun.store.records import InputTotals, RunSpan
from hpcrun.store.store import StateStore

WINDOW_S = 24 * 3600.0     # concurrency is measured over the last day at most
Z95 = 1.96
MIN_SUCCESS = 0.05         # a success rate below this is taken as this (the forecast stays finite)
SPREAD_FLOOR = 0.1         # runs' spread is taken as at least this share of their mean


@dataclass
class Forecast:
    ready: bool
    made_at: str
    why: str = ""                               # ready False: why there is no forecast
    end: Optional[str] = None
    end_low: Optional[str] = None
    end_high: Optional[str] = None
    remaining_s: Optional[float] = None
    inputs_left: int = 0
    runs_ended: int = 0
    seconds_per_input: Optional[float] = None   # job-seconds per input (mu)
    run_success_rate: Optional[float] = None    # p
    concurrency: Optional[float] = None         # c: jobs running at once, measured
    core_hours_spent: float = 0.0
    core_hours_left: Optional[float] = None
    core_hours_left_low: Optional[float] = None
    core_hours_left_high: Optional[float] = None
    cost_unit: str = "core-hours"
    cost_left: Optional[float] = None
    cost_total: Optional[float] = None
    cost_per_event: Optional[float] = None
    cost_per_gb: Optional[float] = None

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="seconds")


def _ended(spans: Sequence[RunSpan]) -> List[RunSpan]:
    return [r for r in spans if r.ended_at is not None and (r.state in TERMINAL or r.state == "LOST")
            and r.elapsed_s is not None]


def concurrency(ended: Sequence[RunSpan], running: Sequence[RunSpan], now: dt.datetime,
                running_scale: float = 1.0, since: Optional[dt.datetime] = None) -> Optional[float]:
    """Job-seconds of the runs over the last day (or since ``since``, else the first start) divided by
    that span; running ones weigh ``running_scale`` each (a sample of them stands for all)."""
    first = since or min((r.started_at for r in [*ended, *running]), default=None)
    if first is None:
        return None
    start = max(first, now - dt.timedelta(seconds=WINDOW_S))
    span = (now - start).total_seconds()
    if span <= 0:
        return None

    def within(r: RunSpan) -> float:
        return max(0.0, (min(r.ended_at or now, now) - max(r.started_at, start)).total_seconds())

    busy = sum(map(within, ended)) + running_scale * sum(map(within, running))
    return busy / span if busy > 0 else None


def _spread(ended: Sequence[RunSpan], mu: float) -> float:
    """The sample standard deviation of job-seconds per input between runs (mu itself for one run), at
    least SPREAD_FLOOR of mu: a few runs of one length do not make the next ones as regular."""
    xs = [(r.elapsed_s or 0.0) / max(1, r.inputs) for r in ended]
    if len(xs) < 2:
        return mu
    mean = sum(xs) / len(xs)
    return max(SPREAD_FLOOR * mu, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)))


def make(spans: Sequence[RunSpan], totals: InputTotals, now: dt.datetime,
         charge: Optional[Mapping[str, Any]] = None, counts: Optional[Tuple[int, int]] = None,
         pilots: Optional[Held] = None) -> Forecast:
    """The forecast at ``now`` from these runs and inputs (``charge``: unit and per_core_hour). ``counts``
    (ended, running): how many runs there are in all when ``spans`` is a sample of the newest. ``pilots``
    (late binding): what the pilots held is what was spent, idle time included; the inputs left cost as
    much more in the same proportion, and run as many at once as the running pilots have slots."""
    charge = charge or {}
    unit, per_core_hour = str(charge.get("unit") or "core-hours"), float(charge.get("per_core_hour") or 1.0)
    ended = _ended(spans)
    running = [r for r in spans if r.ended_at is None]
    n_ended, n_running = counts or (len(ended), len(running))
    scale_e, scale_r = n_ended / max(1, len(ended)), n_running / max(1, len(running))
    spent_core_s = scale_e * sum((r.elapsed_s or 0.0) * (r.alloc_cpus or 1) for r in ended) + scale_r * sum(
        (now - r.started_at).total_seconds() * (r.alloc_cpus or 1) for r in running)
    overhead = 1.0
    if pilots is not None and pilots.core_s > 0:   # the inputs' own core-seconds are what the pilots used of it
        overhead = max(1.0, pilots.core_s / max(1.0, spent_core_s))
        spent_core_s = max(spent_core_s, pilots.core_s)
    f = Forecast(False, _iso(now), inputs_left=totals.left, runs_ended=n_ended,
                 core_hours_spent=spent_core_s / 3600, cost_unit=unit)
    if not ended or not sum(r.inputs for r in ended):
        f.why = "no run has ended yet: the forecast starts once one has"
        return f
    if totals.left == 0 and not running:
        last = max(r.ended_at for r in ended if r.ended_at)
        return _settle(f, last, now, 0.0, 0.0, per_core_hour, totals)
    job_s = sum(r.elapsed_s or 0.0 for r in ended)
    mu = job_s / sum(r.inputs for r in ended)
    p = max(MIN_SUCCESS, sum(1 for r in ended if r.state == "COMPLETED") / len(ended))
    # a sample of the newest: the window starts where the sample's ended runs do (older ones are not in it)
    since = min(r.ended_at for r in ended if r.ended_at) if n_ended > len(ended) else None
    c = concurrency(ended, running, now, scale_r, since) or 1.0
    if pilots is not None and pilots.live_slots:   # late binding: as many at once as the pilots out have slots
        c = float(pilots.live_slots)
    done_now = scale_r * sum(min((now - r.started_at).total_seconds(), max(1, r.inputs) * mu) for r in running)
    work = max(0.0, totals.left * mu / p - done_now)
    sigma, n = _spread(ended, mu), n_ended
    var = (totals.left * sigma ** 2 / p + (totals.left / p) ** 2 * sigma ** 2 / n
           + (totals.left * mu) ** 2 * (1 - p) / (n * p ** 3))
    half = Z95 * math.sqrt(var)
    cpus = overhead * (sum((r.elapsed_s or 0.0) * (r.alloc_cpus or 1) for r in ended) / job_s if job_s else 1.0)
    f.seconds_per_input, f.run_success_rate, f.concurrency = mu, p, c
    f.end_low = _iso(now + dt.timedelta(seconds=max(0.0, work - half) / c))
    f.end_high = _iso(now + dt.timedelta(seconds=(work + half) / c))
    f.core_hours_left_low = max(0.0, work - half) * cpus / 3600
    f.core_hours_left_high = (work + half) * cpus / 3600
    return _settle(f, now + dt.timedelta(seconds=work / c), now, work / c, work * cpus / 3600, per_core_hour, totals)


def _settle(f: Forecast, end: dt.datetime, now: dt.datetime, remaining_s: float, core_h_left: float,
            per_core_hour: float, totals: InputTotals) -> Forecast:
    f.ready, f.end, f.remaining_s = True, _iso(end), remaining_s
    f.end_low, f.end_high = f.end_low or f.end, f.end_high or f.end
    f.core_hours_left = core_h_left
    f.cost_left = core_h_left * per_core_hour
    f.cost_total = (f.core_hours_spent + core_h_left) * per_core_hour
    f.cost_per_event = f.cost_total / totals.events if totals.events else None
    f.cost_per_gb = f.cost_total / (totals.bytes / 1e9) if totals.bytes else None
    return f


def of_store(store: StateStore, campaign_id: int, manifest: Manifest,
             now: Optional[dt.datetime] = None) -> Forecast:
    """The campaign's forecast now, from its store (bounded reads: the newest runs) and its manifest's charge."""
    now = now or dt.datetime.now(dt.timezone.utc)
    sample = store.run_sample(campaign_id)
    pilots = None
    if manifest.pilots:
        plan_dir = Path(str(manifest.pilots["queue"])).parent
        pilots = held(Path(str(manifest.pilots["queue"])), plan_dir / "run", int(manifest.pilots.get("chains", 1)),
                      now.timestamp())
    return make(sample.spans, store.input_totals(campaign_id), now, manifest.charge,
                (sample.ended, sample.running), pilots)


def families(f: Forecast) -> List[Family]:
    """The forecast for the metrics file: end and core-hours left with their 95% bounds, costs."""
    ready = Family("hpcrun_forecast_ready", "1 once a run has ended and the campaign's end is forecast.").add(
        int(f.ready))
    if not f.ready:
        return [ready]
    end = Family("hpcrun_forecast_end_timestamp_seconds", "Forecast end of the campaign (Unix time), with its "
                 "95% bounds.")
    left = Family("hpcrun_forecast_core_hours_left", "Forecast core-hours still to be allocated, with 95% bounds.")
    for bound, when, hours in (("point", f.end, f.core_hours_left), ("low", f.end_low, f.core_hours_left_low),
                               ("high", f.end_high, f.core_hours_left_high)):
        end.add(dt.datetime.fromisoformat(when).timestamp() if when else 0.0, bound=bound)
        left.add(hours or 0.0, bound=bound)
    out = [ready, end, left, Family("hpcrun_forecast_cost_total", "Forecast cost of the whole campaign in the "
                                    "site's units.").add(f.cost_total or 0.0, unit=f.cost_unit)]
    for name, value, text in (("per_event", f.cost_per_event, "per input event"), ("per_gb", f.cost_per_gb,
                                                                                 "per GB of input")):
        if value is not None:
            out.append(Family(f"hpcrun_forecast_cost_{name}", f"Forecast cost {text} in the site's units.")
                       .add(value, unit=f.cost_unit))
    return out


def line(f: Dict[str, Any]) -> str:
    """The forecast in one line (status, the round summary)."""
    if not f["ready"]:
        return f"forecast: {f['why']}"
    if not f["remaining_s"]:
        return f"forecast: ended {_hms(f['end'])} UTC; {_n(f['core_hours_spent'])} core-hours, " + _costs(f)
    return (f"forecast: end {_hms(f['end'])} UTC (95%: {_hms(f['end_low'])} - {_hms(f['end_high'])}), "
            f"{f['inputs_left']} input(s) left, {_n(f['core_hours_left'])} core-hours left "
            f"({_n(f['core_hours_left_low'])}-{_n(f['core_hours_left_high'])}); " + _costs(f)
            + f"; from {f['runs_ended']} ended run(s), {f['concurrency']:.1f} at once")


def _hms(iso: str) -> str:
    return iso[:19].replace("T", " ")


def _n(value: float) -> str:
    """Three significant figures, thousands separated (0.0123, 4.56, 1,230,000)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _costs(f: Dict[str, Any]) -> str:
    parts = [f"{_n(f['cost_total'])} {f['cost_unit']} in all"]
    if f["cost_per_event"] is not None:
        parts.append(f"{f['cost_per_event']:.3g} per event")
    if f["cost_per_gb"] is not None:
        parts.append(f"{f['cost_per_gb']:.3g} per GB")
    return ", ".join(parts)
