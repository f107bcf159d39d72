"""A campaign operated as a team on PostgreSQL, on the real test cluster (issue 25):

* the operators pause it (nothing goes out for several rounds), resume it, cancel a job in flight
  (not retried), and the PostgreSQL server is restarted while `hpcrun run` drives it: the campaign
  finishes, nothing lost, nothing submitted twice, every action in `hpcrun log`; report, status,
  the live page and the API give the same figures;
* supervisor S1 is frozen (SIGSTOP), its sessions are terminated on the server, S2 starts under
  another host name (`unshare --uts`) and takes over; S1, thawed, stops with exit 4 naming S2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest
from sqlalchemy import create_engine, text

from tests import pg

from .campaigns import Campaign
from .test_campaign_state import make_raw

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]


def _campaign(cluster, hpcrun_bin, example_root, name: str, files: int, linger: float) -> Campaign:
    glob = make_raw(cluster, example_root, cluster.pfs / "raw", files, events=200)
    c = Campaign(cluster, hpcrun_bin, example_root, name, burst_buffer=None, inputs__glob=glob,
                 chain_extra=["--linger", str(linger)], jobs={"files_per_job": 1, "chains_per_node": 2})
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return c


def _supervisor(c: Campaign, url: str, *prefix: str) -> subprocess.Popen:
    env = dict(c.cluster.user_env, COLUMNS="200")
    argv = [*prefix, c.hpcrun, "run", str(c.plan), "--db", url, "--interval", "2", "--json"]
    kw = {} if prefix else {"user": c.cluster.uid, "group": c.cluster.gid}
    return subprocess.Popen(argv, cwd=str(c.dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _status(c: Campaign, url: str) -> dict:
    proc = c.hp("status", str(c.plan), "--db", url, "--json", "--all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _ours(c: Campaign) -> list:
    proc = c.cluster.run(["squeue", "-h", "-u", c.cluster.user, "-o", "%i|%j"])
    return [line for line in proc.stdout.split() if line.split("|")[1].startswith(c.name + ".")]


def _slurm_tasks(c: Campaign, since: str) -> list:
    proc = c.cluster.run(["sacct", "-n", "-P", "-X", "-D", "-u", c.cluster.user, "-S", since, "-o", "JobID,JobName"])
    return [line for line in proc.stdout.splitlines()
            if line.split("|")[1].startswith(c.name + ".") and not line.endswith(".finalize")]


def test_pause_resume_cancel_and_a_server_restart_mid_campaign(slurm_cluster, hpcrun_bin, example_root,
                                                               own_pg_server):
    url = pg.fresh_database(own_pg_server)   # restarted below: not the server the other worker's tests use
    c = _campaign(slurm_cluster, hpcrun_bin, example_root, "team", files=6, linger=6)
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    assert c.hp("pause", str(c.plan), "--db", url, "--note", "calibration check").returncode == 0
    sup = _supervisor(c, url)
    try:
        time.sleep(10)                                              # about five rounds of 2 s
        assert _ours(c) == [] and sup.poll() is None
        st = _status(c, url)
        assert st["paused"].startswith("paused by ") and "(calibration check)" in st["paused"], st["paused"]
        assert c.hp("resume", str(c.plan), "--db", url).returncode == 0
        slurm_cluster.wait_until(lambda: len(_ours(c)) >= 2, timeout=120, interval=1)
        victim = next(j for j in _status(c, url)["jobs"] if j["status"] in ("submitted", "running"))
        cancel = c.hp("cancel", str(c.plan), "--db", url, "--jobs", victim["job"], "--json")
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        pg.restart(url)                                             # every session of the supervisor dropped
        out, err = sup.communicate(timeout=420)
    finally:
        if sup.poll() is None:
            sup.kill()
    assert sup.returncode == 0, out[-2000:] + err[-2000:]
    run = json.loads(out)
    assert run["outcome"] == "finished" and run["outages"], run["outages"]

    st = _status(c, url)
    rows = {j["job"]: j for j in st["jobs"]}
    assert len(rows) == 6                                                  # none lost
    assert rows[victim["job"]]["status"] == "failed", rows[victim["job"]]  # cancelled, not retried
    assert {r["status"] for n, r in rows.items() if n != victim["job"]} == {"done"}
    tasks = _slurm_tasks(c, since)
    assert len(tasks) == sum(r["attempts"] for r in rows.values()) == 6    # none submitted twice

    log = json.loads(c.hp("log", str(c.plan), "--db", url, "--json").stdout)
    commands = [e["command"] for e in log]
    for command in ("pause", "run", "resume", "cancel", "submit"):
        assert command in commands, commands
    assert all(e["who"].startswith(f"{slurm_cluster.user}@") for e in log)
    assert victim["job"] in next(e["detail"] for e in log if e["command"] == "cancel")

    # the same figures from report, status, the live page and the Python API
    report = json.loads(c.hp("report", str(c.plan), "--db", url, "--json").stdout)
    assert report["inputs"]["done"] == 5 == sum(1 for r in rows.values() if r["status"] == "done")
    api = c.cluster.run_as_user([os.path.join(os.path.dirname(hpcrun_bin), "python3"), "-c", (
        "import json, sys, hpcrun; r = hpcrun.campaign_report(sys.argv[1], db=sys.argv[2]); "
        "print(json.dumps(r.to_dict(), default=str))"), str(c.plan), url])
    assert api.returncode == 0, api.stderr
    figures = json.loads(api.stdout)
    assert (figures["succeeded"], figures["inputs"]) == (report["succeeded"], report["inputs"])
    serve = subprocess.Popen([c.hpcrun, "serve", str(c.plan), "--db", url, "--port", "0"], cwd=str(c.dir),
                             env=dict(slurm_cluster.user_env), user=slurm_cluster.uid, group=slurm_cluster.gid,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = serve.stdout.readline()
        base = line.split("on ", 1)[1].split(" ", 1)[0]
        page = json.loads(urllib.request.urlopen(base + "api/summary.json", timeout=30).read())
    finally:
        serve.terminate()
        serve.wait(timeout=10)
    assert (page["succeeded"], page["inputs"]["done"]) == (report["succeeded"], report["inputs"]["done"])
    assert page["paused"] is None and any(e["command"] == "cancel" for e in page["audit"])


def test_a_frozen_supervisor_whose_sessions_were_dropped_stops_when_another_took_over(
        slurm_cluster, hpcrun_bin, example_root, pg_server):
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --uts is not permitted here (needs root)")
    url = pg.fresh_database(pg_server)
    c = _campaign(slurm_cluster, hpcrun_bin, example_root, "takeover", files=6, linger=4)
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    s1 = _supervisor(c, url)
    s2 = None
    try:
        slurm_cluster.wait_until(lambda: len(_ours(c)) >= 1, timeout=120, interval=1)
        os.kill(s1.pid, signal.SIGSTOP)
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            dropped = conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                        "WHERE application_name LIKE :me"), {"me": f"%:{s1.pid}"}).all()
        admin.dispose()
        assert dropped, "S1 had no session to drop"
        runuser = ["runuser", "-u", slurm_cluster.user, "--"]
        s2 = _supervisor(c, url, "unshare", "--uts", "sh", "-c", 'hostname login02 && exec "$@"', "sh", *runuser)
        slurm_cluster.wait_until(lambda: "login02" in (_status(c, url).get("supervisor") or {}).get("holder", ""),
                                 timeout=60, interval=1)
        os.kill(s1.pid, signal.SIGCONT)
        _out1, err1 = s1.communicate(timeout=120)
        out2, err2 = s2.communicate(timeout=420)
    finally:
        for p in (s1, s2):
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
    assert s1.returncode == 4, err1[-2000:]
    assert "login02" in err1 and "nothing since" in err1, err1[-2000:]
    assert s2.returncode == 0, out2[-2000:] + err2[-2000:]
    rows = {j["job"]: j for j in _status(c, url)["jobs"]}
    assert len(rows) == 6 and {r["status"] for r in rows.values()} == {"done"}
    assert len(_slurm_tasks(c, since)) == sum(r["attempts"] for r in rows.values()) == 6   # nothing twice
