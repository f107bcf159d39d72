"""The queue of a late-bound campaign: files on the shared filesystem, moved by rename(2) alone.

Atomic on the shared filesystems compute nodes see (no server, no network from a node), as PanDA's Yoda
hands out event ranges. The layout (the pilot's side is templates/pilot.sh.j2):

  queue/arrays/<qid>          one per submission: the script, the per-input time limit, the tag, its
                              indices (ranges), the outputs location of its generation
  queue/backlog/<qid>.<k>     waiting tasks as ranges, at most layout.CHUNKS files a submission (the
                              protocol of a claim's split: layout.py, shared with the pilot's agent)
  queue/ready/<qid>_<i>       a single waiting task: returned by a fenced pilot, or hinted to a node
  queue/live/<pilot>/         a running pilot: ``beat`` (renewed), ``info``, its claims <qid>_<i> (empty
                              until begun; the result line is written in place: ``layout.whole``)
  queue/fenced/<pilot>/       a pilot the supervisor gave up on (ended, or its lease expired):
                              renamed as a whole, so its claims can no longer commit
  queue/ended/<pilot>/        after its claims were returned
  queue/done/<qid>_<i>        a committed result (one TSV line; a twelfth field once its outputs were
                              moved into place: ``placed``, or ``unplaced:<why>``); looked up by name,
                              never listed
  queue/results/<pilot>       the pilot's journal: the tasks it committed, a line each (what changed)
  queue/folded/<journal>@...  the done/ records of the commits a poll recorded, folded out of done/ (ledger.py)
  queue/cancel/<qid>_<i>      an operator's cancel of a running task; cancelled/: of a waiting one
  queue/withdrawn/<qid>_<i>   a task nobody had claimed when a new generation was planned (its input runs
                              under that generation); there and in cancelled/ a whole chunk
                              (``<qid>.<k>``) stands for its tasks
  queue/stop, queue/paused    the campaign ended; claim nothing now
  queue/near/<node>/<task>    locality: a waiting task whose inputs that node's cache holds (a hint
                              the supervisor keeps; that node's pilot claims it first, others leave it
                              to it until they idled ``jobs.locality_wait``)

Fencing: a claim commits with one link(2), ``live/<pilot>/<task>`` -> ``done/<task>`` (the result line written
into the token just before; the token removed after). Once the supervisor renamed ``live/<pilot>`` away that path
no longer exists, so a pilot whose lease expired records nothing, however long it stalled: there is no second
step after a check. A link never replaces a result already there: the first commit of a task stands.
Outputs: a claim writes them into a directory of its own (``<outputs>/.hpcrun-claims/<claim id>``) and the pilot
never moves them. Whoever reads the results (``place``: the supervisor, the single writer) moves the outputs of
the one committed claim into place, so a fenced claim's outputs never reach the outputs location. A move that
fails fails the input (exit 12, retried) and leaves the outputs where they are, never deleted.
A pilot on its way out stops its slots first, then renames its own directory to ``fenced/`` (it holds claims:
the supervisor returns them) or removes it (it holds none): no claim is made after that check.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from hpcrun.backends.late import layout as L
from hpcrun.backends.late.ledger import Ledgers, journals_of

STATES = ("backlog", "ready", "live", "fenced", "ended", "done", "cancelled", "cancel", "arrays", "withdrawn",
          "results")
HOLD_STALE_S = 600.0            # a supervisor's split left this long was cut short (one takes milliseconds)
CLAIMS_DIR = ".hpcrun-claims"   # under an outputs location: each claim's outputs until they are placed
PLACED = "placed"               # the done record's twelfth field: the committed claim's outputs are in place
UNPLACED = "unplaced:"          # ... or they could not be moved (why): the input failed, exit 12
PLACE_EXIT = 12

_entries, _read, _write_new = L.entries, L.read, L.write_new


def epoch(text: str) -> float:
    """A pilot's ``$EPOCHREALTIME``: its decimal point is the locale's (``1795882445,128100`` in de_DE)."""
    return float(text.replace(",", "."))


def _local_time(epoch_text: str) -> Optional[str]:
    """An epoch from a pilot -> the local ISO text the accounting uses (what parse_time reads)."""
    try:
        return _dt.datetime.fromtimestamp(epoch(epoch_text)).strftime("%Y-%m-%dT%H:%M:%S")
    except (ValueError, OverflowError, OSError):
        return None


@dataclass
class Claim:
    """A task held by a pilot: where its token lies and what the pilot wrote into it."""

    task: str
    pilot: str
    claim_id: str
    slot: str
    node: str
    start: str


class Queue:
    """The queue directory: what the supervisor side reads and writes of it."""

    def __init__(self, root: Path):
        self.root = root
        self.done = os.path.join(root, "done")   # as text: read and written for every result recorded
        self.ledgers = Ledgers(root)
        self._leases: Dict[str, Tuple[float, float]] = {}   # pilot -> (beat mtime seen, when it changed: our clock)

    def make(self) -> None:
        for d in STATES:
            (self.root / d).mkdir(parents=True, exist_ok=True)

    def d(self, name: str) -> Path:
        return self.root / name

    # -- putting work in -------------------------------------------------------------------
    def enqueue(self, qid: str, script: str, indices: Sequence[int], walltime_s: int, tag: str,
                outputs: str = "") -> None:
        """The submission's chunks made in a staging directory, its descriptor written, then each chunk renamed
        into the backlog and the enqueue marked complete: at most layout.CHUNKS files whatever its size, fewer
        once the backlog holds many (``repair`` publishes what a crash left staged). ``outputs``: the location
        its claims' outputs are placed in (a generation may change it while earlier pilots run)."""
        self.make()
        self.remember(outputs)   # before any claim can write under it
        stage = self.d("backlog") / f".{qid}"
        stage.mkdir(exist_ok=True)
        for k, text in enumerate(L.chunks(indices, L.chunk_count(len(_entries(self.d("backlog")))))):
            with open(stage / f"{qid}.{k}", "w") as f:
                f.write(text + "\n")
        _write_new(self.d("arrays") / qid,
                   f"{script}\t{walltime_s}\t{tag}\t{L.format_ranges(L.to_ranges(indices))}\t{outputs}\n")
        self._publish(qid)

    def _publish(self, qid: str) -> None:
        stage = self.d("backlog") / f".{qid}"
        for name in _entries(stage):
            _move(stage / name, self.d("backlog") / name)   # gone: published meanwhile (repair beside enqueue)
        (self.d("arrays") / f".{qid}.complete").touch()
        shutil.rmtree(stage, ignore_errors=True)

    def descriptor(self, qid: str) -> Optional[Tuple[str, int, str, List[int]]]:
        desc = self.submission(qid)
        return None if desc is None else desc[:4]

    def tag_and_outputs(self, qid: str) -> Optional[Tuple[str, str]]:
        """A submission's tag and outputs location (a poll asks it of each one changed: indices not expanded)."""
        fields = _read(self.d("arrays") / qid).rstrip("\n").split("\t")
        if len(fields) < 4:
            return None
        return fields[2], (fields[4] if len(fields) > 4 else "")

    def submission(self, qid: str) -> Optional[Tuple[str, int, str, List[int], str]]:
        """A submission's descriptor, read once: script, per-input limit, tag, indices, and the outputs
        location its claims are placed in ("": not recorded)."""
        fields = _read(self.d("arrays") / qid).rstrip("\n").split("\t")
        if len(fields) < 4:
            return None
        outputs = fields[4] if len(fields) > 4 else ""
        return fields[0], int(fields[1]), fields[2], list(L.members(L.parse_ranges(fields[3]))), outputs

    def repair(self) -> int:
        """Enqueues cut short published (their staged chunks renamed into the backlog), and the supervisor's
        own splits cut short settled; how many submissions were published."""
        made = 0
        arrays = self.d("arrays")
        for qid in _entries(arrays):
            if qid.endswith(".sh") or (arrays / f".{qid}.complete").exists() or self.submission(qid) is None:
                continue
            self._publish(qid)
            made += 1
        holds = self.root / ".hold"
        for name in (os.listdir(holds) if holds.is_dir() else []):
            hold = holds / name
            try:
                if time.time() - hold.stat().st_mtime < HOLD_STALE_S:
                    continue
            except FileNotFoundError:
                continue
            L.settle(self.d("backlog"), hold)
            state = _read(hold / "state").strip() or "ready"
            for task in _entries(hold):
                if "_" in task and task != "state":
                    os.rename(hold / task, self.d(state) / task)
            shutil.rmtree(hold, ignore_errors=True)
        return made

    def waiting(self) -> Dict[str, Set[int]]:
        """Every waiting task by submission (the backlog's chunks and ``ready/``)."""
        return L.waiting(self.root)

    def waiting_count(self) -> int:
        return L.waiting_count(self.root)

    def in_state(self, state: str) -> Dict[str, Set[int]]:
        """The tasks ``cancelled/`` or ``withdrawn/`` holds, by submission."""
        return L.held_in(self.root, state)

    def extract(self, tasks: Iterable[str], state: str) -> Set[str]:
        """Waiting tasks moved to ``state`` (ready, cancelled, withdrawn): single ones renamed, chunks that hold
        some split (a chunk all of whose tasks go, and the state is not ``ready``, renamed whole). The supervisor's
        split is held in a directory of its own (``.hold/``), which ``repair`` settles if it was cut short. The
        tasks moved; one that was not waiting (claimed meanwhile, or mid-split in a pilot) is not."""
        self.make()
        wanted: Dict[str, Set[int]] = {}
        moved: Set[str] = set()
        for task in tasks:
            qid, _, i = task.rpartition("_")
            if not i.isdigit():
                continue
            if state != "ready" and _move(self.d("ready") / task, self.d(state) / task):
                moved.add(task)
            else:
                wanted.setdefault(qid, set()).add(int(i))
        backlog = self.d("backlog")
        names = [n for n in _entries(backlog) if n.rsplit(".", 1)[0] in wanted]
        if not names:
            return moved
        hold = self.root / ".hold" / f"{os.getpid()}.{time.time_ns()}"
        hold.mkdir(parents=True)
        _write_new(hold / "state", state + "\n")
        for name in names:
            qid = name.rsplit(".", 1)[0]
            if not any(i in wanted[qid] for i in L.members(L.parse_ranges(_read(backlog / name)))):
                continue   # a glance first: most chunks hold none of them, and stay where they are
            ranges = L.take(backlog, name, hold)   # read again where no one else changes it
            if ranges is None:
                continue
            every = list(L.members(ranges))
            if state != "ready" and all(i in wanted[qid] for i in every):   # the whole chunk goes as it is
                os.rename(hold / (L.TAKE + name), self.d(state) / name)
                moved.update(f"{qid}_{i}" for i in every)
                continue
            moved.update(L.cut(backlog, name, hold, ranges, L.pick_in(wanted[qid]), lambda t: self.d(state) / t))
        try:   # a task that could not be moved stays in the hold: repair settles it, never deleted
            os.unlink(hold / "state")
            os.rmdir(hold)
        except OSError:
            pass
        return moved

    # -- reading pilots and claims ---------------------------------------------------------
    def write_expected(self, input_s: float) -> None:
        """``expected``: the longest of the last inputs' times (with a quarter more), or the spec's
        per-input time before any ended; a pilot claims only what its time left covers. The last inputs are
        the journals' last lines (``done/`` is never listed; a folded one is read from its journal's ledgers)."""
        times: List[float] = []
        for journal, names in self._recent(200).items():
            found = {n: r for n in names if (r := self.result(n))}
            found.update(self.ledgers.find(set(names) - set(found), journals_of(journal), tail=1 << 16))
            for res in found.values():
                if len(res) > 8 and res[8] == "COMPLETED" and res[5] and res[6]:
                    times.append(epoch(res[6]) - epoch(res[5]))
        value = max(times) * 1.25 if times else input_s
        _write_new(self.root / "expected", f"{int(math.ceil(value))}\n")

    def _recent(self, n: int) -> Dict[str, List[str]]:
        """About the last ``n`` tasks committed, by journal: the tails of the newest journals."""
        out: Dict[str, List[str]] = {}
        got = 0
        for path in sorted(self.d("results").glob("[!.]*"), key=_mtime, reverse=True):
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * n))
                    out[path.name] = f.read().decode(errors="replace").splitlines()[1:][-(n - got):]
            except FileNotFoundError:
                continue
            got += len(out[path.name])
            if got >= n:
                break
        return out

    def committed_tasks(self) -> Iterator[str]:
        """Every task the journals name (a task committed once is named once, or twice when the supervisor
        wrote the line of a pilot that stopped between its commit and its journal)."""
        for path in sorted(self.d("results").glob("[!.]*")):
            yield from _read(path).split()

    def pilots(self, state: str = "live") -> List[str]:
        return _entries(self.d(state))

    def claims(self, states: Sequence[str] = ("live", "fenced")) -> Iterator[Claim]:
        for state in states:
            for pilot in self.pilots(state):
                base = self.d(state) / pilot
                info = _read(base / "info").split("\t")
                node = info[0] if info and info[0] else ""
                for name in _entries(base):
                    if "_" not in name or "." in name:
                        continue
                    fields = L.whole(_read(base / name)).rstrip("\n").split("\t")
                    if len(fields) >= 9:   # the result line, written just before the commit's link
                        fields = [fields[1], fields[3], fields[4], fields[5]]
                    fields += [""] * (4 - len(fields))
                    yield Claim(name, pilot, fields[0] or name, fields[1], fields[2] or node, fields[3])

    def result(self, task: str, journal: Optional[str] = None) -> Optional[List[str]]:
        """``done/<task>``, or once folded its ledger line when the journal naming it is known (ledger.py)."""
        text = _read(os.path.join(self.done, task)).rstrip("\n")
        if text or journal is None:
            return text.split("\t") if text else None
        return self.ledgers.find((task,), journals_of(journal)).get(task)

    def committed(self, task: str, outputs: str, known: Optional[Sequence[str]] = None,
                  res: Optional[List[str]] = None) -> Optional[List[str]]:
        """A task's committed result with its outputs in place (placed now if they were not yet): the
        record's twelve fields and, thirteenth, why the input failed after its commit ("" if it did not).
        ``outputs``: its submission's outputs location, looked at first; ``known``: every location (read once by
        a reader of thousands of commits; else read here); ``res``: its result, read already (a folded one:
        from its ledger)."""
        res = self.result(task) if res is None else res
        if res is None:
            return None
        res = (res + [""] * 12)[:12]
        if not res[11]:
            others = self.locations() if known is None else known
            res = self.place(task, res, [outputs] + [o for o in others if o != outputs])
        why = ""
        if res[11].startswith(UNPLACED):   # its outputs wait in the claim's directory, named in the reason
            why = f"its outputs could not be moved into place: {res[11][len(UNPLACED):]}"
            if res[8] == "COMPLETED":      # a failure of its own (a cancel, a time limit) stays what it was
                res[7], res[8] = str(PLACE_EXIT), "FAILED"
        return res + [why]

    def place(self, task: str, result: List[str], locations: Sequence[str]) -> List[str]:
        """The committed claim's outputs moved from its own directory into the outputs location that holds
        it (a generation's job writes under its own; ``locations``: the candidates, its submission's first),
        directories merged; then the record marked ``placed``, or ``unplaced:<why>`` when a move failed
        (the rest stays in the claim's directory, never deleted). Safe to repeat after a crash, and beside
        a second reader: what one moved is gone for the other, and a mark once written is kept. Returns
        the record as it now is."""
        result = (result + [""] * 11)[:11]
        mark = PLACED
        claim = result[1]
        if not claim or "/" in claim or claim in (".", ".."):   # never the claims' common directory, or another's
            mark, locations = f"{UNPLACED}the record names no claim directory of its own ({claim!r})", ()
        for outputs in filter(None, locations):
            private = os.path.join(outputs, CLAIMS_DIR, result[1])
            if os.path.isdir(private):
                why = L.move_tree(private, outputs)
                mark = PLACED if why is None else f"{UNPLACED}{why} (kept in {private})"
                break
        now = self.result(task) or []
        if len(now) > 11 and now[11]:   # another reader marked it meanwhile: its mark stands
            return (now + [""] * 12)[:12]
        _write_new(os.path.join(self.done, task), "\t".join(result + [mark]) + "\n")
        return result + [mark]

    def locations(self) -> List[str]:
        """Every outputs location the campaign's submissions named (``outputs``: one a line, a generation
        may add one): where a claim's own directory may be."""
        return [line for line in _read(self.root / "outputs").splitlines() if line]

    def remember(self, outputs: str) -> None:
        """A submission's outputs location kept in ``outputs`` (once)."""
        known = self.locations()
        if outputs and outputs not in known:
            _write_new(self.root / "outputs", "".join(f"{o}\n" for o in known + [outputs]))

    # -- the supervisor's moves -------------------------------------------------------------
    def fence(self, pilot: str) -> bool:
        """A pilot given up on: its directory renamed as a whole (its claims can commit no more)."""
        try:
            os.rename(self.d("live") / pilot, self.d("fenced") / pilot)
            return True
        except FileNotFoundError:
            return False

    def release(self) -> List[str]:
        """Every claim of a fenced pilot back in ``ready/`` (none counts as an attempt), its splits cut short
        settled; the pilot to ``ended/``. A claim that committed after all stays committed (its journal line
        written here, in case the pilot stopped before it)."""
        returned: List[str] = []
        for pilot in self.pilots("fenced"):
            base = self.d("fenced") / pilot
            L.settle(self.d("backlog"), base)
            tokens = [t for t in _entries(base) if "_" in t and "." not in t]
            # done/ read before the ledgers, never after: a fold writes its ledger before it removes the file
            unseen = {t for t in tokens if not (self.d("done") / t).exists()}
            folded = self.ledgers.committed_by(pilot, unseen)
            for task in tokens:
                if task not in unseen or task in folded:   # committed: the stalled pilot may still append
                    with open(self.d("results") / f"released-{pilot}", "a") as journal:
                        journal.write(task + "\n")
                    continue
                token = _read(base / task)
                try:   # the token moves first: a claim that is gone (it committed after all) keeps its outputs
                    if (self.d("cancel") / task).exists():
                        os.replace(base / task, self.d("cancelled") / task)
                    else:
                        os.replace(base / task, self.d("ready") / task)
                        returned.append(task)
                except FileNotFoundError:
                    continue
                self._drop_outputs(token)
                if task not in returned:
                    continue
                with open(base / "returned", "a") as f:   # what went back, kept with the pilot
                    f.write(task + "\n")
            try:
                os.rename(base, self.d("ended") / pilot)
            except OSError:
                pass
        return returned

    def withdraw(self, tasks: Iterable[str]) -> Set[str]:
        """Waiting tasks out of the queue for good (those not waiting are held by a pilot, or ended); which."""
        self.make()
        return self.extract(tasks, "withdrawn")

    def hint(self, near: Dict[str, str]) -> int:
        """``near/<node>/<task>`` made for each waiting task -> node, and removed for every other (claimed,
        or no longer cached there); each hinted task taken out of its backlog chunk into ``ready/``, where
        that node's pilot claims it by name. How many hints there are now."""
        base = self.d("near")
        base.mkdir(exist_ok=True)
        for node in _entries(base):
            for task in _entries(base / node):
                if near.get(task) != node:
                    try:
                        os.unlink(base / node / task)
                    except FileNotFoundError:
                        pass
        for task, node in near.items():
            (base / node).mkdir(exist_ok=True)
            path = base / node / task
            if not path.exists():
                path.touch()
        if near:
            self.extract(near, "ready")
        return len(near)

    def cancel(self, tasks: Iterable[str]) -> None:
        """Waiting tasks cancelled at once; the others, unless committed, asked to stop (a pilot watches
        ``cancel/``; a task in a pilot's split meanwhile is claimed with the mark already there)."""
        tasks = list(tasks)
        gone = self.extract(tasks, "cancelled")
        for task in tasks:
            if task not in gone and not (self.d("done") / task).exists():
                (self.d("cancel") / task).touch()

    def view(self) -> Dict[str, Any]:
        """The pilots and the inputs in them as the queue shows them now (status, serve): no scheduler asked."""
        pilots: List[Dict[str, Any]] = []
        held: Dict[str, int] = {}
        for c in self.claims(("live",)):
            held[c.pilot] = held.get(c.pilot, 0) + 1
        for pilot in self.pilots("live"):
            info = _read(self.d("live") / pilot / "info").rstrip("\n").split("\t")
            info += [""] * (4 - len(info))
            state = "draining" if (self.d("live") / pilot / "draining").exists() else (
                "running" if held.get(pilot) else "idle")
            pilots.append({"pilot": pilot, "node": info[0], "slots": int(info[1] or 0), "state": state,
                           "inputs": held.get(pilot, 0), "ends": _local_time(info[3]) if info[3] else None})
        return {"pilots": pilots, "waiting": self.waiting_count(), "running": sum(held.values()),
                "done": len(set(self.committed_tasks())),
                "fenced": len(self.pilots("ended")) + len(self.pilots("fenced")),
                "paused": self.d("paused").exists(), "stopped": self.d("stop").exists()}

    def beat_changed(self, pilot: str, now: float) -> float:
        """Seconds since this pilot's heartbeat last changed, by this process's clock (skew-proof: the
        file's mtime is compared with itself, never with our time)."""
        try:
            mtime = os.stat(self.d("live") / pilot / "beat").st_mtime
        except FileNotFoundError:
            mtime = -1.0
        seen = self._leases.get(pilot)
        if seen is None or seen[0] != mtime:
            self._leases[pilot] = (mtime, now)
            return 0.0
        return now - seen[1]

    def _drop_outputs(self, token: str) -> None:
        """A fenced claim's outputs: never placed (its input runs again), so its directory goes."""
        fields = L.whole(token).rstrip("\n").split("\t")
        cid = (fields[1] if len(fields) >= 9 else fields[0]).strip()   # a result line: the commit was cut short
        if cid and "/" not in cid and cid not in (".", ".."):
            for outputs in self.locations():
                shutil.rmtree(Path(outputs) / CLAIMS_DIR / cid, ignore_errors=True)


def _move(src: Path, dest: Path) -> bool:
    try:
        os.rename(src, dest)
        return True
    except FileNotFoundError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
