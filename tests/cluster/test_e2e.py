"""The shipped detector-reco-local campaign, planned, submitted and followed with hpcrun on
the real Slurm test cluster, as the unprivileged test user. Then every failure path.

hpcrun runs from a virtualenv the test user can read (DIR/venv, built once per source
version); jobs, burst buffer stage-in/out (the Lua DataWarp emulator), the per-node
MariaDB and the h5py programs are all real.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .campaigns import PY, Campaign

pytestmark = pytest.mark.cluster


def _node_dir(c, run: Path, node: str) -> str:
    """The job's node-local directory: /tmp/hpcrun.<the campaign's key>.<job id>.<node>."""
    key = json.loads((c.plan / "manifest.json").read_text())["node_key"]
    return f"/tmp/hpcrun.{key}.{run.name}.{node}"

def _events(cluster, job_id: str) -> list:
    return [e["function"] for e in cluster.bb_events(job_id)]


def _epoch(ts: str) -> float:
    return time.mktime(time.strptime(ts, "%Y-%m-%dT%H:%M:%S"))


def _count_events(path: Path) -> int:
    return int(subprocess.run([PY, "-c", "import h5py,sys; print(len(h5py.File(sys.argv[1])['event_id']))",
                               str(path)], capture_output=True, text=True, check=True).stdout)


def test_campaign_end_to_end(slurm_cluster, hpcrun_bin, example_root):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "ok", chain_extra=["--cpu-seconds", "2"])
    subs = c.plan_and_submit()
    assert len(subs) == 2  # one script per input: each stages its own raw file in
    again = c.hp("submit", str(c.plan))
    assert "nothing to submit" in again.stdout
    rows = c.status()
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    for row, raw in zip(rows, sorted((example_root / "raw").glob("*.h5"))):
        job_id = row["slurm_id"]
        acct = slurm_cluster.sacct(job_id, fields="State,ExitCode,Start,End")[0]
        assert (acct["State"], acct["ExitCode"]) == ("COMPLETED", "0:0")
        # burst buffer: stage-in done before the job started, stage-out after it ended
        slurm_cluster.wait_until(lambda j=job_id: "teardown" in _events(slurm_cluster, j),
                                 timeout=30, what="teardown")
        ev = slurm_cluster.bb_events(job_id)
        funcs = [e["function"] for e in ev]
        assert funcs.index("data_in") < funcs.index("pre_run") \
            < funcs.index("post_run") < funcs.index("data_out")
        data_in = next(e["epoch"] for e in ev if e["function"] == "data_in")
        data_out = next(e["epoch"] for e in ev if e["function"] == "data_out")
        assert data_in <= _epoch(acct["Start"]) and data_out >= _epoch(acct["End"])
        assert all(e["status"] == "OK" for e in ev), ev
        # the database ran from the node-local copy, answered before the chains, stopped cleanly
        run = c.rundir(row)
        node = c.node(row)
        db_log = (run / "db" / f"{node}.log").read_text()
        assert f"{_node_dir(c, run, node)}/data" in db_log
        ready = float((run / "db" / f"{node}.ready").read_text())
        timelines = [(run / "chains" / f"{k}.timeline").read_text().split("\n") for k in range(4)]
        begins = [float(line.split()[1]) for t in timelines for line in t if line.startswith("begin")]
        ends = [float(line.split()[1]) for t in timelines for line in t if line.startswith("end")]
        assert len(begins) == 4 and ready < min(begins)
        assert max(begins) < min(ends), "the 4 chains did not run at the same time"
        assert (run / "db" / f"{node}.stopped").read_text().strip() == "0"
        assert "Shutdown complete" in (run / "db" / f"{node}.err").read_text()
        assert not Path(_node_dir(c, run, node)).exists()
        # every event reached the merged output, QA passed, output staged out to the "PFS"
        out = c.out / f"{raw.stem}.reco.h5"
        assert _count_events(out) == _count_events(raw) == 1500
        assert (run / "qa.tsv").read_text().split()[:5] == [raw.stem, "1500", "1500", "pass", f"{raw.stem}.reco.h5"]
        assert not (slurm_cluster.bb_job_dir / run.name).exists(), "burst buffer not torn down"


def test_stage_in_source_missing_holds_the_job(slurm_cluster, hpcrun_bin, example_root):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "nostage",
                 inputs={"files": [{"path": str(example_root / "raw" / "absent.h5"), "size": "1MB"}]})
    [sub] = c.plan_and_submit()
    rows = c.status(timeout=60)
    try:
        assert rows[0]["state"] == "PENDING"
        assert "slurm_bb_data_in" in rows[0]["reason"] and "absent.h5" in rows[0]["reason"]
        table = c.hp("status", str(c.plan))
        assert "slurm_bb_data_in" in table.stdout.replace("\n", "")
    finally:
        slurm_cluster.scancel(sub["job_id"])


def test_chain_failure_reports_the_chain_and_stages_out(slurm_cluster, hpcrun_bin, example_root):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "chainfail", chain_extra=["--fail-chain", "1"],
                 inputs={"glob": str(example_root / "raw" / "run1000.h5")})
    [sub] = c.plan_and_submit()
    [row] = c.status()
    assert (row["state"], row["exit_code"]) == ("FAILED", "7:0")
    assert "chain(s) failed: 1(rc=3)" in row["reason"]
    slurm_cluster.wait_until(lambda: "data_out" in _events(slurm_cluster, sub["job_id"]),
                             timeout=30, what="stage-out after the failure")


def test_db_killed_mid_job_is_restarted(slurm_cluster, hpcrun_bin, example_root):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "dbkill",
                 chain_extra=["--cpu-seconds", "8", "--refresh", "50"],
                 inputs={"glob": str(example_root / "raw" / "run1000.h5")})
    [sub] = c.plan_and_submit()

    def server_pid():
        pattern = rf"mariadbd.*hpcrun\.[0-9a-f]+\.{sub['job_id']}\."   # /tmp/hpcrun.<key>.<job id>.<node>
        out = subprocess.run(["pgrep", "-u", slurm_cluster.user, "-f", pattern],
                             capture_output=True, text=True).stdout.split()
        chains = list(c.plan.glob("run/*/*/chains/0.timeline"))
        return out and chains and "begin" in chains[0].read_text() and out
    pid = slurm_cluster.wait_until(server_pid, timeout=90, what="chains running")
    os.kill(int(pid[0]), signal.SIGKILL)
    [row] = c.status()
    assert row["state"] == "COMPLETED", row
    run = c.rundir(row)
    restarts = (run / "db" / f"{c.node(row)}.restarts").read_text().splitlines()
    assert len(restarts) == 1
    assert (run / "qa.tsv").read_text().split()[3] == "pass"


def test_db_never_ready_fails_fast(slurm_cluster, hpcrun_bin, example_root):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "notready",
                 database__options=["--skip-grant-tables", "--no-such-option"],
                 inputs={"glob": str(example_root / "raw" / "run1000.h5")})
    c.plan_and_submit()
    [row] = c.status(timeout=120)
    assert (row["state"], row["exit_code"]) == ("FAILED", "5:0")
    assert "did not become ready" in row["reason"]


def test_time_limit_stops_db_cleanly_and_stages_out(slurm_cluster, hpcrun_bin, example_root):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "timelimit", chain_extra=["--cpu-seconds", "600"],
                 walltime="00:02:00", inputs={"glob": str(example_root / "raw" / "run1000.h5")})
    [sub] = c.plan_and_submit()
    [row] = c.status(timeout=200)
    assert row["state"] in ("FAILED", "TIMEOUT"), row
    assert "time limit" in row["reason"]
    run = c.rundir(row)
    node = c.node(row)
    assert (run / "db" / f"{node}.stopped").read_text().strip() == "0"
    assert "Shutdown complete" in (run / "db" / f"{node}.err").read_text()
    slurm_cluster.wait_until(lambda: "data_out" in _events(slurm_cluster, sub["job_id"]),
                             timeout=30, what="stage-out after the time limit")


@pytest.mark.parametrize("runtime", ["apptainer", "shifter"])
def test_campaign_in_container_standins(slurm_cluster, hpcrun_bin, example_root, runtime):
    image = "docker:hpcrun/detector-reco:1" if runtime == "shifter" else str(example_root / "reco.sif")
    if runtime == "apptainer":
        Path(image).write_bytes(b"")
        slurm_cluster.chown(Path(image))
    else:
        shutil.rmtree("/tmp/hpcrun-pnc", ignore_errors=True)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, f"in-{runtime}",
                 container={"runtime": runtime, "image": image},
                 inputs={"glob": str(example_root / "raw" / "run1001.h5")})
    c.plan_and_submit()
    script = next((c.plan / "jobs").glob("*.sbatch")).read_text()
    [row] = c.status()
    assert row["state"] == "COMPLETED", row
    calls = [json.loads(line) for line in slurm_cluster.containers_log.read_text().splitlines()]
    mine = [call for call in calls if call["tool"] == runtime and str(c.plan) in call.get("cwd", "")]
    assert any(call["ok"] and "hpcrun-db.sh" in " ".join(call["argv"]) for call in mine), mine[-3:]
    assert any(call["ok"] and "hpcrun-chain.sh" in " ".join(call["argv"]) for call in mine)
    if runtime == "shifter":
        # sbatch accepted the SPANK options (the stub rejects malformed ones)
        assert "#SBATCH --image=docker:hpcrun/detector-reco:1" in script
        assert "#SBATCH --volume=/tmp:/tmp/hpcrun-pnc:perNodeCache=size=" in script
    assert _count_events(c.out / "run1001.reco.h5") == 1500


def test_array_campaign_status_counts_pending_tasks(slurm_cluster, hpcrun_bin, example_root):
    """Without per-job staging the jobs go out as one throttled array; status follows each task."""
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "array", chain_extra=["--cpu-seconds", "3"],
                 burst_buffer=None, jobs={"files_per_job": 1, "chains_per_node": 2, "throttle": 1})
    [sub] = c.plan_and_submit()
    assert sub["array"] == "0-1%1"
    early = c.status(wait=False)
    assert [r["job"] for r in early] == ["e2e-array.00001", "e2e-array.00002"]
    assert all(r["state"] in ("PENDING", "RUNNING", "COMPLETED") for r in early), early
    rows = c.status()
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    assert [r["slurm_id"] for r in rows] == [f"{sub['job_id']}_0", f"{sub['job_id']}_1"]
    for raw in sorted((example_root / "raw").glob("*.h5")):
        assert _count_events(c.out / f"{raw.stem}.reco.h5") == 1500
