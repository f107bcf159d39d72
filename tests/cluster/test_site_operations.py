"""The site acts too (issue 37), on the real Slurm 22.05 of the test cluster (JobRequeue=1, Slurm's
default, and PreemptMode=REQUEUE: Slurm would rerun a job by itself unless it says --no-requeue).

One `hpcrun run`, never restarted, drives a campaign while root cancels running jobs, a node fails
under one of them, slurmctld is stopped and started from its saved state, and slurmdbd is down for
a while (sacct fails) as jobs start and end. Every input must end done exactly once: none lost, none
run twice by Slurm's own requeue, none submitted twice by hpcrun. A preemption by a partition of a
higher PriorityTier is its own test. The full-size run is ``HPCRUN_SITE_FILES=120
HPCRUN_SITE_DBD_DOWN_S=300 pytest tests/cluster/test_site_operations.py -s`` (benchmarks/README.md).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .campaigns import PY
from .faults import FaultCampaign, Faults, Outcome
from .pytest_cluster import HARNESS
from .test_campaign_state import make_raw
from .test_two_clusters import CPU_WRAPPER

pytestmark = pytest.mark.cluster


def _harness(cluster, *args: str) -> None:
    proc = subprocess.run([sys.executable, str(HARNESS), *args, "--dir", str(cluster.dir)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _running(cluster, name: str, states: str = "RUNNING") -> list:
    """(task id, node) of this campaign's running jobs (or those in ``states``), from squeue."""
    argv = ["squeue", "-h", "-r", "-t", states, "-o", "%i|%j|%N"]
    proc = cluster.run(argv)
    rows = [line.split("|") for line in proc.stdout.split()]
    return [(r[0], r[2]) for r in rows if len(r) == 3 and r[1].startswith(name + ".") and not r[1].endswith("final")]


class SiteOperations:
    """What the site does while the supervisor runs: root's cancellations, a controller restart, an
    accounting outage; what `hpcrun status` says meanwhile."""

    def __init__(self, fc: FaultCampaign, cancels: int, ctld_down_s: float, dbd_down_s: float):
        self.fc, self.cluster = fc, fc.cluster
        self.cancels, self.ctld_down_s, self.dbd_down_s = cancels, ctld_down_s, dbd_down_s
        self.cancelled: list = []
        self.seen: collections.Counter = collections.Counter()   # what status said of each daemon while down
        self.done_at_dbd_stop = -1
        self.done_at_dbd_start = -1

    def _status(self) -> dict:
        proc = self.fc.c.hp("status", str(self.fc.c.plan), "--json", timeout=120)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def _watch(self, daemon: str, seconds: float, stop: threading.Event) -> None:
        """Keep the daemon down ``seconds``, asking `hpcrun status` (as the operator would) meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            for o in self._status().get("outages", []):
                if o["ended_at"] is None:
                    self.seen[o["daemon"]] += 1
            stop.wait(5.0)

    def run(self, out: Outcome, stop: threading.Event) -> None:
        name, crash = self.fc.c.name, self.cluster.nodes[-1]
        # root cancels running jobs (not on the node that is crashed: that one ends NODE_FAIL)
        self.cluster.wait_until(lambda: len([t for t, n in _running(self.cluster, name) if n != crash]) >= self.cancels,
                                timeout=240, interval=1)
        victims = [t for t, n in _running(self.cluster, name) if n != crash][: self.cancels]
        self.cluster.run(["scancel", *victims])
        self.cancelled = victims
        out.log.append(f"{time.strftime('%X')} root cancelled {', '.join(victims)}")
        # as a maintenance script does, the controller stops once the cancelled jobs have left their nodes
        # (stopped while they complete, Slurm drains the nodes: "Kill task failed")
        self.cluster.wait_until(lambda: not set(victims) & {t for t, _n in _running(self.cluster, name, "R,CG")},
                                timeout=120, interval=1)
        _harness(self.cluster, "daemon", "stop", "slurmctld")
        out.log.append(f"{time.strftime('%X')} slurmctld stopped")
        self._watch("controller", self.ctld_down_s, stop)
        _harness(self.cluster, "daemon", "start", "slurmctld")
        out.log.append(f"{time.strftime('%X')} slurmctld started from its saved state")
        stop.wait(10.0)
        self.done_at_dbd_stop = self._status().get("counts", {}).get("done", -1)
        _harness(self.cluster, "daemon", "stop", "slurmdbd")
        out.log.append(f"{time.strftime('%X')} slurmdbd stopped ({self.done_at_dbd_stop} jobs done)")
        self._watch("accounting", self.dbd_down_s, stop)
        self.done_at_dbd_start = self._status().get("counts", {}).get("done", -1)
        _harness(self.cluster, "daemon", "start", "slurmdbd")
        out.log.append(f"{time.strftime('%X')} slurmdbd started ({self.done_at_dbd_start} jobs done then)")


def _resume_drained(cluster) -> list:
    """Nodes Slurm drained during the test (a step that did not end while the controller was away):
    resumed, and returned for the test's figures."""
    proc = cluster.run(["sinfo", "-h", "-R", "-o", "%N|%E"])
    nodes = [line.split("|")[0] for line in proc.stdout.splitlines() if "Kill task failed" in line]
    for node in nodes:
        cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    return nodes


def _slurm_runs(cluster, name: str, since: str) -> list:
    """Every run Slurm made of this campaign's jobs, each requeued run apart (sacct -D)."""
    proc = cluster.run(["sacct", "-n", "-P", "-X", "-D", "-S", since, "-E", "now", "-o", "JobID,JobName%80,State"])
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].startswith(name + ".") and not parts[1].endswith(".finalize"):
            rows.append({"job_id": parts[0], "name": parts[1], "state": parts[2].split(" ")[0]})
    return rows


def _check_once_each(fc: FaultCampaign, since: str, files: int, log: str) -> tuple:
    """Every input done, exactly one completed run each, as many runs as attempts recorded; returns
    (status rows by job, report, runs)."""
    st = fc.status()
    rows = {j["job"]: j for j in st["jobs"]}
    states = collections.Counter(j["status"] for j in rows.values())
    assert states == {"done": files}, (states, log)                                   # 0 lost, 0 parked
    runs = _slurm_runs(fc.cluster, fc.c.name, since)
    assert not [r for r in runs if r["state"] in ("REQUEUED", "PENDING", "RUNNING")], (runs, log)  # no Slurm requeue
    completed = collections.Counter(r["job_id"] for r in runs if r["state"] == "COMPLETED")
    assert len(completed) == files and set(completed.values()) == {1}, (completed, log)   # 0 duplicated
    assert len(runs) == sum(r["attempts"] for r in rows.values()), (runs, rows, log)    # none submitted twice
    outputs = sorted(p.name for p in fc.c.out.glob("*.reco.h5"))
    assert len(outputs) == files, outputs                                             # one output per input
    return rows, fc.report(), runs


def test_one_supervisor_rides_out_cancels_a_node_failure_a_controller_restart_and_an_accounting_outage(
        slurm_cluster, hpcrun_bin, example_root):
    files = int(os.environ.get("HPCRUN_SITE_FILES", "18"))
    faults = Faults(files=files, once=0, hopeless=0, slow=0, corrupt=0, kill_db=False, kill_slurmd=True,
                    kill_chains=0, kills=[], linger=float(os.environ.get("HPCRUN_SITE_LINGER", "12")), throttle=6)
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw-site", files)
    fc = FaultCampaign(slurm_cluster, hpcrun_bin, example_root, "site", glob, faults)
    fc.prepare()
    site = SiteOperations(fc, cancels=3, ctld_down_s=float(os.environ.get("HPCRUN_SITE_CTLD_DOWN_S", "20")),
                          dbd_down_s=float(os.environ.get("HPCRUN_SITE_DBD_DOWN_S", "60")))
    try:
        outcome = fc.drive(timeout=float(os.environ.get("HPCRUN_SITE_TIMEOUT", "1200")), extra=[site.run],
                           command=[PY, "-c", CPU_WRAPPER, hpcrun_bin])
    finally:   # never leave the cluster without its daemons (or with a node drained) for the tests after it
        _harness(slurm_cluster, "daemon", "start", "slurmctld")
        _harness(slurm_cluster, "daemon", "start", "slurmdbd")
        drained = _resume_drained(slurm_cluster)
    log = "\n".join(outcome.log)
    assert outcome.runs == 1 and outcome.sigkills == 0, log            # one supervisor, never exited early
    assert len(site.cancelled) == 3 and outcome.slurmd_killed, log
    assert site.seen["controller"] and site.seen["accounting"], (site.seen, log)   # status named each daemon
    rows, report, runs = _check_once_each(fc, fc.started, files, log)
    classes = report["attempts_by_class"]
    assert classes.get("site_cancel", 0) >= 3 and classes.get("node_fail", 0) >= 1, (classes, log)
    assert "cancelled" not in classes, classes                        # none was the operators' decision
    assert report["outcome"] == {"done": files, "parked": 0, "cancelled_by_operator": 0, "not_ended": 0}
    assert f"finished: {files} inputs, {files} done, 0 parked, 0 cancelled by an operator, 0 lost" in log, log
    audit = fc.c.hp("log", str(fc.c.plan), "--json")
    entries = [e for e in json.loads(audit.stdout) if e["command"] == "outage"]
    assert any("accounting (slurmdbd)" in e["detail"] and "does not answer" in e["detail"] for e in entries), entries
    assert any("accounting (slurmdbd)" in e["detail"] and "answered again" in e["detail"] for e in entries), entries
    cpu = float(log.rsplit("SUPERVISOR-CPU ", 1)[1].split()[0])
    figures = (f"{files} inputs: done {rows and sum(r['status'] == 'done' for r in rows.values())}, parked 0, "
               f"lost 0, duplicated 0; Slurm runs {len(runs)} (by state "
               f"{dict(collections.Counter(r['state'] for r in runs))}); attempts by class {classes}; jobs done when "
               f"slurmdbd stopped / started again {site.done_at_dbd_stop} / {site.done_at_dbd_start}; status saw "
               f"{dict(site.seen)}; nodes Slurm drained meanwhile {drained or 'none'}; "
               f"supervisor wall {outcome.wall_s:.0f} s, CPU {cpu:.1f} s "
               f"({100 * cpu / outcome.wall_s:.2f}% of one core)")
    (slurm_cluster.workdir / "site-operations.txt").write_text(figures + "\n\n" + log + "\n")
    print("\n" + figures)


def test_a_preemption_under_preemptmode_requeue_ends_the_job_and_hpcrun_retries_it(slurm_cluster, hpcrun_bin,
                                                                                    example_root):
    """PreemptMode=REQUEUE would rerun a preempted job by itself; with --no-requeue it ends PREEMPTED,
    and hpcrun retries it (class preempted): its input is processed once."""
    files = 2
    faults = Faults(files=files, once=0, hopeless=0, slow=0, corrupt=0, kill_db=False, kill_slurmd=False,
                    kill_chains=0, kills=[], linger=15.0, throttle=2)
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw-preempt", files)
    fc = FaultCampaign(slurm_cluster, hpcrun_bin, example_root, "preempt", glob, faults)
    fc.prepare()
    urgent: dict = {}

    def preempt(out: Outcome, stop: threading.Event) -> None:
        slurm_cluster.wait_until(lambda: _running(slurm_cluster, fc.c.name), timeout=240, interval=1)
        node = _running(slurm_cluster, fc.c.name)[0][1]
        victims = [t for t, n in _running(slurm_cluster, fc.c.name) if n == node]
        slurm_cluster.run(["scontrol", "create", "PartitionName=urgent", "Nodes=ALL", "PriorityTier=2",
                           "MaxTime=INFINITE", "State=UP"])
        proc = slurm_cluster.run(["sbatch", "--parsable", "-p", "urgent", "-w", node, "--exclusive",
                                  "-o", "/dev/null", "--wrap", "sleep 3"])
        urgent.update(victims=victims, node=node, job=proc.stdout.strip(), err=proc.stderr)
        out.log.append(f"{time.strftime('%X')} urgent job {urgent['job']} on {node} to preempt {victims}")

    try:
        outcome = fc.drive(timeout=600, extra=[preempt])
    finally:
        slurm_cluster.run(["scontrol", "delete", "PartitionName=urgent"])
    log = "\n".join(outcome.log)
    assert urgent.get("job", "").isdigit(), (urgent, log)
    rows, report, runs = _check_once_each(fc, fc.started, files, log)
    preempted = [r for r in runs if r["state"] == "PREEMPTED"]
    assert sorted(r["job_id"] for r in preempted) == sorted(urgent["victims"]), (runs, log)   # ended, not requeued
    assert report["attempts_by_class"] == {"preempted": len(preempted)}, report["attempts_by_class"]
    assert sum(r["attempts"] for r in rows.values()) == files + len(preempted), rows
    assert Path(fc.c.plan / "manifest.json").exists()
