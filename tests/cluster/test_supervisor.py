"""`hpcrun run` alone drives a campaign with injected faults to the end on the real test cluster,
SIGKILLed at least 5 times (mid-submit included) and restarted; then the live view shows it in
headless Chromium. The full-size version (200 files, a node failure) is benchmarks/campaign_faults.py,
which runs this test with HPCRUN_FAULT_FILES=200 (HPCRUN_FAULT_SLURMD=0 leaves out the node crash).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import browser

from .faults import FaultCampaign, Faults
from .test_campaign_state import make_raw

pytestmark = pytest.mark.cluster


def _faults() -> Faults:
    files = int(os.environ.get("HPCRUN_FAULT_FILES", "16"))
    big = files >= 100
    return Faults(files=files, once=max(2, files // 12), hopeless=max(2, files // 50), slow=1,
                  corrupt=max(1, files // 100), kill_slurmd=os.environ.get("HPCRUN_FAULT_SLURMD", "1") == "1",
                  kill_chains=max(2, files // 20),
                  kills=["after:1", "timer", "before:1", "timer", "timer"] + (["timer"] * 3 if big else []))


def test_run_drives_a_faulty_campaign_to_the_end_through_sigkills(slurm_cluster, hpcrun_bin, example_root):
    faults = _faults()
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", faults.files)
    fc = FaultCampaign(slurm_cluster, hpcrun_bin, example_root, "sup", glob, faults)
    fc.prepare()
    outcome = fc.drive(timeout=float(os.environ.get("HPCRUN_FAULT_TIMEOUT", "900")))
    log = "\n".join(outcome.log)
    assert outcome.sigkills >= 5, log
    assert sorted(outcome.restored) == sorted(fc.corrupt), log

    st = fc.status()
    by_input = {}
    manifest = json.loads((fc.c.plan / "manifest.json").read_text())
    for job in manifest["jobs"]:
        by_input[os.path.basename(job["inputs"][0])] = job["name"]
    rows = {j["job"]: j for j in st["jobs"]}
    states = collections.Counter(j["status"] for j in st["jobs"])
    # every input ends done or parked with its reason; the hopeless ones are exactly the parked ones
    assert set(states) <= {"done", "parked"}, (states, log)
    parked = sorted(j for j, r in rows.items() if r["status"] == "parked")
    assert parked == sorted(by_input[n] for n in fc.hopeless), (parked, log)
    assert all("chain" in rows[j]["reason"] for j in parked), [rows[j]["reason"] for j in parked]
    assert len(rows) == faults.files                                     # none lost
    # a killed chain says nothing about its input: retried (elsewhere), never parked for it
    assert all(rows[by_input[n]]["status"] == "done" for n in outcome.chains_killed), log

    # none submitted twice for the same attempt: what Slurm ran is what the store recorded
    tasks = fc.slurm_tasks()
    assert len(tasks) == sum(r["attempts"] for r in rows.values()), (tasks, log)
    completed = collections.Counter()
    report = fc.report()
    for t in tasks:
        if t["state"] == "COMPLETED":
            completed[t["job_id"]] += 1
    assert all(n == 1 for n in completed.values())
    assert report["succeeded"] == faults.files - faults.hopeless          # 100% excluding the hopeless
    classes = report["attempts_by_class"]
    # a "once" input whose first attempt ran on the crashed node may fail as node_fail instead
    assert classes.get("chain", 0) >= 2 * faults.hopeless, classes
    assert classes.get("chain", 0) + classes.get("node_fail", 0) >= faults.once + 2 * faults.hopeless, classes
    assert classes.get("time_limit") == faults.slow and classes.get("checksum") == faults.corrupt, classes
    # each killed chain fails its attempt as chain_killed (node_fail if the crashed node had it)
    assert len(outcome.chains_killed) >= 1, log
    assert classes.get("chain_killed", 0) >= 1, classes
    assert classes.get("chain_killed", 0) + classes.get("node_fail", 0) >= len(outcome.chains_killed), classes
    assert report["chain_endings"].get("killed", 0) >= classes.get("chain_killed", 0), report["chain_endings"]
    # nothing of the campaign left on the nodes: the crashed node's copy was reclaimed by a later job
    key = manifest["node_key"]
    assert not list(Path("/tmp").glob(f"hpcrun.{key}.*")), list(Path("/tmp").glob(f"hpcrun.{key}.*"))
    if outcome.slurmd_killed:
        assert report["reclaimed"].get("dirs", 0) >= 1, report["reclaimed"]
    rate = report["succeeded"] / (faults.files - faults.hopeless)
    assert rate >= 0.995, rate
    changes = [c for _j, _s, c in report["retry_changes"]]
    assert any("time limit 00:02:00 -> 00:03:00" in c for c in changes), changes
    if outcome.slurmd_killed:
        assert classes.get("node_fail", 0) >= 1 and any(f"not on {outcome.slurmd_killed}" in c for c in changes)
    heartbeat = json.loads(fc.c.hp("status", str(fc.c.plan), "--json").stdout)
    metrics = (fc.c.plan / "metrics.prom").read_text()
    assert f'hpcrun_campaign_finished{{campaign="{fc.c.name}"}} 1' in metrics
    print(f"\n{faults.files} files: {outcome.runs} supervisor runs, {outcome.sigkills} SIGKILLs, "
          f"{outcome.wall_s:.0f} s wall; attempts by class {classes}; "
          f"success rate (excluding {faults.hopeless} hopeless) "
          f"{report['succeeded']}/{faults.files - faults.hopeless}; tasks run {len(tasks)}; "
          f"DB killed {outcome.db_killed}; slurmd killed {outcome.slurmd_killed}; chains killed "
          f"{len(outcome.chains_killed)}; chain endings {report['chain_endings']}; reclaimed {report['reclaimed']}")
    print("\n".join(line for line in outcome.log if not line.startswith("run ")))
    print("\n".join(line.split("\n", 1)[0] for line in outcome.log if line.startswith("run ")))
    assert heartbeat["campaign"] == fc.c.name
    _dashboard(fc, report)


def _dashboard(fc: FaultCampaign, report: dict) -> None:
    """The live view of this real campaign in headless Chromium; the screenshot is kept."""
    reason = browser.why_not()
    if reason:
        pytest.skip(f"no headless browser for the dashboard: {reason}")
    proc = subprocess.Popen([fc.c.hpcrun, "serve", str(fc.c.plan), "--port", "0"], cwd=str(fc.c.dir),
                            env=dict(fc.cluster.user_env), user=fc.cluster.uid, group=fc.cluster.gid,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, line
        url = line.split("on ", 1)[1].split(" ", 1)[0]

        def check(page):
            assert page.text_content("#done") == str(report["inputs"]["done"])
            assert page.text_content("#parked") == str(report["inputs"]["parked"])
            assert page.text_content("#succeeded") == str(report["succeeded"])
            assert "finished" in page.text_content("#beat")
            points = page.get_attribute("#line-completed", "points")
            assert points.count(",") == report["runs_completed"] + 1
            assert "time_limit" in page.text_content("#classes")

        shot = browser.open_page(url, "dashboard-cluster.png", check)
        assert shot.stat().st_size > 10_000
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        time.sleep(0.1)
