"""A pending job cancelled to be placed again (a move to another cluster, or off a node that caches its inputs) is
released only once the scheduler says it was cancelled: one that started and ended meanwhile ran, and is left to
the tracker (released, its inputs would run twice)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Dict, List

from hpcrun.backends.scheduler.base import Queued, Record
from hpcrun.operate.submission.moves import cancel_and_release
from hpcrun.store.records import ActiveSubmission


class _Sched:
    """What the queue (``squeue --states=all``) and the accounting say once the cancel was sent."""

    def __init__(self, queue: Dict[str, str], acct: Dict[str, str]):
        self.q, self.acct, self.cancelled = queue, acct, []   # type: ignore[var-annotated]

    def cancel(self, ids: List[str]) -> None:
        self.cancelled += ids

    def queue(self, job_ids=None, ended=False, **_kw) -> List[Queued]:
        return [Queued(i, i, "c.tag", s, "None") for i, s in self.q.items() if i in (job_ids or self.q)]

    def records(self, ids, since, **_kw) -> Dict[str, Record]:
        return {i: Record(i, i, "c.tag", s, "0:0", "", 1.0, 1.0, 1, "n1", None, None)
                for i, s in self.acct.items() if i in ids}

    def since_text(self, moment) -> str:
        return "now-1hours"


def test_a_job_that_ended_by_itself_between_the_poll_and_the_cancel_is_not_released():
    then = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    subs = [ActiveSubmission(n, str(100 + n), None, "PENDING", then, n) for n in (1, 2, 3, 4)]
    sched = _Sched({"101": "COMPLETED", "102": "CANCELLED", "103": "FAILED", "104": "CANCELLED"},
                   {"101": "COMPLETED", "102": "CANCELLED", "103": "FAILED"})   # 104: not accounted yet
    cluster = SimpleNamespace(sched=sched, accounting=True, label="alpha", name="alpha")
    released: List[int] = []
    store = SimpleNamespace(record_move=lambda _campaign, sub_id, _why: released.append(sub_id) or True)
    moves = cancel_and_release(store, SimpleNamespace(id=1), cluster, subs, dt.datetime.now(dt.timezone.utc),
                               lambda _s: None, lambda _w: "moved")
    assert sched.cancelled == ["101", "102", "103", "104"]
    assert sorted(released) == [2, 4] and sorted(m.job_id for m in moves) == ["102", "104"], released
