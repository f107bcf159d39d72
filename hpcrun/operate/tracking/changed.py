"""A poll of a late-bound campaign: what changed in the queue since the last poll recorded it.

At 10^6 waiting inputs a poll that reads every task in flight costs seconds and hundreds of MB a round.
The queue says what changed (hpcrun/backends/late/changes.py): new claims, new commits, new cancels, and
the running tasks no longer claimed. The store is asked only for those tasks' submissions (the running
ones, and the others by their ids), so a round costs what changed, not what the campaign holds. Waiting
tasks keep the state the store knows (a late-bound task is never lost: it is always in one place).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

from hpcrun.backends.late.pilots import Pilots
from hpcrun.backends.scheduler.base import TERMINAL, AccountingUnreachable, normalize_state
from hpcrun.operate.outputs import provenance
from hpcrun.operate.outputs.folding import Folder, fold_completed
from hpcrun.store.records import ActiveSubmission, NewStateChange
from hpcrun.store.store import StateStore

ENDED = frozenset(TERMINAL) | {"LOST"}
Poller = Any   # hpcrun.operate.tracking.track.Poller (which imports this module)
Observed = Tuple[List[NewStateChange], List[Tuple[ActiveSubmission, str]], float, Callable[[bool], bool]]


def follows_changes(poller: Poller) -> bool:
    """A late-bound campaign (its one scheduler is the pilots' queue): polled by what changed."""
    return len(poller.clusters) == 1 and isinstance(poller.sched, Pilots)


def observe_changes(poller: Poller, store: StateStore, campaign_id: int,
                    extra: Sequence[Tuple[str, dt.datetime]]) -> Observed:
    """The changes to record and the jobs that ended (as ``Poller.observe``), the seconds spent asking,
    and what moves the queue's cursor on once they are recorded (and, in the supervisor's round, folds what
    was recorded out of ``done/``: ledger.py)."""
    sched = poller.sched
    assert isinstance(sched, Pilots)
    t0 = time.monotonic()
    by_task = {a.slurm_id: a for a in store.active_submissions(campaign_id, ("running",))}
    got = sched.changes(by_task.keys(), store.location)
    missing = [t for t in got.records if t not in by_task]
    keys = [(qid, int(i)) for qid, _, i in (t.rpartition("_") for t in missing) if i.isdigit()]
    by_task.update((a.slurm_id, a) for a in store.submissions_of(campaign_id, keys))
    _finalize_records(poller, extra)
    acct_s = time.monotonic() - t0
    now = dt.datetime.now(dt.timezone.utc)
    unknown: Set[str] = set()
    changes: List[NewStateChange] = []
    ended: List[Tuple[ActiveSubmission, str]] = []
    for task, rec in got.records.items():
        a = by_task.get(task)
        if a is None:   # its submission is not recorded yet: read again at the next poll
            unknown.add(task)
            continue
        if a.last_state in ENDED and rec.state not in ENDED:   # a commit's token still listed: the end stands
            continue
        seen = poller._from_record(a, rec, now)
        if seen is None:
            if normalize_state(rec.state) != a.last_state:   # not complete yet (an end without its times)
                unknown.add(task)
            continue
        changes.append(seen[0])
        if seen[1] is not None:
            ended.append((a, seen[1]))
    held = sched.held()
    if held and sched.budget_reason(held):   # a spent allocation holds every waiting task
        poller.spent.setdefault(poller.first.name, {})[held] = sched.q.waiting_count()
    return changes, ended, acct_s, lambda fold: got.advance(unknown, fold)


def _finalize_records(poller: Poller, extra: Sequence[Tuple[str, dt.datetime]]) -> None:
    """The finalize job (a job of the real scheduler) asked of its accounting, as a poll of arrays does."""
    if not extra:
        return
    sched = poller.sched
    try:
        poller.records = sched.records([j for j, _ in extra], sched.since_text(min(t for _, t in extra)))
        poller.answered.add((poller.first.name, AccountingUnreachable.daemon))
    except AccountingUnreachable as exc:
        poller.down[(poller.first.name, exc.daemon)] = exc.words()
        poller.catching_up.add(poller.first.name or None)


def record_changes(poller: Poller, store: StateStore, campaign_id: int,
                   folder: Optional[Folder] = None) -> Tuple[int, int, bool]:
    """Between two polls of the scheduler: what the queue says changed, recorded (no scheduler command, a
    few metadata operations when nothing changed). A supervisor does this every few seconds, so that each
    read records a few seconds' worth of ends rather than a poll interval's. How many changes, how many of
    them ends, and whether more lines wait (the read was full)."""
    changes, ended, _s, advance = observe_changes(poller, store, campaign_id, ())
    recorded = set(store.record_transitions(campaign_id, changes))
    ended = [(a, raw) for a, raw in ended if a.id in recorded]
    provenance.record_outcomes(store, campaign_id, poller.job_dir, poller.qa_outcomes(ended), ended)
    fold_completed(folder, poller, changes, ended)
    return len(recorded), len(ended), advance(False)   # the next round folds what this recorded
