"""Late binding between two rounds: the queue read every second, the end seen at once.

A round polls the scheduler once a minute (the site's interval). A late-bound campaign's results are files in
the queue, which cost no scheduler RPC to read: the supervisor reads them every TICK_S while it pauses, with
the same code as a poll's (``tracking.changed.record_changes``), so a round records a second's ends rather
than a minute's, and the campaign's end is seen within a second of its last result.
"""

from __future__ import annotations

import time
from typing import Any, Dict

from hpcrun.operate.results import IN_FLIGHT
from hpcrun.operate.tracking.track import record_queue

# how often; a read with nothing changed costs a few metadata operations and writes nothing (2 ms at 10^6)
TICK_S = 1.0
# ... and while every input left may be running (no more than the running pilots' slots), or those left would end
# before the next read at the pace the reads saw: the end may come at any moment, so the queue is read this often,
# for at most FAST_FOR_S (a last input of hours is not watched so)
FAST_TICK_S = 0.1
FAST_FOR_S = 120.0


def open_jobs(jobs: Dict[str, int]) -> int:
    """Plan jobs pending or in flight."""
    return jobs["pending"] + sum(jobs[s] for s in IN_FLIGHT)


def tick_s(sup: Any) -> float:
    """How long until the next read: FAST_TICK_S once the end is near, for FAST_FOR_S from then on, whatever the
    rounds meanwhile, until it is not again; TICK_S otherwise. Near: no input left may be waiting for a slot, or
    at the reads' pace (``read``: their ends over a second or more) those left would end before the next read:
    short inputs end hundreds a second, so that many are left a second before the end, however few the slots
    (issue 55)."""
    rest = sup.left - sup.tick_ends
    if not sup.manifest.pilots or rest <= 0:
        return TICK_S
    if rest > max(sup.slots, sup.pace * TICK_S):
        if sup.slots:   # inputs wait for a slot again (not a round that could not count the pilots)
            sup.near_since = None
        return TICK_S
    now = time.monotonic()
    sup.near_since = sup.near_since or now
    return FAST_TICK_S if now - sup.near_since < FAST_FOR_S else TICK_S


def read(sup: Any) -> bool:
    """One read of the queue if TICK_S passed since the last (at once again while a read was full: what piled up
    is caught up a read a second). What it records counts as the next round's changes (``sup.tick_changes``),
    so the polls do not slow down as if nothing happened. A queue that cannot be read now (a filesystem's
    hiccup) is left to the next round. True once what it recorded may have ended the campaign (at least as many
    ends as jobs were open at the last round, and the store holds no input pending or in flight): the next
    round comes at once."""
    if not sup.manifest.pilots or time.monotonic() - sup.ticked < tick_s(sup) - 0.01:
        return False
    start = time.monotonic()
    try:
        recorded, ends, full = record_queue(sup.plan_dir, sup.manifest, sup.store, sup.campaign.id, sup.folder)
    except OSError:
        recorded, ends, full = 0, 0, False
    if sup.pace_since is None:   # the pace: the ends the reads recorded over a second or more (a round's pause
        sup.pace_since, sup.pace_ends = start, 0   # included); a read 0.1 s after another counts into it, alone
    else:                                          # it would make its few ends look like a trickle
        sup.pace_ends += ends
        if start - sup.pace_since >= TICK_S:
            sup.pace = sup.pace_ends / (start - sup.pace_since)
            sup.pace_since, sup.pace_ends = start, 0
    sup.tick_changes += recorded
    sup.tick_ends += ends
    sup.ticked = 0.0 if full else time.monotonic()
    return ends > 0 and sup.tick_ends >= sup.left and not sup.store.any_in(sup.campaign.id, ("pending",) + IN_FLIGHT)
