"""The notebook in examples/notebook, executed in a Jupyter kernel as the test user against the real
test cluster: its campaign is planned, submitted, followed to the end and reported from Python."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.notebook_run import shown

from .campaigns import REPO

pytestmark = pytest.mark.cluster


def test_the_notebook_drives_a_campaign_on_the_cluster(slurm_cluster, hpcrun_bin):
    venv = Path(hpcrun_bin).parent.parent
    if subprocess.run([str(venv / "bin" / "python"), "-c", "import nbclient, ipykernel"]).returncode != 0:
        pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "nbclient", "nbformat", "ipykernel"],
                             capture_output=True, text=True, timeout=600)
        assert pip.returncode == 0, pip.stderr
    work = slurm_cluster.workdir
    for src in (REPO / "examples" / "notebook" / "campaign.ipynb", REPO / "tests" / "notebook_run.py"):
        shutil.copy(src, work / src.name)
    slurm_cluster.chown(work)
    done = slurm_cluster.run_as_user(
        [str(venv / "bin" / "python"), str(work / "notebook_run.py"), str(work / "campaign.ipynb"),
         str(work / "executed.ipynb")], env={"HPCRUN_NB_DIR": str(work / "nb")}, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    cells = shown(work / "executed.ipynb")
    assert not any("ERROR" in c["text"] for c in cells), cells
    first, _check, _bad, _planned, _submitted, status, report, frame = cells
    assert "scheduler: Slurm" in first["text"]
    assert status["html"].count("<td>done</td>") == 3, status["html"]
    assert "100.0%" in report["html"], report["html"]
    assert frame["text"].count("done") == 3
    outputs = sorted(p.name for p in (work / "nb" / "out").iterdir() if p.is_file())
    assert outputs == ["run0.out", "run1.out", "run2.out"]
