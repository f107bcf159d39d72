"""Late binding: pilots that claim inputs from a queue of files, seen by operate as a scheduler.

A late-bound plan hands its array tasks to this wrapper instead of to the batch system. ``submit``
puts each task in the queue directory (queue.py), a pilot (a one-node job of the real scheduler,
see templates/pilot.sh.j2) claims a task by renaming its file into its own directory, runs the plan's
array script for it, and commits the result by linking the claim into ``done/``. ``records`` reads
those files: operate tracks, retries, checks and exports late-bound tasks exactly as array tasks, and
never learns that the batch system did not make them. ``tend`` is the supervisor's care of the pilots each round.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from hpcrun.backends.late.changes import Changes, claim_record, commit_record, read_changes, waiting_record
from hpcrun.backends.late.config import PilotConfig
from hpcrun.backends.late.queue import (
    Claim,
    Queue,
    _entries,
    _read,
    _write_new,
)
from hpcrun.backends.late.seats import (
    PilotSeat,
    SeatView,
    allot,
    drain,
    hand_off,
    keep_accounting,
    meeting,
    seat_of,
)
from hpcrun.backends.scheduler.base import (
    TERMINAL,
    Adjust,
    Allocation,
    ClusterFacts,
    JobRequest,
    Maintenance,
    Queued,
    Record,
    Scheduler,
    SchedulerError,
    Unreachable,
)

FAILING_MAX = 3
READ_AGAIN_S = 2.0   # a queue question this soon after a reading of the same submissions is answered from it


class Pilots(Scheduler):
    """The real scheduler with late binding on top: tasks go to the queue, pilots to the scheduler."""

    def __init__(self, inner: Scheduler, config: PilotConfig,
                 make: Optional[Callable[[Optional[str]], Scheduler]] = None):
        scheds = {s.cluster: (make(s.cluster) if make and config.several else inner) for s in config.seats}
        inner = scheds[config.seats[0].cluster]
        super().__init__(inner.cluster)
        self.inner = inner
        self.scheds = scheds    # each cluster's own scheduler, by name (its pilots go there)
        self.config = config
        self.q = Queue(Path(config.queue))
        self.failing = False    # its pilots were failing at their start at the last round (said once a turn)
        # the last reading of the queue (when, its submissions, its records): the poll's queue question reuses it
        self._last_read: Optional[Tuple[float, Set[str], Dict[str, Record]]] = None
        # the real scheduler's words (a wrapper of any registered kind, not a kind of its own)
        self.name = inner.name                          # type: ignore[misc]
        self.accounting = True                          # type: ignore[misc]  # the queue keeps every task's record
        self.daemons = inner.daemons                    # type: ignore[misc]
        self.cancel_command = "hpcrun cancel --inputs"  # type: ignore[misc]
        self.launch = inner.launch                      # type: ignore[misc]

    # -- rendering: the real scheduler's ------------------------------------------------------
    def value_problem(self, text: str) -> str:
        return self.inner.value_problem(text)

    def options(self, request: JobRequest) -> List[str]:
        return self.inner.options(request)

    def launch_options(self, nodes: str, tasks: str, per_node: str, *, overcommit: bool = False,
                       step: bool = True) -> List[str]:
        return self.inner.launch_options(nodes, tasks, per_node, overcommit=overcommit, step=step)

    def extra_problem(self, option: str) -> str:
        return self.inner.extra_problem(option)

    def job_identity(self, array: bool) -> List[str]:
        return self.inner.job_identity(array)

    def task_identity(self) -> List[str]:
        return self.inner.task_identity()

    def node_identity(self) -> List[str]:
        return self.inner.node_identity()

    def unanswered(self, daemon: str) -> str:
        return self.inner.unanswered(daemon)

    # -- tasks: the queue ---------------------------------------------------------------------
    def submit(self, script: Path, *, name: str, array: Optional[str] = None, dependency: str = "",
               adjust: Optional[Adjust] = None, text: Optional[str] = None) -> str:
        """Put the tasks in the queue (no scheduler command); the id names them as an array's does."""
        qid = f"L{time.time_ns() // 1000}"
        if text is not None:
            (self.q.d("arrays")).mkdir(parents=True, exist_ok=True)
            path = self.q.d("arrays") / f"{qid}.sh"
            _write_new(path, text)
            script = path
        walltime = (adjust.walltime_s if adjust and adjust.walltime_s else None) or self.config.input_limit_s
        self.q.enqueue(qid, str(script), _indices(array), walltime, name, self.config.outputs)
        return qid

    def cancel(self, job_ids: Sequence[str]) -> None:
        pilots = [j for j in job_ids if not j.startswith("L")]
        if pilots:
            self.inner.cancel(pilots)
        tasks: List[str] = []
        for job in job_ids:
            if not job.startswith("L"):
                continue
            if "_" in job:
                tasks.append(job)
                continue
            desc = self.q.descriptor(job)
            tasks += [f"{job}_{i}" for i in (desc[3] if desc else ())]
        if tasks:
            self.q.cancel(tasks)

    def dependency(self, kind: str, job_ids: Sequence[str]) -> str:
        return self.inner.dependency(kind, [j for j in job_ids if not j.startswith("L")])

    def records(self, job_ids: Sequence[str], since: str, *, names: Sequence[str] = (),
                known: Optional[Mapping[str, str]] = None,
                in_flight: Optional[Collection[str]] = None) -> Dict[str, Record]:
        """Every task of these submissions as the queue holds it; other ids (the finalize job) asked of
        the real scheduler."""
        ours = {j for j in job_ids if j.startswith("L")}
        out: Dict[str, Record] = {}
        others = [j for j in job_ids if j not in ours]
        if others or names:
            out.update(self.inner.records(others, since, names=names, known=known, in_flight=in_flight))
        if not ours:
            return out
        mine: Dict[str, Record] = {}
        self._last_read = (time.monotonic(), ours, mine)
        claims = {c.task: c for c in self.q.claims()}
        held = _read(self.q.root / "held").strip() or "None"   # the reason no pilot starts (a spent allocation)
        waiting, cancelled, withdrawn = self.q.waiting(), self.q.in_state("cancelled"), self.q.in_state("withdrawn")
        unseen: Dict[str, Tuple[str, str]] = {}   # in none of the places read: folded, or moving meanwhile
        for qid in ours:
            desc = self.q.submission(qid)
            if desc is None:
                continue
            _script, _limit, tag, indices, outputs = desc
            ask = {"waiting": waiting.get(qid, set()), "cancelled": cancelled.get(qid, set()),
                   "withdrawn": withdrawn.get(qid, set())}
            for i in indices:
                task = f"{qid}_{i}"
                if in_flight is not None and task not in in_flight:   # its end is recorded: nothing new
                    continue
                rec = self._task_record(task, tag, claims.get(task), held, outputs, i, ask)
                if rec is None and i not in ask["withdrawn"]:
                    unseen[task] = (tag, outputs)
                elif rec is not None:
                    mine[task] = rec
        folded = self.q.ledgers.find(unseen)   # one read of the ledgers for all of them
        for task, (tag, outputs) in unseen.items():
            res = self.q.committed(task, outputs, res=folded[task]) if task in folded else None
            # in none of the places this reading looked, one after the other: moved between two of them meanwhile
            # (a chunk split and put back between the look at the backlog and the look at the pilots). A task is
            # always in one place, so it waits: never LOST, which would run it a second time
            mine[task] = commit_record(task, tag, res, self.config.chains) if res else waiting_record(task, tag, held)
        out.update(mine)
        return out

    def _task_record(self, task: str, tag: str, claim: Optional[Claim], held: str, outputs: str, i: int,
                     ask: Mapping[str, Collection[int]]) -> Optional[Record]:
        """A task's record: held (RUNNING), waiting (PENDING), cancelled while waiting, or committed (read from
        ``done/``, the one file read: the others come from this reading's listings); None: not found there."""
        if claim is not None:
            return claim_record(task, tag, claim)
        if i in ask["waiting"]:
            return waiting_record(task, tag, held)
        if i in ask["cancelled"]:
            return waiting_record(task, tag, "", "CANCELLED")
        res = self.q.committed(task, outputs)
        if res is not None:
            return commit_record(task, tag, res, self.config.chains)
        return None   # withdrawn (a new generation took it: its input runs there), or not found here

    def changes(self, running: Collection[str], reader: str) -> Changes:
        """What changed in the queue since ``reader`` (a state store) last recorded it (changes.py): a poll
        of 10^6 waiting tasks reads the claims, the journals' new lines and the new cancels, not the tasks.
        ``running``: the tasks the store has running."""
        described: Dict[str, Optional[Tuple[str, str]]] = {}

        def describe(qid: str) -> Optional[Tuple[str, str]]:
            if qid not in described:
                described[qid] = self.q.tag_and_outputs(qid)
            return described[qid]
        held = _read(self.q.root / "held").strip() or "None"
        return read_changes(self.q, running, reader, describe, held, self.config.chains)

    def held(self) -> str:
        """Why no pilot starts ("" when nothing holds them): the reason of every waiting task."""
        return _read(self.q.root / "held").strip()

    def queue(self, *, job_ids: Sequence[str] = (), names: Sequence[str] = (), user: Optional[str] = None,
              expand: bool = True, ended: bool = False) -> List[Queued]:
        ours = [j for j in job_ids if j.startswith("L")]
        rows: List[Queued] = []
        if [j for j in job_ids if not j.startswith("L")] or names or user:
            rows = self.inner.queue(job_ids=[j for j in job_ids if not j.startswith("L")], names=names,
                                    user=user, expand=expand, ended=ended)
        tags = set(names)
        wanted = [qid for qid in (self._all_qids() if tags else ours)
                  if (desc := self.q.descriptor(qid)) is not None and (not tags or desc[2] in tags)]
        last = self._last_read
        recs = last[2] if last and time.monotonic() - last[0] < READ_AGAIN_S and set(wanted) <= last[1] else \
            self.records(wanted, "")
        for rec in recs.values():   # the queue read once a poll: the accounting's answer and the queue's are one
            rows.append(Queued(rec.job_id, rec.job_id.rsplit("_", 1)[0], rec.name, rec.state, rec.reason,
                               rec.raw_id))
        return rows

    def _all_qids(self) -> List[str]:
        return [n for n in _entries(self.q.d("arrays")) if not n.endswith(".sh")]

    def queued_count(self, user: str) -> int:
        return self.inner.queued_count(user)

    def since_text(self, moment: _dt.datetime) -> str:
        return self.inner.since_text(moment)

    def parse_time(self, text: Optional[str]) -> Optional[_dt.datetime]:
        return self.inner.parse_time(text)

    def state_of(self, job_id: str) -> Optional[str]:
        if job_id.startswith("L"):
            rec = self.records([job_id.split("_")[0]], "").get(job_id)
            return rec.state if rec else None
        return self.inner.state_of(job_id)

    def maintenance(self) -> List[Maintenance]:
        return self.inner.maintenance()

    def describe(self) -> ClusterFacts:
        return self.inner.describe()

    def known_clusters(self) -> Optional[List[str]]:
        return self.inner.known_clusters()

    def allocation(self, account: Optional[str]) -> Allocation:
        return self.inner.allocation(account)

    def budget_reason(self, reason: str) -> bool:   # type: ignore[override]
        return self.inner.budget_reason(reason)

    def submit_command(self, script: str) -> str:
        return self.inner.submit_command(script)

    def job_env(self) -> Optional[str]:
        return self.inner.job_env()

    # -- the pilots -----------------------------------------------------------------------------
    def tend(self, *, since: _dt.datetime, settled: bool, paused: bool, spent: bool, work: int = 0) -> PilotRound:
        """One round of the pilots' care: ended or silent pilots fenced and their claims returned, the
        expected input time written, pilots submitted up to what the work needs, the queue stopped
        when the campaign is done. Asks each cluster once (its pilots by name; on several clusters, its
        maintenance too), submits at most once to each. ``work``: the jobs the store holds pending or in
        flight (the queue may not have them yet)."""
        self.q.make()
        rnd = PilotRound(repaired=self.q.repair())
        _flag(self.q.d("paused"), paused)
        _flag(self.q.d("stop"), settled)   # first: once settled the pilots stop at once, not after the accounting
        views = [self._view(seat, since) for seat in self.config.seats]
        by_raw = {k: r for v in views for k, r in v.by_raw().items()}
        keep_accounting(self.q.root, by_raw)
        now = time.monotonic()
        for pilot in self.q.pilots("live"):
            rec = by_raw.get(pilot)
            state = rec.state if rec else ""
            if state in TERMINAL:
                why = f"its job ended {state}"
            elif self.q.beat_changed(pilot, now) > self.config.lease_s:
                why = f"no heartbeat for {self.config.lease_s:.0f} s (lease expired)"
            else:
                continue
            if self.q.fence(pilot):
                rnd.fenced.append((pilot, why))
        rnd.returned = self.q.release()
        self.q.write_expected(self.config.input_s)
        for view in views:
            rnd.drained += drain(self.q, view, self.config.seats)
            if self.config.several and self.config.move_after_s and not view.down:
                handed = hand_off(self.q, view, self.scheds[view.seat.cluster], self.config.move_after_s,
                                  {parts[0]: float(parts[2]) for parts in self._submitted(view.seat)})
                rnd.handed += [handed] if handed else []
        waiting = self.q.waiting_count()
        running = sum(1 for _ in self.q.claims(("live",)))
        active = sum(v.active() for v in views)
        pending = sum(len(v.pending()) + v.unseen for v in views)
        rnd.pilots = {"pending": pending, "running": active - pending, "ended": sum(v.ended() for v in views),
                      "draining": sum(1 for p in self.q.pilots("live") if (self.q.d("live") / p / "draining").exists())}
        rnd.down = [(v.seat.label, v.down) for v in views if v.down]
        held = next((h for v in views if v.pending() and (h := self._held_by(v))), "")
        if held != _read(self.q.root / "held").strip():   # the waiting tasks carry it: the poll records the outage
            _write_new(self.q.root / "held", held + "\n") if held else (self.q.root / "held").unlink(missing_ok=True)
        rnd.spent = spent or bool(held)
        if settled:
            return rnd
        work = max(work, waiting + running)   # the store's count: pilots start while the queue is filled
        need = min(sum(s.max_pilots for s in self.config.seats), math.ceil(work / max(1, self.config.slots)))
        rnd.failing = sum(self._failing(v.records.values()) for v in views)
        if need > active and not rnd.spent and not paused and work and rnd.failing < FAILING_MAX:
            for view, n in allot(views, need - active, time.time()):
                self._submit(view, n, rnd)
        return rnd

    def _view(self, seat: PilotSeat, since: _dt.datetime) -> SeatView:
        """One cluster's pilots this round; on a campaign of several, a cluster that does not answer is down
        (the others go on) and its maintenance windows are asked."""
        sched = self.scheds[seat.cluster]
        try:   # none submitted here nor seen (a first round): nothing of ours to ask the accounting for
            records = self._ours(sched.records([], sched.since_text(since), names=[self.config.name],
                                               in_flight=self._running_pilots(seat)), seat) if self._any(seat) else {}
        except Unreachable as exc:
            if not self.config.several:
                raise
            return SeatView(seat, down=str(exc).splitlines()[0] if str(exc) else "no answer")
        view = SeatView(seat, records, unseen=self._unseen(records, seat))
        if self.config.several:
            try:
                view.window = meeting(sched.maintenance(), self.config.walltime_s)
            except SchedulerError as exc:
                view.down = str(exc).splitlines()[0] if str(exc) else "no answer"
            slow = _read(self.q.root / "slow" / str(seat.cluster)).strip()
            view.slow_until = float(slow) if slow else 0.0
        return view

    def _submit(self, view: SeatView, n: int, rnd: PilotRound) -> None:
        seat = view.seat
        job = self.scheds[seat.cluster].submit(Path(seat.script), name=self.config.name,
                                               array=f"0-{n - 1}")   # always an array: its identity
        rnd.submitted = ", ".join(filter(None, [rnd.submitted, job + (f" on {seat.label}" * self.config.several)]))
        rnd.added += n
        with open(self.q.root / "submitted.tsv", "a") as f:
            f.write(f"{job}\t{n}\t{time.time():.0f}\t{seat.cluster or ''}\n")

    def _held_by(self, view: SeatView) -> str:
        """The budget reason holding a pending pilot, from the queue (the accounting's reason lags): asked
        only while a pilot is pending."""
        sched = self.scheds[view.seat.cluster]
        reasons = [r.reason for r in view.pending()] + [q.reason.strip("()") for q in sched.queue(
            names=[self.config.name], expand=False)]
        return next((why for why in reasons if sched.budget_reason(why)), "")

    def _submitted(self, seat: PilotSeat) -> List[List[str]]:
        """The pilot arrays submitted to this cluster (submitted.tsv: id, pilots, epoch, cluster)."""
        first = self.config.seats[0].cluster or ""
        rows = []
        for line in _read(self.q.root / "submitted.tsv").splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and (parts[3] if len(parts) > 3 else first) == (seat.cluster or ""):
                rows.append(parts)
        return rows

    def _any(self, seat: PilotSeat) -> bool:
        """Whether this cluster may hold a pilot of ours: one was submitted to it, or one is in the queue."""
        return bool(self._submitted(seat)) or any(self.q.pilots(d) for d in ("live", "fenced", "ended"))

    def _ours(self, records: Mapping[str, Record], seat: PilotSeat) -> Dict[str, Record]:
        """The pilots of this queue on this cluster: submitted by it, or seen in it (an earlier plan of a
        campaign of the same name had pilots of the same name)."""
        arrays = {parts[0] for parts in self._submitted(seat)}
        seen = set(self.q.pilots("live")) | set(self.q.pilots("fenced")) | set(self.q.pilots("ended"))
        return {k: r for k, r in records.items()
                if r.job_id.split("_")[0] in arrays or seat.prefix + r.raw_id in seen}

    def _failing(self, records: Collection[Record]) -> int:
        """Pilots that failed within a minute of their start in the last ten minutes: at FAILING_MAX no new
        one goes out (a pilot that cannot start its database, say, must not become a submission a round)."""
        now = _dt.datetime.now(_dt.timezone.utc)
        quick = 0
        for r in records:
            ended = self.inner.parse_time(r.end)
            if r.state in ("FAILED", "BOOT_FAIL") and (r.elapsed_s or 0) < 60 and ended is not None \
                    and (now - ended).total_seconds() < 600:
                quick += 1
        return quick

    def _unseen(self, records: Mapping[str, Record], seat: PilotSeat, within_s: float = 600.0) -> int:
        """Pilots this campaign submitted lately to this cluster that its accounting does not list yet."""
        seen: Dict[str, int] = {}
        for r in records.values():
            array = r.job_id.split("_")[0]
            seen[array] = seen.get(array, 0) + 1
        missing = 0
        for parts in self._submitted(seat):
            if time.time() - float(parts[2]) < within_s:
                missing += max(0, int(parts[1]) - seen.get(parts[0], 0))
        return missing

    def refresh_accounting(self, since: _dt.datetime) -> None:
        """The pilots that ended after the supervisor's last round (they stop once it finished) read from
        the accounting now, with their CPU time; one query a cluster, and none when every pilot's end is kept."""
        for seat in self.config.seats:
            running = self._running_pilots(seat)
            if not running:
                continue
            sched = self.scheds[seat.cluster]
            try:
                records = self._ours(sched.records([], sched.since_text(since), names=[self.config.name],
                                                   in_flight=running), seat)
            except Unreachable:   # that cluster's pilots are read when it answers again
                if self.config.several:
                    continue
                raise
            keep_accounting(self.q.root, SeatView(seat, records).by_raw())

    def _running_pilots(self, seat: PilotSeat) -> List[str]:
        """This cluster's pilots (as its accounting keys them) last seen not ended: those of them that ended now
        get their steps read (the CPU time, which the accounting's job line leaves at 0)."""
        out = []
        for line in _read(self.q.root / "pilots.tsv").splitlines():
            parts = line.split("\t")
            if len(parts) >= 9 and parts[1] not in TERMINAL and parts[8] \
                    and seat_of(parts[0], self.config.seats) == seat:
                out.append(parts[8])
        return out


@dataclass
class PilotRound:
    """What one round of care did (for the round's summary and the audit trail)."""

    repaired: int = 0
    fenced: List[Tuple[str, str]] = field(default_factory=list)
    returned: List[str] = field(default_factory=list)
    pilots: Dict[str, int] = field(default_factory=dict)
    submitted: str = ""
    added: int = 0
    spent: bool = False
    failing: int = 0      # pilots that failed at their start lately (FAILING_MAX of them hold new ones)
    down: List[Tuple[str, str]] = field(default_factory=list)       # clusters that did not answer, and why
    drained: List[Tuple[str, str]] = field(default_factory=list)    # pilots told of a maintenance window
    handed: List[Tuple[str, int, float]] = field(default_factory=list)   # pilots pending too long, cancelled


def _flag(path: Path, on: bool) -> None:
    if on and not path.exists():
        path.touch()
    elif not on and path.exists():
        path.unlink()


def _indices(array: Optional[str]) -> List[int]:
    """``0-3,7%2`` -> [0, 1, 2, 3, 7] (the throttle means nothing to pilots)."""
    if not array:
        return [0]
    out: List[int] = []
    for part in array.split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def wrap(inner: Scheduler, pilots: Optional[Mapping[str, Any]],
         make: Optional[Callable[[Optional[str]], Scheduler]] = None) -> Scheduler:
    """The scheduler a plan's operate side talks to: the real one, or the pilots on top of it (``make``: the
    real scheduler of a named cluster, for a campaign's pilots on several)."""
    if not pilots:
        return inner
    return Pilots(inner, PilotConfig.from_dict(pilots), make)


__all__ = ["Pilots", "PilotConfig", "PilotRound", "Queue", "wrap"]
