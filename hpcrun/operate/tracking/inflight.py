"""The jobs in flight as the previous poll left them, kept by a process that polls again (the
supervisor's rounds, ``status --wait``): at 10^5 jobs in flight, re-reading them from the store is
most of what a poll that changes nothing costs.

The list is kept by an ``InFlight`` that the polling process holds (not by this module), and only
while the store's fingerprint of it (jobs in flight, the newest submission and observation) is the
one the list was read or updated with, and read afresh at least every ``REFRESH_POLLS`` polls, so
another process's submissions or observations are never missed for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from hpcrun.backends.scheduler.base import TERMINAL, normalize_state
from hpcrun.operate.tracking.lookup import Index, index_of, keep_index
from hpcrun.store.records import ActiveSubmission, NewStateChange
from hpcrun.store.store import StateStore

REFRESH_POLLS = 10


@dataclass
class _Kept:
    fingerprint: Tuple[int, int, int, int]
    active: List[ActiveSubmission]
    polls: int = 0


class InFlight:
    """What this process's polls keep between them: the supervisor and ``status --wait`` hold one and pass it
    to each poll; a poll given none reads the list from the store."""

    def __init__(self) -> None:
        self.kept: Dict[Tuple[str, int], _Kept] = {}

    def read(self, store: StateStore, campaign_id: int) -> List[ActiveSubmission]:
        """The submissions in flight: the kept list when the store says nothing changed since, else read."""
        key = (store.location, campaign_id)
        kept = self.kept.get(key)
        fingerprint = store.active_fingerprint(campaign_id)
        if kept is not None and kept.fingerprint == fingerprint and kept.polls < REFRESH_POLLS:
            kept.polls += 1
            return kept.active
        active = store.active_submissions(campaign_id)
        self.kept[key] = _Kept(fingerprint, active)
        return active

    def recorded(self, store: StateStore, campaign_id: int, active: Sequence[ActiveSubmission],
                 changes: Sequence[NewStateChange], recorded: int) -> None:
        """Bring the kept list up to date with what this poll recorded (ended jobs leave it, others take
        their new state); dropped when the store did not take every change as offered (another writer
        got there first, an observation of an older attempt)."""
        key = (store.location, campaign_id)
        kept = self.kept.get(key)
        if kept is None or kept.active is not active or not changes:
            return
        if recorded != len(changes):
            del self.kept[key]
            return
        new_state = {c.submission_id: normalize_state(c.slurm_state) for c in changes}
        if (len(new_state) == len(active) and all(s in TERMINAL or s == "LOST" for s in set(new_state.values()))
                and new_state.keys() == {a.id for a in active}):
            self.kept[key] = _Kept(store.active_fingerprint(campaign_id), [], kept.polls)   # every job ended
            keep_index(self.kept[key].active, Index([]))
            return
        self.kept[key] = _Kept(store.active_fingerprint(campaign_id), _updated(active, new_state), kept.polls)


def _updated(active: Sequence[ActiveSubmission], new_state: Dict[int, str]) -> List[ActiveSubmission]:
    """The kept list after a poll: ended jobs out, the others with the state just recorded; its index kept."""
    index = index_of(active)
    updated, noted = [], []
    for a in active:
        state = new_state.get(a.id)
        if state is None:
            updated.append(a)
        elif state in TERMINAL or state == "LOST":
            index.forget(a)
        else:   # the kept record takes the state just recorded (records are this module's own copies)
            a.last_state = state
            noted.append(a)
            updated.append(a)
    index.note_all(noted)
    index.active = updated
    keep_index(updated, index)   # the next poll's index_of finds it: not built again over the whole list
    return updated
