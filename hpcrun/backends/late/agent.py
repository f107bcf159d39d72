"""The pilot's agent: one Python process per pilot that claims tasks, runs them and commits their results.

Standard library only; the plan ships it as ``bin/hpcrun-pilot.py`` beside ``bin/hpcrun_late_layout.py`` (the
queue's protocol, layout.py), and the pilot's batch script (templates/pilot.sh.j2) runs it once the node's
database server is up. One loop holds every slot: a claim is a few renames and no process, an input is one
child (its array script, in a session of its own so a signal reaches its chains), its time limit a deadline
in the loop, its CPU time and peak memory from ``os.wait4``. Why one process: docs/decisions/backends.md.

Rules kept from the protocol (hpcrun/backends/late/queue.py): a claim is a task file in the pilot's own
directory ``live/<pilot>/``; the commit is one link(2) of it into ``done/``, then its name appended to the
pilot's journal ``results/<pilot>``; a pilot whose directory is gone (fenced) commits nothing and stops.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

if __package__:
    from hpcrun.backends.late import layout as L
else:   # run as the plan's bin/hpcrun-pilot.py: the protocol is the copy beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hpcrun_late_layout as L  # type: ignore[no-redef]

NAPS = (0.2, 0.5, 1.0, 2.0, 5.0)   # the queue looked at soon after a miss, then less and less often
STOP_WAIT_S = 15.0                 # a claim's script TERMed on the way out, KILLed after this


@dataclass
class Running:
    """An input this pilot runs now."""

    task: str
    cid: str
    slot: int
    proc: subprocess.Popen
    t0: float
    warn_at: float
    kill_at: float
    state: str = ""               # CANCELLED or TIMEOUT once the pilot stopped it for that


@dataclass
class Agent:
    queue: Path
    pilot: str
    node: str
    slots: int
    ends: float
    idle_s: float
    beat_s: float
    drain_s: float
    claim_before: float
    steal_s: float
    input_s: float
    seat_dir: str
    rundir: Path
    bb_root: str = ""
    running: Dict[int, Running] = field(default_factory=dict)
    claims_made: int = 0
    draining: bool = False
    stopping: str = ""            # why the pilot stops ("": it does not)
    idle_since: float = field(default_factory=time.monotonic)
    nap: int = 0
    next_look: float = 0.0
    next_beat: float = 0.0
    flags: Dict[str, object] = field(default_factory=dict)   # stop, paused, expected, until, hinted: per beat
    scripts: Dict[str, Tuple[str, int]] = field(default_factory=dict)

    @property
    def me(self) -> Path:
        return self.queue / "live" / self.pilot

    def log(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp} pilot[{self.pilot}]: {text}", file=sys.stderr, flush=True)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_drain)
        (self.rundir / "claims").mkdir(parents=True, exist_ok=True)
        while True:
            self._reap()
            now = time.monotonic()
            if now >= self.next_beat:
                self._beat()
                self.next_beat = now + self.beat_s
            if self.stopping:
                break
            self._limits(now)
            if now >= self.next_look:
                self._fill()
            if not self.running and not self._may_claim() and self._done_for_good():
                break
            if not self.running and time.monotonic() - self.idle_since >= self.idle_s:
                self.log(f"nothing to claim for {self.idle_s:.0f} s: released")
                break
            timeout = min([self.next_beat, self.next_look] + [r.warn_at for r in self.running.values()]
                          + [r.kill_at for r in self.running.values()]) - time.monotonic()
            if select.select([wake_r], [], [], max(0.0, min(timeout, 5.0)))[0]:
                os.read(wake_r, 512)
        return self._leave()

    def _on_term(self, *_: object) -> None:
        if not self.stopping:
            self.stopping = "cancelled (SIGTERM): its claims return to the queue"

    def _on_drain(self, *_: object) -> None:
        if not self.draining:
            self.draining = True
            try:
                (self.me / "draining").touch()
            except OSError:
                pass
            self.log("drain signal: claiming nothing more; running inputs finish")

    def _done_for_good(self) -> bool:
        return self.draining or bool(self.flags.get("stop")) or self._left() is not None

    def _left(self) -> Optional[str]:
        """Why no input may start now for lack of time (the drain, a maintenance window), or None."""
        stop_at = self.ends - self.drain_s
        until = self.flags.get("until")
        if isinstance(until, int) and until < stop_at:
            stop_at = until
        expected = self.flags.get("expected") or self.input_s
        left = stop_at - time.time()
        if float(expected) > left:   # type: ignore[arg-type]
            return (f"{left:.0f} s left before the drain or the cluster's maintenance, an input takes about "
                    f"{expected} s: claiming nothing more")
        return None

    def _may_claim(self) -> bool:
        return not (self.draining or self.stopping or self.flags.get("stop") or self.flags.get("paused"))

    # -- the lease, and what the supervisor says -----------------------------------------------------------
    def _beat(self) -> None:
        """The lease renewed; the queue's flags read (once a beat, not once a claim); operators' cancels done.
        A pilot whose directory is gone was fenced: it stops."""
        try:
            os.utime(self.me / "beat")
        except FileNotFoundError:
            self.stopping = "fenced: its claims were returned to the queue"
            return
        q = self.queue
        self.flags["stop"] = (q / "stop").exists()
        self.flags["paused"] = (q / "paused").exists()
        expected = L.read(q / "expected").strip()
        self.flags["expected"] = int(expected) if expected.isdigit() else None
        until = L.read(self.me / "until").strip()
        self.flags["until"] = int(until) if until.isdigit() else None
        self.flags["hinted"] = {t for n in L.entries(q / "near") for t in L.entries(q / "near" / n)}
        cancels = set(L.entries(q / "cancel"))
        for r in self.running.values():
            if r.task in cancels and not r.state:
                r.state = "CANCELLED"
                _signal(r.proc, signal.SIGTERM)
        if self.flags["stop"] and not self.running:
            self.log("the campaign is done: nothing to claim")

    def _limits(self, now: float) -> None:
        """Each input's own time limit, as its array task would have it: the warning signal, then the end."""
        for r in self.running.values():
            if now >= r.kill_at:
                r.state, r.kill_at, r.warn_at = "TIMEOUT", float("inf"), float("inf")
                _signal(r.proc, signal.SIGKILL)
            elif now >= r.warn_at:
                r.warn_at = float("inf")
                try:
                    os.kill(r.proc.pid, signal.SIGUSR1)   # the script's alone: it passes it on to its chains
                except ProcessLookupError:
                    pass

    # -- claiming ----------------------------------------------------------------------------------------
    def _fill(self) -> None:
        free = [s for s in range(self.slots) if s not in self.running]
        if not free or not self._may_claim():
            self.next_look = time.monotonic() + NAPS[self.nap]
            return
        why = self._left()
        if why is not None:
            if not self.running:
                self.log(why)
            self.draining = True
            return
        for slot in free:
            if self.stopping:
                return
            task = self._claim()
            if task is None:
                self.next_look = time.monotonic() + NAPS[self.nap]
                self.nap = min(self.nap + 1, len(NAPS) - 1)
                return
            self.nap = 0
            self.idle_since = time.monotonic()
            self._start(task, slot)
            if slot not in self.running:   # not started (no descriptor, cancelled): look again later
                return
        self.next_look = time.monotonic() + 0.05

    def _claim(self) -> Optional[str]:
        """The next task: one this node's cache holds (a hint under its short name), a single waiting one
        (returned, or hinted to a node whose pilot left it long enough), or the first of a backlog chunk."""
        q, me = self.queue, self.me
        for task in L.entries(q / "near" / self.node.split(".")[0]):
            if _rename(q / "ready" / task, me / task):
                return task
        hinted = self.flags.get("hinted") or set()
        stealing = time.monotonic() - self.idle_since >= self.steal_s
        for task in L.shuffled(L.entries(q / "ready"))[:8]:
            if (stealing or task not in hinted) and _rename(q / "ready" / task, me / task):  # type: ignore[operator]
                return task
        for name in L.shuffled(L.entries(q / "backlog"))[:8]:
            try:
                got = L.split(q / "backlog", name, me, L.pick_first, lambda t: me / t)
            except OSError:   # our directory is gone: fenced (the supervisor settles the split)
                self.stopping = "fenced: its claims were returned to the queue"
                return None
            if got:
                return got[0]
        return None

    def _start(self, task: str, slot: int) -> None:
        qid, _, idx = task.rpartition("_")
        cid = f"{self.pilot}.{slot}.{self.claims_made}"
        self.claims_made += 1
        desc = self._descriptor(qid)
        if desc is None:
            self.log(f"no descriptor for {task}: returned")
            _rename(self.me / task, self.queue / "ready" / task)
            self.next_look = time.monotonic() + 5   # not claimed again at once
            return
        if (self.queue / "cancel" / task).exists():   # cancelled while it was in a split: never started
            _rename(self.me / task, self.queue / "cancelled" / task)
            return
        script, limit = desc
        t0 = time.time()
        env = dict(os.environ, HPCRUN_CLAIM_ID=cid, HPCRUN_CLAIM_INDEX=idx)
        with open(self.rundir / "claims" / f"{cid}.log", "w") as out:
            proc = subprocess.Popen(["bash", script], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        try:
            L.write_new(self.me / task, f"{cid}\t{slot}\t{self.node}\t{t0:.6f}\t{proc.pid}\n")
        except OSError:   # fenced meanwhile: the input runs elsewhere, this run is stopped at once
            self.stopping = "fenced: its claims were returned to the queue"
            _signal(proc, signal.SIGKILL)
        # the input's own time limit as its array task would have it: the pre-timeout signal, then the end
        warn = time.monotonic() + (limit - self.claim_before if limit > self.claim_before else limit)
        self.running[slot] = Running(task, cid, slot, proc, t0, warn, warn + self.claim_before)

    def _descriptor(self, qid: str) -> Optional[Tuple[str, int]]:
        """A submission's script (this cluster's copy) and per-input limit, read once."""
        if qid not in self.scripts:
            fields = L.read(self.queue / "arrays" / qid).split("\t")
            if len(fields) < 2 or not fields[1].strip().isdigit():
                return None
            script = fields[0]
            if self.seat_dir and "/jobs/" in script:   # the task names the first cluster's script
                head, _, tail = script.rpartition("/jobs/")
                mine = f"{head}/{self.seat_dir}jobs/{tail}"
                script = mine if os.path.exists(mine) else script
            self.scripts[qid] = (script, int(fields[1]))
        return self.scripts[qid]

    # -- results -------------------------------------------------------------------------------------------
    def _reap(self) -> None:
        while self.running:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            r = next((x for x in self.running.values() if x.proc.pid == pid), None)
            if r is None:
                continue
            r.proc.returncode = os.waitstatus_to_exitcode(status)
            del self.running[r.slot]
            self.idle_since = time.monotonic()
            if self.stopping:   # its claim goes back to the queue: no result
                continue
            self._commit(r, status, usage)

    def _commit(self, r: Running, status: int, usage: os.struct_rusage) -> None:  # type: ignore[name-defined]
        rc = os.waitstatus_to_exitcode(status)
        rc = 128 - rc if rc < 0 else rc
        state = r.state or ("COMPLETED" if rc == 0 else "FAILED")
        line = "\t".join([r.task, r.cid, self.pilot, str(r.slot), self.node, f"{r.t0:.6f}", f"{time.time():.6f}",
                          str(rc), state, f"{usage.ru_utime:.3f}+{usage.ru_stime:.3f}", str(usage.ru_maxrss)])
        token, done = self.me / r.task, self.queue / "done" / r.task
        try:
            with open(token, "w") as f:
                f.write(line + "\n")
            os.link(token, done)       # the commit: fails once fenced, never replaces a result
        except OSError:
            if done.exists():   # committed by an earlier claim: named in the journal again, so that commit is read
                _unlink(token)
                with open(self.queue / "results" / self.pilot, "a") as journal:
                    journal.write(r.task + "\n")
            self.log(f"claim {r.cid} of {r.task} was taken from this pilot: its result is dropped, its outputs "
                     "never placed")
            return
        with open(self.queue / "results" / self.pilot, "a") as journal:   # what changed, for the supervisor
            journal.write(r.task + "\n")
        _unlink(token)
        if self.bb_root:
            shutil.rmtree(os.path.join(self.bb_root, "claims", r.cid), ignore_errors=True)
        self.log(f"slot {r.slot}: {r.task} ({r.cid}) {state}, exit {rc}")

    # -- the way out ---------------------------------------------------------------------------------------
    def _leave(self) -> int:
        """Running inputs stopped (TERM, KILL after STOP_WAIT_S) before their claims go back, lest one write on
        while its input runs again elsewhere; then the pilot's directory leaves live/ as a whole."""
        if self.stopping:
            self.log(self.stopping)
        for r in self.running.values():
            _signal(r.proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while self.running and time.monotonic() < deadline:
            for r in list(self.running.values()):
                if r.proc.poll() is not None:
                    del self.running[r.slot]
            time.sleep(0.1)
        for r in self.running.values():
            _signal(r.proc, signal.SIGKILL)
            r.proc.wait()
        held = [n for n in os.listdir(self.me) if "_" in n and not n.startswith(".")] if self.me.is_dir() else []
        if held or _splitting(self.me):
            try:
                os.rename(self.me, self.queue / "fenced" / self.pilot)
                self.log(f"its {len(held)} claim(s) handed back to the queue")
            except OSError:
                pass
        elif self.me.is_dir():
            shutil.rmtree(self.me, ignore_errors=True)
        self.log("pilot ends")
        return 0


def _splitting(me: Path) -> bool:
    try:
        return any(n.startswith((L.TAKE, L.REST)) for n in os.listdir(me))
    except FileNotFoundError:
        return False


def _rename(src: Path, dest: Path) -> bool:
    try:
        os.rename(src, dest)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """A claim's script and its chains (its session's process group), or the script alone if that is gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


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


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="a late-bound campaign's pilot agent (run by the pilot's batch script)")
    for name in ("queue", "pilot", "node", "rundir"):
        ap.add_argument(f"--{name}", required=True)
    for name in ("slots",):
        ap.add_argument(f"--{name}", type=int, required=True)
    for name in ("ends", "idle-s", "beat-s", "drain-s", "claim-before", "steal-s", "input-s"):
        ap.add_argument(f"--{name}", type=float, required=True)
    ap.add_argument("--seat-dir", default="")
    ap.add_argument("--bb-root", default="")
    a = ap.parse_args(argv)
    agent = Agent(Path(a.queue), a.pilot, a.node, a.slots, a.ends, a.idle_s, a.beat_s, a.drain_s, a.claim_before,
                  a.steal_s, a.input_s, a.seat_dir, Path(a.rundir), a.bb_root)
    (agent.queue / "results").mkdir(exist_ok=True)
    ops: Dict[str, int] = {}
    if argv is None:   # the real pilot (not a test calling main): its metadata operations counted
        count_ops(ops)
    try:
        return agent.run()
    finally:   # claims started, and the metadata operations it made for them: the cost per input
        counts = "\t".join(f"{k}={v}" for k, v in sorted(ops.items()))
        with open(agent.rundir / "agent.tsv", "w") as f:
            f.write(f"{agent.claims_made}\t{sum(ops.values())}\t{counts}\n")


if __name__ == "__main__":
    sys.exit(main())
