"""Array mode near its end: the last jobs' own ends seen between two polls, so the next poll comes at once.

A round polls the scheduler once a minute. A job writes ``run/<job>/<id>/exit_code`` as its last act, so once
a campaign has few plan jobs open (WATCH_MAX), the supervisor looks for those files while it pauses: one
listing of a watched job's run directory, at most PER_S jobs a second (a listing is a metadata-server call).
The jobs watched are those submitted, and an exit code counts when it was written at or after the
submission (an earlier attempt's was written before it was resubmitted). Once every watched job wrote one,
the pause ends and the round asks the scheduler, which stays the authority: a file is only a reason to ask
sooner. While the accounting lags behind the files (the round still sees a job running), at most QUICK_ROUNDS
more rounds are brought forward for the same submissions, each twice as long after the last (1, 2, 4 ... s,
never sooner than the site's shortest poll interval); a round brought forward that saw nothing change does
not lengthen the pause. No scheduler RPC is made here, and nothing is written.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

WATCH_MAX = 64      # plan jobs open at most for their files to be looked at
PER_S = 16          # job directories listed per second at most
QUICK_ROUNDS = 5    # rounds brought forward for one set of watched submissions, at most
LOOK_S = 5.0        # a look that takes longer (its filesystem hangs) is left to end on its own: none meanwhile


class Watch:
    """The submitted jobs of a campaign of the scheduler's jobs, set after each round, looked for between rounds."""

    def __init__(self, run_dir: str, min_interval_s: float = 0.0):
        self.run_dir = run_dir
        self.min_interval_s = min_interval_s
        self.jobs: Dict[str, float] = {}    # plan job name -> its submission's epoch
        self.ended: Set[str] = set()
        self.next_at = 0.0
        self.quick, self.turn, self.last_round = 0, 0, 0.0
        self.last: Optional[Tuple[Tuple[str, float], ...]] = None
        self.brought = False   # the round about to come was brought forward
        self.looking: Optional[threading.Thread] = None   # a look that did not end in LOOK_S

    def after_round(self, store: Any, campaign_id: int, open_jobs: int, late: bool) -> None:
        """The jobs to watch until the next round: none for late binding (its queue is read instead), none while
        more than WATCH_MAX are open."""
        self.jobs, self.ended, self.next_at, self.last_round = {}, set(), 0.0, time.monotonic()
        if late or not 0 < open_jobs <= WATCH_MAX:
            self.quick, self.last = 0, None
            return
        for sub in store.active_submissions(campaign_id):
            if sub.job_name:
                self.jobs[sub.job_name] = sub.submitted_at.timestamp()
        watched = tuple(sorted(self.jobs.items()))
        if watched != self.last:   # other submissions open (a retry included) than when rounds were brought forward
            self.quick, self.last = 0, watched

    def read(self) -> bool:
        """True once every watched job wrote its exit code since its submission (and rounds may still be brought
        forward, the last long enough ago): the next round should come now."""
        now = time.monotonic()
        if not self.jobs or self.quick >= QUICK_ROUNDS or now < self.next_at or (
                self.looking is not None and self.looking.is_alive()):
            return False
        left = [name for name in self.jobs if name not in self.ended]
        self.turn = (self.turn + PER_S) % len(left) if left else 0   # each look the next PER_S, round the list
        names = (left[self.turn:] + left[:self.turn])[:PER_S]
        found: List[str] = []
        since = {n: self.jobs[n] for n in names}
        # in a thread of its own: a filesystem that hangs holds the look, never the supervisor (its rounds go on,
        # and tell of a store that hangs with it)
        look = threading.Thread(target=lambda: found.extend(
            n for n in names if _ended_since(os.path.join(self.run_dir, n), since[n])), daemon=True)
        look.start()
        look.join(LOOK_S)
        self.next_at = time.monotonic() + 1.0
        if look.is_alive():
            self.looking = look
            return False
        self.ended.update(found)
        if len(self.ended) < len(self.jobs) or now - self.last_round < max(2.0 ** self.quick, self.min_interval_s):
            return False
        self.quick += 1
        self.brought = True
        return True


def _ended_since(job_dir: str, since: float) -> bool:
    """Whether a run of the job wrote its exit code at or after ``since`` (its submission)."""
    try:
        runs = os.listdir(job_dir)
    except OSError:
        return False
    for run in runs:
        try:
            if os.stat(os.path.join(job_dir, run, "exit_code")).st_mtime >= since:
                return True
        except OSError:
            continue
    return False
