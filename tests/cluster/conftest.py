"""Fixtures of the campaign tests on the test cluster (the cluster itself: pytest_cluster.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .campaigns import EXAMPLE, PY, REPO, source_digest


@pytest.fixture(scope="session")
def hpcrun_bin(slurm_cluster) -> str:
    """hpcrun installed (non-editable) in a venv the test user can run."""
    venv = slurm_cluster.dir / "venv"
    stamp = venv / "hpcrun-source.digest"
    digest = source_digest()
    hpcrun = venv / "bin" / "hpcrun"
    if not (stamp.exists() and stamp.read_text() == digest and hpcrun.exists()):   # a run killed mid-install
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([PY, "-m", "venv", str(venv)], check=True)
        src = slurm_cluster.dir / "hpcrun-src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "*.plan", "__pycache__",
                                                                  "build", "*.egg-info"))
        # the optional parts an operator installs for the whole tool (plots, Darshan, a shared PostgreSQL store)
        proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", f"{src}[plots,darshan,postgres]"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        stamp.write_text(digest)
    return str(hpcrun)


@pytest.fixture(scope="session")
def example_root(slurm_cluster) -> Path:
    """The example prepared by the test user where its campaign.yaml expects it."""
    root = slurm_cluster.pfs_root / "detector-reco"
    copy = slurm_cluster.dir / "example-src"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(EXAMPLE, copy)
    slurm_cluster.chown(copy)
    shutil.rmtree(root, ignore_errors=True)
    proc = slurm_cluster.run_as_user([PY, str(copy / "prepare.py"), "--root", str(root),
                                      "--files", "2", "--events", "1500"], cwd=str(copy))
    assert proc.returncode == 0, proc.stderr
    return root
