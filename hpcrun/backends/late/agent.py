"""The pilot's agent: one Python process per pilot that claims tasks, runs them and commits their results.

Standard library only; shipped as ``bin/hpcrun-pilot.py`` beside ``bin/hpcrun_late_layout.py`` (the queue's protocol),
run by the pilot's batch script (templates/pilot.sh.j2). One loop holds every slot: a claim is a few renames, a run
of a claim one child (its job script or the direct worker), each input's time limit a deadline in the loop.

Rules kept from the protocol (hpcrun/backends/late/queue.py): a claim is a task file in the pilot's own
directory ``live/<pilot>/``; the commit is one link(2) of it into ``done/``, then its name appended to the
pilot's journal ``results/<pilot>``; a pilot whose directory is gone (fenced) commits nothing and stops.
"""

from __future__ import annotations

import contextlib
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
    from hpcrun.backends.late import runs as R
else:   # run as the plan's bin/hpcrun-pilot.py: the protocol and the runs are the copies beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hpcrun_late_layout as L  # type: ignore[no-redef]
    import hpcrun_late_runs as R  # type: ignore[no-redef]

NAPS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)   # the queue looked at soon after a miss, then less and less often
STOP_WAIT_S = 15.0                 # a claim's script TERMed on the way out, KILLed after this
STOP_LOOK_S = 0.5                  # a pilot that runs nothing looks for the campaign's end this often (one stat)


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
    running: Dict[int, R.Running] = field(default_factory=dict)
    claims_made: int = 0
    draining: bool = False
    stopping: str = ""            # why the pilot stops ("": it does not)
    idle_since: float = field(default_factory=time.monotonic)
    nap: int = 0
    next_look: float = 0.0
    next_beat: float = 0.0
    next_stop: float = 0.0
    flags: Dict[str, object] = field(default_factory=dict)   # stop, paused, expected, until, hinted: per beat
    scripts: Dict[str, R.Descriptor] = field(default_factory=dict)   # qid -> its script, limit, plan, worker
    pace: R.ClaimPace = field(init=False)   # how much a claim holds, from this pilot's last input times
    table: R.TaskTable = field(default_factory=R.TaskTable)
    summer: R.Summer = field(default_factory=lambda: R.Summer(-1))   # outputs summed here, for scripts that ask

    me: Path = field(init=False)      # queue/live/<pilot>: this pilot's claims
    at: Dict[str, str] = field(init=False)   # paths an input touches, as text (pathlib: a third of its CPU)

    def __post_init__(self) -> None:
        self.pace = R.ClaimPace(self.input_s)
        self.me = self.queue / "live" / self.pilot
        self.at = {d: os.path.join(str(self.queue), d) for d in ("cancel", "cancelled", "done")}
        self.at.update(me=str(self.me), journal=os.path.join(str(self.queue), "results", self.pilot),
                       stop=os.path.join(str(self.queue), "stop"))

    def log(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp} pilot[{self.pilot}]: {text}", file=sys.stderr, flush=True)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        self.summer.wake = wake_w
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
            busy = self.running or self.summer.pending   # an input summed is not yet committed
            if not busy and now >= self.next_stop:   # runs nothing: its looks at the queue may be seconds apart, but
                self.next_stop = now + STOP_LOOK_S   # the campaign's end is seen within STOP_LOOK_S (issue 55)
                self._saw_stop(os.path.exists(self.at["stop"]))
            if not busy and not self._may_claim() and (self.draining or self.flags.get("stop")
                                                       or self._left() is not None):   # done for good
                break
            if not busy and time.monotonic() - self.idle_since >= self.idle_s:
                self.log(f"nothing to claim for {self.idle_s:.0f} s: released")
                break
            soon = [t for r in self.running.values() for t in (r.warn_at, r.kill_at, self.pace.give_back_at(r))]
            timeout = min([self.next_beat, self.next_look, *soon] + ([] if busy else [self.next_stop]))
            ready = select.select([wake_r] + [r.out for r in self.running.values()], [], [],
                                  max(0.0, min(timeout - time.monotonic(), 5.0)))[0]
            if wake_r in ready:
                os.read(wake_r, 512)
            for r in list(self.running.values()):
                if r.out in ready:
                    self._read_worker(r)
            self.summer.finished(self._summed)
        return self._leave()

    def _saw_stop(self, there: bool) -> None:   # queue/stop: once there, the pilot claims nothing more, and says so
        if there and not self.flags.get("stop"):
            self.flags["stop"] = True
            self.log("the campaign is done: nothing to claim")

    def _on_term(self, *_: object) -> None:
        self.stopping = self.stopping or "cancelled (SIGTERM): its claims return to the queue"

    def _on_drain(self, *_: object) -> None:
        if not self.draining:
            self.draining = True
            with contextlib.suppress(OSError):
                (self.me / "draining").touch()
            self.log("drain signal: claiming nothing more; running inputs finish")

    def _left(self) -> Optional[str]:
        """Why no input may start now for lack of time (the drain, a maintenance window), or None."""
        f = self.flags
        return R.time_short(self.ends - self.drain_s, f.get("until"), f.get("expected") or self.input_s)

    def _may_claim(self) -> bool:
        return not (self.draining or self.stopping or self.flags.get("stop") or self.flags.get("paused"))

    # -- the lease, and what the supervisor says -----------------------------------------------------------
    def _beat(self) -> None:
        """The lease renewed; the queue's flags read once a beat; operators' cancels done. Fenced (gone): stops."""
        try:
            os.utime(self.me / "beat")
        except FileNotFoundError:
            self.stopping = "fenced: its claims were returned to the queue"
            return
        flags = R.flags(self.queue, self.me)
        self._saw_stop(bool(flags.get("stop")))   # said once, where the pilot first sees it
        self.flags.update(flags)
        cancels = set(L.entries(self.queue / "cancel"))
        for r in self.running.values():
            if r.at >= 0 and r.task in cancels and not r.state:
                r.state = "CANCELLED"
                R.cancel(r.items[r.at])

    def _limits(self, now: float) -> None:
        """Each input's own time limit, as its array task would have it: the warning signal, then the end. An
        input that runs long sends the claim's inputs not begun back to the queue, for other slots."""
        for r in self.running.values():
            if r.at < 0:
                continue
            if now >= r.kill_at:   # a cancelled input stays CANCELLED; a direct run's worker is stopped in turn (it
                r.state, r.warn_at = r.state or "TIMEOUT", float("inf")   # may hang on its files before or after)
                r.kill_at = now + STOP_WAIT_S if r.items[r.at].kill() else float("inf")
            elif now >= r.warn_at:
                r.warn_at = float("inf")
                try:
                    os.kill(r.items[r.at].warn or r.items[r.at].pid, signal.SIGUSR1)   # the script's input or worker
                except ProcessLookupError:
                    pass
            if now >= self.pace.give_back_at(r):
                self._give_back(r)

    # -- claiming ----------------------------------------------------------------------------------------
    def _fill(self) -> None:
        free = [s for s in range(self.slots) if s not in self.running]
        if not free:   # the next slot to end looks at once (_reap): not up to a nap after its end
            self.next_look = float("inf")
            return
        if not self._may_claim():   # paused, stopping or draining: its flags change at a beat, not sooner
            self.next_look = time.monotonic() + NAPS[max(self.nap, 1)]
            return
        why = self._left()
        if why is not None:
            if not self.running:
                self.log(why)
            self.draining = True
            return
        while free and not self.stopping:
            tasks = self._claim(self.pace.size() * len(free))   # for every free slot: one split, dealt out
            if not tasks:   # nothing left: the campaign's end (queue/stop) is looked at now, not at the next beat
                self._saw_stop(os.path.exists(self.at["stop"]))
                self.next_look = time.monotonic() + NAPS[self.nap]
                self.nap = min(self.nap + 1, len(NAPS) - 1)
                return
            self.nap = 0
            self.idle_since = time.monotonic()
            dealt = list(zip(free, R.shares(tasks, len(free))))
            for slot, share in (d for d in dealt if not self.stopping):   # a TERM: the rest go back with the pilot
                self._start(share, slot)
            if any(slot not in self.running for slot, _ in dealt):   # not started (no descriptor): look again later
                return
            free = [s for s in range(self.slots) if s not in self.running]
        self.next_look = float("inf")   # every slot busy: the next to end looks (_freed)

    def _claim(self, n: int) -> List[str]:
        """Up to ``n`` tasks of one submission: one this node's cache holds (a hint under its short name), single
        waiting ones (returned, or hinted to a node whose pilot left them long enough), or the first ``n`` of
        backlog chunks, one split a chunk whatever ``n`` (a chunk too small: the next of the same submission)."""
        q, me = self.queue, self.me
        for task in L.entries(q / "near" / self.node.split(".")[0]):
            if R.rename(q / "ready" / task, me / task):
                return [task]
        hinted = self.flags.get("hinted") or set()
        stealing = time.monotonic() - self.idle_since >= self.steal_s
        got: List[str] = []
        for task in L.shuffled(L.entries(q / "ready"))[:max(8, n)]:
            if got and task.rpartition("_")[0] != got[0].rpartition("_")[0]:
                continue
            if (stealing or task not in hinted) and R.rename(q / "ready" / task, me / task):  # type: ignore[operator]
                got.append(task)
                if len(got) >= n:
                    break
        if got:
            return got
        for name in L.shuffled(L.entries(q / "backlog"))[:8]:
            if got and not name.startswith(got[0].rpartition("_")[0] + "."):
                continue   # a claim's inputs share one script: one submission's
            try:
                got += L.split(q / "backlog", name, me, L.pick_n(n - len(got)), lambda t: me / t) or []
            except OSError:   # our directory is gone: fenced (the supervisor settles the split)
                self.stopping = "fenced: its claims were returned to the queue"
                return []
            if len(got) >= n:
                break
        return got

    def _start(self, tasks: List[str], slot: int) -> None:
        """One run of the job script for the claimed tasks: told them all (their rows read here, so the script
        starts no process to find them), then each one's start, one at a time (``_next``)."""
        qid = tasks[0].rpartition("_")[0]
        desc = self._descriptor(qid)
        if desc is None:
            self.log(f"no descriptor for {qid}: {len(tasks)} task(s) returned")
            for task in tasks:
                R.rename(self.me / task, self.queue / "ready" / task)
            self.next_look = time.monotonic() + 5   # not claimed again at once
            return
        script, limit, plan, (argv, extra) = desc
        argv, extra = (argv, extra) if len(tasks) > 1 else (["bash", script], {})   # runs.worker: why one is bash
        items = []
        for task in tasks:
            cid = f"{self.pilot}.{slot}.{self.claims_made}"
            self.claims_made += 1
            idx = task.rpartition("_")[2]
            items.append(R.Item(task, cid, idx, self.table.rows(plan, int(idx))))
        out_r, out_w = os.pipe()
        env = dict(os.environ, HPCRUN_CLAIM_FEED=str(out_w), **extra)
        with R.claim_log(self.rundir, slot, [i.cid for i in items]) as log:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, pass_fds=(out_w,), **R.OWN_GROUP)
        os.close(out_w)
        r = R.Running(slot, proc, items, limit, out=out_r)
        self.running[slot] = r
        feed = "".join(f"item\t{i.task}\t{i.idx}\t{i.cid}\t{i.rows.count(chr(10))}\n{i.rows}" for i in items)
        r.tell(feed + f"ready\tsums\t{','.join(R.SUMS)}\n")   # what it sums for a script that leaves that to it
        self._next(r)

    def _next(self, r: R.Running) -> None:
        """The claim's next input told to start, or, when the claim has run its share of time (or the pilot stops
        claiming), its inputs not begun sent back to the queue and the script told to end."""
        while r.fed < len(r.items):
            item = r.items[r.fed]
            if self.stopping or r.fed and (self.pace.spent(r) or not self._may_claim()
                                           or self._left() is not None):
                break
            at = self.at
            if not os.path.exists(f"{at['me']}/{item.task}"):   # fenced since the claim: nothing more starts here
                self.stopping = "fenced: its claims were returned to the queue"
                return
            if os.path.exists(f"{at['cancel']}/{item.task}"):   # cancelled while claimed: never started
                R.rename(f"{at['me']}/{item.task}", f"{at['cancelled']}/{item.task}")
                r.fed += 1
                continue
            r.tell(f"go\t{r.fed}\n")
            r.fed += 1
            return
        self._give_back(r)
        if r.proc.stdin is not None:
            with contextlib.suppress(OSError):
                r.proc.stdin.close()   # the script's last input is done: it ends

    def _give_back(self, r: R.Running, start: int = -1) -> None:
        """The claim's inputs from ``start`` (default: those not told to start) back to ``ready/`` (never started,
        so not an attempt): other slots take them at once rather than after the input that holds this one."""
        start = r.fed if start < 0 else start
        if start < len(r.items):
            for item in r.items[start:]:
                R.rename(self.me / item.task, self.queue / "ready" / item.task)
            r.items, r.fed = r.items[:start], min(r.fed, start)
            self.nap, self.next_look = 0, time.monotonic()   # a free slot here takes them at once

    def _descriptor(self, qid: str) -> Optional[R.Descriptor]:
        """A submission's script (this cluster's copy), per-input limit, plan directory and worker, read once."""
        if qid not in self.scripts:
            desc = R.descriptor(self.queue, qid, self.seat_dir)
            if desc is None:
                return None
            self.scripts[qid] = desc
        return self.scripts[qid]

    # -- results -------------------------------------------------------------------------------------------
    def _read_worker(self, r: R.Running) -> bool:
        """What the script said (``begin``, ``pid``, ``end``), acted on; False at its pipe's end."""
        more, said = r.said()
        for f in said:
            if f[0] == "begin" and len(f) >= 4 and f[1].isdigit() and int(f[1]) < len(r.items):
                self._begin(r, int(f[1]), int(f[2]), float(f[3]), int(f[4]) if f[4:] and f[4].isdigit() else 0)
            elif f[0] == "pid" and len(f) >= 3 and f[1] == str(r.at) and f[2].isdigit():   # a direct run's program
                r.items[r.at].pid = int(f[2])
            elif f[0] == "end" and len(f) >= 5 and f[1].isdigit() and int(f[1]) == r.at:
                self._end(r, int(f[2]), float(f[3]), f[4])
            elif f[0] == "sums" and len(f) >= 3 and f[1] in R.SUMS:   # the script leaves its outputs' sums to us
                r.sums = (f[1], "\t".join(f[2:]))
        return more

    def _begin(self, r: R.Running, n: int, pid: int, t0: float, warn: int) -> None:
        item = r.items[n]
        item.pid, item.t0, item.warn = pid, t0, warn
        r.at, r.state, r.began, r.begun = n, "", time.monotonic(), n + 1
        try:
            L.write_new(f"{self.at['me']}/{item.task}",   # the group a pilot's script stops if its agent could not
                        f"{item.cid}\t{r.slot}\t{self.node}\t{t0:.6f}\t{pid or warn}\n")
        except OSError:   # fenced meanwhile: the input runs elsewhere, this run is stopped at once
            self.stopping = "fenced: its claims were returned to the queue"
            item.kill()
        # the input's own time limit as its array task would have it: the pre-timeout signal, then the end
        lim = r.limit
        r.warn_at = r.began + (lim - self.claim_before if lim > self.claim_before else lim)
        r.kill_at = r.warn_at + self.claim_before

    def _end(self, r: R.Running, rc: int, t1: float, cpu: str) -> None:
        item = r.items[r.at]
        state = r.state or ("COMPLETED" if rc == 0 else "FAILED")
        r.at, r.warn_at, r.kill_at = -1, float("inf"), float("inf")
        self.pace.ended(r, item.t0, t1)
        self.idle_since = time.monotonic()
        if len(r.items) == 1 and r.fed >= len(r.items):
            r.ended.append((item, rc, t1, cpu, state))   # committed at its reaping, with the run's own figures
        elif not self.stopping:
            self._settle(r, item, rc, state, t1, cpu, "")
        if not self.stopping and r.proc.poll() is None:   # a script that ended is told nothing more
            self._next(r)

    def _reap(self) -> None:
        while self.running:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            r = next((x for x in self.running.values() if x.proc.pid == pid), None) if pid else None
            if r is None:
                if pid == 0:
                    return
                continue
            r.proc.returncode = R.exit_status(status)
            while self._read_worker(r):   # what it said before it ended, to the end of its pipe
                pass
            os.close(r.out)
            self._freed(r.slot)
            if not self.stopping:   # else its claims go back to the queue: no result
                self._ended(r, status, usage)
            elif r.at >= 0:   # what it began stops with it (a direct run's program, which _leave cannot see)
                r.items[r.at].kill(False)

    def _freed(self, slot: int) -> None:
        """A slot whose script ended claims at once (a busy pilot's next look waits for it, not a nap)."""
        del self.running[slot]
        self.idle_since = time.monotonic()
        self.next_look = min(self.next_look, self.idle_since)

    def _ended(self, r: R.Running, status: int, usage: os.struct_rusage) -> None:  # type: ignore[name-defined]
        """A script's end: the input it said had ended committed with the run's own CPU time and peak memory (it
        ran alone); an input begun that it never said ended fails with the script's exit; the rest go back."""
        cpu = f"{usage.ru_utime:.3f}+{usage.ru_stime:.3f}"
        for item, rc, t1, _cpu, state in r.ended:
            self._settle(r, item, rc, state, t1, cpu, str(usage.ru_maxrss))
        if r.at >= 0:   # its input leads a group of its own: stopped before its failure is committed
            r.items[r.at].kill(False)
            rc = R.exit_status(status)
            rc = 128 - rc if rc < 0 else (rc or 1)
            self._commit(r, r.items[r.at], rc, r.state or "FAILED", time.time(), cpu, str(usage.ru_maxrss))
            r.at = -1
        if r.begun < len(r.items):   # told to start but never begun (the script died first) included
            self.log(f"slot {r.slot}: its script ended (exit {R.exit_status(status)}) before "
                     f"{len(r.items) - r.begun} input(s) began: back to the queue, no attempt counted")
        self._give_back(r, r.begun)

    def _settle(self, r: R.Running, item: R.Item, rc: int, state: str, t1: float, cpu: str, rss: str) -> None:
        """An input's end committed, once its outputs are summed where its script left that to the agent."""
        algo, base = r.sums
        if not algo or not item.rows or rc != 0 or state != "COMPLETED":   # the job summed (rows it found itself),
            return self._commit(r, item, rc, state, t1, cpu, rss)        # or failed: no outputs' record, as in the job
        desc = self._descriptor(item.task.rpartition("_")[0])
        where = R.outputs_of(item.rows, base, desc[2] if desc else "", item.cid)
        if where is None:
            self.log(f"{item.task} ({item.cid}): its job's rows cannot be read, so its outputs cannot be summed")
            return self._commit(r, item, 3, "FAILED", t1, cpu, rss)
        self.summer.start((r, item, rc, state, t1, cpu, rss), *where, algo)

    def _summed(self, then: Tuple[R.Running, R.Item, int, str, float, str, str], why: Optional[str]) -> None:
        r, item, rc, state, t1, cpu, rss = then
        if self.stopping:   # as an input that ended meanwhile: its claim goes back with the pilot
            return
        if why is not None:
            self.log(f"{item.task} ({item.cid}) failed: {why}")
            rc, state = 3, "FAILED"
        self._commit(r, item, rc, state, max(t1, time.time()), cpu, rss)   # its end: its record's, as in the job

    def _commit(self, r: R.Running, item: R.Item, rc: int, state: str, t1: float, cpu: str, rss: str) -> None:
        line = "\t".join([item.task, item.cid, self.pilot, str(r.slot), self.node, f"{item.t0:.6f}", f"{t1:.6f}",
                          str(rc), state, cpu, rss])
        at = self.at
        token, done = f"{at['me']}/{item.task}", f"{at['done']}/{item.task}"
        try:
            with open(token, "w") as f:
                f.write(line + "\n")
            os.link(token, done)       # the commit: fails once fenced, never replaces a result
        except OSError:
            if os.path.exists(done):   # committed by an earlier claim: named in the journal again, so it is read
                R.unlink(token)
                R.append_line(at["journal"], item.task)
            elif not self.me.is_dir():
                self.stopping = "fenced: its claims were returned to the queue"
            self.log(f"claim {item.cid} of {item.task} was taken from this pilot: its result is dropped, its "
                     "outputs never placed")
            return
        R.append_line(at["journal"], item.task)   # what changed, for the supervisor
        R.unlink(token)
        if self.bb_root:
            shutil.rmtree(os.path.join(self.bb_root, "claims", item.cid), ignore_errors=True)
        self.log(f"slot {r.slot}: {item.task} ({item.cid}) {state}, exit {rc}")

    # -- the way out ---------------------------------------------------------------------------------------
    def _leave(self) -> int:
        """Running inputs stopped (TERM, KILL after STOP_WAIT_S) before their claims go back, lest one write on
        while its input runs again elsewhere; then the pilot's directory leaves live/ as a whole."""
        if self.stopping:
            self.log(self.stopping)
        runs = list(self.running.values())
        for r in runs:
            self._read_worker(r)   # an input begun since the last look: known, so signalled
            r.stop(signal.SIGTERM)   # the script passes it on to an input it starts meanwhile (its TERM trap)
        deadline = time.monotonic() + STOP_WAIT_S
        while self.running and time.monotonic() < deadline:
            for r in list(self.running.values()):
                self._read_worker(r)
                if r.proc.poll() is not None and (r.at < 0 or not R.alive(r.items[r.at].pid)):
                    del self.running[r.slot]
            time.sleep(0.1)
        for r in runs:   # whatever is left of each (an input's chains that outlived their leader)
            r.stop(signal.SIGKILL)
            r.proc.wait()
        handed = R.hand_back(self.me, self.queue / "fenced" / self.pilot, (L.TAKE, L.REST))
        if handed is not None:
            self.log(f"its {handed} claim(s) handed back to the queue")
        self.log("pilot ends")
        return 0


def main(argv: Optional[List[str]] = None) -> int:
    a = R.arguments(argv)
    agent = Agent(Path(a.queue), a.pilot, a.node, a.slots, a.ends, a.idle_s, a.beat_s, a.drain_s, a.claim_before,
                  a.steal_s, a.input_s, a.seat_dir, Path(a.rundir), a.bb_root)
    (agent.queue / "results").mkdir(exist_ok=True)
    ops: Dict[str, int] = {}
    if argv is None:   # the real pilot (not a test calling main): its metadata operations counted
        R.count_ops(ops)
    try:
        return agent.run()
    finally:   # claims started, and the metadata operations it made for them: the cost per input
        own = os.times()
        counts = "\t".join([f"{k}={v}" for k, v in sorted(ops.items())] + [f"cpu_s={own.user + own.system:.2f}"])
        with open(agent.rundir / "agent.tsv", "w") as f:
            f.write(f"{agent.claims_made}\t{sum(ops.values())}\t{counts}\n")


if __name__ == "__main__":
    sys.exit(main())
