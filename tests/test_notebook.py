"""The notebook in examples/notebook runs end to end in a real Jupyter kernel (nbclient), against a
**stub** scheduler: the fake sbatch/squeue/sacct of tests/fake_slurm.py accept the jobs and never
run them. tests/cluster/test_notebook_cluster.py runs it against the real test cluster."""

from __future__ import annotations

import pytest

from .conftest import REPO
from .notebook_run import execute, shown

pytest.importorskip("nbclient", reason="nbclient is not installed (the test extra has it)")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (the test extra has it)")

NOTEBOOK = REPO / "examples" / "notebook" / "campaign.ipynb"


def test_the_notebook_runs_with_a_stub_scheduler(tmp_path, fake_slurm, monkeypatch):
    monkeypatch.setenv("HPCRUN_NB_DIR", str(tmp_path / "nb"))
    monkeypatch.setenv("HPCRUN_NB_STUB", "1")
    monkeypatch.delenv("HPCRUN_PROFILE_PATH", raising=False)
    execute(NOTEBOOK, tmp_path / "executed.ipynb", tmp_path)
    cells = shown(tmp_path / "executed.ipynb")
    assert not any("ERROR" in c["text"] for c in cells), cells
    first, check, bad, planned, submitted, status, report, frame = cells
    assert "scheduler: STUB" in first["text"]
    assert "<Validation" in check["text"] and "<strong>hpcrun validate</strong>" in check["html"]
    assert "files_per_jbo" in bad["text"] and "'line': 5" in bad["text"] and "did you mean" in bad["text"].lower()
    assert "<strong>hpcrun plan</strong>" in planned["html"] and "nb-demo.00003" in planned["html"]
    assert submitted["html"].count("jobs/") >= 1 and "plan_jobs" in submitted["html"]
    assert "<strong>hpcrun status</strong>" in status["html"] and "nb-demo.00001" in status["html"]
    assert "success rate" in report["html"]
    assert "nb-demo.00001" in frame["text"] and "status" in frame["text"]
    assert len([a for a in fake_slurm.args() if "array001.sbatch" in a]) == 1   # the 3 jobs: one array
