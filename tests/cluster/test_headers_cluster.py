"""Per-job scripts rendered at submission on the real Slurm: sbatch reads each job's script from
standard input, Slurm stages each job's own #DW stage_in file, and the script Slurm holds is byte
for byte what `hpcrun plan show` prints and what the campaign store recorded."""

from __future__ import annotations

import hashlib
import sqlite3

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
