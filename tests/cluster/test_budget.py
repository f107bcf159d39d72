"""Allocations and forecasts on the real Slurm 22.05 of the test cluster (issue 40).

The harness runs Slurm with ``AccountingStorageEnforce=associations,limits`` and the multifactor
priority plugin (usage that never decays), as a site that enforces allocations does. Each test
makes its own account, so its limit and usage touch no other test.

* An account with ``GrpTRESMins=cpu=1``, far less than the campaign needs: ``plan`` notes the shortfall
  with both figures; ``hpcrun run`` submits until the limit holds jobs (reason
  ``AssocGrpCPUMinutesLimit``), then nothing more (status, the audit trail and the supervisor's round
  say why, and the spec's event hook is run); when the limit is raised with ``sacctmgr`` it goes on (the
  hook is run again), and every input runs exactly once.
* A campaign whose inputs take known times: the forecast made once a third of the inputs are done lies
  within 20% of the actual end.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import re
import subprocess
import threading
import time
import urllib.request
import uuid

import pytest

from .campaigns import Campaign, queue_results, supervising
from .test_campaign_state import make_raw

pytestmark = pytest.mark.cluster


def _account(cluster, limit: str) -> str:
    name = "b" + uuid.uuid4().hex[:7]
    for argv in (["sacctmgr", "-i", "add", "account", name, "Cluster=hpcrun", "Description=issue40",
                  "Organization=hpcrun"],
                 ["sacctmgr", "-i", "add", "user", cluster.user, f"Account={name}", "Cluster=hpcrun"],
                 ["sacctmgr", "-i", "modify", "account", name, "set", f"GrpTRESMins={limit}"]):
        proc = cluster.run(argv)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return name


def _profile(cluster, max_queued: int):
    """local-test with a per-user queue limit (what a site's MaxSubmitJobs does)."""
    profiles = cluster.workdir / "profiles"
    profiles.mkdir(exist_ok=True)
    cluster.chown(profiles)
    cluster.write(profiles / "budget-test.yaml",
                  f"name: budget-test\nextends: local-test\nmax_queued_jobs: {max_queued}\n")
    return {"HPCRUN_PROFILE_PATH": str(profiles), "COLUMNS": "200"}


def _campaign(cluster, hpcrun_bin, example_root, name, files, linger, account=None, **more) -> Campaign:
    site = {"profile": "budget-test", **({"account": account} if account else {})}
    more.setdefault("jobs", {"files_per_job": 1, "chains_per_node": 1})
    return Campaign(cluster, hpcrun_bin, example_root, name, burst_buffer=None, inputs={"files": files},
                    chain_extra=["--linger", str(linger)], site=site, walltime="00:05:00", **more)


def _hp(c: Campaign, env, *args, timeout=300) -> subprocess.CompletedProcess:
    return c.cluster.run_as_user([c.hpcrun, *args], cwd=str(c.dir), env=env, timeout=timeout)


def _supervisor(c: Campaign, env) -> subprocess.Popen:
    return subprocess.Popen([c.hpcrun, "run", str(c.plan), "--interval", "2", "--json"], cwd=str(c.dir),
                            env=dict(c.cluster.user_env, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, user=c.cluster.uid, group=c.cluster.gid)


def _supervising(c: Campaign, env):
    """`hpcrun run` while the block waits on it; on a failure no held job is left for later tests."""
    return supervising(_supervisor(c, env), 600, lambda: _cancel(c))


def _status(c: Campaign, env) -> dict:
    proc = _hp(c, env, "status", str(c.plan), "--json", "--all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _runs(c: Campaign, since: str, fields: str = "Start,End") -> list:
    """(job or array task id, state, *fields) of every run of the campaign's jobs submitted since
    ``since`` (local time), as sacct lists them."""
    proc = c.cluster.run(["sacct", "-n", "-P", "-X", "-D", "-u", c.cluster.user, "-S", since,
                          "-o", f"JobName,JobID,State,{fields}"])
    return [line.split("|")[1:] for line in proc.stdout.splitlines() if line.startswith(c.name + ".")]


def _inputs(cluster, example_root, name, n):
    make_raw(cluster, example_root, cluster.pfs / f"raw-{name}", n, events=100)
    return sorted(str(p) for p in (cluster.pfs / f"raw-{name}").glob("*.h5"))[:n]


def _wait(what, check, timeout, sup=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        if sup is not None and sup.poll() is not None:
            raise AssertionError(f"the supervisor ended while waiting for {what}: {sup.communicate()}")
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}")


def test_run_stops_submitting_on_a_spent_allocation_and_goes_on_when_it_is_raised(
        slurm_cluster, hpcrun_bin, example_root):
    cluster = slurm_cluster
    if cluster.accounting != "slurmdbd":
        pytest.skip("association limits need slurmdbd")
    account = _account(cluster, "cpu=1")
    env = _profile(cluster, max_queued=3)
    c = _campaign(cluster, hpcrun_bin, example_root, "budget", _inputs(cluster, example_root, "budget", 10),
                  linger=8, account=account, events={"command": ["true"], "on": ["budget"]})
    planned = _hp(c, env, "plan", str(c.spec), "--out", str(c.plan))
    text = " ".join((planned.stdout + planned.stderr).split())
    assert planned.returncode == 0, text
    # 10 jobs x 1 CPU (one chain on the shared partition) x 5 min = 50 cpu-minutes; 1 is all there is
    assert f"note: account {account} has 1 of 1 cpu-minutes left" in text, text
    assert "the plan needs 50 cpu-minutes at its walltime" in text and "49 more than is left" in text, text

    since = dt.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    with _supervising(c, env) as sup:
        held = _wait("jobs held by the allocation", lambda: (lambda s: s if s["budget_held"] else None)(
            _status(c, env)), 420, sup)
        reasons = held["budget_held"][""]
        assert set(reasons) == {"AssocGrpCPUMinutesLimit"}, held["budget_held"]
        assert any(j["reason"] == "AssocGrpCPUMinutesLimit" for j in held["jobs"]), held["jobs"]
        outage = [o for o in held["outages"] if o["daemon"] == "allocation"]
        assert outage and outage[0]["ended_at"] is None and "AssocGrpCPUMinutesLimit" in outage[0]["detail"], outage
        # the supervisor sees it in its rounds; while it lasts it submits nothing, though plan jobs wait
        _wait("the supervisor's round to say so", lambda: "the allocation is spent" in (
            _status(c, env)["supervisor"] or {}).get("note", ""), 120, sup)
        now = _status(c, env)
        before, rounds = _sent(now), now["supervisor"]["rounds"]
        _wait("two more rounds", lambda: _status(c, env)["supervisor"]["rounds"] >= rounds + 2, 180, sup)
        during = _status(c, env)
        assert _sent(during) == before, "submitted while the allocation was spent"
        assert during["counts"]["pending"] > 0, during["counts"]     # there was work it held back
        assert during["budget_held"], during

        raised = cluster.run(["sacctmgr", "-i", "modify", "account", account, "set", "GrpTRESMins=cpu=-1"])
        assert raised.returncode == 0, raised.stderr
    final = _status(c, env)
    assert final["counts"]["done"] == 10 and not final["budget_held"], final["counts"]
    # nothing lost, nothing doubled: each plan job completed once. Slurm also ends jobs *running* when the
    # group's minutes run out (TIMEOUT long before their limit): those are class allocation, rerun unchanged
    runs = _runs(c, since)
    states = collections.Counter(state for _, state, _, _ in runs)
    assert states["COMPLETED"] == 10 and set(states) <= {"COMPLETED", "TIMEOUT"}, runs
    assert len({job_id for job_id, _, _, _ in runs}) == len(runs), runs
    assert sum(j["attempts"] for j in final["jobs"]) == len(runs), final["jobs"]
    log = _hp(c, env, "log", str(c.plan))
    assert "the allocation is spent" in log.stdout and "submitting again" in log.stdout, log.stdout[-2000:]
    report = _hp(c, env, "report", str(c.plan), "--json", "--no-plots")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert any("was raised" in a["text"] for a in data["allocation"]), data["allocation"]
    assert data["attempts_by_class"] == ({"allocation": states["TIMEOUT"]} if states["TIMEOUT"] else {}), data
    events = (c.plan / "events.log").read_text()   # the spec's hook: told once when spent, once when raised
    told = [json.loads(line.split(" ", 2)[2]) for line in events.splitlines()
            if line.split(" ")[1:2] == ["budget"] and " hook exit " not in line]
    assert [e["spent"] for e in told] == [True, False] and events.count("budget hook exit 0") == 2, events


def _forecast_on_the_live_page(c: Campaign) -> None:
    """`hpcrun serve`'s page in headless Chromium: the forecast's line on the chart and its words."""
    from hpcrun.report.web import make_server
    from tests import browser

    srv = make_server(c.plan, port=0, min_age=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        data = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{srv.server_address[1]}/api/summary.json",
                                                 timeout=30).read())
        assert data["forecast"].startswith("forecast: end "), data["forecast"]
        assert data["chart"]["forecast"].count(",") == 2, data["chart"]   # from now to the end
        if browser.why_not():
            return

        def check(page):
            assert page.text_content("#forecast").startswith("forecast: end ")
            assert page.get_attribute("#line-forecast", "points").count(",") == 2

        browser.open_page(f"http://127.0.0.1:{srv.server_address[1]}/", "dashboard-forecast.png", check)
    finally:
        srv.shutdown()
        srv.server_close()


def _sent(status: dict) -> list:
    """The plan jobs handed to Slurm so far, with their ids (a new submission changes this)."""
    return sorted((j["job"], j["slurm_id"]) for j in status["jobs"] if j["status"] != "pending")


def _cancel(c: Campaign) -> None:
    listed = [line.split() for line in c.cluster.run(["squeue", "-h", "-u", c.cluster.user, "-o", "%A %j"]
                                                     ).stdout.splitlines()]
    ids = [words[0] for words in listed if len(words) == 2 and words[1].startswith(c.name + ".")]
    if ids:
        c.cluster.run(["scancel", *ids])


def _end_of(c: Campaign, since: str) -> dt.datetime:
    ends = [dt.datetime.fromisoformat(end).astimezone(dt.timezone.utc)
            for _, state, _, end in _runs(c, since) if state == "COMPLETED"]
    return max(ends)


def test_forecast_after_a_third_lies_within_20_percent_of_the_actual_end(slurm_cluster, hpcrun_bin, example_root):
    cluster = slurm_cluster
    env = _profile(cluster, max_queued=3)
    n = 9
    # inputs of 20 s: a job's start-up and the supervisor's polls (a few seconds each, more under load) are
    # a small part of what the forecast measures (with 10 s they made errors of 20.5% and 20.9% in CI)
    c = _campaign(cluster, hpcrun_bin, example_root, "forecast", _inputs(cluster, example_root, "forecast", n),
                  linger=20)
    assert _hp(c, env, "plan", str(c.spec), "--out", str(c.plan)).returncode == 0
    started, since = dt.datetime.now(dt.timezone.utc), dt.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    sup = _supervisor(c, env)
    try:
        first = _status(c, env)   # nothing has ended: no guess
        assert first["forecast"] is None or not first["forecast"]["ready"], first["forecast"]
        third = _wait("a third of the inputs done", lambda: (lambda s: s if s["inputs"]["done"] >= n // 3 else None)(
            _status(c, env)), 600, sup)
        _forecast_on_the_live_page(c)
        out, err = sup.communicate(timeout=900)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.communicate()
    assert sup.returncode == 0, out[-3000:] + err[-3000:]
    f = third["forecast"]
    assert f["ready"], f
    made, end = dt.datetime.fromisoformat(f["made_at"]), dt.datetime.fromisoformat(f["end"])
    actual = _end_of(c, since)
    total, left = (actual - started).total_seconds(), (actual - made).total_seconds()
    error = (end - actual).total_seconds()
    figures = {"done_at_forecast": third["inputs"]["done"], "forecast_end": f["end"], "low": f["end_low"],
               "high": f["end_high"], "actual_end": actual.isoformat(), "campaign_s": round(total),
               "left_at_forecast_s": round(left), "forecast_left_s": round(f["remaining_s"]),
               "error_s": round(error), "error_of_campaign": round(abs(error) / total, 3),
               "error_of_left": round(abs(error) / left, 3), "concurrency": f["concurrency"],
               "seconds_per_input": f["seconds_per_input"]}
    print("forecast figures:", json.dumps(figures))
    (cluster.workdir / "forecast-figures.json").write_text(json.dumps(figures, indent=1))
    assert abs(error) <= 0.2 * total, figures
    done = _status(c, env)["forecast"]
    assert done["ready"] and done["remaining_s"] == 0, done


def test_a_running_job_the_spent_allocation_ends_is_rerun_with_the_same_time_limit(
        slurm_cluster, hpcrun_bin, example_root):
    """Slurm ends a job *running* when its account's group minutes run out: TIMEOUT long before its 5-minute
    limit. hpcrun calls that class allocation (not a time limit): the rerun keeps 00:05:00, and pends on
    the allocation until someone raises it (here the test stops there, and cancels it)."""
    cluster = slurm_cluster
    if cluster.accounting != "slurmdbd":
        pytest.skip("association limits need slurmdbd")
    account = _account(cluster, "cpu=1")   # one CPU-minute: a one-CPU job is ended after about a minute
    env = _profile(cluster, max_queued=3)
    c = _campaign(cluster, hpcrun_bin, example_root, "budget-kill",
                  _inputs(cluster, example_root, "budget-kill", 1), linger=240, account=account)
    planned = _hp(c, env, "plan", str(c.spec), "--out", str(c.plan))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    since = dt.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    sup = _supervisor(c, env)
    try:
        rerun = _wait("the rerun held by the allocation", lambda: (lambda s: s if s["budget_held"] and any(
            j["attempts"] == 2 for j in s["jobs"]) else None)(_status(c, env)), 300, sup)
    finally:
        sup.terminate()
        sup.communicate(timeout=120)
        _cancel(c)
    runs = _wait("both runs in accounting", lambda: (lambda r: r if len(r) >= 2 else None)(   # slurmdbd lags
        _runs(c, since, "ElapsedRaw,Timelimit")), 60)
    first, second = sorted(runs, key=lambda r: int(r[0].split("_")[0]))
    first[1], second[1] = first[1].split()[0], second[1].split()[0]   # "CANCELLED by 0": the state
    assert first[1] == "TIMEOUT" and int(first[2]) < 240 and first[3] == "00:05:00", first   # ended long before
    assert second[1] in ("PENDING", "CANCELLED") and second[3] == "00:05:00", second    # the same limit
    report = json.loads(_hp(c, env, "report", str(c.plan), "--json", "--no-plots").stdout)
    assert report["attempts_by_class"] == {"allocation": 1}, (report["attempts_by_class"], rerun["jobs"])



def test_late_bound_pilots_wait_out_a_spent_allocation_and_count_what_they_hold(slurm_cluster, hpcrun_bin,
                                                                                example_root):
    """The late-binding twin: `plan` counts what the pilots hold (their whole walltime, drain tail included).
    The allocation is spent from the start: the pilot the limit holds makes the waiting inputs show its
    reason, so status, the outage, the audit trail and the event hook say so as for held jobs; no other
    pilot is submitted meanwhile; raised, the pilot runs every input once, and the report counts the
    core-seconds the pilots held, idle ones too."""
    cluster = slurm_cluster
    if cluster.accounting != "slurmdbd":
        pytest.skip("association limits need slurmdbd")
    account = _account(cluster, "cpu=0")   # spent before the campaign starts: its first pilot is held
    env = _profile(cluster, max_queued=3)
    files = _inputs(cluster, example_root, "budget-late", 10)
    c = _campaign(cluster, hpcrun_bin, example_root, "budget-late", files,
                  linger=3, account=account, events={"command": ["true"], "on": ["budget"]},
                  jobs={"files_per_job": 1, "chains_per_node": 1, "binding": "late",
                        "pilot": {"walltime": "00:20:00", "slots": 1, "nodes": 1}})
    planned = _hp(c, env, "plan", str(c.spec), "--out", str(c.plan))
    text = " ".join(re.sub("[│┌┐└┘─┬┴┼├┤]", " ", planned.stdout + planned.stderr).split())   # cells wrap
    assert planned.returncode == 0, text
    # 10 inputs of up to 5 min, one at a time in a pilot of 20 min that drains 60 s before its end: 3 per
    # pilot, so 4 pilots of 1 CPU held 20 min = 80 cpu-minutes (not the inputs' 50)
    assert "about 4 pilot(s) for 10 job(s)" in text and "the plan needs 80 cpu-minutes at its walltime" in text, text

    with _supervising(c, env) as sup:
        held = _wait("the pilot held by the allocation", lambda: (lambda s: s if s["budget_held"] else None)(
            _status(c, env)), 300, sup)
        assert set(held["budget_held"][""]) == {"AssocGrpCPUMinutesLimit"}, held["budget_held"]
        _wait("the supervisor's round to say so", lambda: "the allocation is spent" in (
            _status(c, env)["supervisor"] or {}).get("note", ""), 120, sup)
        rounds = _status(c, env)["supervisor"]["rounds"]
        sent = (c.plan / "queue" / "submitted.tsv").read_text().splitlines()
        _wait("two more rounds", lambda: _status(c, env)["supervisor"]["rounds"] >= rounds + 2, 180, sup)
        assert (c.plan / "queue" / "submitted.tsv").read_text().splitlines() == sent   # none while spent
        raised = cluster.run(["sacctmgr", "-i", "modify", "account", account, "set", "GrpTRESMins=cpu=-1"])
        assert raised.returncode == 0, raised.stderr
    final = _status(c, env)
    assert final["counts"]["done"] == 10 and not final["budget_held"], final["counts"]
    done = queue_results(c.plan)
    assert collections.Counter(r[8] for r in done) == {"COMPLETED": 10}, done
    log = _hp(c, env, "log", str(c.plan)).stdout
    assert "the allocation is spent" in log and "submitting again" in log, log[-2000:]
    cluster.wait_until(lambda: not cluster.run(["squeue", "-h", "-n", f"{c.name}.pilot", "-o", "%A"]).stdout.strip(),
                       timeout=120, interval=1, what="the pilots ended")   # they stop once the queue says so
    report = json.loads(_hp(c, env, "report", str(c.plan), "--json", "--no-plots").stdout)
    p = report["pilots"]
    assert p["core_s_held"] > p["core_s_busy"] > 0 and sum(p["idle_core_s"].values()) > 0, p
    f = _status(c, env)["forecast"]   # read after the pilots ended, as the report was
    assert f["ready"] and f["core_hours_spent"] * 3600 >= 0.95 * p["core_s_held"], (f, p)   # idle time is cost
    metrics = (c.plan / "metrics.prom").read_text()
    assert 'hpcrun_pilots{campaign="e2e-budget-late",state="running"}' in metrics, metrics
