"""The forecast of a campaign's end and cost (issue 40), on simulated runs: inputs of known durations
run a few at a time with gaps between jobs, as a supervisor's polls leave them. The real cluster's
turn (a campaign forecast after a third of its inputs, against its actual end) is in
tests/cluster/test_budget.py."""

from __future__ import annotations

import datetime as dt
import random
from typing import List, Tuple

from hpcrun.operate.campaign.forecast import families, line, make
from hpcrun.store.records import InputTotals, RunSpan

T0 = dt.datetime(2026, 11, 27, 8, 0, tzinfo=dt.timezone.utc)


def simulate(durations: List[float], slots: int, gap: float = 5.0, fail_every: int = 0
             ) -> List[Tuple[float, float, str]]:
    """(start, end, state) of each run: each slot takes the next input ``gap`` seconds after its last
    ended; every ``fail_every``-th run fails halfway and its input goes to the back of the queue."""
    queue = list(durations)
    free = [0.0] * slots
    runs: List[Tuple[float, float, str]] = []
    while queue:
        k = min(range(slots), key=lambda i: free[i])
        d = queue.pop(0)
        start = free[k] + gap
        if fail_every and (len(runs) + 1) % fail_every == 0:
            runs.append((start, start + d / 2, "FAILED"))
            queue.append(d)
            free[k] = start + d / 2
            continue
        runs.append((start, start + d, "COMPLETED"))
        free[k] = start + d
    return runs


def spans_at(runs: List[Tuple[float, float, str]], now: float) -> List[RunSpan]:
    out = []
    for start, end, state in runs:
        if start > now:
            continue
        ended = end <= now
        out.append(RunSpan(state if ended else "RUNNING", T0 + dt.timedelta(seconds=start),
                           T0 + dt.timedelta(seconds=end) if ended else None, end - start if ended else None, 2, 1))
    return out


def totals_at(runs: List[Tuple[float, float, str]], n: int, now: float) -> InputTotals:
    done = sum(1 for _, end, state in runs if state == "COMPLETED" and end <= now)
    return InputTotals(n, n * 2_000_000_000, n * 1000, n - done, done)


def forecast_after_a_third(durations: List[float], slots: int, fail_every: int = 0):
    runs = simulate(durations, slots, fail_every=fail_every)
    actual_end = max(end for _, end, _ in runs)
    n = len(durations)
    third = sorted(end for _, end, state in runs if state == "COMPLETED")[n // 3 - 1]
    f = make(spans_at(runs, third), totals_at(runs, n, third), T0 + dt.timedelta(seconds=third))
    return f, third, actual_end


def test_before_any_run_ended_there_is_no_forecast():
    running = [RunSpan("RUNNING", T0, None, None, 2, 1)]
    f = make(running, InputTotals(10, 0, None, 10, 0), T0 + dt.timedelta(seconds=30))
    assert not f.ready and f.end is None and "no run has ended yet" in f.why
    assert line(f.as_dict()).startswith("forecast: no run has ended yet")
    assert [fam.name for fam in families(f)] == ["hpcrun_forecast_ready"]


def test_forecast_after_a_third_lies_within_20_percent_of_the_actual_end():
    rng = random.Random(40)
    durations = [rng.uniform(20, 40) for _ in range(30)]   # known times: 20-40 s each, in no order
    f, third, actual_end = forecast_after_a_third(durations, slots=3)
    assert f.ready
    forecast_end = (dt.datetime.fromisoformat(f.end) - T0).total_seconds()
    assert abs(forecast_end - actual_end) <= 0.2 * actual_end, (forecast_end, actual_end)
    # the time still to run, the stricter test: also within 20 %
    assert abs((forecast_end - third) - (actual_end - third)) <= 0.2 * (actual_end - third)
    low, high = ((dt.datetime.fromisoformat(x) - T0).total_seconds() for x in (f.end_low, f.end_high))
    assert low <= actual_end <= high, (low, actual_end, high)
    assert 2.5 <= (f.concurrency or 0) <= 3.0


def test_failed_runs_lengthen_the_forecast_through_the_success_rate():
    rng = random.Random(7)
    durations = [rng.uniform(20, 40) for _ in range(30)]
    clean, _, _ = forecast_after_a_third(durations, slots=3)
    failing, third, actual_end = forecast_after_a_third(durations, slots=3, fail_every=4)
    assert failing.run_success_rate is not None and failing.run_success_rate < 0.9
    end = (dt.datetime.fromisoformat(failing.end) - T0).total_seconds()
    assert abs(end - actual_end) <= 0.2 * actual_end, (end, actual_end)
    assert (clean.remaining_s or 0) < (failing.remaining_s or 0)


def test_the_interval_narrows_as_runs_end():
    rng = random.Random(3)
    durations = [rng.uniform(10, 50) for _ in range(60)]
    runs = simulate(durations, slots=4)
    widths = []
    for done in (10, 30, 50):
        now = sorted(end for _, end, _ in runs)[done - 1]
        f = make(spans_at(runs, now), totals_at(runs, 60, now), T0 + dt.timedelta(seconds=now))
        widths.append((dt.datetime.fromisoformat(f.end_high) - dt.datetime.fromisoformat(f.end_low)).total_seconds())
    assert widths[0] > widths[1] > widths[2], widths


def test_costs_per_event_and_per_gb_in_the_sites_units():
    runs = simulate([30.0] * 6, slots=2, gap=0.0)
    now = 45.0   # 2 ended, 2 running halfway, 2 waiting
    f = make(spans_at(runs, now), totals_at(runs, 6, now), T0 + dt.timedelta(seconds=now),
             {"unit": "NERSC-hours", "per_core_hour": 2.0})
    assert f.ready and f.cost_unit == "NERSC-hours"
    # 6 inputs x 30 s x 2 CPUs = 0.1 core-hours in all, x 2 units per core-hour
    assert abs((f.cost_total or 0) - 0.2) < 0.01, f
    assert abs((f.cost_per_event or 0) - 0.2 / 6000) < 1e-5 and abs((f.cost_per_gb or 0) - 0.2 / 12) < 1e-3
    text = line(f.as_dict())
    assert "NERSC-hours in all" in text and "per event" in text and "95%" in text


def test_a_finished_campaign_forecasts_its_own_end():
    runs = simulate([30.0] * 4, slots=2, gap=0.0)
    f = make(spans_at(runs, 1000), totals_at(runs, 4, 1000), T0 + dt.timedelta(seconds=1000))
    assert f.ready and f.remaining_s == 0 and f.end == (T0 + dt.timedelta(seconds=60)).isoformat()
    assert line(f.as_dict()).startswith("forecast: ended")


def test_a_sample_of_the_newest_runs_stands_for_all_of_them():
    """A long campaign's forecast reads the newest runs only (store.run_sample): scaled by the counts, it
    agrees with the forecast from every run."""
    rng = random.Random(11)
    durations = [rng.uniform(20, 40) for _ in range(120)]
    runs = simulate(durations, slots=4)
    now = sorted(end for _, end, _ in runs)[59]
    spans = spans_at(runs, now)
    ended = sorted((r for r in spans if r.ended_at), key=lambda r: r.ended_at, reverse=True)
    running = [r for r in spans if r.ended_at is None]
    totals = totals_at(runs, 120, now)
    full = make(spans, totals, T0 + dt.timedelta(seconds=now))
    part = make(ended[:20] + running[:2], totals, T0 + dt.timedelta(seconds=now), counts=(len(ended), len(running)))
    assert abs((part.remaining_s or 0) - (full.remaining_s or 0)) <= 0.1 * (full.remaining_s or 1), (part, full)
    assert abs(part.core_hours_spent - full.core_hours_spent) <= 0.1 * full.core_hours_spent
    assert part.runs_ended == full.runs_ended == len(ended)


def test_late_binding_counts_what_the_pilots_held_and_runs_as_many_as_their_slots():
    """Pilots held twice the core-seconds their inputs used: that is what was spent, and the inputs left
    cost twice their own time too; they run as many at once as the running pilots have slots."""
    from hpcrun.backends.late.figures import Held
    runs = simulate([60.0] * 30, slots=3)
    now = sorted(end for _, end, _ in runs)[9]
    spans, totals, at = spans_at(runs, now), totals_at(runs, 30, now), T0 + dt.timedelta(seconds=now)
    plain = make(spans, totals, at)
    used = plain.core_hours_spent * 3600
    late = make(spans, totals, at, pilots=Held(core_s=2 * used, live_slots=6))
    assert late.core_hours_spent == 2 * plain.core_hours_spent
    assert late.core_hours_left is not None and plain.core_hours_left is not None
    assert abs(late.core_hours_left - 2 * plain.core_hours_left) < 1e-6
    assert late.concurrency == 6.0 and late.remaining_s is not None and plain.remaining_s is not None
    assert late.remaining_s < plain.remaining_s      # 6 slots at once against the 3 measured
