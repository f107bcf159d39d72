"""The metrics file a supervisor writes after each round (Prometheus text format): the campaign's inputs and jobs,
the supervisor's own figures, the pilots, budgets, clusters, daemons, exports and the forecast."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, List, Optional

from hpcrun.operate.campaign import forecast, generations
from hpcrun.operate.metrics import Family, render, write_atomically
from hpcrun.operate.outputs.exports import export_families
from hpcrun.operate.supervision import pilots as pilot_care
from hpcrun.operate.tracking import budget, outages

FORECAST_EVERY_S = 300.0  # the forecast made again this often (a campaign's end moves slowly)
UNREADY_EVERY_S = 60.0    # ... and this often while no run has ended


def forecast_due(sup: Any) -> bool:
    """The forecast is made again once ``FORECAST_EVERY_S`` passed (at 10^6 inputs it reads every input's size
    and every submission's state: 0.7 s of CPU), every minute while none is ready (the first run's end shows
    within a minute)."""
    made, fams = sup.forecast_kept
    ready = any(f.name == "hpcrun_forecast_end_timestamp_seconds" for f in fams)
    return time.monotonic() - made >= (FORECAST_EVERY_S if ready else UNREADY_EVERY_S)


def refresh_forecast(sup: Any) -> None:
    """The forecast made now and kept for the metrics file (the supervisor does this in its pause, when due,
    so that a round at 10^6 inputs does not carry it)."""
    sup.forecast_kept = (time.monotonic(), forecast.families(forecast.of_store(sup.store, sup.campaign.id,
                                                                               sup.manifest)))


def _forecast(sup: Any, finished: bool) -> List[Family]:
    """The forecast's families as last made (in the pause: ``refresh_forecast``); made here at the first round
    and at the end."""
    if finished or not sup.forecast_kept[1]:
        refresh_forecast(sup)
    return sup.forecast_kept[1]


def write(sup: Any, rnd: Any, beat_at: float, path: Path) -> None:
    """The metrics file after a round (Prometheus text format, written whole)."""
    fams = [Family("hpcrun_inputs", "Input files per state.").samples_from(rnd.inputs, "state"),
            Family("hpcrun_plan_jobs", "Plan jobs per state.").samples_from(rnd.jobs, "state"),
            Family("hpcrun_jobs_held", "Pending jobs held for a human (burst-buffer failure).").add(rnd.held),
            Family("hpcrun_campaign_finished", "1 once every plan job and the finalize job settled.")
            .add(int(rnd.finished)),
            Family("hpcrun_supervisor_heartbeat_timestamp_seconds", "When the supervisor last finished a "
                   "round (Unix time).").add(beat_at),
            Family("hpcrun_supervisor_rounds_total", "Rounds of this supervisor.", "counter").add(rnd.number),
            Family("hpcrun_supervisor_poll_interval_seconds", "Pause before the next round.").add(rnd.pause),
            *generations.metric_families(generations.figures(sup.store, sup.campaign.id)),
            *budget.families(rnd.spent), *pilot_care.families(rnd.pilots),
            *_forecast(sup, rnd.finished)]
    if rnd.clusters:   # several clusters: each one's health and jobs
        up = Family("hpcrun_cluster_up", "1 while the cluster answers and is not in maintenance.")
        for name, state in rnd.clusters.items():
            up.add(int(state == "up"), cluster=name)
        per = Family("hpcrun_cluster_plan_jobs", "Plan jobs per state on each cluster (latest submission).")
        for cluster, counts in sup.store.cluster_counts(sup.campaign.id).items():
            for state, n in counts.items():
                per.add(n, cluster=cluster or "", state=state)
        fams += [up, per]
    seen = [o for o in sup.outages if o.daemon not in outages.NOT_DAEMONS]   # this round's, after its probe
    if seen:   # a daemon that did not answer once: 0 while it still does not
        daemon_up = Family("hpcrun_scheduler_daemon_up", "0 while a daemon of the scheduler (controller, "
                           "accounting) does not answer, 1 once it answers again.")
        for o in seen:
            daemon_up.add(int(not o.open), cluster=o.cluster or "", daemon=o.daemon)
        fams.append(daemon_up)
    if rnd.exports:
        fams += export_families(rnd.exports)
    for key, text in (("submitted", "Jobs and array tasks submitted by this supervisor."),
                      ("requeued", "Failed plan jobs this supervisor sent back to pending."),
                      ("parked", "Plan jobs this supervisor parked for a human.")):
        fams.append(Family(f"hpcrun_supervisor_{key}_total", text, "counter").add(sup.totals[key]))
    sup.metrics_kept = fams
    write_atomically(path, render(fams + _store_up(None), {"campaign": sup.campaign.name}))


def store_down(sup: Any, since: Optional[float], path: Path) -> None:
    """The metrics file during an outage of the store (``since``: when it began; None: it ended): the last
    round's figures kept, the store said to be away (nothing can be read of it)."""
    try:
        write_atomically(path, render(list(sup.metrics_kept) + _store_up(since), {"campaign": sup.campaign.name}))
    except OSError:
        pass   # the plan directory's filesystem may be the one away


def _store_up(since: Optional[float]) -> List[Family]:
    fams = [Family("hpcrun_store_up", "1 while the supervisor reaches its state store, 0 during an outage "
                   "(it waits it out; nothing is lost).").add(int(since is None))]
    if since is not None:
        fams.append(Family("hpcrun_store_unreachable_since_timestamp_seconds",
                           "When the state store's current outage began (Unix time).").add(since))
    return fams
