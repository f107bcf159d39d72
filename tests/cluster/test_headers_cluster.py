"""Per-job scripts rendered at submission on the real Slurm: sbatch reads each job's script from
standard input, Slurm stages each job's own #DW stage_in file, and the script Slurm holds is byte
for byte what `hpcrun plan show` prints and what the campaign store recorded."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from .campaigns import Campaign

pytestmark = pytest.mark.cluster


def test_headers_rendered_at_submission_run_on_slurm(slurm_cluster, hpcrun_bin, example_root):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "headers", chain_extra=["--cpu-seconds", "2"],
                 jobs__script_files="never")
    subs = c.plan_and_submit()
    assert len(subs) == 2
    assert sorted(p.name for p in (c.plan / "jobs").iterdir()) == ["headers.tsv", "job.header"]
    rows = c.status()
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    with sqlite3.connect(c.plan / "state.db") as db:
        texts = dict(db.execute("SELECT digest, text FROM hpcrun_script_text"))
        recorded = dict(db.execute("SELECT job_id, script_digest FROM hpcrun_submission"))
    for n, row in enumerate(rows, 1):
        job_id = row["slurm_id"]
        held = slurm_cluster.run(["scontrol", "write", "batch_script", job_id, "-"])
        assert held.returncode == 0, held.stderr
        shown = c.hp("plan", "show", str(c.plan), str(n))
        assert shown.returncode == 0, shown.stderr
        assert held.stdout == shown.stdout
        digest = hashlib.sha256(shown.stdout.encode()).hexdigest()
        assert recorded[job_id] == digest and texts[digest] == shown.stdout
        staged = [e for e in slurm_cluster.bb_events(job_id) if e["function"] == "data_in"]
        assert staged and all(e["status"] == "OK" for e in staged), staged
        assert f"--job-name=e2e-headers.{n:05d}" in shown.stdout and "#DW stage_in" in shown.stdout
        assert (c.rundir(row) / "qa.tsv").read_text().split()[3] == "pass"
    assert sorted(p.name for p in c.out.glob("*.reco.h5")) == sorted(
        f"{raw.stem}.reco.h5" for raw in (example_root / "raw").glob("*.h5"))


def test_array_scripts_rendered_at_submission_run_on_slurm(slurm_cluster, hpcrun_bin, example_root):
    """An array plan whose array scripts are rendered at submission (``script_files: never``): Slurm
    runs every task from the text it read on standard input, which is what `plan show` prints for any
    of the array's jobs and what the store recorded."""
    from .test_campaign_state import make_raw

    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw-arrays", 4)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "array-headers", burst_buffer=None,
                 chain_extra=["--cpu-seconds", "1"], inputs__glob=glob,
                 jobs={"files_per_job": 1, "chains_per_node": 1, "array": "always", "throttle": 2,
                       "script_files": "never"})
    [batch] = c.plan_and_submit()
    assert batch["array"] == "0-3%2"
    assert sorted(p.name for p in (c.plan / "jobs").iterdir()) == ["array.header", "arrays.tsv"]
    rows = c.status()
    assert [r["state"] for r in rows] == ["COMPLETED"] * 4, rows
    held = slurm_cluster.run(["scontrol", "write", "batch_script", batch["job_id"], "-"])
    assert held.returncode == 0, held.stderr
    with sqlite3.connect(c.plan / "state.db") as db:
        texts = dict(db.execute("SELECT digest, text FROM hpcrun_script_text"))
        recorded = set(db.execute("SELECT script_path, script_digest FROM hpcrun_submission"))
    digest = hashlib.sha256(held.stdout.encode()).hexdigest()
    assert recorded == {("jobs/arrays.tsv#0", digest)} and texts == {digest: held.stdout}
    for n in (1, 4):
        shown = c.hp("plan", "show", str(c.plan), str(n))
        assert shown.returncode == 0 and shown.stdout == held.stdout, shown.stderr
    assert "#SBATCH --array=0-3%2" in held.stdout
    assert sorted(p.name for p in c.out.glob("*.reco.h5")) == sorted(
        f"{Path(p).stem}.reco.h5" for p in sorted(Path(glob).parent.glob("*.h5")))
