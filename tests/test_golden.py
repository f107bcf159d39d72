"""Golden renders: the exact scripts of the shipped examples, reviewed as text.

A template or planner change that alters any generated line shows up here as a diff.
Regenerate deliberately with:  HPCRUN_UPDATE_GOLDEN=1 python3 -m pytest tests/test_golden.py
"""

import os
from pathlib import Path

import pytest

from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import render_plan

from .conftest import REPO

GOLDEN = REPO / "tests" / "golden"
CASES = {
    "star-cori": ["jobs/job00001.sbatch", "bin/hpcrun-job.sh", "bin/hpcrun-db.sh", "bin/hpcrun-chain.sh"],
    "star-generic-apptainer": ["jobs/array001.sbatch", "bin/hpcrun-chain.sh", "bin/hpcrun-checksum.py",
                               "jobs/finalize.sbatch"],
    "analysis-train-lustre": ["jobs/array001.sbatch", "bin/hpcrun-chain.sh"],
    "star-generic-apptainer-late": ["bin/hpcrun-pilot.sh", "jobs/array001.sbatch"],
}


@pytest.mark.parametrize("example", sorted(CASES))
def test_golden(example, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = load_plan(Path("examples") / example / "campaign.yaml")
    files, manifest = render_plan(plan, Path("/plans") / example)
    rendered = {f.path: f.text for f in files}
    update = os.environ.get("HPCRUN_UPDATE_GOLDEN") == "1"
    for rel in CASES[example]:
        golden = GOLDEN / example / rel
        if update:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(rendered[rel])
        assert golden.exists(), f"missing golden file {golden}; run with HPCRUN_UPDATE_GOLDEN=1"
        assert rendered[rel] == golden.read_text(), f"{example}/{rel} differs from its golden file"
