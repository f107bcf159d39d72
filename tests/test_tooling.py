"""Lint and type checks are part of the suite, so CI enforces them."""

import shutil
import subprocess
import sys

import pytest

from .conftest import REPO


def test_ruff_clean():
    if shutil.which("ruff") is None:
        pytest.fail("ruff is not installed; pip install -e '.[test]'")
    dirs = [d for d in ("hpcrun", "tests", "benchmarks", "examples") if (REPO / d).is_dir()]
    proc = subprocess.run(["ruff", "check", *dirs], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_mypy_clean():
    proc = subprocess.run([sys.executable, "-m", "mypy", "hpcrun"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout
