"""Array mode near its end: the last jobs' own ends seen between two polls, so the next poll comes at once.

A round polls the scheduler once a minute. A job writes ``run/<job>/<id>/exit_code`` as its last act, so once
a campaign has few plan jobs open (WATCH_MAX), the supervisor looks for those files while it pauses: one
listing of each open job's run directory, at most PER_S jobs a second (a listing is a metadata-server call).
Once every open job wrote one since its submission, the pause ends and the round asks the scheduler, which
stays the authority: a file is only a reason to ask sooner. While the accounting lags behind the files (the
round still sees a job running), QUICK_ROUNDS more pauses are cut short the same way, then the polls keep
their interval. No scheduler RPC is made here, and nothing is written.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Tuple

WATCH_MAX = 64      # plan jobs open at most for their files to be looked at
PER_S = 16          # job directories listed per second at most
QUICK_ROUNDS = 5    # rounds brought forward for one set of open jobs, at most
SKEW_S = 30.0       # a node's clock may be behind the login node's: an end this much before its submission counts


class Watch:
    """The open jobs of a campaign of the scheduler's jobs, set after each round, looked for between rounds."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.jobs: Dict[str, float] = {}    # plan job name -> its submission's epoch
        self.ended: set = set()
        self.next_at = 0.0
        self.quick, self.turn = 0, 0
        self.last: Optional[Tuple[str, ...]] = None

    def after_round(self, store: Any, campaign_id: int, open_jobs: int, late: bool) -> None:
        """The jobs to watch until the next round: none for late binding (its queue is read instead), none while
        more than WATCH_MAX are open."""
        self.jobs, self.ended, self.next_at = {}, set(), 0.0
        if late or not 0 < open_jobs <= WATCH_MAX:
            self.quick, self.last = 0, None
            return
        for sub in store.active_submissions(campaign_id):
            if sub.job_name:
                self.jobs[sub.job_name] = sub.submitted_at.timestamp()
        names = tuple(sorted(self.jobs))
        if names != self.last:   # other jobs open than when the rounds were last brought forward
            self.quick, self.last = 0, names

    def read(self) -> bool:
        """True once every watched job wrote its exit code since its submission (and rounds may still be brought
        forward): the next round should come now."""
        if not self.jobs or self.quick >= QUICK_ROUNDS or time.monotonic() < self.next_at:
            return False
        left = [name for name in self.jobs if name not in self.ended]
        self.turn = (self.turn + PER_S) % len(left) if left else 0   # each look the next PER_S, round the list
        for name in (left[self.turn:] + left[:self.turn])[:PER_S]:
            if _ended_since(os.path.join(self.run_dir, name), self.jobs[name] - SKEW_S):
                self.ended.add(name)
        self.next_at = time.monotonic() + max(1.0, len(left) / PER_S)
        if len(self.ended) < len(self.jobs):
            return False
        self.quick += 1
        return True


def _ended_since(job_dir: str, since: float) -> bool:
    """Whether a run of the job wrote its exit code after ``since`` (an earlier attempt's is older)."""
    try:
        runs: List[str] = os.listdir(job_dir)
    except OSError:
        return False
    for run in runs:
        try:
            if os.stat(os.path.join(job_dir, run, "exit_code")).st_mtime >= since:
                return True
        except OSError:
            continue
    return False
