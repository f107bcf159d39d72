"""What changed in the queue since a poll last recorded it: a round of a late-bound campaign reads only that.

A poll must not cost what the campaign holds (10^6 waiting inputs): waiting tasks are not looked at, they
wait as the store knows them. What changes a task's recorded state is one of four things, each read here:

1. a claim (``live/`` and ``fenced/``: as many as the slots) of a task the store does not have running;
2. a commit: the journals' lines (``results/<pilot>``), read from the cursor on;
3. a cancel of a waiting task: an entry of ``cancelled/`` not seen before;
4. a task the store has running that is no longer claimed: committed (its line may lag), cancelled, or
   back to waiting (returned after its pilot was fenced, never lost).

The cursor (each journal's offset, the ``cancelled/`` entries seen) is kept per state store in
``queue/seen/``. The poll moves it on only after it recorded what it read, and only past lines whose tasks
the store knows: a submission recorded after its tasks' commits (a crash between the queue and the store)
is read again at the next poll. A cursor lost or never written reads everything once.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Callable, Collection, Dict, List, Optional, Sequence, Set, Tuple

from hpcrun.backends.late import layout as L
from hpcrun.backends.late.figures import _seconds
from hpcrun.backends.late.ledger import journals_of
from hpcrun.backends.late.queue import Claim, Queue, _local_time, epoch
from hpcrun.backends.scheduler.base import Record

Described = Callable[[str], Optional[Tuple[str, str]]]   # submission -> (its tag, its outputs location)
BLOCK = 1 << 16


@dataclass
class Line:
    """One line of a journal: where it is, and the committed tasks it names."""

    journal: str
    start: int
    end: int
    tasks: List[str]


def claim_record(task: str, tag: str, claim: Claim) -> Record:
    """A held task: running where its pilot is."""
    return Record(task, claim.claim_id, tag, "RUNNING", "0:0", "", None, None, None, claim.node,
                  _local_time(claim.start) if claim.start else None, None)


def waiting_record(task: str, tag: str, held: str, state: str = "PENDING") -> Record:
    """A task no pilot holds: waiting (``held``: why no pilot starts), or cancelled before a claim (it ran for
    0 s: its record is complete, as accounting's is of a job cancelled while pending)."""
    if state == "PENDING":
        return Record(task, task, tag, state, "0:0", held, None, None, None, "", None, None)
    return Record(task, task, tag, state, "0:0", "", 0.0, 0.0, None, "", None, None)


def commit_record(task: str, tag: str, res: List[str], chains: int) -> Record:
    """A committed task from its result (``Queue.committed``: the outputs placed first)."""
    # task claim pilot slot node start end rc state cpu_s maxrss_kb placed, why it failed after
    _t, claim_id, _pilot, _slot, node, start, end, rc, state, cpu, rss, _placed, reason = res
    elapsed = epoch(end) - epoch(start) if start and end else None
    return Record(task, claim_id, tag, state, f"{rc or 0}:0", reason, elapsed, _seconds(cpu), chains, node,
                  _local_time(start), _local_time(end), int(rss) * 1024 if rss else None)


@dataclass
class Cursor:
    """How far one state store's polls have recorded the queue."""

    journals: Dict[str, int] = field(default_factory=dict)   # journal -> bytes read
    cancelled: Set[str] = field(default_factory=set)          # cancelled/ entries recorded
    held: List[Tuple[str, int, int]] = field(default_factory=list)   # lines read but not recorded: (journal, from, to)
    folded: Dict[str, int] = field(default_factory=dict)     # journal -> bytes whose commits were folded (ledger.py)

    @staticmethod
    def path(q: Queue, reader: str) -> str:
        return str(q.root / "seen" / hashlib.sha256(reader.encode()).hexdigest()[:16])

    @classmethod
    def load(cls, q: Queue, reader: str) -> Cursor:
        try:
            with open(cls.path(q, reader)) as f:
                data = json.load(f)
            return cls({str(k): int(v) for k, v in data["journals"].items()}, set(data["cancelled"]),
                       [(str(n), int(a), int(b)) for n, a, b in data.get("held", [])],
                       {str(k): int(v) for k, v in data.get("folded", {}).items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls()   # none yet, or unreadable: everything is read once

    def save(self, q: Queue, reader: str) -> None:
        """Written whole (a reader sees the old cursor or the new); a plan directory this user cannot write
        keeps the old one (the next poll reads a little more)."""
        path = self.path(q, reader)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"   # two readers (two login nodes) write their own
            with open(tmp, "w") as f:
                json.dump({"journals": self.journals, "cancelled": sorted(self.cancelled), "held": self.held,
                           "folded": self.folded}, f)
            os.replace(tmp, path)
        except OSError:
            pass


@dataclass
class Changes:
    """The records of the tasks whose state may have changed, and how to move the cursor past them."""

    records: Dict[str, Record]
    cursor: Cursor
    reader: str
    q: Queue
    lines: Dict[str, List[Line]] = field(default_factory=dict)   # journal -> its new lines read
    again: List[Line] = field(default_factory=list)   # the lines held before, read again
    stuck: List[Tuple[str, int, int]] = field(default_factory=list)   # ... or that could not be read again: kept
    full: bool = False   # the read took as many new lines as it could: more may wait
    entries: Dict[str, Set[str]] = field(default_factory=dict)   # new cancelled/ entry -> its tasks
    unread: Set[str] = field(default_factory=set)   # named by a line or an entry, but no record read (read again)

    def advance(self, unknown: Collection[str], fold: bool = False) -> bool:
        """The cursor past what was read, after the poll recorded it. A line or an entry naming a task the
        store does not know or did not take (``unknown``), or one whose record could not be read, is held:
        read again at every poll until it is recorded (the lines after it are not held up). Whether more new
        lines may wait (the read was full). Written only when it moved (a read every second of a quiet
        campaign writes nothing on the shared filesystem). ``fold``: the commits recorded up to the cursor
        folded too (the supervisor's round alone: the one process that also releases fenced pilots' claims,
        so it reads its own ledgers, and no ``status`` leaves a ledger of its own)."""
        before = (dict(self.cursor.journals), set(self.cursor.cancelled), list(self.cursor.held),
                  dict(self.cursor.folded))
        unknown = set(unknown) | self.unread
        held = [line for line in self.again if any(t in unknown for t in line.tasks)]
        for name, lines in self.lines.items():
            for line in lines:
                if any(t in unknown for t in line.tasks):
                    held.append(line)
                self.cursor.journals[name] = line.end
        self.cursor.held = [(line.journal, line.start, line.end) for line in held] + self.stuck
        self.cursor.cancelled |= {e for e, tasks in self.entries.items() if not tasks & unknown}
        self.cursor.cancelled &= set(L.entries(self.q.d("cancelled"))) | set(self.entries)
        if fold:
            self._fold(unknown)
        if (self.cursor.journals, self.cursor.cancelled, self.cursor.held, self.cursor.folded) != before:
            self.cursor.save(self.q, self.reader)
        return self.full

    def _fold(self, unknown: Collection[str]) -> None:
        """The commits recorded now folded out of ``done/`` (ledger.py): those the journals name up to the
        cursor or to its first held line (folded once it is recorded); a fold that could not be written is
        tried again at the next round."""
        held: Dict[str, int] = {}
        for name, start, _end in self.cursor.held:
            held[name] = min(start, held.get(name, start))
        for name, end in self.cursor.journals.items():
            start, end = self.cursor.folded.get(name, 0), min(end, held.get(name, end))
            if end > start and self.q.ledgers.fold(name, start, end, unknown) is not None:
                self.cursor.folded[name] = end


# the journals' new lines a read takes at most (a line names one task, rarely a few), shared among the
# journals: a poll after a long pause (a first round that enqueued 10^6 inputs, a store outage) records what
# piled up over several reads, each bounded, and the cursor keeps the rest
LINES_PER_READ = 500


def read_changes(q: Queue, running: Collection[str], reader: str, describe: Described, held: str,
                 chains: int, lines: Optional[int] = None) -> Changes:
    """What changed since ``reader``'s cursor (``running``: the tasks the store has running), at most
    ``lines`` of the journals' lines (LINES_PER_READ)."""
    lines = LINES_PER_READ if lines is None else lines
    cur = Cursor.load(q, reader)
    out = Changes({}, cur, reader, q)
    known = q.locations()   # every outputs location, read once for all the commits read
    claims = {c.task: c for c in q.claims()}
    for task, claim in claims.items():
        if task not in running and (d := describe(task.rpartition("_")[0])):
            out.records[task] = claim_record(task, d[0], claim)
    for name, start, end in cur.held:   # each held range read again whole (a line, unless a read saw it torn)
        got = _tail(q, name, start, end - start, until=end)
        if got and got[-1].end == end:
            out.again += got
        else:
            out.stuck.append((name, start, end))
    out.lines = _new_lines(q, cur, lines)
    out.full = sum(len(got) for got in out.lines.values()) >= lines
    folded: Dict[str, List[str]] = {}   # journal -> the tasks it names whose done/ file is gone: folded
    for line in out.again + [line for got in out.lines.values() for line in got]:
        for task in line.tasks:   # a line names only commits
            if not _committed(q, task, describe, chains, out.records, known):
                folded.setdefault(line.journal, []).append(task)
    for journal, tasks in folded.items():   # one read of that journal's ledgers for all of them
        found = q.ledgers.find(tasks, journals_of(journal))
        out.unread |= {t for t in tasks if not _committed(q, t, describe, chains, out.records, known, found.get(t))}
    for name in set(L.entries(q.d("cancelled"))) - cur.cancelled:
        held_there = out.entries[name] = _held_by(q, name)
        for task in held_there:
            if not (d := describe(task.rpartition("_")[0])):
                out.unread.add(task)
            elif task not in out.records:
                out.records[task] = waiting_record(task, d[0], "", "CANCELLED")
    _running_unclaimed(q, running, claims, out, describe, chains, known, held)
    return out


def _running_unclaimed(q: Queue, running: Collection[str], claims: Collection[str], out: Changes,
                       describe: Described, chains: int, known: Sequence[str], held: str) -> None:
    """The tasks the store has running that no pilot holds: committed (in done/, or folded: a store whose
    cursor passed their lines, or another store's fold), cancelled, or back to waiting."""
    left: Dict[str, str] = {}
    for task in running:   # (a task a journal names committed, even if its result cannot be read yet)
        if task in claims or task in out.records or task in out.unread or not (d := describe(task.rpartition("_")[0])):
            continue
        if not _committed(q, task, describe, chains, out.records, known):
            left[task] = d[0]
    if not left:
        return
    waiting = q.waiting()
    cancelled = {t for t in left if (q.d("cancelled") / t).exists()}
    gone = [t for t in left if t not in cancelled and int(t.rpartition("_")[2]) not in waiting.get(
        t.rpartition("_")[0], ())]
    found = q.ledgers.find(gone) if gone else {}   # neither waiting nor cancelled: a read of the ledgers
    for task, tag in left.items():
        if not _committed(q, task, describe, chains, out.records, known, found.get(task)):
            out.records[task] = waiting_record(task, tag, held, "CANCELLED" if task in cancelled else "PENDING")


def _committed(q: Queue, task: str, describe: Described, chains: int, into: Dict[str, Record],
               known: Sequence[str], res: Optional[List[str]] = None) -> bool:
    """A committed task's record into ``into``: read from done/, or given (``res``: its folded result)."""
    d = describe(task.rpartition("_")[0])
    res = q.committed(task, d[1], known, res=res) if d else None
    if d is None or res is None:
        return False
    into[task] = commit_record(task, d[0], res, chains)
    return True


def _new_lines(q: Queue, cur: Cursor, budget: int) -> Dict[str, List[Line]]:
    """At most ``budget`` new lines: each journal its share first, then what is left to those with more (no
    journal is starved by a busier one)."""
    names = L.entries(q.d("results"))
    share = max(1, budget // max(1, len(names)))
    out = {name: _tail(q, name, cur.journals.get(name, 0), share) for name in names}
    left = budget - sum(len(got) for got in out.values())
    for name, got in out.items():
        if left > 0 and len(got) == share:
            more = _tail(q, name, got[-1].end, left)
            got += more
            left -= len(more)
    return out


def _tail(q: Queue, name: str, offset: int, most: int, until: Optional[int] = None) -> List[Line]:
    """At most ``most`` whole lines of a journal from ``offset`` on (and ending by ``until``), read in blocks (a
    journal of 10^5 lines is not read whole to take a thousand); a line a pilot is still writing waits."""
    out: List[Line] = []
    try:
        with open(q.d("results") / name, "rb") as f:
            f.seek(offset)
            rest = b""
            while len(out) < most and (block := f.read(BLOCK)):
                data, pos = rest + block, 0
                while len(out) < most and (nl := data.find(b"\n", pos)) >= 0:
                    start = offset + pos
                    if until is not None and start + nl - pos + 1 > until:
                        return out
                    out.append(Line(name, start, start + nl - pos + 1, data[pos:nl].decode(errors="replace").split()))
                    pos = nl + 1
                offset, rest = offset + pos, data[pos:]
    except OSError:
        return out
    return out


def _held_by(q: Queue, name: str) -> Set[str]:
    """The tasks one entry of ``cancelled/`` holds (a task file, or a chunk of ranges)."""
    if "." not in name:
        return {name} if name.rpartition("_")[2].isdigit() else set()
    qid = name.rsplit(".", 1)[0]
    return {f"{qid}_{i}" for i in L.members(L.parse_ranges(L.read(q.d("cancelled") / name)))}
