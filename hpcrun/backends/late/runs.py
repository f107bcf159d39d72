"""The pieces of the pilot's agent that are not its loop: a claim's run of the job script and its inputs, the plan's
task table read at known places, process groups, and the count of metadata operations.

Standard library only: shipped beside the agent as ``bin/hpcrun_late_runs.py``. The claim's protocol with the job
script (templates/_shell.j2, ``claim_loop``): the agent writes ``item <task> <index> <claim id> <rows>`` and the rows
for each input, ``ready sums``, then ``go <n>`` for each one to start; the script (or the Python worker, direct.py)
answers ``begin <n> <pid> <start> [<pid its warning goes to>]``, the worker ``pid <n> <program's pid, 0 once gone>``,
then ``end <n> <exit> <end> <cpu s>`` on the fd ``HPCRUN_CLAIM_FEED``, first ``sums <algo> <outputs base>`` if the
agent is to sum its outputs (``Summer``: no process per output)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import marshal
import os
import queue
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Deque, Dict, List, Optional, Tuple, Union

if __package__:
    from hpcrun.backends.late import direct as D
    from hpcrun.backends.late import layout as L
else:   # the plan's bin/hpcrun_late_runs.py: the protocol is the copy beside it (the agent put its folder on the path)
    import hpcrun_late_direct as D  # type: ignore[no-redef]
    import hpcrun_late_layout as L  # type: ignore[no-redef]

CLAIM_S = 2.0         # the work a claim holds: as many inputs as take about this long, at least one
CLAIM_MAX = 64        # ... and at most this many
CLAIM_RUN = 1.5       # a claim that ran this many times CLAIM_S starts nothing more: its rest goes back
GIVE_BACK_S = 0.5     # an input running 4x the median, and at least this, sends its claim's rest back
RECENT = 50           # input times the claim's size is judged from (their median)


@dataclass
class ClaimPace:
    """How much a claim holds and how long its inputs not begun wait, from the pilot's last input times."""

    expected: float       # an input's time before any ended
    recent: Deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))

    def typical(self) -> float:
        """The median of the last input times, or the campaign's expected time before any ended."""
        return sorted(self.recent)[len(self.recent) // 2] if self.recent else float(self.expected)

    def size(self) -> int:
        return max(1, min(CLAIM_MAX, int(CLAIM_S / max(self.typical(), 0.001))))

    def ended(self, r: Running, t0: float, t1: float) -> None:
        """An input's time as its claim sees it: from the end of the one before in the claim (the loop's turn
        between them, at most 1 s of it), so that the node's load sizes claims too. The first input of a claim
        counts from its own start: the script's start is paid once a claim, and counted, it would keep claims of
        one input as small as they began."""
        self.recent.append(max(0.0, t1 - (max(min(r.last_end, t0), t0 - 1.0) if r.last_end else t0)))
        r.last_end = t1

    def give_back_at(self, r: Running) -> float:
        """When the running input has run long enough that the claim's inputs not begun should not wait for it."""
        late = r.at < 0 or r.fed >= len(r.items)
        return float("inf") if late else r.began + max(GIVE_BACK_S, 4 * self.typical())

    def spent(self, r: Running) -> bool:
        """The claim has run its share: it starts nothing more."""
        return time.monotonic() - r.batch_t0 >= CLAIM_RUN * CLAIM_S


@dataclass
class Item:
    """One input of a run: its task, claim id, job index and rows of tasks.tsv; its start once begun."""

    task: str
    cid: str
    idx: str
    rows: str
    t0: float = 0.0
    pid: int = 0        # its process group (the script's input, or a direct run's program while it runs)
    warn: int = 0       # the process its time limit's warning goes to (0: ``pid``; the direct worker names itself)
    termed: bool = False   # a direct run's worker was TERMed at the input's limit: KILLed at the next

    def kill(self, alone: bool = True) -> bool:
        """KILLed (its group; ``alone``: the process if that is gone); True where a direct run's worker is left to
        stop next: TERMed (it stops a program started unseen), then KILLed (``alone`` False: reaped, none left)."""
        if not self.warn or self.pid:
            group(self.pid, signal.SIGKILL, alone and not self.warn)   # a direct run's: its leader may be reaped
            self.pid = 0 if self.warn else self.pid
            return bool(self.warn)
        if alone:
            self.termed = not self.termed
            group(self.warn, signal.SIGTERM if self.termed else signal.SIGKILL, False)
        return alone and self.termed


@dataclass
class Running:
    """One run of the job script on a slot: a claim of one input or several, fed to it one at a time."""

    slot: int
    proc: subprocess.Popen
    items: List[Item]
    limit: int
    at: int = -1                  # the item running now (-1: none yet)
    warn_at: float = float("inf")
    kill_at: float = float("inf")
    began: float = 0.0            # monotonic start of the item running now
    state: str = ""               # CANCELLED or TIMEOUT once the pilot stopped the running item for that
    buf: bytes = b""
    fed: int = 0                  # items told to start
    begun: int = 0                # items that said they began (the last one: ``at`` until its end)
    ended: List[Tuple[Item, int, float, str, str]] = field(default_factory=list)   # item rc end cpu state
    out: int = -1                 # its result lines (begin, end) come on this pipe
    sums: Tuple[str, str] = ("", "")   # the algorithm and the claims' outputs base, when the agent sums the outputs
    batch_t0: float = field(default_factory=time.monotonic)
    last_end: float = 0.0         # the end of the claim's last input that ended (epoch; 0: none yet)

    @property
    def task(self) -> str:
        return self.items[self.at].task if self.at >= 0 else ""

    def tell(self, text: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(text.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass   # the script ended: its reaping says how

    def said(self) -> Tuple[bool, List[List[str]]]:
        """The lines the script wrote since the last look (split on tabs); False once its pipe ended."""
        try:
            data = os.read(self.out, 65536) if select.select([self.out], [], [], 0)[0] else b""
        except OSError:
            data = b""
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return bool(data), [line.decode(errors="replace").split("\t") for line in lines]

    def stop(self, sig: int) -> None:
        """The script and the input it runs (each leads a process group: its chains stop with it); once the script
        was reaped, only what is left of the groups (its pid, or its input's, may be another process's by now)."""
        alone = self.proc.returncode is None
        if self.at >= 0:
            group(self.items[self.at].pid, sig, alone and not self.items[self.at].warn)
        group(self.proc.pid, sig, alone)


def plan_dir(script: str) -> str:
    """The plan directory a job script names (its ``export HPCRUN_PLAN_DIR=`` line, shell-quoted), "" if none: a
    submission's script may be a copy in the queue (tagged), and a later generation's tasks are in its own plan."""
    for line in D.script_head(script).splitlines():
        if line.startswith("export HPCRUN_PLAN_DIR="):
            try:
                words = shlex.split(line[len("export HPCRUN_PLAN_DIR="):])
            except ValueError:
                return ""
            return words[0] if len(words) == 1 else ""
    return ""


def worker(script: str) -> Tuple[List[str], Dict[str, str]]:
    """How a claim of several inputs runs, and what its environment adds: the Python worker where the script carries
    a recipe and the worker is here, handed the recipe as read here (it parses no JSON), else the script's bash (as
    a claim of one input: a Python costs more to start than the script's two forks, docs/late-binding.md)."""
    mine = os.path.join(os.path.dirname(os.path.abspath(__file__)), D.WORKER)
    rec = D.recipe(script) if os.path.isfile(mine) and hasattr(os, "posix_spawn") else None   # Python 3.8 on
    if rec is None:
        return ["bash", script], {}
    text = marshal.dumps(rec).hex()
    return [sys.executable or "python3", "-I", "-S", mine, script], {D.RECIPE_ENV: text} if len(text) < 65536 else {}


def arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="a late-bound campaign's pilot agent (run by the pilot's batch script)")
    for name in ("queue", "pilot", "node", "rundir"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--slots", type=int, required=True)
    for name in ("ends", "idle-s", "beat-s", "drain-s", "claim-before", "steal-s", "input-s"):
        ap.add_argument(f"--{name}", type=float, required=True)
    ap.add_argument("--seat-dir", default="")
    ap.add_argument("--bb-root", default="")
    return ap.parse_args(argv)


def exit_status(status: int) -> int:
    """A wait status as ``subprocess`` gives it (``-signal`` when killed): os.waitstatus_to_exitcode, which a node's
    Python 3.7 or 3.8 lacks."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _read(path: Path) -> Optional[str]:
    """A queue file's text ("" if it is not there), None if it cannot be read (a hung mount's EIO)."""
    try:
        return L.read(path)
    except OSError:
        return None


def _number(path: Path) -> Optional[int]:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def flags(queue: Path, me: Path) -> Dict[str, object]:
    """What the supervisor says, read once a beat: the campaign's stop, a pause, the inputs' expected time, this
    pilot's end (a maintenance), the hints of inputs cached on nodes."""
    near = queue / "near"
    hinted = {t for n in L.entries(near) for t in L.entries(near / n)}
    return {"stop": (queue / "stop").exists(), "paused": (queue / "paused").exists(),
            "expected": _number(queue / "expected"), "until": _number(me / "until"), "hinted": hinted}


def time_short(stop_at: float, until: object, expected: object) -> Optional[str]:
    """Why no input may start now for lack of time before ``stop_at`` (the drain) or ``until`` (the cluster's
    maintenance), when an input takes ``expected`` seconds; None when it may."""
    if isinstance(until, int) and until < stop_at:
        stop_at = until
    left = stop_at - time.time()
    if float(expected) > left:   # type: ignore[arg-type]
        return (f"{left:.0f} s left before the drain or the cluster's maintenance, an input takes about "
                f"{expected} s: claiming nothing more")
    return None


Descriptor = Tuple[str, int, str, Tuple[List[str], Dict[str, str]]]   # script, limit, plan, worker and its env


def descriptor(queue: Path, qid: str, seat_dir: str) -> Optional[Descriptor]:
    """A submission's script (this cluster's copy), per-input limit, plan directory (``arrays/<qid>``) and the
    command that runs a claim of it (``worker``)."""
    fields = (_read(queue / "arrays" / qid) or "").split("\t")
    if len(fields) < 2 or not fields[1].strip().isdigit():
        return None
    script = fields[0]
    plan = plan_dir(script) or script.rpartition("/jobs/")[0]
    if seat_dir and "/jobs/" in script:   # the task names the first cluster's script
        head, _, tail = script.rpartition("/jobs/")
        mine = f"{head}/{seat_dir}jobs/{tail}"
        script = mine if os.path.exists(mine) else script
    return script, int(fields[1]), plan, worker(script)


def outputs_of(rows: str, base: str, plan: str, cid: str) -> Optional[Tuple[List[str], str, str]]:
    """An input's output names (its rows of tasks.tsv), the directory its claim wrote them to (under ``base``,
    as the job script's ``HPCRUN_OUTDIR``) and its run directory (``run/<job>/<claim id>``); None without rows."""
    rows_ = [row.split("\t") for row in rows.splitlines() if row.count("\t") >= 6]
    if not rows_ or not plan:
        return None
    return [r[6] for r in rows_], os.path.join(base, cid), os.path.join(plan, "run", rows_[0][1], cid)


class TaskTable:
    """A plan's tasks.tsv rows of a job, read where tasks.idx says they start (both files kept open): a claim's
    script then starts no process to find its rows, whatever the plan's size."""

    def __init__(self) -> None:
        self.open: Dict[str, Tuple[int, int, int, int]] = {}   # plan -> idx fd, tsv fd, line width, first index

    def rows(self, plan: str, idx: int) -> str:
        """The job's rows, or "" if they cannot be read (the script then finds them itself)."""
        try:
            if plan not in self.open:
                fi, ft = os.open(f"{plan}/tasks.idx", os.O_RDONLY), os.open(f"{plan}/tasks.tsv", os.O_RDONLY)
                self.open[plan] = (fi, ft, os.pread(fi, 64, 0).index(b"\n") + 1,
                                   int(os.pread(ft, 64, 0).split(b"\t")[0]))
            fi, ft, width, base = self.open[plan]
            off = int(os.pread(fi, width, (idx - base) * width))
            key, rest = f"{idx}\t".encode(), b""
            out: List[str] = []
            while True:   # block by block: a job of many inputs has rows beyond the first
                block = os.pread(ft, 65536, off)
                off += len(block)
                *lines, rest = (rest + block).split(b"\n")
                for line in lines:
                    if not line.startswith(key):
                        return "".join(out)
                    out.append(line.decode() + "\n")
                if not block:
                    return "".join(out) + (rest.decode() + "\n" if rest.startswith(key) else "")
        except (OSError, ValueError):
            return ""


CLAIM_HEADER = "# hpcrun claim "   # before each claim in its slot's log: the claims' ids (``hpcrun logs`` finds them)


def claim_log(rundir: Path, slot: int, cids: List[str]) -> IO[str]:
    """The slot's log, one for the pilot's life (a file per claim is an inode of the user's quota per input
    when inputs are long), opened to append, the claim's header written."""
    log = open(rundir / "claims" / f"{slot}.log", "a")
    log.write(CLAIM_HEADER + " ".join(cids) + "\n")
    log.flush()
    return log


def splitting(me: Path, prefixes: Tuple[str, ...]) -> bool:
    """Whether a split of a chunk is under way in ``me`` (its files named with these prefixes)."""
    try:
        return any(n.startswith(prefixes) for n in os.listdir(me))
    except FileNotFoundError:
        return False


def hand_back(me: Path, fenced: Path, prefixes: Tuple[str, ...]) -> Optional[int]:
    """A leaving pilot's directory renamed to ``fenced`` as a whole (the supervisor returns its claims) when it holds
    claims or a split under way (files named with ``prefixes``), else removed; how many claims it handed back (None:
    it held none, or the rename failed)."""
    held = [n for n in os.listdir(me) if "_" in n and not n.startswith(".")] if me.is_dir() else []
    if held or splitting(me, prefixes):
        try:
            os.rename(me, fenced)
        except OSError:   # whatever it is, the pilot still leaves: the supervisor fences it by its job's end
            return None
        return len(held)
    if me.is_dir():
        shutil.rmtree(me, ignore_errors=True)
    return None


def append_line(path: str, line: str) -> None:
    """One line appended (a pilot's journal: the tasks it committed, for the supervisor)."""
    with open(path, "a") as f:
        f.write(line + "\n")


def rename(src: Union[str, Path], dest: Union[str, Path]) -> bool:
    try:
        os.rename(src, dest)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False


def unlink(path: Union[str, Path]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def cancel(item: Item) -> None:
    """An operator's cancel of a running input: its worker told first (a direct run), then its group TERMed."""
    if item.warn:
        with contextlib.suppress(OSError):
            os.kill(item.warn, signal.SIGUSR2)
    group(item.pid, signal.SIGTERM, not item.warn)


group, alive = D.group, D.alive   # (the worker signals its program the same way)


METADATA = ("rename", "replace", "link", "unlink", "listdir", "scandir", "stat", "lstat", "utime", "mkdir", "rmdir")


def count_ops(counts: Dict[str, int]) -> None:
    """Every metadata operation of this process counted (a file opened, renamed, linked, listed...): the figure
    benchmarks/late_binding.py prints per input. Installed in the agent's own process only."""
    import builtins

    def counted(name: str, real):  # type: ignore[no-untyped-def]
        def call(*a, **k):  # type: ignore[no-untyped-def]
            counts[name] = counts.get(name, 0) + 1
            return real(*a, **k)
        return call
    for name in METADATA:
        setattr(os, name, counted(name, getattr(os, name)))
    builtins.open = counted("open", builtins.open)


def shares(tasks: List[str], slots: int) -> List[List[str]]:
    """A claim for several free slots dealt out evenly, in order: each slot one share, no share empty (fewer
    tasks than slots: one each, the other slots left free)."""
    n = min(slots, len(tasks))
    base, extra = divmod(len(tasks), n) if n else (0, 0)
    out, at = [], 0
    for k in range(n):
        size = base + (1 if k < extra else 0)
        out.append(tasks[at:at + size])
        at += size
    return out


# A claim's script leads a process group of its own (a signal to the group reaches its inputs and chains), in the
# pilot's session: a session of its own would make it a scheduling group of its own where the kernel groups by session
# (autogroup), so a pilot of 8 slots would weigh as 8 jobs against the node's other processes (and, on the test
# cluster, against the login node's supervisor). Python before 3.11 cannot make a group alone safely with threads
# running: a session there, as before.
OWN_GROUP: Dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
SUMS = ("sha256", "md5", "adler32")   # what the agent sums itself (the plan's provenance algorithm, else the job does)
CHUNK = 1 << 20


def file_sum(path: str, algo: str) -> str:
    """A file's sum as the job's programs print it (hex, lower case): read 1 MiB at a time, the GIL let go."""
    with open(path, "rb") as f:
        if algo == "adler32":
            value = 1
            while True:
                block = f.read(CHUNK)
                if not block:
                    return f"{value:08x}"
                value = zlib.adler32(block, value)
        h = hashlib.new(algo)
        while True:
            block = f.read(CHUNK)
            if not block:
                return h.hexdigest()
            h.update(block)


def outputs_tsv(names: List[str], outdir: str, algo: str) -> Tuple[str, str]:
    """``outputs.tsv`` of an input that succeeded, as the job writes it (each output there: name, size, sum; a sum
    that cannot be made left empty), and what could not be read (for ``checksums.log``). OSError: no ``outdir``."""
    if not os.path.isdir(outdir):
        raise FileNotFoundError(errno.ENOENT, "its outputs' directory is not there", outdir)
    lines, errors = [], []
    for name in names:
        path = os.path.join(outdir, name)
        if not os.path.isfile(path):
            continue
        size = value = ""
        try:
            size = str(os.stat(path).st_size)
            value = f"{algo}:{file_sum(path, algo)}"
        except OSError as e:
            errors.append(f"{path}: {e.strerror or e}\n")
        lines.append(f"{name}\t{size}\t{value}\n")
    return "".join(lines), "".join(errors)


class Summer:
    """Outputs summed in threads of the agent, the commit left to the loop once written: a big output holds neither
    the loop (the lease, other slots) nor a process per output. An input's sum goes to an idle thread, or a new one
    when none is idle, so no input waits behind another's; threads are kept for the next inputs (starting one an
    input held the loop until it ran: 1 ms an input on a loaded node). ``wake``: written when one is done."""

    def __init__(self, wake: int) -> None:
        self.wake = wake
        self.pending = 0
        self.done: Deque[Tuple[Any, Optional[str]]] = deque()
        self.jobs: queue.SimpleQueue[Tuple[Any, ...]] = queue.SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()

    def start(self, then: Any, names: List[str], outdir: str, rundir: str, algo: str) -> None:
        self.pending += 1
        job = (then, names, outdir, rundir, algo)
        with self.lock:
            spawn = self.idle == 0
            self.idle -= 0 if spawn else 1
        if spawn:
            threading.Thread(target=self._work, args=(job,), daemon=True).start()
        else:
            self.jobs.put(job)

    def _work(self, job: Tuple[Any, ...]) -> None:
        while True:
            self._run(*job)
            with self.lock:
                self.idle += 1
            job = self.jobs.get()   # handed to it by start(), which counted it idle no more

    def _run(self, then: Any, names: List[str], outdir: str, rundir: str, algo: str) -> None:
        why: Optional[str] = None
        try:
            text, errors = outputs_tsv(names, outdir, algo)
            with open(os.path.join(rundir, "outputs.tsv"), "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
            if errors:
                with open(os.path.join(rundir, "checksums.log"), "a", encoding="utf-8", errors="surrogateescape") as f:
                    f.write(errors)
        except OSError as e:
            why = f"its outputs' record could not be written in {rundir}: {e.strerror or e} ({e.filename or rundir})"
        except Exception as e:   # whatever it is, the input is settled (else it would hold its pilot to the end)
            why = f"its outputs could not be summed: {e!r}"
        finally:
            self.done.append((then, why))
            try:
                os.write(self.wake, b"s")
            except OSError:
                pass

    def finished(self, each: Callable[[Any, Optional[str]], None]) -> None:
        """``each(then, why)`` for every sum written since the last look (``why``: it could not be)."""
        while self.done:
            then, why = self.done.popleft()
            self.pending -= 1
            each(then, why)
