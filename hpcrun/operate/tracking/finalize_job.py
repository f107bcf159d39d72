"""The campaign's finalize job observed at each poll: from the poll's accounting answer, the queue for a pending
reason, or its own record where the site has no accounting."""

from __future__ import annotations

import datetime as dt
from typing import Optional

from hpcrun.backends.scheduler.base import TERMINAL, Unreachable, normalize_state, parse_exit_code
from hpcrun.operate.tracking import track
from hpcrun.operate.tracking.track import _WAIT_REASONS, Poller, _read
from hpcrun.store.records import FinalizeRecord
from hpcrun.store.store import StateStore


def finalize_in_flight(store: StateStore, campaign_id: int) -> Optional[FinalizeRecord]:
    rounds = store.finalize_rounds(campaign_id)
    last = rounds[-1] if rounds else None
    if last is None or last.job_id is None or last.submitted_at is None \
            or last.last_state in TERMINAL or last.last_state == "LOST":
        return None
    return last


def observe_finalize(poller: Poller, store: StateStore, row: FinalizeRecord) -> None:
    """Record the finalize job's state from this poll's accounting answer (the queue for a pending reason)."""
    assert row.job_id is not None and row.submitted_at is not None
    now = dt.datetime.now(dt.timezone.utc)
    rec = poller.records.get(row.job_id)
    queued = None
    waits = (poller.first.name or None) in poller.catching_up
    if rec is None or rec.state == "PENDING":
        try:
            queued = next((q for q in poller.sched.queue(job_ids=[row.job_id], expand=False, ended=True)
                           if q.job_id == row.job_id), None)
        except Unreachable:
            return   # the controller does not answer: asked again at the next poll
    if waits and rec is None and (queued is None or normalize_state(queued.state) in TERMINAL):
        return   # accounting is down or catching up: its record will say how it ended
    own = _read(f"{poller.run_dir}/finalize/{row.job_id}/reason")
    if rec is not None and not (rec.state == "PENDING" and queued is not None):
        code, _sig = parse_exit_code(rec.exit_code)
        if rec.state == "PENDING":
            reason = rec.reason
        elif rec.state in TERMINAL and rec.state != "COMPLETED":
            reason = own or ("" if rec.reason.startswith(_WAIT_REASONS) else rec.reason)
        else:
            reason = ""
        parse = poller.sched.parse_time
        store.record_finalize_state(row.id, rec.state, exit_code=code, elapsed_s=rec.elapsed_s,
                                    started_at=parse(rec.start), ended_at=parse(rec.end),
                                    reason=reason or None, observed_at=now)
    elif queued is not None:
        state = normalize_state(queued.state)
        if state in TERMINAL and poller.accounting and (now - row.submitted_at).total_seconds() <= track.LOST_AFTER_S:
            return  # ended a moment ago: wait for accounting's record
        store.record_finalize_state(row.id, state, reason=(own if state in TERMINAL else "")
                                    or queued.reason.strip("()") or None, observed_at=now)
    elif not poller.accounting:
        store.record_finalize_state(row.id, "FAILED" if own else "COMPLETED",
                                    reason=own or "left the queue (no accounting)", observed_at=now)
    elif (now - row.submitted_at).total_seconds() > track.LOST_AFTER_S and not track.record_may_come(
            poller.manifest, row.last_state, row.last_observed_at, now):
        store.record_finalize_state(row.id, "LOST", reason=(
            "the finalize job left the queue and accounting has no record of it"), observed_at=now)
