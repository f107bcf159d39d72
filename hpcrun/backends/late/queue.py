"""The queue of a late-bound campaign: files on the shared filesystem, moved by rename(2) alone.

Atomic on the shared filesystems compute nodes see (no server, no network from a node), as PanDA's Yoda
hands out event ranges. The layout (the pilot's side is templates/pilot.sh.j2):

  queue/arrays/<qid>          one per submission: the script, the per-input time limit, the tag, its
                              indices, the outputs location of its generation
  queue/ready/<qid>_<i>       a task nobody holds
  queue/live/<pilot>/         a running pilot: ``beat`` (renewed), ``info``, its claims <qid>_<i>
  queue/fenced/<pilot>/       a pilot the supervisor gave up on (ended, or its lease expired):
                              renamed as a whole, so its claims can no longer commit
  queue/ended/<pilot>/        after its claims were returned
  queue/done/<qid>_<i>        a committed result (one TSV line; a twelfth field once its outputs were
                              moved into place: ``placed``, or ``unplaced:<why>``)
  queue/cancel/<qid>_<i>      an operator's cancel of a running task; cancelled/: of a waiting one
  queue/withdrawn/<qid>_<i>   a task nobody had claimed when a new generation was planned (its input runs
                              under that generation)
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
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

STATES = ("ready", "live", "fenced", "ended", "done", "cancelled", "cancel", "arrays", "withdrawn")
CLAIMS_DIR = ".hpcrun-claims"   # under an outputs location: each claim's outputs until they are placed
PLACED = "placed"               # the done record's twelfth field: the committed claim's outputs are in place
UNPLACED = "unplaced:"          # ... or they could not be moved (why): the input failed, exit 12
PLACE_EXIT = 12

def _entries(path: Path) -> List[str]:
    try:
        return [n for n in os.listdir(path) if not n.startswith(".")]
    except FileNotFoundError:
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return ""


def _write_new(path: Path, text: str) -> None:
    """A file that appears whole (written under a temporary name, renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


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
        self._leases: Dict[str, Tuple[float, float]] = {}   # pilot -> (beat mtime seen, when it changed: our clock)

    def make(self) -> None:
        for d in STATES:
            (self.root / d).mkdir(parents=True, exist_ok=True)

    def d(self, name: str) -> Path:
        return self.root / name

    # -- putting work in -------------------------------------------------------------------
    def enqueue(self, qid: str, script: str, indices: Sequence[int], walltime_s: int, tag: str,
                outputs: str = "") -> None:
        """The submission's descriptor first, then a ready file per task (a task is in exactly one place
        from then on; ``repair`` completes an enqueue cut short). ``outputs``: the location its claims'
        outputs are placed in (a generation may change it while earlier pilots run)."""
        self.make()
        self.remember(outputs)   # before any claim can write under it
        _write_new(self.d("arrays") / qid,
                   f"{script}\t{walltime_s}\t{tag}\t{','.join(map(str, indices))}\t{outputs}\n")
        for i in indices:
            (self.d("ready") / f"{qid}_{i}").touch()
        (self.d("arrays") / f".{qid}.complete").touch()

    def descriptor(self, qid: str) -> Optional[Tuple[str, int, str, List[int]]]:
        desc = self.submission(qid)
        return None if desc is None else desc[:4]

    def submission(self, qid: str) -> Optional[Tuple[str, int, str, List[int], str]]:
        """A submission's descriptor, read once: script, per-input limit, tag, indices, and the outputs
        location its claims are placed in ("": not recorded)."""
        fields = _read(self.d("arrays") / qid).rstrip("\n").split("\t")
        if len(fields) < 4:
            return None
        outputs = fields[4] if len(fields) > 4 else ""
        return fields[0], int(fields[1]), fields[2], [int(i) for i in fields[3].split(",") if i], outputs

    def repair(self) -> int:
        """Tasks of a submission whose enqueue was cut short put in ``ready/``; how many."""
        made = 0
        arrays = self.d("arrays")
        for qid in _entries(arrays):
            if qid.endswith(".sh") or (arrays / f".{qid}.complete").exists():
                continue
            desc = self.descriptor(qid)
            if desc is None:
                continue
            placed = self.placed()
            for i in desc[3]:
                if f"{qid}_{i}" not in placed:
                    (self.d("ready") / f"{qid}_{i}").touch()
                    made += 1
            (arrays / f".{qid}.complete").touch()
        return made

    def placed(self) -> Dict[str, str]:
        """Every task the queue holds -> where (ready, a pilot's dir, done, cancelled, withdrawn). Read in
        the order pilots move tasks (ready -> live -> fenced -> done), so a task moved meanwhile is met
        again further on, never missed; the moves back (release, withdraw, cancel) are the caller's own."""
        where: Dict[str, str] = {t: "ready" for t in _entries(self.d("ready"))}
        for c in self.claims():
            where.setdefault(c.task, f"claimed:{c.pilot}")
        for state in ("done", "cancelled", "withdrawn"):
            where.update((t, state) for t in _entries(self.d(state)) if t not in where)
        return where

    # -- reading pilots and claims ---------------------------------------------------------
    def write_expected(self, input_s: float) -> None:
        """``expected``: the longest of the last inputs' times (with a quarter more), or the spec's
        per-input time before any ended; a pilot claims only what its time left covers."""
        times: List[float] = []
        done = self.d("done")
        for name in _entries(done)[-200:]:
            res = _read(done / name).split("\t")
            if len(res) > 8 and res[8] == "COMPLETED" and res[5] and res[6]:
                times.append(epoch(res[6]) - epoch(res[5]))
        value = max(times) * 1.25 if times else input_s
        _write_new(self.root / "expected", f"{int(math.ceil(value))}\n")

    def pilots(self, state: str = "live") -> List[str]:
        return _entries(self.d(state))

    def claims(self, states: Sequence[str] = ("live", "fenced")) -> Iterator[Claim]:
        for state in states:
            for pilot in self.pilots(state):
                base = self.d(state) / pilot
                info = _read(base / "info").split("\t")
                node = info[0] if info and info[0] else ""
                for name in _entries(base):
                    if name.endswith(".commit"):
                        name = name[:-len(".commit")]
                    if "_" not in name or "." in name:
                        continue
                    fields = (_read(base / name) or _read(base / f"{name}.commit")).rstrip("\n").split("\t")
                    if len(fields) >= 9:   # the result line, written just before the commit's rename
                        fields = [fields[1], fields[3], fields[4], fields[5]]
                    fields += [""] * (4 - len(fields))
                    yield Claim(name, pilot, fields[0] or name, fields[1], fields[2] or node, fields[3])

    def result(self, task: str) -> Optional[List[str]]:
        text = _read(self.d("done") / task).rstrip("\n")
        return text.split("\t") if text else None

    def committed(self, task: str, outputs: str) -> Optional[List[str]]:
        """A task's committed result with its outputs in place (placed now if they were not yet): the
        record's twelve fields and, thirteenth, why the input failed after its commit ("" if it did not).
        ``outputs``: its submission's outputs location, looked at first."""
        res = self.result(task)
        if res is None:
            return None
        res = (res + [""] * 12)[:12]
        if not res[11]:
            res = self.place(task, res, [outputs] + [o for o in self.locations() if o != outputs])
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
        for outputs in filter(None, locations):
            private = Path(outputs) / CLAIMS_DIR / result[1]
            if os.path.isdir(private):
                why = move_tree(private, Path(outputs))
                mark = PLACED if why is None else f"{UNPLACED}{why} (kept in {private})"
                break
        now = self.result(task) or []
        if len(now) > 11 and now[11]:   # another reader marked it meanwhile: its mark stands
            return (now + [""] * 12)[:12]
        _write_new(self.d("done") / task, "\t".join(result + [mark]) + "\n")
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
        """Every claim of a fenced pilot back in ``ready/`` (none counts as an attempt); the pilot to ``ended/``."""
        returned: List[str] = []
        for pilot in self.pilots("fenced"):
            base = self.d("fenced") / pilot
            for name in _entries(base):
                task = name[:-len(".commit")] if name.endswith(".commit") else name
                if "_" not in task or "." in task or (self.d("done") / task).exists():
                    continue
                token = _read(base / name)
                try:   # the token moves first: a claim that is gone (it committed after all) keeps its outputs
                    if (self.d("cancel") / task).exists():
                        os.replace(base / name, self.d("cancelled") / task)
                    else:
                        os.replace(base / name, self.d("ready") / task)
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

    def withdraw(self, task: str) -> bool:
        """A waiting task out of the queue for good (False: a pilot holds it, or it ended)."""
        self.make()
        try:
            os.rename(self.d("ready") / task, self.d("withdrawn") / task)
            return True
        except FileNotFoundError:
            return False

    def hint(self, near: Dict[str, str]) -> int:
        """``near/<node>/<task>`` made for each waiting task -> node, and removed for every other (claimed,
        or no longer cached there); how many hints there are now."""
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
        return len(near)

    def cancel(self, task: str) -> None:
        """A waiting task cancelled at once; a running one asked to stop (its pilot watches ``cancel/``)."""
        try:
            os.rename(self.d("ready") / task, self.d("cancelled") / task)
        except FileNotFoundError:
            if not (self.d("done") / task).exists():
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
        return {"pilots": pilots, "waiting": len(_entries(self.d("ready"))), "running": sum(held.values()),
                "done": len(_entries(self.d("done"))), "fenced": len(self.pilots("ended")) + len(self.pilots("fenced")),
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
        fields = token.rstrip("\n").split("\t")
        cid = (fields[1] if len(fields) >= 9 else fields[0]).strip()   # a result line: the commit was cut short
        if cid and "/" not in cid and cid not in (".", ".."):
            for outputs in self.locations():
                shutil.rmtree(Path(outputs) / CLAIMS_DIR / cid, ignore_errors=True)


def move_tree(src: Path, dest: Path) -> Optional[str]:
    """Every entry of ``src`` renamed into ``dest`` (a directory there already is merged into), then ``src``
    removed; None, or why a move failed (what did not move stays in ``src``)."""
    try:
        names = sorted(os.listdir(src))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{src}: {exc.strerror}"
    for name in names:
        s, d = src / name, dest / name
        if s.is_dir() and not s.is_symlink() and d.is_dir() and not d.is_symlink():
            why = move_tree(s, d)
            if why is not None:
                return why
            continue
        try:
            os.replace(s, d)
        except FileNotFoundError:
            if not os.path.lexists(s):   # moved by another reader meanwhile
                continue
            return f"{s} -> {d}: No such file or directory"
        except OSError as exc:
            return f"{s} -> {d}: {exc.strerror}"
    try:
        os.rmdir(src)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"{src}: {exc.strerror}"
    return None



@dataclass(frozen=True)
class Held:
    """What the pilots hold so far, for the forecast: core-seconds held (running pilots until now), and the
    slots of the pilots running now. Read from the pilots' own files only (never the per-input results: a
    forecast is made every round)."""

    core_s: float
    live_slots: int


def held(queue: Path, run_dir: Path, chains: int, now: float) -> Held:
    """The pilots' core-seconds: ended ones from their own record, live ones from their start until ``now``."""
    q = Queue(queue)
    core_s = 0.0
    for p in (run_dir / "pilots").glob("*/pilot.tsv"):
        own = _read(p).split("\t")
        if len(own) >= 4 and _float(own[2]) is not None and _float(own[3]) is not None:
            core_s += (float(own[3]) - float(own[2])) * _int(own[1]) * chains
    slots = 0
    for pilot in q.pilots("live"):
        info = _read(q.d("live") / pilot / "info").split("\t")
        if len(info) >= 3 and _float(info[2]) is not None and not (run_dir / "pilots" / pilot / "pilot.tsv").exists():
            slots += _int(info[1])
            core_s += max(0.0, now - float(info[2])) * _int(info[1]) * chains
    return Held(core_s, slots)


def figures(queue: Path, run_dir: Path, chains: int) -> Dict[str, Any]:
    """The pilots' figures for the report: payload copies, inputs run, the core-seconds they held and how
    much of it was idle (before the first input, starved between inputs, the drain tail), and the inputs'
    CPU time against the pilots' own from the accounting."""
    q = Queue(queue)
    claims: Dict[str, List[Tuple[float, float, Optional[float]]]] = {}
    for name in _entries(q.d("done")):
        r = _read(q.d("done") / name).rstrip("\n").split("\t")
        if len(r) >= 10 and r[5] and r[6]:
            claims.setdefault(r[2], []).append((epoch(r[5]), epoch(r[6]), _seconds(r[9])))
    acct = {line.split("\t")[0]: line.split("\t") for line in _read(queue / "pilots.tsv").splitlines()}
    out: Dict[str, Any] = {"pilots": 0, "payload_copies": 0, "inputs_run": sum(len(v) for v in claims.values()),
                           "core_s_held": 0.0, "core_s_busy": 0.0, "idle_core_s": {"start": 0.0, "starved": 0.0,
                                                                                    "drain_tail": 0.0},
                           "input_cpu_s": 0.0, "pilots_cpu_s": 0.0, "pilots_by_state": {}}
    pilots = sorted(p for p in (run_dir / "pilots").glob("*") if p.is_dir()) if (run_dir / "pilots").is_dir() else []
    for p in pilots:
        out["pilots"] += 1
        copies = _read(p / "payload-copies").strip()
        out["payload_copies"] += int(copies) if copies.isdigit() else 0
        own = _read(p / "pilot.tsv").split("\t")
        if len(own) < 4:   # still running (or it ended without its record): held from its start until now
            own = _read(q.d("live") / p.name / "info").rstrip("\n").split("\t")[:3] + [f"{time.time():.3f}"]
        mine = sorted(claims.get(p.name, []))
        cpus = _int(own[1]) * chains if len(own) > 1 else 0
        start = _float(own[2]) if len(own) > 2 else None
        end = _float(own[3]) if len(own) > 3 else None
        a = acct.get(p.name)
        if a and len(a) >= 7:
            state = a[1]
            out["pilots_by_state"][state] = out["pilots_by_state"].get(state, 0) + 1
            out["pilots_cpu_s"] += _float(a[5]) or 0.0
        if start is None or end is None or not cpus:
            continue
        held = (end - start) * cpus
        busy = sum((e - s) for s, e, _c in mine) * chains
        out["core_s_held"] += held
        out["core_s_busy"] += busy
        out["input_cpu_s"] += sum(c or 0.0 for _s, _e, c in mine)
        head = ((mine[0][0] - start) if mine else (end - start)) * cpus
        tail = ((end - max(e for _s, e, _c in mine)) * cpus) if mine else 0.0
        out["idle_core_s"]["start"] += max(0.0, head)
        out["idle_core_s"]["drain_tail"] += max(0.0, tail)
        out["idle_core_s"]["starved"] += max(0.0, held - busy - max(0.0, head) - max(0.0, tail))
    out["idle_core_s"] = {k: round(v, 1) for k, v in out["idle_core_s"].items()}
    for k in ("core_s_held", "core_s_busy", "input_cpu_s", "pilots_cpu_s"):
        out[k] = round(out[k], 1)
    out["idle_share"] = round(1 - out["core_s_busy"] / out["core_s_held"], 3) if out["core_s_held"] else None
    return out


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _float(text: str) -> Optional[float]:
    try:
        return epoch(text)
    except ValueError:
        return None


def _seconds(text: str) -> Optional[float]:
    """The pilot's ``user+system`` seconds -> their sum (None when the timer said nothing)."""
    try:
        return sum(epoch(x) for x in text.split("+")) if text else None
    except ValueError:
        return None
