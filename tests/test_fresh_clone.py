"""The tests a checkout's place can break pass from a checkout nobody prepared: a copy of the repository in a 0700
directory (as CI and home directories are), where the unprivileged test user cannot read the checkout and no
``../shared`` sits beside it. Guards the failures that only showed on a new machine: tests that ran the checkout's
programs as another user, and tests of ../shared's data that did not skip without it. (The whole suite from a fresh
clone under a 0700 directory is what CI runs, and what a session runs before it stops.)"""

from __future__ import annotations

import ast
import os
import re
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


# What the private copy can break: a test that runs a program as the unprivileged test user (which cannot enter the
# copy: it must use a world-readable copy of what it runs, or a working directory of its own) or that reads
# ../shared (absent beside the copy: it must skip). The copy runs those test files; the others import the same tree
# from either place (about 25 minutes of CI on one worker when it ran them all).
AT_RISK = re.compile(r"readable_copy|shared_dir|shared_data|\bSHARED\b|\.\./shared|xrootd_origin|runuser|setpriv"
                     r"|unprivileged|test_user|TEST_USER|def test\w*\([^)]*\bcase\b|\bpg\.(start|standby)\b")
AS_USER = re.compile(r"runuser|setpriv|\{\"user\": user\}")   # a helper module that runs programs as the test user


def _helpers_as_user(root: Path) -> set:
    """The tests' helper modules (not test files) that run programs as the test user: pg, xrootd."""
    return {p.stem for p in (root / "tests").glob("*.py")
            if not p.name.startswith(("test_", "conftest")) and AS_USER.search(p.read_text())}


def _imports(path: Path) -> set:
    """The modules of tests/ a test file imports (``from .xrootd import ...``, ``from tests import pg``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 or mod == "tests":
                out |= {mod} if mod and mod != "tests" else {a.name for a in node.names}
            elif mod.startswith("tests."):
                out.add(mod.split(".", 1)[1])
    return out


def _at_risk(clone: Path) -> list:
    helpers = _helpers_as_user(clone)
    return sorted(str(p.relative_to(clone)) for p in (clone / "tests").glob("test_*.py")
                  if p.name != Path(__file__).name and (AT_RISK.search(p.read_text()) or _imports(p) & helpers))


def test_the_copy_runs_every_test_that_runs_programs_as_the_test_user_or_reads_shared_data():
    assert {"pg", "xrootd"} <= _helpers_as_user(REPO)
    picked = _at_risk(REPO)
    for name in ("test_job_local.py", "test_xrootd.py", "test_iotune_darshan.py", "test_job_shared_node.py",
                 "test_store_outage.py", "test_node_cache.py"):
        assert f"tests/{name}" in picked, picked
    assert "tests/test_late_claims.py" not in picked


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
                               "-m", "not cluster and not selfcheck", *_at_risk(clone)],
                              cwd=clone, env=env, capture_output=True, text=True, timeout=1800)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        assert proc.returncode == 0, tail
        assert " passed" in proc.stdout
        import hpcrun
        assert Path(hpcrun.__file__).resolve().is_relative_to(REPO), "the outer run imports its own tree"
    finally:
        shutil.rmtree(private, ignore_errors=True)
