"""Parsing of Slurm command output (the commands themselves run in tests/cluster)."""

import json
import os
from pathlib import Path

import pytest

from hpcrun import slurm
from hpcrun.errors import InputError
from hpcrun.submit import read_record, submit

SACCT = """\
17_0|18|detector-reco-local|COMPLETED|0:0|None|00:00:04|2026-11-22T05:00:01|2026-11-22T05:00:05|localhost
17_1|19|detector-reco-local|FAILED|7:0|NonZeroExitCode|00:00:03|2026-11-22T05:00:01|2026-11-22T05:00:04|localhost
17_1.batch|19.batch|batch|FAILED|7:0||00:00:03|2026-11-22T05:00:01|2026-11-22T05:00:04|localhost
20|20|x.00001|CANCELLED by 1001|0:15|None|00:00:01|2026-11-22T05:00:01|2026-11-22T05:00:02|localhost
21|21|x.00002|PENDING|0:0|BurstBufferOperation|00:00:00|Unknown|Unknown|None assigned
"""


def test_parse_sacct_rows():
    rows = slurm.parse_sacct(SACCT)
    assert [r.job_id for r in rows] == ["17_0", "17_1", "20", "21"]
    assert rows[1].raw_id == "19" and rows[1].exit_code == "7:0"
    assert rows[2].state == "CANCELLED" and rows[2].terminal
    assert not rows[3].terminal


def test_sbatch_rejection_is_verbatim(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
                                 "Invalid account' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    with pytest.raises(slurm.SlurmError) as exc:
        slurm.sbatch(script)
    assert str(script) in str(exc.value) and "Invalid account" in str(exc.value)


def test_sbatch_env_drops_sbatch_variables(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\nenv | grep -c '^SBATCH_' > \"$(dirname \"$0\")/count\"\n"
                                 "echo '42;cluster'\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "1")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    assert slurm.sbatch(script) == "42"
    assert (fake / "count").read_text().strip() == "0"


def test_submit_records_each_job_and_is_repeatable(tmp_path, monkeypatch, spec_factory):
    from hpcrun.pipeline import load_plan
    from hpcrun.plandir import write_plan
    plan_dir = write_plan(load_plan(spec_factory({"jobs": {"array": "never"}}, inputs=3)),
                          tmp_path / "plan").out_dir
    fake = tmp_path / "bin"
    fake.mkdir()
    counter = fake / "n"
    counter.write_text("100")
    (fake / "sbatch").write_text(f"#!/bin/sh\nn=$(cat {counter}); echo $((n+1)) > {counter}; echo $n\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    first = submit(plan_dir)
    assert [s.job_id for s in first] == ["100", "101", "102"]
    assert submit(plan_dir) == []
    record = json.loads((plan_dir / "submitted.json").read_text())
    assert [s["script"] for s in record["submissions"]] == [f"jobs/job0000{i}.sbatch" for i in (1, 2, 3)]
    assert len(read_record(plan_dir)) == 3


def test_submit_needs_a_plan(tmp_path):
    with pytest.raises(InputError) as exc:
        submit(Path(tmp_path))
    assert "not a plan directory" in str(exc.value)
