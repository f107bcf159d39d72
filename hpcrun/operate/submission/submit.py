"""Submit a plan's outstanding work to the scheduler, recording every job in the campaign state store.

Each submission is three steps: claim the plan jobs in the store (their inputs become
``submitted`` under a fresh claim token), submit them with the job name
``<campaign>.<token[:12]>`` (the *tag*), and record the job id. A process killed between
any two steps leaves a claim without a record; the next ``submit`` (under the campaign's
submit lock, so no live submitter is mid-way) looks for the tag in the queue (ended jobs too)
and the accounting records, and records the job it finds, or returns the claim to pending when
the scheduler never got it (not while its accounting is down or catching up after an outage: its
records may come late). Nothing is submitted twice and nothing is lost.

Job arrays go out as one array submission of the pending task ids (``%N`` throttled) per
array script, so a retry resubmits exactly the failed tasks of the same script; an unthrottled
array above CLAIM_MAX tasks (a late-bound plan's 10^6) goes in pieces, one claim each.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from hpcrun.backends.scheduler.base import (
    ACCOUNTING_CATCHUP_S,
    AccountingUnreachable,
    SchedulerError,
    SubmitUncertain,
    Unreachable,
)
from hpcrun.errors import InputError, Problem
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import (
    ClusterInfo,
    clusters_of,
    has_store,
    open_plan_store,
    poll_interval,
    read_manifest,
)
from hpcrun.operate.results import Batch, FinalizeAction, ScriptInfo, SubmitReport
from hpcrun.operate.submission.batches import (  # re-exported: callers and tests use submit.*
    claim_groups,
    compress_indices,
    plan_batches,
    plan_retry_batches,
    scripts_of,
    tag_of,
    throttle_of,
)
from hpcrun.operate.submission.headers import HeaderBook, text_key
from hpcrun.operate.submission.headers import digest as text_digest
from hpcrun.operate.submission.locality import prefer_nodes
from hpcrun.operate.submission.placement import (
    DOWN,
    mark_slow,
    on_cluster,
    place,
    queue_budget,
    spent_words,
    survey,
)
from hpcrun.operate.submission.registration import register  # re-exported: the supervisor and the API use it
from hpcrun.store.locking.lock import submit_lock
from hpcrun.store.records import Campaign, Claim, NewSubmission
from hpcrun.store.store import StateStore

DEFAULT_LOCK_TIMEOUT = 600.0


class Submitter:
    """Claims, submits and records the batches of one plan; settles claims left by a stopped run."""

    def __init__(self, plan_dir: Path, store: StateStore, manifest: Manifest, campaign: Campaign,
                 cluster: Optional[ClusterInfo] = None):
        self.plan_dir = plan_dir
        self.store = store
        self.manifest = manifest
        self.campaign = campaign
        self.clusters = clusters_of(manifest)
        self.cluster = cluster or self.clusters[0]     # where this submitter sends work
        self.scripts = scripts_of(manifest, self.cluster.scripts)
        self._script_by_job: Dict[int, ScriptInfo] = {}
        self.accounting = self.cluster.accounting
        self.sched = self.cluster.sched
        self.changes: Dict[int, Optional[str]] = {}   # plan job -> a retry's changes, while one group submits
        self.texts: Dict[int, str] = {}                # plan job -> its script rendered at submission
        self.unsettled = self.returned = 0   # plan jobs whose claims wait for a later settle; sent back to pending
        self.sent: List[Batch] = []
        self._books: Dict[str, HeaderBook] = {}

    def script_text(self, script: ScriptInfo, job_index: int) -> Optional[str]:
        """The script of a job (an array task: of its array) rendered at submission (None: the script
        is a file of the plan)."""
        if script.headers is None:
            return None
        book = self._books.get(script.headers)
        if book is None:
            book = self._books[script.headers] = HeaderBook(self.plan_dir, script.path, script.headers)
        return book.text(text_key(script, job_index))

    def on(self, cluster: ClusterInfo) -> Submitter:
        """The same submitter sending work to another cluster of the plan."""
        return Submitter(self.plan_dir, self.store, self.manifest, self.campaign, cluster)

    def script_of(self, job_index: int) -> ScriptInfo:
        hit = self._script_by_job.get(job_index)
        if hit is not None:
            return hit
        for s in self.scripts:
            if s.first <= job_index <= s.last:
                self._script_by_job.update(dict.fromkeys(range(s.first, s.last + 1), s))
                return s
        raise InputError([Problem(str(self.plan_dir / "manifest.json"), None, "", (
            f"has no script for job {job_index} recorded in {self.store.location}; the plan changed after "
            "submission. Plan the changed campaign into a new directory."))])

    # -- one claim: one array submission, or a group of per-job submissions ------------------

    def submit_group(self, batches: Sequence[Batch]) -> List[Batch]:
        """Claim the jobs of these batches at once, submit each batch, then record them all.

        Claiming and recording once per group (not per submission) keeps the store's cost far
        below the scheduler's own. Each submission carries a name that ties it to the claim (and, in a
        group of per-job scripts, to its plan job), so a stop anywhere in between is settled
        by the next submit (``settle``).
        """
        self.sent = []   # this group's, from its start (a claim that comes back empty sends nothing)
        claim = self.store.claim_jobs(self.campaign.id, [j for b in batches for j in b.jobs])
        claimed = {i.job_index for i in claim.inputs if i.job_index is not None}
        if not claimed:
            return []  # another submitter took them
        base = tag_of(self.campaign.name, claim.token)
        grouped = len(batches) > 1
        done = self.sent   # what the scheduler took, as it goes: a caller reports it when the group raises
        by_job: Dict[int, str] = {}
        changes = self.changes = {}
        self.texts = {}
        try:
            for batch in batches:
                jobs = [j for j in batch.jobs if j in claimed]
                if not jobs:
                    continue
                if jobs != batch.jobs:
                    batch = Batch(batch.script, jobs, self._array_spec(batch.script, jobs) if batch.array_spec
                                  else None, adjust=batch.adjust, changes=batch.changes)
                batch.tag = f"{base}.{jobs[0]}" if grouped else base
                self.store.check_fences()   # a holder that lost its lock hands the scheduler nothing
                text = self.script_text(batch.script, jobs[0])
                if text is not None:
                    self.texts[text_key(batch.script, jobs[0])] = text
                batch.job_id = self.sched.submit(self.plan_dir / batch.script.path, name=batch.tag,
                                                 array=batch.array_spec or None, adjust=batch.adjust, text=text)
                changes.update(dict.fromkeys(jobs, batch.changes))
                done.append(batch)
                by_job.update(dict.fromkeys(jobs, batch.job_id))
        except SubmitUncertain as uncertain:
            # what was submitted is recorded; the timed-out job is looked for, never released now (the controller
            # may make it after this look): unfound, or another cluster not answering the look, the claim waits for
            # the next settle. Found, the jobs after it, never submitted, go back to pending
            self._record(claim, by_job)
            rest = Claim(claim.token, claim.claimed_by, tuple(i for i in claim.inputs if i.job_index not in by_job))
            try:
                found = self.settle([rest], False, dict.fromkeys(batch.jobs, batch.changes))[0]
            except Unreachable as exc:   # this cluster's: its seat is down; another's says nothing of this one
                if exc.asked == self.cluster.name:
                    raise
                raise uncertain from exc
            batch.job_id = dict(found).get(batch.tag or "")
            if not batch.job_id:
                raise
            self.store.release_claim(claim.token, reason="released: not submitted (a submission before it timed out)")
            self.returned += len(claimed) - len(by_job) - len(batch.jobs)   # pending again, not submitted this round
            return done + [batch]
        except SchedulerError as exc:
            self._record(claim, by_job)
            self.store.release_claim(claim.token, reason=str(exc))
            raise
        self._record(claim, by_job)
        return done

    def _array_spec(self, script: ScriptInfo, jobs: Sequence[int]) -> str:
        throttle = throttle_of(self.manifest)
        return compress_indices(j - script.first for j in jobs) + (f"%{throttle}" if throttle else "")

    def _record(self, claim: Claim, job_ids: Dict[int, str], changes: Optional[Dict[int, Optional[str]]] = None
                ) -> None:
        """Record the claimed plan jobs that got a job on this submitter's cluster (``job_ids``: plan job ->
        scheduler job id), with their retry's ``changes`` (default: those of the group being submitted)."""
        changes = self.changes if changes is None else changes
        by_job: Dict[int, List[int]] = {}
        for rec in claim.inputs:
            if rec.job_index is not None and rec.job_index in job_ids:
                by_job.setdefault(rec.job_index, []).append(rec.id)
        if not by_job:
            return
        subs = []
        digests: Dict[int, str] = {}
        tag = tag_of(self.campaign.name, claim.token)
        for job_index, input_ids in sorted(by_job.items()):
            script = self.script_of(job_index)
            key = text_key(script, job_index)
            text = self.texts.get(key) or self.script_text(script, job_index)  # settled: the same text
            if text is not None and key not in digests:   # an array's tasks: filled and hashed once
                self.texts[key], digests[key] = text, text_digest(text)
            path, digest = (script.path, script.sha256) if text is None else (f"{script.headers}#{key}", digests[key])
            subs.append(NewSubmission(job_ids[job_index], path, digest, tag, input_ids,
                                      job_index - script.first if script.is_array else None, claim.token,
                                      changes=changes.get(job_index), cluster=self.cluster.name,
                                      script_text=text, generation=script.generation))
        self.store.record_submissions(self.campaign.id, subs)

    # -- claims left by a stopped submitter --------------------------------------------------

    def settle(self, claims: Sequence[Claim], release: bool = True, changes: Optional[Dict[int, Optional[str]]] = None
               ) -> Tuple[List[Tuple[str, str]], List[str]]:
        """Record the Slurm jobs found under each claim's names (with ``changes``, the retry's of a timed-out
        submission: a stopped submitter's are not known), release what Slurm never got (``release``).

        A claim's names are its tag (an array, or a single job) and ``<tag>.<plan job>`` (a
        group of per-job scripts). Returns ([(name, job id) found], [tags released]).
        """
        if not claims:
            return [], []
        names: Dict[str, Tuple[Claim, Optional[int]]] = {}
        for c in claims:
            base = tag_of(self.campaign.name, c.token)
            names[base] = (c, None)
            for j in {i.job_index for i in c.inputs if i.job_index is not None}:
                names[f"{base}.{j}"] = (c, j)
        # every cluster is asked: the claim's job may be on any (one that cannot be asked raises Unreachable, and
        # the claims wait rather than risk a second job); ended jobs too (MinJobAge): slurmdbd may lag behind
        ids: Dict[str, set] = {n: set() for n in names}
        claimed = [i.claimed_at for c in claims for i in c.inputs if i.claimed_at is not None]
        for cl in self.clusters:
            try:
                self._look(cl, list(names), ids, claimed)
            except Unreachable as exc:
                exc.asked = cl.name
                raise
        found: List[Tuple[str, str]] = []
        released: List[str] = []
        by_label = {cl.label: cl for cl in self.clusters}
        now = dt.datetime.now(dt.timezone.utc)   # a claim waits while an accounting may still send its job's record
        asked = {cl.name for cl in self.clusters if cl.accounting}   # another's outage (off, or gone) says nothing
        late = release and any(o.daemon == AccountingUnreachable.daemon and o.cluster in asked
                               and o.within(now, ACCOUNTING_CATCHUP_S) for o in self.store.outages(self.campaign.id))
        for c in claims:
            got: Dict[str, Dict[int, str]] = {}
            jobs = {i.job_index for i in c.inputs if i.job_index is not None}
            for name, (owner, job) in names.items():
                if owner is not c or not ids[name]:
                    continue
                label, job_id = min(ids[name], key=lambda cj: int(cj[1]) if cj[1].isdigit() else 0)
                got.setdefault(label, {}).update(dict.fromkeys(jobs if job is None else [job], job_id))
                found.append((name, job_id))
            for label, job_ids in got.items():
                self.on(by_label[label])._record(c, job_ids, changes or {})
            if release and sum(len(j) for j in got.values()) < len(jobs):
                if late:   # left for a later settle: not pending, not submitted (no finalize job meanwhile)
                    self.unsettled += len(jobs) - sum(len(j) for j in got.values())
                    continue
                tag = tag_of(self.campaign.name, c.token)
                self.store.release_claim(c.token, reason=(
                    f"released: no job named {tag} (the submitter stopped before the scheduler took it)"))
                released.append(tag)
        return found, released

    def _look(self, cl: ClusterInfo, names: List[str], ids: Dict[str, set], claimed: List[dt.datetime]) -> None:
        """The jobs of one cluster under the claims' ``names``, in its queue (ended too) and its accounting, into
        ``ids`` (name -> {(cluster label, job id)})."""
        for q in cl.sched.queue(names=names, ended=True):
            if q.name in ids:
                ids[q.name].add((cl.label, q.array_job_id))
        if cl.accounting:
            since = cl.sched.since_text(min(claimed)) if claimed else "now-7days"
            for rec in cl.sched.records((), since, names=names).values():
                if rec.name in ids:
                    ids[rec.name].add((cl.label, rec.job_id.split("_", 1)[0]))
            ended = self.store.end_outage(self.campaign.id, cl.name, AccountingUnreachable.daemon)
            if ended is not None:   # it answered: its catch-up counts from now (a poll may not ask it)
                self.store.audit(self.campaign.id, "outage", ended.text(cl.sched.daemon_name(ended.daemon)))

    def reconcile(self) -> Tuple[List[Tuple[str, str]], List[str]]:
        return self.settle(self.store.unresolved_claims(self.campaign.id))


def _claimed_jobs(store: StateStore, campaign: Campaign) -> int:
    """Plan jobs claimed but neither recorded nor released: their jobs may exist (not pending, not in flight)."""
    return len({i.job_index for c in store.unresolved_claims(campaign.id) for i in c.inputs})


def _finalize_step(plan_dir: Path, store: StateStore, manifest: Manifest, campaign: Campaign,
                   report: SubmitReport, again: bool) -> Optional[FinalizeAction]:
    """The campaign's finalize job, once nothing of the plan is left pending (see submission/finalize.py)."""
    if not manifest.finalize:
        return None
    claimed = _claimed_jobs(store, campaign)   # a claim of any round, on any cluster
    if claimed:   # its dependency would miss the jobs those claims may hold
        return FinalizeAction("waiting", f"the finalize job waits until the claims of {claimed} plan job(s) are "
                                         "settled (their scheduler, or its accounting, did not say)")
    from hpcrun.operate.submission.finalize import Finalizer, in_flight_elsewhere
    from hpcrun.operate.tracking.track import poll_store

    def refresh() -> None:
        poll_store(plan_dir, manifest, store)

    finalizer = Finalizer(plan_dir, store, manifest, campaign, refresh=refresh)
    refused = finalizer.again() if again else None
    if refused is not None:
        return refused
    room = None if report.queue is None else report.queue[1] - report.queue[0] - report.submitted_jobs
    elsewhere = in_flight_elsewhere(manifest, store, campaign)
    if elsewhere:   # a dependency cannot reach another cluster's jobs: wait for them to end
        return FinalizeAction("waiting", f"plan jobs are still in flight on {elsewhere}; the finalize job (on the "
                                         "first cluster) goes out once they have ended")
    return finalizer.step(report, room)


def submit(plan_dir: Union[str, Path], *, db: Optional[str] = None, dry_run: bool = False,
           limit: Optional[int] = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
           on_batch: Optional[Callable[[Batch], None]] = None,
           on_wait: Optional[Callable[[str], None]] = None, finalize_again: bool = False) -> SubmitReport:
    """Submit every plan job that is neither done nor in flight (at most ``limit`` and the queue's room),
    then the campaign's finalize job once nothing is left pending; ``finalize_again`` opens one more
    finalize round after the last one ended (for work retried after it)."""
    plan_dir = Path(os.path.abspath(plan_dir))
    manifest = read_manifest(plan_dir)
    throttle = throttle_of(manifest)
    if dry_run and not has_store(plan_dir, db):
        # nothing recorded yet: everything is outstanding, and a dry run creates no store
        budget, queue = queue_budget(manifest, limit)
        batches, left = plan_batches(scripts_of(manifest), [j["index"] for j in manifest.jobs], budget, throttle)
        from hpcrun.operate.submission.finalize import dry_run_action
        return SubmitReport(manifest.campaign, str(plan_dir / "state.db"), batches, left_pending=left,
                            queue=queue, dry_run=True, finalize=dry_run_action(manifest, None, None, left))
    with open_plan_store(plan_dir, db) as store:
        return submit_store(plan_dir, manifest, store, dry_run=dry_run, limit=limit, lock_timeout=lock_timeout,
                            on_batch=on_batch, on_wait=on_wait, finalize_again=finalize_again)


def submit_store(plan_dir: Path, manifest: Manifest, store: StateStore, *, dry_run: bool = False,
                 limit: Optional[int] = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 on_batch: Optional[Callable[[Batch], None]] = None,
                 on_wait: Optional[Callable[[str], None]] = None, finalize_again: bool = False,
                 with_finalize: bool = True, spent: Optional[Dict[Optional[str], Dict[str, int]]] = None
                 ) -> SubmitReport:
    """``submit`` on a plan directory already open (retry and run reuse its manifest and store);
    ``with_finalize`` False leaves the finalize job for a later call (the supervisor sends it once
    every plan job has settled, retries included); ``spent``: clusters whose jobs the last poll saw
    held by a spent allocation (reason -> jobs), which get nothing new."""
    throttle = throttle_of(manifest)
    campaign = register(store, manifest)
    report = SubmitReport(campaign.name, store.location, dry_run=dry_run)
    if dry_run:
        budget, report.queue = queue_budget(manifest, limit)
        report.batches, report.left_pending = plan_batches(
            scripts_of(manifest), store.pending_jobs(campaign.id), budget, throttle)
        from hpcrun.operate.submission.finalize import dry_run_action
        report.finalize = dry_run_action(manifest, store, campaign, report.left_pending)
        return report
    with submit_lock(store.engine, store.location, campaign.name, lock_timeout, on_wait), \
            store.leased(campaign.id, "submit"):
        submitter = Submitter(plan_dir, store, manifest, campaign)
        try:
            report.recovered, report.released = submitter.reconcile()
        except Unreachable:
            if len(submitter.clusters) < 2:
                raise
            # a claim's job may sit on the cluster that does not answer: settled once it does, never guessed
            submitter.unsettled = _claimed_jobs(store, campaign)
        held, spent = store.paused(campaign.id), spent or {}
        report.paused = held.text() if held else None
        report.spent = spent_words(spent[submitter.cluster.name]) if (
            len(submitter.clusters) < 2 and spent.get(submitter.cluster.name)) else None
        if report.paused or report.spent:   # an operator's pause, a spent allocation: settle, submit nothing new
            report.left_pending = len(store.pending_jobs(campaign.id)) + submitter.unsettled
            return report
        try:   # what went out is audited however the round ends
            if len(submitter.clusters) > 1:
                _spread(submitter, limit, report, on_batch, spent)
            else:
                budget, report.queue = queue_budget(manifest, limit)
                pending = store.pending_jobs(campaign.id)
                adjustments = prefer_nodes(manifest, store, campaign.id, pending,
                                           store.pending_adjustments(campaign.id))
                batches, report.left_pending = plan_retry_batches(submitter.scripts, pending, adjustments, budget,
                                                                  throttle)
                for group in claim_groups(batches):
                    try:
                        done = submitter.submit_group(group)
                    except BaseException:   # what the group sent before it raised is recorded, so reported too
                        _reported(submitter.sent, None, report, on_batch)
                        raise
                    _reported(done, None, report, on_batch)
                report.left_pending += submitter.returned
            report.left_pending += submitter.unsettled
            if with_finalize:
                report.finalize = _finalize_step(plan_dir, store, manifest, campaign, report, finalize_again)
        finally:
            _audit(store, campaign, report)
    return report


def _audit(store: StateStore, campaign: Campaign, report: SubmitReport) -> None:
    if report.batches:
        ids = ", ".join(b.job_id or "?" for b in report.batches[:20]) + (" ..." if len(report.batches) > 20 else "")
        store.audit(campaign.id, "submit", f"submitted {report.submitted_jobs} job(s) in "
                    f"{len(report.batches)} submission(s): {ids}")


def _spread(submitter: Submitter, limit: Optional[int], report: SubmitReport,
            on_batch: Optional[Callable[[Batch], None]], spent: Dict[Optional[str], Dict[str, int]]) -> None:
    """A campaign on several clusters: ask each one, place the pending jobs, submit each cluster's share."""
    store, campaign = submitter.store, submitter.campaign
    pending = sorted(store.pending_jobs(campaign.id))
    active = store.active_submissions(campaign.id)
    in_flight = collections.Counter(a.cluster for a in active)
    waiting = collections.Counter(a.cluster for a in active if a.last_state in (None, "PENDING"))
    walltime = submitter.manifest.walltime_seconds
    seats = [survey(cl, in_flight[cl.name], waiting[cl.name], walltime, spent=spent.get(cl.name))
             for cl in submitter.clusters]
    mark_slow(seats, store, campaign.id, active, submitter.manifest.move_pending_after_s)
    todo = pending if limit is None else pending[:limit]
    left = place(todo, seats)
    report.left_pending = len(pending) - len(todo) + len(left)
    adjustments = store.pending_adjustments(campaign.id)
    last = store.last_clusters(campaign.id) if adjustments else {}
    throttle = throttle_of(submitter.manifest)
    for seat in seats:
        if seat.given:
            own = {j: on_cluster(adjustments[j], last.get(j), seat.cluster.name)
                   for j in seat.given if j in adjustments}
            sub = submitter.on(seat.cluster)
            batches, _ = plan_retry_batches(sub.scripts, seat.given, own, None, throttle)
            try:
                for group in claim_groups(batches):
                    _reported(sub.submit_group(group), seat.cluster.name, report, on_batch)
                report.left_pending += sub.returned
            except (Unreachable, SubmitUncertain) as exc:
                # it went away between the survey and now (the claim was released), or a submission timed out and its
                # job was not found (the claim waits for the next settle): the other clusters still get theirs
                _reported(sub.sent, seat.cluster.name, report, on_batch)   # what its group sent before (recorded)
                if isinstance(exc, Unreachable):
                    seat.state = DOWN
                seat.detail = exc.words()
                report.left_pending += len(seat.given) - sum(b.tasks for b in report.batches
                                                             if b.cluster == seat.cluster.name)
        store.record_cluster_health(campaign.id, seat.cluster.name, seat.state, seat.detail)
        report.clusters[seat.cluster.label] = {"state": seat.state, "detail": seat.detail, "room": seat.room,
                                               "pending_there": seat.pending, "placed": len(seat.given)}


def _reported(batches: Sequence[Batch], cluster: Optional[str], report: SubmitReport,
              on_batch: Optional[Callable[[Batch], None]]) -> None:
    for done in batches:
        if cluster is not None:   # a campaign on several clusters: where each went
            done.cluster = cluster
        report.batches.append(done)
        if on_batch:
            on_batch(done)


def follow(plan_dir: Union[str, Path], *, interval: Optional[float] = None, db: Optional[str] = None,
           lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
           on_batch: Optional[Callable[[Batch], None]] = None,
           on_round: Optional[Callable[[SubmitReport], None]] = None,
           finalize_again: bool = False,
           on_outage: Optional[Callable[[SchedulerError], None]] = None) -> List[SubmitReport]:
    """Keep submitting as the queue drains until no outstanding work is left to submit (every
    ``interval`` seconds: one minute by default, never below the site's minimum). A controller that does not
    answer, or a submission that timed out, after the first round is waited out (``on_outage`` told), round after
    round: a restart of the controller does not end it. In the first round it is an error to show at once."""
    pause = poll_interval(read_manifest(Path(os.path.abspath(plan_dir)), jobs=False), interval)
    reports: List[SubmitReport] = []
    while True:
        try:
            report = submit(plan_dir, db=db, lock_timeout=lock_timeout, on_batch=on_batch,
                            finalize_again=finalize_again and not reports)
        except (Unreachable, SubmitUncertain) as exc:
            if not reports:   # no Slurm here, a wrong cluster name: not an outage to wait for
                raise
            if on_outage:
                on_outage(exc)
            time.sleep(pause)
            continue
        reports.append(report)
        if on_round:
            on_round(report)
        if report.left_pending == 0 and not (report.finalize and report.finalize.action == "waiting"):
            return reports
        time.sleep(pause)
