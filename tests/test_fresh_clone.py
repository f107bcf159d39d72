"""The suite passes from a checkout nobody prepared: a copy of the repository in a 0700
directory (as CI and home directories are), where the unprivileged test user cannot read the
checkout and no ``../shared`` sits beside it. Guards two classes of failure that only showed
on a new machine: tools the tests need but the test command did not install, and tests that
ran the checkout's programs as another user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.selfcheck]


def _tracked_files() -> list:
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          cwd=REPO, capture_output=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout: nothing to clone")
    return [f for f in proc.stdout.decode().split("\0") if f and (REPO / f).is_file()]


def test_suite_passes_from_a_private_copy():
    if os.environ.get("HPCRUN_SELFCHECK_INNER") == "1":
        pytest.skip("already inside the self-check")
    private = Path(tempfile.mkdtemp(prefix="hpcrun-selfcheck-"))
    try:
        assert (private.stat().st_mode & 0o777) == 0o700
        clone = private / "repo"
        for rel in _tracked_files():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, clone / rel)
        env = dict(os.environ, HPCRUN_SELFCHECK_INNER="1", PYTHONPATH=str(clone),
                   PYTHONDONTWRITEBYTECODE="1")
        env.pop("HPCRUN_REQUIRE_CLUSTER", None)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "-m", "not cluster and not selfcheck", "tests"],
                              cwd=clone, env=env, capture_output=True, text=True, timeout=1800)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        assert proc.returncode == 0, tail
        assert " passed" in proc.stdout
        import hpcrun
        assert Path(hpcrun.__file__).resolve().is_relative_to(REPO), "the outer run imports its own tree"
    finally:
        shutil.rmtree(private, ignore_errors=True)
