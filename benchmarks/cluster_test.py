"""Run one of the cluster tests at benchmark size (the benchmarks that are a cluster test made big)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

REPO = Path(__file__).resolve().parents[1]


def run_cluster_test(test: str, select: str, sizes: Dict[str, str]) -> int:
    """pytest ``test -k select`` on the running test cluster, with ``sizes`` in the environment."""
    env = dict(os.environ, **sizes, HPCRUN_REQUIRE_CLUSTER="1")
    env.setdefault("HPCRUN_TEST_CLUSTER_DIR", "/tmp/hpcrun-test-cluster")
    argv = [sys.executable, "-m", "pytest", test, "-k", select, "-q", "-s", "-p", "no:cacheprovider"]
    return subprocess.run(argv, cwd=REPO, env=env).returncode
