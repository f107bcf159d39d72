"""``hpcrun run``: one supervisor drives a campaign to the end, unattended.

Each round is what an operator did by hand: poll (status), move failures back to pending or
park them (retry), submit what is neither done nor in flight within the queue's room
(submit), and once every plan job has settled send the finalize job. Every step is the
existing transactional protocol (claim -> tag -> record, one transaction per poll), so the
supervisor may be SIGKILLed at any moment: the next one settles what was half done.

The site's scheduler has outages of its own (a controller restarted, accounting down for an
upgrade): a round uses what answers and waits for the rest (the poll asks the queue while
accounting is away; submissions wait while the controller is), so the supervisor never exits
on one; each round names the daemon that does not answer and since when. It ends only when
every plan job is done, parked (with its reason) or cancelled by an operator.

One supervisor per campaign: an OS (flock) or server lock held for its whole life decides,
and the heartbeat row in the store tells everyone else. A flock on a network filesystem
may be local to one login node, so with the SQLite store a fresh heartbeat from another
host also refuses a start (``take_over`` overrides it once that host is known dead).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from sqlalchemy.exc import DBAPIError

from hpcrun.backends.scheduler.base import PACE, SubmitUncertain, Unreachable
from hpcrun.errors import HpcrunError, InputError
from hpcrun.operate import plandir as plan_files
from hpcrun.operate.campaign import generations
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.metrics import Family
from hpcrun.operate.outputs.exports import Exporter, exported_counts
from hpcrun.operate.outputs.folding import Folder
from hpcrun.operate.plandir import (
    clusters_of,
    has_store,
    next_interval,
    open_plan_store,
    paced_interval,
    poll_interval,
    read_manifest,
)
from hpcrun.operate.results import SubmitReport, outcome_of
from hpcrun.operate.retries.policy import RetryPolicy
from hpcrun.operate.submission.finalize import finalize_summary
from hpcrun.operate.submission.locality import release_waiting
from hpcrun.operate.submission.moves import move_stuck
from hpcrun.operate.submission.submit import DEFAULT_LOCK_TIMEOUT, register, submit_store
from hpcrun.operate.supervision import array_ends, queue_reads, round_metrics, store_outage
from hpcrun.operate.supervision import events as campaign_events
from hpcrun.operate.supervision import pilots as pilot_care
from hpcrun.operate.supervision.stopping import Stop
from hpcrun.operate.tracking import budget, outages
from hpcrun.operate.tracking.inflight import InFlight
from hpcrun.operate.tracking.track import poll_store
from hpcrun.store.base import StateStoreError, StoreUnreachable, _whoami
from hpcrun.store.locking.fence import Fenced, lost
from hpcrun.store.locking.lock import Held, LockTimeout, supervisor_lock
from hpcrun.store.records import Campaign, Outage, SupervisorRecord
from hpcrun.store.store import StateStore

STALE_MIN_S = 600.0       # a heartbeat older than this (and 3 pauses) is a dead supervisor's
METRICS_NAME = "metrics.prom"


class SupervisorBusy(HpcrunError):
    """Another supervisor drives this campaign and is alive."""

    exit_code = 4


@dataclass
class Round:
    """What one round saw and did."""

    number: int
    at: dt.datetime
    inputs: Dict[str, int]
    jobs: Dict[str, int]
    observed: int = 0
    submitted: int = 0                      # array tasks and jobs submitted this round
    requeued: List[str] = field(default_factory=list)
    parked: List[str] = field(default_factory=list)
    held: int = 0
    moved: List[str] = field(default_factory=list)   # jobs taken off a cluster where they waited too long
    clusters: Dict[str, str] = field(default_factory=dict)  # several clusters: each one's health this round
    finalize: Optional[str] = None          # the finalize job's state or what was done about it
    exports: Optional[Dict[str, Any]] = None  # outputs.export: this round's copies and the campaign's figures
    outages: List[str] = field(default_factory=list)   # daemons not answering: waited out, in words
    ended: Dict[str, int] = field(default_factory=dict)   # at the end: inputs by outcome (results.outcome_of)
    spent: Dict[str, Dict[str, int]] = field(default_factory=dict)  # cluster label -> budget reason -> jobs held
    budget_turns: List[Dict[str, Any]] = field(default_factory=list)   # allocations spent or raised since the last
    pilots: Optional[Dict[str, Any]] = None   # late binding: pilots by state, this round's care
    finished: bool = False
    pause: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.observed or self.submitted or self.requeued or self.parked or self.moved
                    or (self.exports and (self.exports["verified_now"] or self.exports["failed_now"])))

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.jobs.items() if n) or "no jobs"
        parts = [f"round {self.number}: jobs {counts}"]
        parts += [text for n, text in ((self.submitted, f"submitted {self.submitted}"),
                                        (self.requeued, f"retrying {len(self.requeued)}"),
                                        (self.parked, f"parked {len(self.parked)}"),
                                        (self.held, f"{self.held} held for a human"),
                                        (self.moved, f"moved {len(self.moved)} to another cluster")) if n]
        if self.clusters:
            parts.append("clusters " + ", ".join(f"{n} {s}" for n, s in self.clusters.items()))
        if self.pilots:
            parts.append(pilot_care.words(self.pilots))
        if self.finalize:
            parts.append(f"finalize {self.finalize}")
        if self.exports:
            e = self.exports
            parts.append(f"exports {e['files']['verified']} verified, {e['backlog']} waiting, "
                         f"{e['files']['failed']} given up")
        parts += [f"waiting out: {o}" for o in self.outages]
        parts += budget.status_lines(self.spent)
        if self.finished:
            e = self.ended   # at the end, an input neither done, parked nor cancelled by an operator is lost
            parts.append(f"finished: {sum(e.values())} inputs, {e['done']} done, {e['parked']} parked, "
                         f"{e['cancelled_by_operator']} cancelled by an operator, "
                         + (f"{e['export_failed']} whose export was given up, " if "export_failed" in e else "")
                         + f"{e['not_ended']} lost")
        else:
            parts.append(f"next poll in {self.pause:.0f} s")
        return "; ".join(parts)

    def as_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data


@dataclass
class RunReport:
    campaign: str
    outcome: str = "running"        # finished | once | rounds | stopped | superseded
    rounds: List[Round] = field(default_factory=list)
    took_over: Optional[str] = None  # the holder of the row this supervisor replaced
    outages: List[str] = field(default_factory=list)   # database sessions lost and reconnected

    def as_dict(self) -> Dict[str, Any]:
        return {"campaign": self.campaign, "outcome": self.outcome, "took_over": self.took_over,
                "outages": self.outages, "rounds": [r.as_dict() for r in self.rounds]}


def _host(holder: str) -> str:
    return holder.partition("@")[2].rpartition(":")[0]


class Supervisor:
    """Runs rounds on one open plan; the caller holds the supervisor lock."""

    def __init__(self, plan_dir: Path, manifest: Manifest, store: StateStore, campaign: Campaign,
                 *, lock_timeout: float, metrics_path: Optional[Path]):
        self.plan_dir = plan_dir
        self.manifest = manifest
        self.manifest_id = plan_files.manifest_id(plan_dir)
        self.store = store
        self.campaign = campaign
        self.lock_timeout = lock_timeout
        self.metrics_path = metrics_path
        self.policy = RetryPolicy.from_manifest(manifest)
        self.events = campaign_events.Hook.from_manifest(manifest, plan_dir)
        self.totals = {"submitted": 0, "requeued": 0, "parked": 0}
        self.exporter = Exporter(manifest, store, campaign.id, generations.earlier_manifests(plan_dir, manifest))
        self.last_change = time.monotonic()
        self._clusters(manifest)
        self.outages: List[Outage] = []   # each daemon's last outage, as this round left them
        self.spent_since, _ = budget.turns({}, store.outages(campaign.id))   # spent before: no event again
        self.forecast_kept: Tuple[float, List[Family]] = (0.0, [])   # when made, and its families
        self.metrics_kept: List[Family] = []   # the last round's metrics (rewritten during a store outage)
        self.ticked, self.tick_changes, self.tick_ends = time.monotonic(), 0, 0   # reads between rounds: when, what
        self.left = 0   # plan jobs pending or in flight at the last round: fewer changes cannot have ended them all
        self.slots, self.near_since = 0, None   # the running pilots' slots; since when the end is near (queue_reads.py)
        self.pace_since, self.pace_ends, self.pace = None, 0, 0.0   # the reads' ends a second, and since when counted
        # array mode: the last jobs' ends looked for between rounds
        self.watch = array_ends.Watch(str(plan_dir / "run"), float(manifest.submit.min_poll_interval))
        self.folder = Folder(str(plan_dir / "run"))   # successful runs' directories folded: one segment for its life
        self.kept = InFlight()   # the jobs in flight, kept between its rounds

    def _clusters(self, manifest: Manifest) -> None:
        """The plan's clusters (late binding: the pilots of the generation planned last)."""
        self.listed = clusters_of(manifest)
        self.sched = self.listed[0].sched   # its words for the daemons (slurmctld, slurmdbd)
        self.scheds = {c.name: c.sched for c in self.listed}

    def follow_plan(self) -> None:
        """A new generation planned into the directory since the last round: its manifest read and taken
        up now (no restart). One that cannot be read is left for the next round: the one read before runs on."""
        ident = plan_files.manifest_id(self.plan_dir)
        if ident == self.manifest_id:
            return
        try:
            manifest = read_manifest(self.plan_dir)
        except InputError:
            return
        self.campaign = register(self.store, manifest)
        self.manifest, self.manifest_id = manifest, ident
        self.policy = RetryPolicy.from_manifest(manifest)
        self.events = campaign_events.Hook.from_manifest(manifest, self.plan_dir)
        self.exporter.adopt(manifest)
        self._clusters(manifest)

    def round(self, number: int) -> Round:
        self.follow_plan()
        # rides out daemons that do not answer
        status = poll_store(self.plan_dir, self.manifest, self.store, folder=self.folder, fold_queue=True,
                            kept=self.kept)
        requeued, parked = self.policy.apply(self.store, self.campaign.id)
        waited = False
        try:
            moved = move_stuck(self.manifest, self.store, self.campaign) + release_waiting(
                self.manifest, self.store, self.campaign)
        except (Unreachable, SubmitUncertain) as exc:
            moved, waited = [], self.wait_out(exc)
        jobs = self.store.job_counts(self.campaign.id)
        settled = queue_reads.open_jobs(jobs) == 0
        pilots = pilot_care.tend(self, status, jobs, settled)   # before the queue is filled: they start meanwhile
        try:
            sub = submit_store(self.plan_dir, self.manifest, self.store, lock_timeout=self.lock_timeout,
                               with_finalize=settled, spent=budget.by_name(status, self.listed))
        except (Unreachable, SubmitUncertain) as exc:   # claims settle at a later round: nothing doubled
            sub, waited = SubmitReport(self.campaign.name, self.store.location), self.wait_out(exc)
        pilot_care.hint(self.manifest, [c.sched for c in self.listed])   # the queue filled: locality hints
        between, self.tick_changes, self.tick_ends = self.tick_changes, 0, 0
        rnd = Round(number, dt.datetime.now(dt.timezone.utc), self.store.counts_by_state(self.campaign.id),
                    self.store.job_counts(self.campaign.id), observed=status.observed + between,
                    submitted=sub.submitted_jobs, requeued=self._names(requeued), parked=self._names(parked),
                    held=status.held,
                    moved=[f"{m.job} off {m.cluster}" for m in moved],
                    clusters={n: c["state"] for n, c in sub.clusters.items()}, spent=status.budget_held, pilots=pilots)
        self.outages = outages.probe(self.store, self.campaign.id, self.scheds, self.sched)
        self.spent_since, rnd.budget_turns = budget.turns(self.spent_since, self.outages)
        rnd.outages = [o["text"] for o in outages.rows(self.outages, self.sched)   # a spent allocation: rnd.spent
                       if o["ended_at"] is None and o["daemon"] != outages.ALLOCATION]
        rnd.finalize, finalize_settled = self._finalize(sub.finalize.action if sub.finalize else None)
        exports_settled = self._exports(rnd)
        # settled: every submission's end is recorded (a job whose end only a daemon that does not answer
        # could tell is still in flight), so a daemon still down elsewhere does not hold the end back
        rnd.finished = settled and not waited and sub.submitted_jobs == 0 and finalize_settled and exports_settled
        if rnd.finished:
            rnd.ended = outcome_of(rnd.inputs, self.store.operator_cancelled(self.campaign.id))
        for key in self.totals:
            self.totals[key] += rnd.submitted if key == "submitted" else len(getattr(rnd, key))
        self.left, self.slots = queue_reads.open_jobs(rnd.jobs), (pilots or {}).get("slots", 0)
        late = bool(self.manifest.pilots)
        self.watch.after_round(self.store, self.campaign.id, 0 if rnd.finished else self.left, late)
        return rnd

    def between_rounds(self) -> bool:
        """While it pauses: exports go on; in each second either the metrics file's forecast is made again,
        when due, or a late-bound campaign's queue is read (queue_reads.py), or an array campaign's last jobs'
        ends looked for (array_ends.py). True when the next round should come at once."""
        self.exporter.pump()
        if self.metrics_path is not None and round_metrics.forecast_due(self):
            round_metrics.refresh_forecast(self)
            return False
        return queue_reads.read(self) or self.watch.read()

    def _names(self, job_indices: List[int]) -> List[str]:
        named = self.store.job_names(self.campaign.id, job_indices) if job_indices else {}
        return [named.get(i, f"#{i}") for i in job_indices]

    def paced(self, pause: float) -> float:
        """The pause after this round, lengthened while the scheduler's commands answer slowly (a throttled
        user: fewer RPCs, not more timeouts); the slow spell recorded for status."""
        slowest = PACE.end_round()
        pause = paced_interval(pause, slowest, PACE.slow_s)
        outages.paced(self.store, self.campaign.id, slowest, PACE.slow_since, pause)
        return pause

    def wait_out(self, exc: Unreachable | SubmitUncertain) -> bool:
        """A daemon did not answer a move or a submission: recorded (the round waits it out), never raised."""
        daemon = exc.daemon if isinstance(exc, Unreachable) else Unreachable.daemon
        cluster = exc.cluster if isinstance(exc, Unreachable) else None
        outages.unanswered(self.store, self.campaign.id, self.scheds.get(cluster, self.sched), cluster, daemon,
                           exc.words())
        return True

    def _exports(self, rnd: Round) -> bool:
        """Send on what became done, record what ended (outputs.export); whether every export settled.
        An input counts as done once its output is verified at the destination."""
        if not self.exporter.active:
            return True
        step = self.exporter.step()
        rnd.inputs, figures = exported_counts(self.store, self.campaign.id, rnd.inputs)
        assert figures is not None
        rnd.exports = {**figures, "verified_now": len(step.verified), "failed_now": step.failed[:5],
                       "given_up_now": step.given_up, "in_flight": step.in_flight}
        return self.exporter.settled(figures["backlog"])

    def _finalize(self, action: Optional[str]) -> tuple[Optional[str], bool]:
        """The finalize job's word for the round summary, and whether it is settled (ended, skipped, none)."""
        summary = finalize_summary(self.manifest, self.store, self.campaign.id)
        if summary is None:
            return None, True
        if action == "skipped":
            return "skipped (finalize.after is 'ok' and some jobs failed or are parked)", True
        status = summary["status"]
        if summary["job_id"]:
            return f"{summary['job_id']} {summary['state'] or status}", status in ("done", "failed")
        return ("waiting" if action in (None, "waiting") else action), False

    def notify(self, rnd: Round, stall_after: float) -> None:
        """Run the spec's event hook for what this round brought (parked inputs, the end, a stall)."""
        if rnd.changed:
            self.last_change = time.monotonic()
        if rnd.parked:
            self.events.emit("parked", {"jobs": rnd.parked, "round": rnd.number})
        for turn in rnd.budget_turns:
            self.events.emit("budget", {**turn, "round": rnd.number})
        if rnd.finished:
            self.events.emit("done", {"inputs": rnd.inputs, "jobs": rnd.jobs, "round": rnd.number})
        elif time.monotonic() - self.last_change >= stall_after:
            self.events.emit("stalled", {"since_s": round(time.monotonic() - self.last_change),
                                         "jobs": rnd.jobs, "held": rnd.held, "round": rnd.number})
            self.last_change = time.monotonic()   # once per stall period, not every round

    def write_metrics(self, rnd: Round, beat_at: float) -> None:
        if self.metrics_path is not None:
            round_metrics.write(self, rnd, beat_at, self.metrics_path)


def _check_heartbeat(store: StateStore, campaign: Campaign, holder: str, take_over: bool) -> None:
    """With a flock that may be local to one host, a live heartbeat from another host also refuses."""
    if store.engine.dialect.name != "sqlite" or take_over:
        return   # a server lock is seen by every host
    prev = store.supervisor(campaign.id)
    if prev is None or prev.phase != "running" or _host(prev.holder) in ("", _host(holder)):
        return
    pause = prev.poll_interval_s or 60.0
    stale = max(STALE_MIN_S, 3 * pause)
    if prev.age_s() < stale:
        raise SupervisorBusy(
            f"campaign '{campaign.name}' is supervised by {prev.holder}, whose last heartbeat was "
            f"{prev.age_s():.0f} s ago (it pauses {pause:.0f} s between rounds). Its lock is held on another "
            f"host, where this one cannot see it. If that supervisor is dead, run again once its heartbeat is "
            f"older than {stale:.0f} s, or now with --take-over.")


def run(plan_dir: Union[str, Path], *, db: Optional[str] = None, once: bool = False, follow: bool = False,
        interval: Optional[float] = None, max_rounds: Optional[int] = None,
        metrics: Union[str, Path, None, bool] = None, take_over: bool = False,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT, on_round: Optional[Callable[[Round], None]] = None,
        sleep: Callable[[float], None] = time.sleep, say: Optional[Callable[[str], None]] = None) -> RunReport:
    """Drive the campaign of ``plan_dir`` until every plan job is done or parked and the finalize job
    has ended (``follow``: keep going after that, for work unparked or retried by hand; ``once``: one
    round, for cron or scrontab). Metrics go to ``PLAN_DIR/metrics.prom`` (``metrics``: another path,
    or False for none). An outage of the store is waited out however long it lasts (store_outage.py), told
    to ``say`` (the supervisor's log), the event hook and the metrics file."""
    plan_dir = Path(os.path.abspath(plan_dir))
    manifest = read_manifest(plan_dir)
    metrics_path = None if metrics is False else Path(metrics) if metrics else plan_dir / METRICS_NAME  # type: ignore[arg-type]
    holder = _whoami()
    with open_plan_store(plan_dir, db) as store, store_outage.Watch(store.engine) as watch:
        campaign = register(store, manifest)
        started: Optional[Tuple[Supervisor, RunReport]] = None
        outage: Optional[store_outage.Outage] = None
        while True:
            try:
                with supervisor_lock(store.engine, store.location, campaign.name) as held:
                    if started is None:
                        started = _start(plan_dir, manifest, store, campaign, holder, take_over, lock_timeout,
                                         metrics_path)
                        outage = watch.tell(_outage_of(started[0], say))
                    else:   # back after an outage: only if nobody took the campaign meanwhile
                        store.check_fences()
                    sup, report = started
                    _loop(sup, report, holder, held, once=once, follow=follow, interval=interval, max_rounds=max_rounds,
                          on_round=store_outage.after_round(outage, watch, on_round), sleep=sleep)
                    sup.exporter.close(wait=once)   # one round from cron: record its copies before leaving
                return report
            except LockTimeout as exc:
                if started is None:
                    raise SupervisorBusy(str(exc)) from None
                if outage is None or outage.since is None or not store_outage.lease_still_mine(store, campaign.id):
                    raise _taken_over(store, campaign) from None
                why: BaseException = store_outage.SessionLost()   # our own old session, still held by the server
            except (store_outage.SessionLost, StateStoreError, StoreUnreachable, DBAPIError, OSError) as exc:
                if started is None or outage is None or not store_outage.is_outage(store.engine.dialect.name, exc):
                    raise
                why = exc
            pause = outage.wait(why)
            started[1].outages[:] = outage.seen
            store.engine.dispose()   # every pooled session may be dead: start afresh
            if store_outage.wait_out(pause, sleep):
                started[0].exporter.close(wait=False)
                started[1].outcome = "stopped"
                return started[1]


def _outage_of(sup: Supervisor, say: Optional[Callable[[str], None]]) -> store_outage.Outage:
    """How this supervisor tells of its store's outages: the event hook, its log, its metrics file."""
    def mark(since: Optional[float]) -> None:
        if sup.metrics_path is not None:
            round_metrics.store_down(sup, since, sup.metrics_path)
    return store_outage.Outage(sup.events.emit, say or (lambda _text: None), mark)


def _start(plan_dir: Path, manifest: Manifest, store: StateStore, campaign: Campaign, holder: str,
           take_over: bool, lock_timeout: float, metrics_path: Optional[Path]) -> Tuple[Supervisor, RunReport]:
    """Become the campaign's supervisor: heartbeat row, lease (fencing every later write), the rounds' state."""
    _check_heartbeat(store, campaign, holder, take_over)
    prev = store.begin_supervising(campaign.id, holder)
    store.take_lease(campaign.id, "supervisor", holder)
    took = prev.holder if prev and prev.phase == "running" else None
    store.audit(campaign.id, "run", f"started supervising (took over from {took})" if took else "started supervising",
                holder)
    sup = Supervisor(plan_dir, manifest, store, campaign, lock_timeout=lock_timeout, metrics_path=metrics_path)
    return sup, RunReport(campaign.name, took_over=took)


def _taken_over(store: StateStore, campaign: Campaign) -> Fenced:
    lease = store.lease(campaign.id, "supervisor")
    mine = store.fences.get("supervisor")
    return lost(store.location, mine.holder if mine else _whoami(), "supervisor",
                lease.holder if lease else "another process")


def next_pause(base: float, pause: float, changed: bool, *, brought: bool, first: bool) -> float:
    """The pause after a round: back off while nothing changes, back to ``base`` once something did; a round that
    the jobs' own ends brought forward and that saw nothing change keeps the pause it cut short."""
    if first:
        return base
    return pause if brought and not changed else next_interval(base, pause, changed)


def _loop(sup: Supervisor, report: RunReport, holder: str, held: Held, *, once: bool, follow: bool,
          interval: Optional[float], max_rounds: Optional[int], on_round: Optional[Callable[[Round], None]],
          sleep: Callable[[float], None]) -> None:
    base = poll_interval(sup.manifest, interval)
    pause, sup.watch.brought = base, False
    stall_after = sup.events.stall_after_s
    with Stop() as stop:
        while True:
            if not held.alive():
                raise store_outage.SessionLost()
            with sup.store.one_round():   # counts read once a round, not once a question
                rnd = sup.round(len(report.rounds) + 1)
            pause = next_pause(base, pause, rnd.changed, brought=sup.watch.brought, first=not report.rounds)
            sup.watch.brought = False
            pause = sup.paced(pause)
            rnd.pause = 0.0 if rnd.finished and not follow else pause
            report.rounds.append(rnd)
            phase = "finished" if rnd.finished and not follow else "running"
            last = once or stop.asked or (max_rounds is not None and len(report.rounds) >= max_rounds)
            if last and phase == "running":
                phase = "stopped"
            if not sup.store.beat(sup.campaign.id, holder, rounds=rnd.number, phase=phase, note=rnd.summary(),
                                  poll_interval_s=rnd.pause):
                report.outcome = "superseded"
                return
            sup.write_metrics(rnd, time.time())
            sup.notify(rnd, stall_after)
            if on_round:
                on_round(rnd)
            if phase == "finished":
                report.outcome = "finished"
                return
            if last:
                report.outcome = "once" if once else "stopped" if stop.asked else "rounds"
                return
            sup.ticked = time.monotonic()
            stop.sleep(rnd.pause, sleep, sup.between_rounds, lambda: queue_reads.tick_s(sup))
            if stop.asked:   # stopped while waiting: no new round, say so in the heartbeat
                sup.store.beat(sup.campaign.id, holder, rounds=rnd.number, phase="stopped", note=rnd.summary(),
                               poll_interval_s=rnd.pause)
                report.outcome = "stopped"
                return


def heartbeat(plan_dir: Union[str, Path], *, db: Optional[str] = None) -> Optional[SupervisorRecord]:
    """The campaign's supervisor row (None: never supervised), for status and the web view."""
    plan_dir = Path(os.path.abspath(plan_dir))
    manifest = read_manifest(plan_dir, jobs=False)
    if not has_store(plan_dir, db):
        return None
    with open_plan_store(plan_dir, db) as store:
        try:
            return store.supervisor(store.get_campaign(manifest.campaign).id)
        except HpcrunError:
            return None

