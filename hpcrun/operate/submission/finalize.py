"""The campaign's finalize job: one job after every plan job, chained by a dependency.

``hpcrun submit`` sends it once nothing of the plan is left pending (every plan job has been
submitted), depending on (after any; after ok for ``finalize.after: ok``) the plan jobs that
are **still queued or running according to the queue**: a scheduler refuses, or never
satisfies, a dependency on a job that already ended and left its memory. With none left it goes
out without a dependency.

Crash safety follows the claim/tag/record pattern of plan jobs, with a fixed tag: the job name
``<campaign>.finalize``. A round row is written in the store *before* the submission; a submitter
killed between submitting and recording leaves a row without a job id, and the next submit (under
the same submit lock) looks for that name in the queue and the accounting (since the row was
written) before it submits anything, so the finalize job is never duplicated. Job ids of earlier rounds are
excluded from that search, so ``--finalize-again`` (a new round after retried work) reuses the name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from hpcrun.backends.scheduler.base import (
    INPUT_STATE_OF,
    TERMINAL,
    Scheduler,
    SchedulerError,
    SubmitUncertain,
    normalize_state,
)
from hpcrun.operate.manifest import FinalizeEntry, Manifest
from hpcrun.operate.plandir import clusters_of, scheduler_of
from hpcrun.operate.results import FinalizeAction, SubmitReport
from hpcrun.store.records import Campaign, FinalizeRecord
from hpcrun.store.store import StateStore
from hpcrun.units import format_duration

# a command-line argument longer than this cannot be passed at all (Linux MAX_ARG_STRLEN is 128 KiB)
MAX_DEPENDENCY_CHARS = 100_000
_QUEUE_CHUNK = 5000


def _numeric(job_id: str) -> int:
    return int(job_id) if job_id.isdigit() else 0


def queued_job_ids(sched: Scheduler, candidates: Sequence[str]) -> List[str]:
    """The ids among ``candidates`` (plain or array job ids) that the queue shows queued or running."""
    wanted = set(candidates)
    live = set()
    ordered = sorted(wanted, key=_numeric)
    for start in range(0, len(ordered), _QUEUE_CHUNK):
        for row in sched.queue(job_ids=ordered[start:start + _QUEUE_CHUNK], expand=False):
            owner = row.job_id.split("_", 1)[0]
            if owner in wanted and normalize_state(row.state) not in TERMINAL:
                live.add(owner)
    return sorted(live, key=_numeric)


def find_by_name(sched: Scheduler, tag: str, since: Any, exclude: Sequence[str], accounting: bool) -> Optional[str]:
    """The job named ``tag`` that the scheduler knows (queue, recently ended, accounting since ``since``),
    other than the ``exclude``d ids of earlier rounds; the lowest id if several."""
    found = set()
    for q in sched.queue(names=[tag], expand=False, ended=True):
        if q.name == tag:
            found.add(q.job_id.split("_", 1)[0])
    if accounting:
        for rec in sched.records((), sched.since_text(since), names=[tag]).values():
            if rec.name == tag:
                found.add(rec.job_id.split("_", 1)[0])
    found -= set(exclude)
    return min(found, key=_numeric) if found else None


class Finalizer:
    """Decides about, settles and submits the finalize job of one plan (under the submit lock)."""

    def __init__(self, plan_dir: Path, store: StateStore, manifest: Manifest, campaign: Campaign,
                 refresh: Optional[Callable[[], None]] = None):
        self.plan_dir = plan_dir
        self.store = store
        self.campaign = campaign
        assert manifest.finalize is not None, "a finalizer for a plan without a finalize job"
        self.info: FinalizeEntry = manifest.finalize
        self.accounting = manifest.submit.accounting
        self.sched = scheduler_of(manifest)
        self.refresh = refresh  # a status poll: brings failed jobs into the store before `after: ok` decides

    @property
    def tag(self) -> str:
        return str(self.info["job_name"])

    @property
    def after(self) -> str:
        return str(self.info.get("after") or "any")

    def _known(self, rounds: Sequence[FinalizeRecord]) -> List[str]:
        return [r.job_id for r in rounds if r.job_id]

    def again(self) -> Optional[FinalizeAction]:
        """--finalize-again: open one more round once the last one's job has left the queue."""
        rounds = self.store.finalize_rounds(self.campaign.id)
        last = rounds[-1] if rounds else None
        if last is None or last.job_id is None:
            return None  # the first (or a requested) round is still to go out: nothing to add
        queued = queued_job_ids(self.sched, [last.job_id])
        if queued:
            return FinalizeAction("refused", (
                f"finalize job {last.job_id} (round {last.round}) is still queued or running; "
                "--finalize-again opens a new round only after it has ended "
                f"(or `{self.sched.cancel_hint(last.job_id)}` it first)"),
                last.job_id, last.round)
        self.store.add_finalize_round(self.campaign.id, self.tag, self.after)
        return None

    def step(self, report: SubmitReport, room: Optional[int]) -> FinalizeAction:
        """Submit the finalize job if every plan job has been submitted and it is not out yet."""
        rounds = self.store.finalize_rounds(self.campaign.id)
        last = rounds[-1] if rounds else None
        if last is not None and last.job_id is not None:
            text = f"finalize job {last.job_id} (round {last.round}) was submitted earlier"
            if report.batches:
                text += ("; work was submitted after it: once it has ended, `hpcrun submit --finalize-again` "
                         "sends one more finalize job after the new work")
            return FinalizeAction("earlier", text, last.job_id, last.round, last.dependency)
        pending = len(self.store.pending_jobs(self.campaign.id))
        if pending:
            return FinalizeAction("waiting", (
                f"the finalize job waits until every plan job has been submitted ({pending} still pending)"))
        if last is not None:
            found = find_by_name(self.sched, self.tag, last.created_at, self._known(rounds), self.accounting)
            if found:
                self.store.record_finalize_job(last.id, found, self.info["sha256"], None)
                return FinalizeAction("recovered", (
                    f"recovered finalize job {found} ({self.tag}) submitted by a run that stopped before "
                    "recording it"), found, last.round)
        if room is not None and room <= 0:
            return FinalizeAction("waiting", "the finalize job waits for room in the queue (max_queued_jobs)")
        if self.after == "ok":
            if self.refresh is not None:
                self.refresh()
            counts = self.store.job_counts(self.campaign.id)
            bad = counts.get("failed", 0) + counts.get("parked", 0)
            if bad:
                return FinalizeAction("skipped", (
                    f"finalize.after is 'ok' but {bad} plan job(s) failed or are parked: not submitted. "
                    "`hpcrun retry` them; the finalize job goes out once none is left failed"))
        if last is None:
            last = self.store.add_finalize_round(self.campaign.id, self.tag, self.after)
        return self._submit(last, rounds)

    def _dependency(self) -> Optional[str]:
        ids = queued_job_ids(self.sched, self.store.in_flight_job_ids(self.campaign.id, self.sched.cluster))
        return self.sched.dependency(self.after, ids)

    def _submit(self, row: FinalizeRecord, rounds: Sequence[FinalizeRecord]) -> FinalizeAction:
        script = self.plan_dir / self.info["path"]
        for attempt in range(2):
            dependency = self._dependency()
            assert dependency is not None
            if len(dependency) > MAX_DEPENDENCY_CHARS:
                return FinalizeAction("waiting", (
                    f"too many plan jobs are still queued for one dependency ({dependency.count(':')} job ids); "
                    "the finalize job goes out from a later submit, when fewer are queued"), round=row.round)
            try:
                job_id = self.sched.submit(script, name=self.tag, dependency=dependency)
            except SubmitUncertain:
                found = find_by_name(self.sched, self.tag, row.created_at, self._known(rounds), self.accounting)
                if not found:
                    raise
                job_id = found
            except SchedulerError as exc:
                # a job named in the dependency ended (and was purged) between the queue query and the
                # submission: look again
                if attempt == 0 and dependency and "dependency" in str(exc).lower():
                    continue
                self.store.note_finalize(row.id, f"submission refused: {exc}")
                raise
            self.store.record_finalize_job(row.id, job_id, self.info["sha256"], dependency)
            after = f"after {dependency}" if dependency else "without a dependency (no plan job is queued any more)"
            return FinalizeAction("submitted", f"submitted finalize job {job_id} ({self.tag}) {after}", job_id,
                                  row.round, dependency)
        raise AssertionError("unreachable")  # pragma: no cover


def dry_run_action(manifest: Manifest, store: Optional[StateStore], campaign: Optional[Campaign],
                   left_pending: int) -> Optional[FinalizeAction]:
    """What a submit would do about the finalize job (no Slurm query, no change)."""
    if not manifest.finalize:
        return None
    if store is not None and campaign is not None:
        rounds = store.finalize_rounds(campaign.id)
        if rounds and rounds[-1].job_id:
            return FinalizeAction("earlier", f"finalize job {rounds[-1].job_id} (round {rounds[-1].round}) was "
                                             "submitted earlier", rounds[-1].job_id, rounds[-1].round)
    if left_pending:
        return FinalizeAction("waiting", (
            f"the finalize job waits until every plan job has been submitted ({left_pending} would be left pending)"))
    return FinalizeAction("would-submit", (
        f"would submit the finalize job ({manifest.finalize['path']}) with --dependency=after"
        f"{manifest.finalize.get('after', 'any')} on the plan jobs still queued"))


def finalize_summary(manifest: Manifest, store: Optional[StateStore],
                     campaign_id: Optional[int]) -> Optional[Dict[str, Any]]:
    """The finalize job as status and report show it (the latest round), or None without one in the spec."""
    info = manifest.finalize
    if not info:
        return None
    rounds = store.finalize_rounds(campaign_id) if store is not None and campaign_id is not None else []
    if not rounds or rounds[-1].job_id is None:
        return {"round": len(rounds) or 1, "job_id": "", "status": "pending", "state": "", "exit_code": "",
                "elapsed": "", "after": info.get("after", "any"), "dependency": "",
                "reason": (rounds[-1].reason if rounds else None) or
                "not submitted yet: goes out once every plan job has been submitted"}
    last = rounds[-1]
    state = last.last_state or ""
    status = INPUT_STATE_OF.get(state, "failed" if state in TERMINAL else "submitted")
    return {"round": last.round, "job_id": last.job_id, "status": status, "state": state,
            "exit_code": "" if last.exit_code is None else str(last.exit_code), "elapsed": (
                "" if last.elapsed_s is None else format_duration(int(last.elapsed_s))),
            "after": last.after, "dependency": last.dependency or "", "reason": last.reason or ""}


def in_flight_elsewhere(manifest: Manifest, store: StateStore, campaign: Campaign) -> str:
    """The other clusters (not the first) with plan jobs queued or running, in words ('' for none): a dependency
    cannot reach their jobs."""
    clusters = clusters_of(manifest)
    if len(clusters) < 2:
        return ""
    counts = store.cluster_counts(campaign.id)
    busy = [c.label for c in clusters[1:] if any(counts.get(c.name, {}).get(s, 0) for s in ("submitted", "running"))]
    return ", ".join(f"cluster {b}" for b in busy)
