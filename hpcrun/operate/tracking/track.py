"""Follow a campaign: one Slurm poll, recorded in the state store, summarised by state.

A poll makes one accounting query for every job in flight (by their job and array ids,
with an explicit start time), plus one queue query when some are pending (the queue holds
the reason a job waits, e.g. a burst-buffer stage-in error). Sites without accounting
(``accounting: false`` in the profile) are followed with the queue alone.
Only transitions are stored, so polling is idempotent. A finished job's own record in
``run/<job>/<slurm id>/`` adds its failure reason and its QA outcome per output.

The site's daemons come and go (a controller restarted, accounting down for an upgrade): a poll
uses what answers and waits for the rest. With accounting down the queue gives every job in flight
its pending or running state; a job that ended waits for its accounting record, never called lost
meanwhile nor for ``ACCOUNTING_CATCHUP_S`` after (the controller sends the records it kept late).
Each daemon's outage is recorded (hpcrun/operate/tracking/outages.py) for status, serve and the audit trail.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from hpcrun.backends.late.queue import Queue
from hpcrun.backends.scheduler.base import (
    ACCOUNTING_CATCHUP_S,
    INPUT_STATE_OF,
    TERMINAL,
    AccountingUnreachable,
    Queued,
    Record,
    Unreachable,
    normalize_state,
    parse_exit_code,
)
from hpcrun.bulk import bulk
from hpcrun.operate.campaign import forecast
from hpcrun.operate.campaign.generations import figures as generation_figures
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.outputs import provenance
from hpcrun.operate.outputs.exports import exported_counts
from hpcrun.operate.outputs.folding import Folder, fold_completed
from hpcrun.operate.outputs.qa_rows import qa_outcomes
from hpcrun.operate.outputs.qa_rows import read_or_empty as _read
from hpcrun.operate.plandir import (
    ClusterInfo,
    clusters_of,
    has_store,
    next_interval,
    open_plan_store,
    poll_interval,
    read_manifest,
)
from hpcrun.operate.results import IN_FLIGHT, JobRow, StatusReport, outcome_of  # noqa: F401  (re-exported)
from hpcrun.operate.submission.finalize import finalize_summary
from hpcrun.operate.tracking import budget, footprint, outages
from hpcrun.operate.tracking.changed import follows_changes, observe_changes, record_changes
from hpcrun.operate.tracking.clusterview import cluster_figures
from hpcrun.operate.tracking.inflight import InFlight
from hpcrun.operate.tracking.lookup import Found, index_of, match
from hpcrun.store.base import StateStoreError
from hpcrun.store.locking.mounts import INPUT_STATES
from hpcrun.store.records import (
    ActiveSubmission,
    NewStateChange,
    Outage,
    QaResult,
)
from hpcrun.store.store import StateStore
from hpcrun.units import format_duration

LOST_AFTER_S = 60.0  # a job neither the queue nor accounting knows this long after submission is gone
MIN_JOB_AGE_S = 600.0   # the queue may list an ended job this long (Slurm's MinJobAge, 300 s by default, and more)
_WAIT_REASONS = ("BurstBuffer", "JobArrayTaskLimit", "Resources", "Priority", "Dependency", "JobHeld", "None",
                 "BeginTime", "ReqNodeNotAvail", "QOS", "AssocGrp", "AssocMax")


def record_may_come(manifest: Manifest, last_state: Optional[str], seen: Optional[dt.datetime],
                    now: dt.datetime) -> bool:
    """A job seen started (``last_state`` at ``seen``) has an accounting record, written as it started, which a
    slurmdbd lagging behind the controller while it answers (no outage) may deliver after the queue forgot the
    job: it is not called lost (it would run twice) before the longest walltime it may have had (a retry's is
    raised up to the partition's), the queue's MinJobAge and the catch-up have passed since it was seen so."""
    if INPUT_STATE_OF.get(last_state or "") != "running" or seen is None:
        return False
    longest = max(manifest.walltime_seconds, int(manifest.submit.limits.get("max_walltime_s") or 0))
    return (now - seen).total_seconds() <= longest + MIN_JOB_AGE_S + ACCOUNTING_CATCHUP_S


def _fmt_elapsed(seconds: Optional[float]) -> str:
    return "" if seconds is None else format_duration(int(seconds))


class Poller:
    """Observes the submissions in flight and records what changed."""

    def __init__(self, plan_dir: Path, store: StateStore, manifest: Manifest):
        self.plan_dir = plan_dir
        self.store = store
        self.manifest = manifest
        self.run_dir = str(plan_dir / "run")
        self.waiting: Dict[int, str] = {}   # plan job -> why it is pending now (the queue's words, this poll)
        self.spent: Dict[Optional[str], Dict[str, int]] = {}   # cluster -> budget reason -> jobs it holds now
        self.accounting = manifest.submit.accounting
        self.records: Dict[str, Record] = {}  # this poll's accounting answer (the finalize job reads it)
        listed = clusters_of(manifest)
        self.clusters = {c.name: c for c in listed}
        self.first = listed[0]
        self.sched = self.first.sched
        self.unreachable: Dict[Optional[str], str] = {}   # clusters whose queue did not answer this poll
        self.down: Dict[Tuple[Optional[str], str], str] = {}   # (cluster, daemon) that did not answer: its words
        self.answered: Set[Tuple[Optional[str], str]] = set()   # (cluster, daemon) that answered this poll
        self.catching_up: Set[Optional[str]] = set()   # clusters whose accounting is down or was lately

    def note_outages(self, outages: Sequence[Outage], now: dt.datetime) -> None:
        """Accounting outages recorded earlier: while one lasts, or lately ended, nothing is called lost."""
        for o in outages:
            if o.daemon == AccountingUnreachable.daemon and o.within(now, ACCOUNTING_CATCHUP_S):
                self.catching_up.add(o.cluster)

    def _waits(self, a: ActiveSubmission) -> bool:
        """Nothing may be concluded of a job the queue and accounting do not list: a daemon is not answering."""
        cluster = self._cluster_of(a)
        return cluster in self.unreachable or (cluster or None) in self.catching_up

    def job_dir(self, sub: ActiveSubmission, raw_id: str) -> str:
        """run/<job>/<slurm id> (a plain string: this is called once per job per poll); a named cluster's
        ids are prefixed with its name (ids repeat across clusters)."""
        prefix = self.clusters[sub.cluster].run_prefix if sub.cluster in self.clusters else ""
        return f"{self.run_dir}/{sub.job_name or '?'}/{prefix}{raw_id}"

    def _lookup(self, active: Sequence[ActiveSubmission], extra: Sequence[Tuple[str, dt.datetime]]
                ) -> Tuple[Found, List[ActiveSubmission], Dict[Tuple[Optional[str], str], Queued], float]:
        """Each cluster's in-flight jobs asked of that cluster (ids are only unique within one)."""
        by_cluster: Dict[Optional[str], Sequence[ActiveSubmission]] = {}
        if len(self.clusters) <= 1:   # one cluster (the usual case): the list as it is (its index is kept)
            by_cluster[self.first.name] = active
        for a in active if len(self.clusters) > 1 else ():
            name = a.cluster if a.cluster in self.clusters else self.first.name
            by_cluster.setdefault(name, []).append(a)  # type: ignore[attr-defined]
        if extra:
            by_cluster.setdefault(self.first.name, [])
        found: Found = {}
        need: List[ActiveSubmission] = []
        queued: Dict[Tuple[Optional[str], str], Queued] = {}
        acct_s = 0.0
        for name, subs in by_cluster.items():
            cluster = self.clusters.get(name, self.first)
            f, n, q, secs = self._lookup_on(cluster, subs, extra if name == self.first.name else ())
            found.update(f)
            need += n
            queued.update({(name, k): v for k, v in q.items()})
            acct_s += secs
        return found, need, queued, acct_s

    def _lookup_on(self, cluster: ClusterInfo, active: Sequence[ActiveSubmission],
                   extra: Sequence[Tuple[str, dt.datetime]]
                   ) -> Tuple[Found, List[ActiveSubmission], Dict[str, Queued], float]:
        """One accounting query for everything in flight on one cluster, and one queue query for those it lacks."""
        sched = cluster.sched
        index = index_of(active)
        ids = sorted(set(index.job_ids) | {j for j, _ in extra}, key=lambda j: int(j) if j.isdigit() else 0)
        since = sched.since_text(min([t for t in [index.first_submitted] if t] + [t for _, t in extra]))
        t0 = time.monotonic()
        # what this poll already knows: unchanged jobs come back as one shared record (cheap)
        records: Dict[str, Record] = {}
        if cluster.accounting:
            try:
                records = sched.records(ids, since, known=index.known, in_flight=index.by_sid)
                self.answered.add((cluster.name, AccountingUnreachable.daemon))
            except AccountingUnreachable as exc:   # the queue says what waits and runs; ends wait for it
                self.down[(cluster.name, exc.daemon)] = exc.words()
                self.catching_up.add(cluster.name or None)
        if cluster is self.first:
            self.records = records
        acct_s = time.monotonic() - t0
        found, need = match(index, records)
        queued: Dict[str, Queued] = {}
        if need:
            try:
                for row in sched.queue(job_ids=sorted({a.job_id for a in need}), ended=True):
                    queued[row.job_id] = row
                self.answered.add((cluster.name, Unreachable.daemon))
            except Unreachable as exc:   # its jobs stay as recorded; asked again at the next poll
                self.unreachable[cluster.name] = str(exc).splitlines()[0]
                self.down[(cluster.name, exc.daemon)] = exc.words()
        return found, need, queued, acct_s

    def observe(self, active: Sequence[ActiveSubmission], extra: Sequence[Tuple[str, dt.datetime]] = ()
                ) -> Tuple[List[NewStateChange], List[Tuple[ActiveSubmission, str]], float]:
        """Observations of these submissions; also (submission, raw id) of those that just ended.
        ``extra`` (job id, submit time) go into the same accounting query (the finalize job).
        Only the jobs whose record says something, or that the queue was asked about, are looked at."""
        if not active and not extra:
            return [], [], 0.0
        found, need, queued, acct_s = self._lookup(active, extra)
        now = dt.datetime.now(dt.timezone.utc)
        changes: List[NewStateChange] = []
        ended: List[Tuple[ActiveSubmission, str]] = []
        candidates = {a.id: a for a in need}
        candidates.update((sid, a) for sid, (a, _rec) in found.items())
        for a in candidates.values():
            hit = found.get(a.id)
            rec = hit[1] if hit is not None else None
            q = queued.get((self._cluster_of(a), a.slurm_id)) if queued else None   # usually none was asked
            if rec is None and q is None:
                seen = None if self._waits(a) else self._unseen(a, now)
            elif rec is None or (rec.state == "PENDING" and q is not None):
                assert q is not None
                seen = self._from_queue(a, q, now)
            else:
                seen = self._from_record(a, rec, now)
            if seen is not None:
                change, raw = seen
                changes.append(change)
                if raw is not None:
                    ended.append((a, raw))
        return changes, ended, acct_s

    _Seen = Optional[Tuple[NewStateChange, Optional[str]]]   # the change, and the raw id if the job ended

    def label(self, cluster: Optional[str]) -> str:
        """How status names a cluster ("" for a campaign on one)."""
        return "" if len(self.clusters) <= 1 else self.clusters.get(cluster or "", self.first).label

    def _cluster_of(self, a: ActiveSubmission) -> Optional[str]:
        return a.cluster if a.cluster in self.clusters else self.first.name

    def _unseen(self, a: ActiveSubmission, now: dt.datetime) -> _Seen:
        """Neither accounting nor the queue lists the job."""
        if self.accounting:
            # not visible yet (accounting lags the controller by a moment), or gone without a record
            # (e.g. an array task cancelled before it was ever eligible)
            if (now - a.submitted_at).total_seconds() > LOST_AFTER_S and not self._record_may_come(a, now):
                return NewStateChange(a.id, "LOST", now, reason=(
                    "the job left the queue and accounting has no record of it (cancelled before it "
                    "was eligible to run?)")), ""
            return None
        if a.last_state is None:
            return None
        # no accounting and gone from the queue: the job's own record is all there is
        raw = a.slurm_id if a.array_index is None else ""
        reason = _read(self.job_dir(a, raw) + "/reason") if raw else ""
        state = "FAILED" if reason else "COMPLETED"
        return NewStateChange(a.id, state, now, reason=reason or "left the queue (no accounting)"), raw

    def _record_may_come(self, a: ActiveSubmission, now: dt.datetime) -> bool:
        if INPUT_STATE_OF.get(a.last_state or "") != "running":   # no query for the rest (pending, held)
            return False
        seen = max((c.observed_at for c in self.store.state_changes(a.id)), default=a.submitted_at)
        return record_may_come(self.manifest, a.last_state, seen, now)

    def _from_queue(self, a: ActiveSubmission, q: Queued, now: dt.datetime) -> _Seen:
        """The queue's word, where accounting has none yet (or only a pending one)."""
        state = normalize_state(q.state)
        if state == "PENDING" and a.job_index is not None:
            why = self.waiting[a.job_index] = q.reason.strip("()")
            cluster = self._cluster_of(a)
            if self.clusters.get(cluster or "", self.first).sched.budget_reason(why):
                held = self.spent.setdefault(cluster, {})
                held[why] = held.get(why, 0) + 1
        if state == a.last_state:
            return None
        if state in TERMINAL and self.accounting and (
                state != "CANCELLED" or (now - a.submitted_at).total_seconds() <= LOST_AFTER_S
                or self._waits(a)):
            # accounting has no record of this job yet, or only its array's pending one: a job
            # that ran gets its own (written when it started), which accounting may deliver late,
            # so wait for it (elapsed, CPU time, exit code); only a job cancelled before it
            # ever ran has none, and is taken from the queue after a moment (not while accounting
            # is down or catching up: then its record may still come)
            return None
        reason = q.reason.strip("()")
        if state in TERMINAL and state != "COMPLETED" and q.raw_id:
            reason = _read(self.job_dir(a, q.raw_id) + "/reason") or reason  # the job's own words
        return NewStateChange(a.id, state, now, reason=reason), (q.raw_id if state in TERMINAL else None)

    def _from_record(self, a: ActiveSubmission, rec: Record, now: dt.datetime) -> _Seen:
        """The accounting record, once it is complete."""
        if rec.state == a.last_state:
            return None  # nothing new (the steady state of a long campaign: most polls change little)
        code, sig = parse_exit_code(rec.exit_code)
        if rec.state in TERMINAL and (code is None or rec.elapsed_s is None):
            ended_at = self.sched.parse_time(rec.end)
            if ended_at is None or (now - ended_at).total_seconds() <= LOST_AFTER_S:
                return None  # accounting has the end but not yet its exit code or elapsed time: next poll
        reason = "" if rec.state in ("COMPLETED", "RUNNING") else rec.reason
        if rec.state in TERMINAL and rec.state != "COMPLETED":
            # accounting keeps the last *pending* reason on ended jobs (e.g. BurstBufferStageIn): not why it ended
            if reason.startswith(_WAIT_REASONS):
                reason = ""
            reason = _read(self.job_dir(a, rec.raw_id) + "/reason") or reason
        change = NewStateChange(
            a.id, rec.state, now, code, sig, rec.nodes if rec.nodes not in ("None assigned", "") else None,
            rec.elapsed_s, rec.cpu_s, rec.max_rss_bytes, reason or None, rec.alloc_cpus,
            self.sched.parse_time(rec.start), self.sched.parse_time(rec.end), rec.req_mem_bytes)
        return change, (rec.raw_id if rec.state in TERMINAL and a.last_state not in TERMINAL else None)

    def qa_outcomes(self, ended: Sequence[Tuple[ActiveSubmission, str]]) -> List[QaResult]:
        """QA rows the finished jobs wrote (see :mod:`hpcrun.operate.outputs.qa_rows`)."""
        return qa_outcomes(self.store, self.run_dir, self.job_dir, ended)


# without --all: the jobs a human must look at, and those in flight while they are few enough to list
NEED_A_HUMAN = ("failed", "parked")
MAX_IN_FLIGHT_ROWS = 500


def _unsubmitted(location: str, plan_dir: Path, all_jobs: bool) -> StatusReport:
    """A plan nothing of which was submitted yet: every job pending."""
    manifest = read_manifest(plan_dir)
    report = StatusReport(manifest.campaign, location)
    report.counts = {s: 0 for s in INPUT_STATES}
    report.counts["pending"] = len(manifest.jobs)
    report.inputs = {s: 0 for s in INPUT_STATES}
    report.inputs["pending"] = sum(len(j["inputs"]) for j in manifest.jobs)
    if all_jobs:
        report.jobs = [JobRow(j["name"], j["index"], "pending", "", "", "", "", 0, "") for j in manifest.jobs]
    report.finalize = finalize_summary(manifest, None, None)
    return report


def _report(campaign: str, store: StateStore, campaign_id: int, all_jobs: bool,
            waiting: Dict[int, str], exports: bool = False) -> StatusReport:
    """Counts of every state; rows for the jobs worth following (all of them with ``all_jobs``)."""
    report = StatusReport(campaign, store.location)
    report.counts = store.job_counts(campaign_id)
    report.inputs, report.exports = exported_counts(store, campaign_id, store.counts_by_state(campaign_id), exports)
    report.held = sum(1 for why in waiting.values() if held_for_a_human(why))
    report.outcome = outcome_of(report.inputs, store.operator_cancelled(campaign_id))
    held = store.paused(campaign_id)
    report.paused = held.text() if held else None
    beat = store.supervisor(campaign_id)
    if beat is not None:
        report.supervisor = {"holder": beat.holder, "phase": beat.phase, "rounds": beat.rounds,
                             "heartbeat_age_s": round(beat.age_s()), "note": beat.note or ""}
    if all_jobs:
        states: Optional[Tuple[str, ...]] = None
    elif sum(report.counts.get(s, 0) for s in IN_FLIGHT) <= MAX_IN_FLIGHT_ROWS:
        states = NEED_A_HUMAN + IN_FLIGHT
    else:
        states = NEED_A_HUMAN
    for js in store.job_states(campaign_id, states):
        exit_code = "" if js.exit_code is None else f"{js.exit_code}:{js.signal or 0}"
        reason = js.last_reason if js.state in ("failed", "parked") else (js.slurm_reason or "")
        if js.state == "failed" and js.cancel_requested_by:
            reason = f"cancelled by an operator ({js.cancel_requested_by}); `hpcrun retry --cancelled` reruns it"
        if js.state == "submitted" and js.job_index in waiting:  # a pending reason changes without a transition
            reason = waiting[js.job_index]
        report.jobs.append(JobRow(js.job_name or f"#{js.job_index}", js.job_index, js.state, js.slurm_state or "",
                                  js.slurm_id or "", exit_code, _fmt_elapsed(js.elapsed_s), js.attempts,
                                  reason or ""))
    return report


def poll(plan_dir: Union[str, Path], *, db: Optional[str] = None, all_jobs: bool = False, with_forecast: bool = False,
         folder: Optional[Folder] = None, kept: Optional[InFlight] = None) -> StatusReport:
    """Observe every job in flight once, record the changes, and summarise the campaign; ``with_forecast`` adds
    the forecast (`hpcrun status`); ``kept``: the jobs in flight as the previous poll left them (status --wait)."""
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir, jobs=False)  # names come from the store: a 100k-job manifest is 30 MB
    if not has_store(plan_dir, db):
        return _unsubmitted(str(plan_dir / "state.db"), plan_dir, all_jobs)  # nothing submitted: create no store
    with open_plan_store(plan_dir, db) as store:
        report = poll_store(plan_dir, manifest, store, all_jobs, folder, kept=kept)
        if manifest.pilots:   # late binding: what the pilots hold, read from the queue
            report.pilots = Queue(Path(manifest.pilots["queue"])).view()
        if with_forecast:
            try:
                campaign_id = store.get_campaign(manifest.campaign).id
            except StateStoreError:
                return report
            report.forecast = forecast.of_store(store, campaign_id, manifest).as_dict()
            report.footprint = footprint.of_status(plan_dir, manifest, store, campaign_id, report)
        return report


def poll_store(plan_dir: Path, manifest: Manifest, store: StateStore, all_jobs: bool = False,
               folder: Optional[Folder] = None, fold_queue: bool = False, kept: Optional[InFlight] = None
               ) -> StatusReport:
    """``poll`` on a plan directory already open (retry and submit reuse their manifest and store); the
    supervisor passes its ``folder`` (see folding.fold_completed) and the jobs in flight it ``kept``."""
    with bulk():   # a poll of 10^5 ended jobs makes ~10 objects each: no collector passes over them
        return _poll_store(plan_dir, manifest, store, all_jobs, folder, fold_queue, kept or InFlight())


def _poll_store(plan_dir: Path, manifest: Manifest, store: StateStore, all_jobs: bool,
                folder: Optional[Folder], fold_queue: bool, kept: InFlight) -> StatusReport:
    try:
        campaign = store.get_campaign(manifest.campaign)
    except StateStoreError:
        return _unsubmitted(store.location, plan_dir, all_jobs)
    from hpcrun.operate.tracking.finalize_job import finalize_in_flight, observe_finalize  # it imports this module
    poller = Poller(plan_dir, store, manifest)
    known_outages = store.outages(campaign.id)
    poller.note_outages(known_outages, dt.datetime.now(dt.timezone.utc))
    fin = finalize_in_flight(store, campaign.id) if manifest.finalize else None
    extra = [(fin.job_id, fin.submitted_at)] if fin and fin.job_id and fin.submitted_at else []
    late = follows_changes(poller)   # late binding: the queue says what changed (no list of what is in flight)
    if late:
        changes, ended, acct_s, advance = observe_changes(poller, store, campaign.id, extra)
    else:
        changes, ended, acct_s = poller.observe(active := kept.read(store, campaign.id), extra)
    recorded = set(store.record_transitions(campaign.id, changes))
    observed = len(recorded)
    if not late:
        kept.recorded(store, campaign.id, active, changes, observed)
    ended = [(a, raw) for a, raw in ended if a.id in recorded]   # not those another poller recorded first
    provenance.record_outcomes(store, campaign.id, poller.job_dir, poller.qa_outcomes(ended), ended)
    fold_completed(folder, poller, changes, ended)
    if late:
        advance(fold_queue)   # recorded: the cursor moves past what was read (the supervisor's round folds too)
    if fin is not None:
        observe_finalize(poller, store, fin)
    report = _report(campaign.name, store, campaign.id, all_jobs, poller.waiting, bool(manifest.export))
    report.finalize = finalize_summary(manifest, store, campaign.id)
    report.observed = observed
    report.accounting_seconds = acct_s
    report.clusters = cluster_figures(manifest, store, campaign.id, poller.unreachable)
    spent = {c: dict(r) for c, r in poller.spent.items()}
    if budget.record(store, campaign.id, spent, set(poller.clusters) - set(poller.unreachable)
                     - {c for c, _ in poller.down}, known_outages):
        known_outages = store.outages(campaign.id)
    report.outages = outages.after_poll(store, campaign.id, poller.sched, known_outages, poller.down, poller.answered)
    report.generations = generation_figures(store, campaign.id)
    report.budget_held = {poller.label(c): r for c, r in spent.items()}
    return report


def record_queue(plan_dir: Path, manifest: Manifest, store: StateStore, campaign_id: int,
                 folder: Optional[Folder] = None) -> Tuple[int, int, bool]:
    """Late binding between two polls: the queue's changes recorded (changed.record_changes); nothing for a
    campaign of the scheduler's jobs, whose changes only a poll sees."""
    poller = Poller(plan_dir, store, manifest)
    if not follows_changes(poller):
        return 0, 0, False
    with bulk():
        return record_changes(poller, store, campaign_id, folder)


def held_for_a_human(pending_reason: str) -> bool:
    """A pending job that Slurm holds because of a burst-buffer failure will not start by itself."""
    return "burst_buffer" in pending_reason


def watch(plan_dir: Union[str, Path], *, db: Optional[str] = None, timeout: Optional[float] = None,
          interval: Optional[float] = None, on_poll: Optional[Callable[[StatusReport], None]] = None,
          all_jobs: bool = False, sleep: Callable[[float], None] = time.sleep) -> StatusReport:
    """Poll until nothing is in flight (or what is left is held for a human); returns the last report.

    Polite by default: once a minute (or ``interval``, never below the site's
    ``scheduler.min_poll_interval``), backing off while nothing changes."""
    base = poll_interval(read_manifest(Path(plan_dir).resolve(), jobs=False), interval)
    current = base
    deadline = None if timeout is None else time.monotonic() + timeout
    folder, kept = Folder(str(Path(plan_dir).resolve() / "run")), InFlight()   # one segment, one list: for all polls
    while True:
        report = poll(plan_dir, db=db, all_jobs=all_jobs, with_forecast=True, folder=folder, kept=kept)
        if on_poll:
            on_poll(report)
        if report.in_flight - report.held <= 0 and not report.finalize_in_flight:
            return report
        if deadline is not None and time.monotonic() > deadline:
            return report
        current = next_interval(base, current, report.observed > 0)
        left = None if deadline is None else max(1.0, deadline - time.monotonic())
        sleep(current if left is None else min(current, left))
