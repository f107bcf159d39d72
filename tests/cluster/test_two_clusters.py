"""examples/two-clusters-local on the test set-up's two Slurm clusters (one slurmdbd): `hpcrun run`
places jobs on both, rides out the second cluster's maintenance as a site does it (root cancels its
running jobs, then its controller is stopped mid-campaign and started again), retries what root
cancelled (class site_cancel), and loses or duplicates nothing, although the two clusters' job ids
overlap.

The second cluster (beta: bet00001-bet00002) is started here with its first job id set to the
first cluster's next one, so the campaign's jobs get the same ids on both clusters on purpose.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from .campaigns import PY, REPO, queue_results, run_jobs
from .pytest_cluster import HARNESS
from .test_campaign_state import make_raw

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "examples" / "two-clusters-local"
CPU_WRAPPER = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
               "r = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(f'SUPERVISOR-CPU {r.ru_utime + r.ru_stime:.2f}', flush=True); sys.exit(rc)")


def _harness(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def beta(slurm_cluster):
    """The second cluster, its job ids starting at the first cluster's next one."""
    probe = slurm_cluster.run_as_user(["sbatch", "--parsable", "--hold", "--wrap", "true"])
    assert probe.returncode == 0, probe.stderr
    first_id = int(probe.stdout.strip().split(";")[0])
    slurm_cluster.run(["scancel", str(first_id)])
    _harness("twin", "start", "--dir", str(slurm_cluster.dir), "--first-job-id", str(first_id + 1))
    yield "beta"
    _harness("twin", "stop", "--dir", str(slurm_cluster.dir))


def _campaign(cluster, example_root: Path, files: int, name: str) -> Path:
    """The example's spec and profiles in a fresh directory of the test user, over ``files`` inputs."""
    glob = make_raw(cluster, example_root, cluster.pfs / f"raw-{name}", files)
    work = cluster.workdir / name
    work.mkdir(exist_ok=True)
    cluster.chown(work)
    for profile in ("alpha.yaml", "beta.yaml"):
        shutil.copy(EXAMPLE / profile, work / profile)
    data = yaml.safe_load((EXAMPLE / "campaign.yaml").read_text())
    data["name"] = name
    data["inputs"]["glob"] = glob
    out = cluster.pfs / f"out-{name}"
    out.mkdir(parents=True, exist_ok=True)
    cluster.chown(out)
    data["outputs"]["location"] = str(out)
    cluster.write(work / "campaign.yaml", yaml.safe_dump(data, sort_keys=False))
    cluster.chown(work)
    return work


def _hp(cluster, hpcrun: str, work: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return cluster.run_as_user([hpcrun, *args], cwd=str(work), timeout=timeout, env={"COLUMNS": "200"})


def _tasks(cluster, name: str, since: str) -> list:
    """Every job of this campaign that either cluster ran since ``since``: (cluster, job id, state), from
    sacct -M."""
    proc = cluster.run(["sacct", "-M", "hpcrun,beta", "-X", "-n", "-P", "-S", since, "-E", "now",
                        "-o", "Cluster,JobID,JobName%80,State"])
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[2].startswith(name + "."):
            rows.append((parts[0], parts[1], parts[3].split(" ")[0]))
    return rows


def _running_on(cluster, which: str, name: str, states: str = "RUNNING") -> list:
    """Task ids of this campaign's jobs running (or in ``states``) on cluster ``which`` (squeue -M)."""
    proc = cluster.run(["squeue", "-M", which, "-h", "-r", "-t", states, "-o", "%i|%j"])
    rows = [line.split("|") for line in proc.stdout.split() if "|" in line]
    return [r[0] for r in rows if r[1].startswith(name + ".")]


def test_campaign_rides_out_a_stopped_controller_on_two_clusters(slurm_cluster, beta, hpcrun_bin, example_root):
    name = "two-clusters"
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    files = int(os.environ.get("HPCRUN_TWO_CLUSTER_FILES", "12"))
    down_s = float(os.environ.get("HPCRUN_TWO_CLUSTER_DOWN_S", "25"))
    work = _campaign(slurm_cluster, example_root, files, name)
    plan = work / "plan"
    proc = _hp(slurm_cluster, hpcrun_bin, work, "plan", str(work / "campaign.yaml"), "--out", str(plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "clusters" in proc.stdout and "beta" in proc.stdout, proc.stdout

    env = dict(slurm_cluster.user_env, COLUMNS="200")
    # the supervisor under a wrapper that reports its CPU time (its own and the commands it ran)
    timed = [PY, "-c", CPU_WRAPPER, hpcrun_bin, "run", str(plan), "--interval", "2"]
    started = time.monotonic()
    run = subprocess.Popen(timed, cwd=str(work), env=env,
                           user=slurm_cluster.uid, group=slurm_cluster.gid, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        # once beta runs some of the campaign, its maintenance begins as a site's does: root cancels the
        # running jobs there, then its controller goes away for a while
        slurm_cluster.wait_until(lambda: _running_on(slurm_cluster, "beta", name), timeout=120, interval=1)
        cancelled = _running_on(slurm_cluster, "beta", name)
        slurm_cluster.run(["scancel", "-M", "beta", *cancelled])
        # as a maintenance script does, the daemons stop once the cancelled jobs have left the nodes
        # (stopped while they complete, Slurm drains the nodes: "Kill task failed")
        slurm_cluster.wait_until(lambda: not set(cancelled) & set(_running_on(slurm_cluster, "beta", name, "R,CG")),
                                 timeout=120, interval=1)
        _harness("twin", "stop-controller", "--dir", str(slurm_cluster.dir))
        stopped_at = time.monotonic()
        down_seen = False
        while time.monotonic() - stopped_at < down_s:
            st = _hp(slurm_cluster, hpcrun_bin, work, "status", str(plan), "--json")
            if st.returncode == 0 and json.loads(st.stdout)["clusters"].get("beta", {}).get("state") == "down":
                down_seen = True
            time.sleep(2)
        _harness("twin", "start-controller", "--dir", str(slurm_cluster.dir))
        out, _ = run.communicate(timeout=600 + 10 * files)
        wall = time.monotonic() - started
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out
    assert down_seen, "status never showed cluster beta down while its controller was stopped"

    st = _hp(slurm_cluster, hpcrun_bin, work, "status", str(plan), "--json", "--all")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    states = collections.Counter(j["status"] for j in status["jobs"])
    assert states == {"done": files}, (states, out)                         # 0 lost
    tasks = _tasks(slurm_cluster, name, since)
    completed = collections.Counter()
    manifest = json.loads((plan / "manifest.json").read_text())
    per_cluster = collections.Counter(c for c, _j, s in tasks if s == "COMPLETED")
    for c, job_id, state in tasks:
        if state == "COMPLETED":
            completed[(c, job_id)] += 1
    assert sum(per_cluster.values()) == files, (tasks, out)                 # 0 duplicated: one completed run each
    assert len(tasks) == sum(j["attempts"] for j in status["jobs"]), (tasks, out)   # none submitted twice
    assert set(per_cluster) == {"hpcrun", "beta"}, per_cluster              # both clusters used
    ids = collections.defaultdict(set)
    for c, job_id, _s in tasks:
        ids[job_id].add(c)
    overlapping = [j for j, cs in ids.items() if len(cs) == 2]
    assert overlapping, f"no job id was used on both clusters: {tasks}"   # the store kept them apart anyway
    # the run records of both clusters are apart: run/<job>/<cluster>-<id>
    runs = sorted(run_jobs(plan))
    assert any(r.startswith("beta-") for r in runs) and any(r.startswith("hpcrun-") for r in runs), runs
    figures = status["clusters"]
    assert figures["hpcrun"]["jobs"].get("done", 0) + figures["beta"]["jobs"].get("done", 0) == files, figures
    assert figures["beta"]["state"] == "up", figures
    assert len(manifest["clusters"]) == 2
    report = _hp(slurm_cluster, hpcrun_bin, work, "report", str(plan), "--json")
    assert report.returncode == 0, report.stderr
    classes = json.loads(report.stdout)["attempts_by_class"]
    assert classes.get("site_cancel", 0) == len(cancelled) and "cancelled" not in classes, (classes, cancelled)
    assert f"finished: {files} inputs, {files} done, 0 parked, 0 cancelled by an operator, 0 lost" in out, out
    figures = json.loads(report.stdout)["clusters"]
    assert set(figures) == {"hpcrun", "beta"}, figures
    assert sum(f["runs_completed"] for f in figures.values()) == files, figures
    assert all(0 < f["cpu_efficiency"] <= 1 for f in figures.values()), figures
    metrics = (plan / "metrics.prom").read_text()
    assert 'hpcrun_cluster_up{campaign="two-clusters",cluster="beta"} 1' in metrics, metrics
    assert 'hpcrun_cluster_plan_jobs{campaign="two-clusters",cluster="beta",state="done"}' in metrics
    _live_page(slurm_cluster, hpcrun_bin, work, plan, figures)
    cpu = float(out.rsplit("SUPERVISOR-CPU ", 1)[1].split()[0])
    print(f"\n{files} inputs, {len(cancelled)} running jobs on beta cancelled by root, then beta's controller "
          f"down {down_s:.0f} s: attempts by class {classes}; lost {files - states['done']}, "
          f"duplicated {sum(per_cluster.values()) - files}; completed per cluster {dict(per_cluster)}; runs "
          f"{len(tasks)} (by state {dict(collections.Counter(s for _c, _j, s in tasks))}); job ids used on both "
          f"clusters {len(overlapping)}; supervisor wall {wall:.0f} s, CPU {cpu:.1f} s ({100 * cpu / wall:.1f}% of "
          f"one core)")


def test_jobs_waiting_on_a_drained_cluster_move_and_maintenance_gets_no_work(slurm_cluster, beta, hpcrun_bin,
                                                                             example_root):
    """beta is preferred (share 100) but its nodes are drained: the jobs placed there wait, are moved
    after move_pending_after (cancelled there, confirmed gone) and run on the first cluster; a
    maintenance reservation on beta then keeps new work off it."""
    name, files = "moves", 4
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    work = _campaign(slurm_cluster, example_root, files, name)
    data = yaml.safe_load((work / "campaign.yaml").read_text())
    data["site"]["profile"] = ["alpha.yaml", {"profile": "beta.yaml", "share": 100}]
    data["site"]["move_pending_after"] = "15s"
    slurm_cluster.write(work / "campaign.yaml", yaml.safe_dump(data, sort_keys=False))
    plan = work / "plan"
    assert _hp(slurm_cluster, hpcrun_bin, work, "plan", str(work / "campaign.yaml"), "--out", str(plan)).returncode == 0
    nodes = "bet[00001-00002]"
    slurm_cluster.run(["scontrol", "-M", "beta", "update", f"nodename={nodes}", "state=drain", "reason=hpcrun-test"])
    try:
        proc = _hp(slurm_cluster, hpcrun_bin, work, "run", str(plan), "--interval", "2", timeout=600)
    finally:
        slurm_cluster.run(["scontrol", "-M", "beta", "update", f"nodename={nodes}", "state=resume"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "moved" in proc.stdout, proc.stdout
    tasks = _tasks(slurm_cluster, name, since)
    on_beta = [t for t in tasks if t[0] == "beta"]
    assert on_beta and all(s == "CANCELLED" for _c, _j, s in on_beta), tasks    # placed there, never ran there
    done = [t for t in tasks if t[2] == "COMPLETED"]
    assert len(done) == files and {c for c, _j, _s in done} == {"hpcrun"}, tasks
    report = json.loads(_hp(slurm_cluster, hpcrun_bin, work, "report", str(plan), "--json").stdout)
    assert report["attempts_by_class"].get("moved") == len(on_beta), report["attempts_by_class"]
    assert report["succeeded"] == files
    log = _hp(slurm_cluster, hpcrun_bin, work, "log", str(plan)).stdout
    assert "off beta after" in log, log

    # maintenance: a reservation flagged MAINT over the walltime keeps every new job off beta
    slurm_cluster.run(["scontrol", "-M", "beta", "create", "reservation", "reservationname=hpcrun-maint",
                       "starttime=now", "duration=30", "flags=maint,ignore_jobs", "nodes=ALL", "users=root"])
    try:
        work2 = _campaign(slurm_cluster, example_root, 2, "maint")
        plan2 = work2 / "plan"
        assert _hp(slurm_cluster, hpcrun_bin, work2, "plan", str(work2 / "campaign.yaml"), "--out",
                   str(plan2)).returncode == 0
        sub = _hp(slurm_cluster, hpcrun_bin, work2, "submit", str(plan2))
        assert sub.returncode == 0, sub.stdout + sub.stderr
        assert "cluster beta: maintenance, 0 job(s) placed" in sub.stdout, sub.stdout
        assert "maintenance reservation hpcrun-maint" in sub.stdout, sub.stdout
        st = json.loads(_hp(slurm_cluster, hpcrun_bin, work2, "status", str(plan2), "--json").stdout)
        assert st["clusters"]["beta"]["state"] == "maintenance", st["clusters"]
        slurm_cluster.wait_until(lambda: len(_tasks(slurm_cluster, "maint", since)) == 2, timeout=30, interval=1)
        assert {c for c, _j, _s in _tasks(slurm_cluster, "maint", since)} == {"hpcrun"}
        _hp(slurm_cluster, hpcrun_bin, work2, "cancel", str(plan2), "--all")
    finally:
        slurm_cluster.run(["scontrol", "-M", "beta", "delete", "reservation=hpcrun-maint"])


def _live_page(cluster, hpcrun_bin: str, work: Path, plan: Path, figures: dict) -> None:
    """`hpcrun serve` of the campaign in headless Chromium: a row per cluster, and each one's health."""
    from tests import browser

    reason = browser.why_not()
    if reason:
        pytest.skip(f"no headless browser for the live page: {reason}")
    proc = subprocess.Popen([hpcrun_bin, "serve", str(plan), "--port", "0"], cwd=str(work), env=dict(cluster.user_env),
                            user=cluster.uid, group=cluster.gid, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, line
        url = line.split("on ", 1)[1].split(" ", 1)[0]

        def check(page):
            text = page.text_content("#merit")
            for name, f in figures.items():
                assert f"cluster {name}: runs completed / ended" in text, text
                assert f"{f['runs_completed']} / {f['runs_ended']}" in text, text
            assert "cluster beta health" in text and "up since" in text, text

        browser.open_page(url, "dashboard-two-clusters.png", check)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_plan_checks_each_clusters_own_allocation(slurm_cluster, beta, hpcrun_bin, example_root):
    """Issue 40, per cluster: one account on both clusters, limited on beta only (GrpTRESMins=cpu=1 there).
    `plan` asks each cluster (sshare --clusters) and notes the shortfall on beta alone."""
    account = "t" + uuid.uuid4().hex[:7]
    for argv in (["sacctmgr", "-i", "add", "account", account, "Cluster=hpcrun,beta", "Description=issue40",
                  "Organization=hpcrun"],
                 ["sacctmgr", "-i", "add", "user", slurm_cluster.user, f"Account={account}", "Cluster=hpcrun,beta"],
                 ["sacctmgr", "-i", "modify", "account", "where", f"name={account}", "cluster=beta", "set",
                  "GrpTRESMins=cpu=1"]):
        proc = slurm_cluster.run(argv)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    work = _campaign(slurm_cluster, example_root, 4, "two-budgets")
    data = yaml.safe_load((work / "campaign.yaml").read_text())
    data["site"]["account"] = account
    slurm_cluster.write(work / "campaign.yaml", yaml.safe_dump(data, sort_keys=False))
    proc = _hp(slurm_cluster, hpcrun_bin, work, "plan", str(work / "campaign.yaml"), "--out", str(work / "plan"),
               "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    budgets = {b["cluster"]: b for b in json.loads(proc.stdout)["budget"]}
    assert set(budgets) == {"hpcrun", "beta"}, budgets
    assert budgets["beta"]["checked"] and budgets["beta"]["limit_minutes"] == 1 and budgets["beta"]["short"]
    assert budgets["hpcrun"]["checked"] and budgets["hpcrun"]["limit_minutes"] is None
    assert not budgets["hpcrun"]["short"] and "no cpu-minute limit" in budgets["hpcrun"]["line"]
    assert f"account {account} on cluster beta has 1 of 1 cpu-minutes left" in budgets["beta"]["line"]


def _done_rows(plan: Path) -> list:
    """The queue's results: task, claim, pilot, slot, node, start, end, rc, state, ..."""
    return queue_results(plan)


def test_late_pilots_of_two_clusters_hand_off_then_drain_before_a_maintenance(slurm_cluster, beta, hpcrun_bin,
                                                                              example_root):
    """The late-binding twin of the two tests above. The example bound late on both clusters (alpha capped at
    one pilot): beta's nodes are drained at first, so its pilots pend; after move_pending_after they are
    cancelled there and alpha's pilot claims the inputs (none was bound to beta). Once beta is back, new
    pilots go there and claim inputs; then a maintenance reservation is made on beta to start shortly: its
    pilots claim only what ends before the window, and end; no pilot goes there after. Every input is done
    once."""
    name, files = "late-two", int(os.environ.get("HPCRUN_LATE_TWO_FILES", "36"))
    work = _campaign(slurm_cluster, example_root, files, name)
    data = yaml.safe_load((work / "campaign.yaml").read_text())
    data["site"]["profile"] = [{"profile": "alpha.yaml", "max_queued_jobs": 1}, {"profile": "beta.yaml", "share": 4}]
    data["site"]["move_pending_after"] = "10s"
    data["walltime"] = "00:02:00"
    data["chain"]["command"] += ["--linger", "10"]
    data["jobs"] = {"files_per_job": 1, "chains_per_node": 2, "binding": "late",
                    "pilot": {"walltime": "00:10:00", "idle_release": "10s", "input_time": "20s"}}
    slurm_cluster.write(work / "campaign.yaml", yaml.safe_dump(data, sort_keys=False))
    plan = work / "plan"
    proc = _hp(slurm_cluster, hpcrun_bin, work, "plan", str(work / "campaign.yaml"), "--out", str(plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (plan / "clusters" / "beta" / "bin" / "hpcrun-pilot.sh").exists()
    nodes = "bet[00001-00002]"
    slurm_cluster.run(["scontrol", "-M", "beta", "update", f"nodename={nodes}", "state=drain", "reason=hpcrun-test"])
    resumed = False
    env = dict(slurm_cluster.user_env, COLUMNS="200")
    run = subprocess.Popen([hpcrun_bin, "run", str(plan), "--interval", "2"], cwd=str(work), env=env,
                           user=slurm_cluster.uid, group=slurm_cluster.gid, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    slow = plan / "queue" / "slow" / "beta"
    try:
        slurm_cluster.wait_until(slow.exists, timeout=120, interval=1)    # beta's pending pilots handed off
        slurm_cluster.run(["scontrol", "-M", "beta", "update", f"nodename={nodes}", "state=resume"])
        resumed = True
        live = plan / "queue" / "live"
        slurm_cluster.wait_until(lambda: any(p.name.startswith("beta-") and [c for c in p.iterdir() if "_" in c.name]
                                             for p in live.iterdir()) if live.exists() else False,
                                 timeout=180, interval=1)   # a pilot of beta runs a claim
        created = time.time()
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(created + 30))
        slurm_cluster.run(["scontrol", "-M", "beta", "create", "reservation", "reservationname=hpcrun-late-maint",
                           f"starttime={start}", "duration=20", "flags=maint,ignore_jobs", "nodes=ALL",
                           "users=root"])
        window = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        if not resumed:
            slurm_cluster.run(["scontrol", "-M", "beta", "update", f"nodename={nodes}", "state=resume"])
        slurm_cluster.run(["scontrol", "-M", "beta", "delete", "reservation=hpcrun-late-maint"])
    assert run.returncode == 0, out[-4000:]
    status = json.loads(_hp(slurm_cluster, hpcrun_bin, work, "status", str(plan), "--json", "--all").stdout)
    assert collections.Counter(j["status"] for j in status["jobs"]) == {"done": files}, status["jobs"]
    rows = _done_rows(plan)
    completed = collections.Counter(r[0] for r in rows if r[8] == "COMPLETED")
    assert len(completed) == files and set(completed.values()) == {1}, completed      # each input once
    on_beta = [r for r in rows if r[2].startswith("beta-")]
    on_alpha = [r for r in rows if r[2].startswith("hpcrun-")]   # alpha.yaml names the first cluster hpcrun
    assert on_beta and on_alpha, rows
    # beta's pilots ran nothing past the window's start
    assert max(float(r[6]) for r in on_beta) <= window, (window, [r[6] for r in on_beta])
    sent = [line.split("\t") for line in (plan / "queue" / "submitted.tsv").read_text().splitlines()]
    assert [s for s in sent if s[3] == "beta" and float(s[2]) > created + 5] == [], sent
    log = _hp(slurm_cluster, hpcrun_bin, work, "log", str(plan)).stdout
    assert "pending on cluster beta for more than 10 s cancelled there" in log, log
    assert "drains before maintenance reservation hpcrun-late-maint" in log, log
    first_beta = next(s for s in sent if s[3] == "beta")[0]
    states = {j: s for c, j, s in _tasks(slurm_cluster, name, time.strftime("%Y-%m-%dT00:00:00")) if c == "beta"}
    assert all(s == "CANCELLED" for j, s in states.items() if j.startswith(first_beta + "_")), states
    print(f"\nlate on two clusters: {files} inputs, {len(on_alpha)} claims on alpha, {len(on_beta)} on beta; "
          f"beta's first pilots handed off, its later ones ended before the maintenance window")
