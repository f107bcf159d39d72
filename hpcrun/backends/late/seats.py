"""Late binding on several clusters: each cluster's pilots (its seat), as one round of care sees them.

No task is bound to a cluster: the pilots of every cluster claim from the one queue. A round asks each
cluster for its own pilots (their ids in the queue carry the cluster's name, since job ids repeat across
clusters) and gives new pilots to the clusters that can start them, by room and share as placement.py gives
jobs. A cluster closes to new pilots while it does not answer, while a maintenance window meets a pilot's
walltime (its pilots then claim only inputs that end before the window), and, with
``site.move_pending_after``, for three times that long after its pilots pended that long (they are
cancelled: the inputs they would have claimed are claimed elsewhere).
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpcrun.backends.late.queue import Queue, _read, _write_new
from hpcrun.backends.scheduler.base import TERMINAL, Maintenance, Record, Scheduler

SLOW_FOR = 3.0   # a cluster whose pilots pended too long gets none for this many times move_pending_after


@dataclass(frozen=True)
class PilotSeat:
    """One cluster the pilots go to (a campaign on one cluster has one seat, unnamed, unprefixed)."""

    cluster: Optional[str]
    script: str
    max_pilots: int
    max_queued: Optional[int] = None
    share: float = 1.0
    prefix: str = ""        # before a pilot's job id in the queue ("beta-" on a campaign's cluster beta)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PilotSeat:
        return cls(d.get("cluster"), str(d["script"]), int(d["max_pilots"]), d.get("max_queued"),
                   float(d.get("share", 1.0)), str(d.get("prefix", "")))

    @property
    def label(self) -> str:
        return self.cluster or "(default)"

    @property
    def cap(self) -> int:
        return min(self.max_pilots, self.max_queued) if self.max_queued else self.max_pilots


@dataclass
class SeatView:
    """One cluster's pilots this round: their records (by the cluster's own ids), and whether it takes more."""

    seat: PilotSeat
    records: Dict[str, Record] = field(default_factory=dict)
    unseen: int = 0                        # submitted lately, not yet in the accounting
    down: str = ""                         # why the cluster did not answer ("": it did)
    window: Optional[Maintenance] = None   # a maintenance window meeting a pilot's walltime from now
    slow_until: float = 0.0                # epoch: its pilots pended too long, none goes there before

    def by_raw(self) -> Dict[str, Record]:
        """Its pilots by their name in the queue."""
        return {self.seat.prefix + r.raw_id: r for r in self.records.values() if r.raw_id}

    def active(self) -> int:
        return sum(1 for r in self.records.values() if r.state not in TERMINAL) + self.unseen

    def pending(self) -> List[Record]:
        return [r for r in self.records.values() if r.state == "PENDING"]

    def ended(self) -> int:
        return sum(1 for r in self.records.values() if r.state in TERMINAL)

    def closed(self, now: float) -> str:
        """Why no new pilot goes to this cluster now ("": one may)."""
        if self.down:
            return f"down ({self.down})"
        if self.window is not None:
            return f"maintenance reservation {self.window.name}"
        if now < self.slow_until:
            return "its pilots pended too long"
        if self.pending() or self.unseen:
            return "a pilot waits there"
        return ""


def allot(views: Sequence[SeatView], add: int, now: float) -> List[Tuple[SeatView, int]]:
    """``add`` new pilots given one at a time to the open cluster with room whose pilots are fewest for its
    share."""
    given = [0] * len(views)
    for _ in range(add):
        open_ = [k for k, v in enumerate(views) if not v.closed(now) and v.seat.cap - v.active() > given[k]]
        if not open_:
            break
        best = min(open_, key=lambda k: ((views[k].active() + given[k]) / views[k].seat.share, -views[k].seat.share))
        given[best] += 1
    return [(v, n) for v, n in zip(views, given) if n]


def seat_of(pilot: str, seats: Sequence[PilotSeat]) -> Optional[PilotSeat]:
    """The cluster a pilot of the queue runs on, by its id's prefix (the one seat when unprefixed)."""
    named = [s for s in seats if s.prefix and pilot.startswith(s.prefix)]
    if named:
        return max(named, key=lambda s: len(s.prefix))
    return next((s for s in seats if not s.prefix), None)


def meeting(windows: Sequence[Maintenance], walltime_s: float) -> Optional[Maintenance]:
    """The first maintenance window that a pilot submitted now would meet."""
    now = _dt.datetime.now(_dt.timezone.utc)
    return next((w for w in windows if w.overlaps(now, walltime_s)), None)


def window_start(w: Maintenance) -> int:
    """Epoch seconds a maintenance window starts (already started: now)."""
    return int(w.start.timestamp()) if w.start is not None else int(time.time())


def drain(q: Queue, view: SeatView, seats: Sequence[PilotSeat]) -> List[Tuple[str, str]]:
    """A maintenance window coming: each live pilot of that cluster learns its start (``live/<p>/until``) and
    claims only inputs that end before it, then ends: the window finds none of ours. Those told now."""
    if view.window is None:
        return []
    start, told = window_start(view.window), []
    for pilot in q.pilots("live"):
        if seat_of(pilot, seats) != view.seat:
            continue
        path = q.d("live") / pilot / "until"
        if _read(path).strip() == str(start):
            continue
        try:
            _write_new(path, f"{start}\n")
        except OSError:   # it ended meanwhile
            continue
        told.append((pilot, view.window.name))
    return told


def hand_off(q: Queue, view: SeatView, sched: Scheduler, after: float,
             sent: Mapping[str, float]) -> Optional[Tuple[str, int, float]]:
    """Pilots pending longer than ``after`` (move_pending_after) on one of several clusters are cancelled there,
    and it gets none for a while: the inputs they would have claimed are claimed by the other clusters'
    pilots (none was bound to this one). ``sent``: each pilot array's submission epoch."""
    now = time.time()
    stale = [r.job_id for r in view.pending() if now - sent.get(r.job_id.split("_")[0], now) > after]
    if not stale:
        return None
    sched.cancel(stale)
    q.d("slow").mkdir(exist_ok=True)
    view.slow_until = now + SLOW_FOR * after
    _write_new(q.d("slow") / str(view.seat.cluster), f"{view.slow_until:.0f}\n")
    for r in view.records.values():
        if r.job_id in stale:
            r.state = "CANCELLED"
    return view.seat.label, len(stale), after


def keep_accounting(root: Path, by_raw: Mapping[str, Record]) -> None:
    """What the accounting says of each pilot (``pilots.tsv`` in the queue ``root``: state, start, end, elapsed,
    CPU time, CPUs), kept for the report: the accounting sees the pilots, never the inputs in them."""
    if not by_raw:
        return
    path = root / "pilots.tsv"
    rows: Dict[str, str] = {}
    for line in _read(path).splitlines():
        rows[line.split("\t", 1)[0]] = line
    for raw, r in by_raw.items():
        kept = rows.get(raw, "").split("\t")
        if len(kept) > 1 and kept[1] in TERMINAL:   # its end was read with its steps: kept as it was
            continue
        rows[raw] = "\t".join(str(x if x is not None else "") for x in (
            raw, r.state, r.start, r.end, r.elapsed_s, r.cpu_s, r.alloc_cpus, r.nodes, r.job_id))
    _write_new(path, "".join(f"{line}\n" for line in rows.values()))
