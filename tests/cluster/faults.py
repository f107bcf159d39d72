"""A campaign with injected faults, driven by `hpcrun run` alone while the test SIGKILLs it.

Shared by tests/cluster/test_supervisor.py (the small version, in CI) and
benchmarks/campaign_faults.py (the full one). Faults, each on chosen inputs:

* ``once``: the chains fail on the first attempt only (``--fail-marked``, "once");
* ``hopeless``: the chains fail every time (``--fail-marked``): parked after the chain class's limit;
* ``slow``: a chain hangs on the first attempt (``--slow-marked``) until the job's time limit;
* ``corrupt``: the input's bytes change after planning, so the job's checksum check fails;
  a watcher puts the original back as soon as the job reports the mismatch (a transfer
  error that a new stage-in cures);
* a DB server of a running job is SIGKILLed once (the job's DB supervisor restarts it);
* ``kill_chains``: that many chain programs of good inputs are SIGKILLed while they run, as the
  kernel's OOM killer or a node health check would (the job ends chain_killed and is retried);
* optionally a node's slurmd is killed while it runs a job (NODE_FAIL), and started again.

The supervisor runs as the test user with a wrapper around sbatch first on PATH, which can
SIGKILL it right before or right after a real sbatch (mid-submit); other runs are killed
at random moments. Every kill is followed by a restart, and the last run goes to the end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .campaigns import Campaign

WRAPPER = """#!/bin/bash
# test stand-in around the real sbatch: kills its caller (hpcrun) at a chosen call{note}
counter=${{HPCRUN_TEST_COUNTER:?}}
n=$(( $(cat "$counter" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$counter"
if [ "${{HPCRUN_TEST_KILL:-}}" = "before:$n" ]; then kill -9 "$PPID"; exit 1; fi
out=$(/usr/bin/sbatch {extra}"$@")
rc=$?
if [ "${{HPCRUN_TEST_KILL:-}}" = "after:$n" ]; then kill -9 "$PPID"; sleep 1; fi
printf '%s\\n' "$out"
exit "$rc"
"""


def install_sbatch_wrapper(cluster, hold: bool = False) -> Tuple[Dict[str, str], Path]:
    """The wrapper first on PATH for hpcrun run as the test user: (environment, call counter file)."""
    bindir = cluster.workdir / "wrap-bin"
    bindir.mkdir(exist_ok=True)
    text = WRAPPER.format(note=" and holds every job" if hold else "", extra="--hold " if hold else "")
    cluster.write(bindir / "sbatch", text, mode=0o755)
    cluster.chown(bindir)
    counter = cluster.workdir / "sbatch-calls"
    return {"PATH": f"{bindir}:{cluster.user_env['PATH']}", "HPCRUN_TEST_COUNTER": str(counter)}, counter


@dataclass
class Faults:
    files: int = 24
    once: int = 3
    hopeless: int = 2
    slow: int = 1
    corrupt: int = 1
    kill_db: bool = True
    kill_slurmd: bool = False
    kill_chains: int = 0
    kills: List[str] = field(default_factory=lambda: ["after:1", "timer", "before:1", "timer", "timer"])
    seed: int = 13
    linger: float = 0.0        # seconds each chain stays (idle) first, so that jobs are found running
    throttle: int = 12


@dataclass
class Outcome:
    runs: int = 0
    sigkills: int = 0
    wall_s: float = 0.0
    db_killed: bool = False
    slurmd_killed: Optional[str] = None
    restored: List[str] = field(default_factory=list)
    chains_killed: List[str] = field(default_factory=list)   # input file names
    log: List[str] = field(default_factory=list)


class FaultCampaign:
    def __init__(self, cluster, hpcrun: str, example_root: Path, name: str, glob: str, faults: Faults):
        self.cluster, self.faults = cluster, faults
        self.raw = Path(glob).parent
        self.markers = cluster.workdir / "markers"
        self.markers.mkdir(exist_ok=True)
        cluster.chown(self.markers)
        # chains stay a couple of seconds (idle: 2 cores emulate 24), so that the chain killer finds them
        self.c = Campaign(cluster, hpcrun, example_root, name, burst_buffer=None, inputs__glob=glob,
                          walltime="00:02:00",
                          chain_extra=["--fail-marked", str(self.markers), "--slow-marked", str(self.markers)]
                          + (["--linger", str(max(2.0, faults.linger))] if faults.kill_chains or faults.linger else []),
                          jobs={"files_per_job": 1, "chains_per_node": 2, "throttle": faults.throttle})
        self.names = sorted(p.name for p in self.raw.glob("*.h5"))
        rng = random.Random(faults.seed)
        picks = rng.sample(self.names, faults.once + faults.hopeless + faults.slow + faults.corrupt)
        self.once = picks[:faults.once]
        self.hopeless = picks[faults.once:faults.once + faults.hopeless]
        self.slow = picks[faults.once + faults.hopeless:faults.once + faults.hopeless + faults.slow]
        self.corrupt = picks[len(picks) - faults.corrupt:]
        self.rng = rng
        self.env, self.counter = install_sbatch_wrapper(cluster)
        self.originals: Dict[str, bytes] = {}

    # -- set-up ------------------------------------------------------------------------------
    def prepare(self) -> None:
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S")   # sacct's -S: only this run's jobs count
        for name in self.once:
            self.cluster.write(self.markers / f"{name}.fail", "once\n")
        for name in self.hopeless:
            self.cluster.write(self.markers / f"{name}.fail", "always\n")
        for name in self.slow:
            self.cluster.write(self.markers / f"{name}.slow", "once\n")
        proc = self.c.hp("plan", str(self.c.spec), "--out", str(self.c.plan))   # checksums of the good files
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for name in self.corrupt:
            path = self.raw / name
            data = path.read_bytes()
            self.originals[name] = data
            middle = len(data) // 2
            path.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:])

    # -- the faults while it runs ----------------------------------------------------------------
    def _restore_corrupted(self, out: Outcome, stop: threading.Event) -> None:
        while not stop.is_set() and len(out.restored) < len(self.originals):
            for reason in self.c.plan.glob("run/*/*/reason"):
                text = reason.read_text(errors="replace")
                for name, data in self.originals.items():
                    if name not in out.restored and "checksum mismatch" in text and name in text:
                        (self.raw / name).write_bytes(data)
                        out.restored.append(name)
                        out.log.append(f"{time.strftime('%X')} restored {name} after: {text.strip()[:120]}")
            stop.wait(0.2)

    def _kill_a_db(self, out: Outcome, stop: threading.Event) -> None:
        while self.faults.kill_db and not stop.is_set() and not out.db_killed:
            proc = subprocess.run(["pgrep", "-u", str(self.cluster.uid), "-f", "mariadbd.*--socket"],
                                  capture_output=True, text=True)
            pids = [int(p) for p in proc.stdout.split()]
            if pids:
                stop.wait(3.0)
                try:
                    os.kill(pids[0], signal.SIGKILL)
                    out.db_killed = True
                    out.log.append(f"{time.strftime('%X')} SIGKILLed a job's DB server (pid {pids[0]})")
                except ProcessLookupError:
                    pass
            stop.wait(0.5)

    def _node_of(self, pid: int) -> Optional[str]:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return None
        for item in env:
            if item.startswith(b"SLURMD_NODENAME="):
                return item.split(b"=", 1)[1].decode()
        return None

    def _kill_chains(self, out: Outcome, stop: threading.Event) -> None:
        """SIGKILL the chain programs of good inputs now and then, one input at most once; never on the
        node that is crashed (its jobs end NODE_FAIL, which would hide the chain_killed class)."""
        spared = set(self.once + self.hopeless + self.slow + self.corrupt)
        crash_node = self.cluster.nodes[-1] if self.faults.kill_slurmd and len(self.cluster.nodes) >= 2 else None
        while not stop.is_set() and len(out.chains_killed) < self.faults.kill_chains:
            stop.wait(self.rng.uniform(1.0, 4.0))
            proc = subprocess.run(["pgrep", "-a", "-u", str(self.cluster.uid), "-f", f"chain.py --input {self.raw}/"],
                                  capture_output=True, text=True)
            for line in proc.stdout.splitlines():
                pid, _, args = line.partition(" ")
                name = os.path.basename(args.split("--input ", 1)[1].split(" ", 1)[0])
                if name in spared or name in out.chains_killed:
                    continue
                if crash_node is not None and self._node_of(int(pid)) in (crash_node, None):
                    continue
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                out.chains_killed.append(name)
                out.log.append(f"{time.strftime('%X')} SIGKILLed a chain of {name} (pid {pid})")
                break

    def _descendants(self, pids: List[int]) -> List[int]:
        found, todo = [], list(pids)
        while todo:
            pid = todo.pop()
            found.append(pid)
            kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
            todo += [int(k) for k in kids]
        return found

    def _crash_node(self, node: str, jobs: List[str]) -> List[int]:
        """What a node crash does: its slurmd, and the job steps running there with every process under them."""
        steps = []
        for job in jobs:
            proc = subprocess.run(["pgrep", "-f", f"slurmstepd: \\[{job}\\."], capture_output=True, text=True)
            steps += [int(p) for p in proc.stdout.split()]
        slurmd = [int(p) for p in self.cluster.run(["pgrep", "-f", f"slurmd -D -N {node}"]).stdout.split()]
        # frozen before they are killed, until no new one appears: a process forked between the listing
        # and the kill would outlive the "crash", holding the job's node-local lock for ever
        frozen: List[int] = []
        while True:
            new = [pid for pid in slurmd + self._descendants(steps) if pid not in frozen]
            if not new:
                break
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            frozen += new
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return frozen

    def _kill_a_slurmd(self, out: Outcome, stop: threading.Event) -> None:
        """Crash the last node while it runs one of this campaign's jobs (NODE_FAIL); start its slurmd later."""
        if not self.faults.kill_slurmd or len(self.cluster.nodes) < 2:
            return
        node = self.cluster.nodes[-1]
        while not stop.is_set():
            proc = self.cluster.run(["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%A|%j"])
            jobs = [line.split("|")[0] for line in proc.stdout.split()
                    if line.split("|")[1].startswith(self.c.name + ".")]
            if jobs:
                stop.wait(2.0)
                victims = self._crash_node(node, jobs)
                out.slurmd_killed = node
                out.log.append(f"{time.strftime('%X')} crashed {node}: SIGKILLed its slurmd and the {len(victims) - 1} "
                               f"processes of jobs {', '.join(jobs)}")
                break
            stop.wait(1.0)
        if out.slurmd_killed:
            try:   # a controller stopped meanwhile (tests/cluster/test_site_operations.py) delays it
                self.cluster.wait_until(lambda: "down" in self.cluster.run(
                    ["sinfo", "-h", "-n", node, "-o", "%T"]).stdout, timeout=240, interval=2)
            except TimeoutError:
                state = self.cluster.run(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip()
                out.log.append(f"{time.strftime('%X')} {node} not seen down in 240 s (sinfo: {state})")
            self.cluster.restart_slurmd(node)
            out.log.append(f"{time.strftime('%X')} slurmd of {node} started again")

    # -- the supervisor, killed and restarted ----------------------------------------------------
    def _start(self, kill: str) -> subprocess.Popen:
        self.counter.write_text("0")
        self.cluster.chown(self.counter)
        env = dict(self.cluster.user_env, **self.env, HPCRUN_TEST_KILL=kill, COLUMNS="200")
        argv = [*(getattr(self, "command", None) or [self.c.hpcrun]), "run", str(self.c.plan), "--interval", "2"]
        return subprocess.Popen(argv, cwd=str(self.c.dir),
                                env=env, user=self.cluster.uid, group=self.cluster.gid, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def drive(self, timeout: float = 900, extra=(), command=None) -> Outcome:
        """``extra``: more fault threads, each called with (outcome, stop event); ``command``: the argv
        that runs ``hpcrun run`` (a wrapper that measures it), instead of hpcrun itself."""
        out = Outcome()
        stop = threading.Event()
        self.command = command
        helpers = [threading.Thread(target=f, args=(out, stop), daemon=True)
                   for f in (self._restore_corrupted, self._kill_a_db, self._kill_a_slurmd, self._kill_chains,
                             *extra)]
        for t in helpers:
            t.start()
        start = time.monotonic()
        try:
            for kill in self.faults.kills + ["none"]:
                proc = self._start("" if kill in ("timer", "none") else kill)
                out.runs += 1
                limit = self.rng.uniform(2.0, 10.0) if kill == "timer" else \
                    (30.0 if kill != "none" else timeout - (time.monotonic() - start))
                try:
                    text, _ = proc.communicate(timeout=max(limit, 5.0))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    text, _ = proc.communicate()
                out.log.append(f"run {out.runs} ({kill}): exit {proc.returncode}\n{text.strip()[-1500:]}")
                if proc.returncode == -signal.SIGKILL:
                    out.sigkills += 1
                elif kill == "none":
                    assert proc.returncode == 0, "\n".join(out.log)
        finally:
            stop.set()
            for t in helpers:
                t.join(timeout=300)
        out.wall_s = time.monotonic() - start
        return out

    # -- what it left ----------------------------------------------------------------------------
    def status(self) -> dict:
        proc = self.c.hp("status", str(self.c.plan), "--json", "--all")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    def report(self) -> dict:
        proc = self.c.hp("report", str(self.c.plan), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    def slurm_tasks(self) -> List[dict]:
        """Every job or array task Slurm ran for this campaign's plan jobs (not the finalize job)."""
        # -D: every run of a job id, so a job Slurm requeued by itself would count twice
        proc = self.cluster.run(["sacct", "-n", "-P", "-X", "-D", "-u", self.cluster.user, "-S", self.started,
                                 "-o", "JobID,JobName,State"])
        rows = []
        for line in proc.stdout.splitlines():
            job_id, name, state = line.split("|")[:3]
            if name.startswith(self.c.name + ".") and not name.endswith(".finalize"):
                rows.append({"job_id": job_id, "name": name, "state": state.split(" ")[0]})
        return rows
