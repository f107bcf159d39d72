#!/usr/bin/env python3
"""The full site-operations campaign of issue 37: one `hpcrun run`, never restarted, drives 120 inputs
on the test cluster while root cancels running jobs, a node fails under one (JobRequeue=1), slurmctld
is stopped and started from its saved state, and slurmdbd is down for five minutes.

It runs tests/cluster/test_site_operations.py at full size (the CI size is 18 inputs and 60 s):

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/site_operations.py [--files 120] [--dbd-down 300] [--ctld-down 20]

Prints the test's summary line: inputs done, parked, lost and duplicated, Slurm's runs by state,
failed attempts by class, what `hpcrun status` said of each daemon while it was down, the
supervisor's wall and CPU time; the fault log is beside it in the test's work directory
(site-operations.txt). Needs root (jobs run as the test user).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=120)
    ap.add_argument("--dbd-down", type=float, default=300, help="seconds slurmdbd stays down")
    ap.add_argument("--ctld-down", type=float, default=20, help="seconds slurmctld stays down")
    ap.add_argument("--timeout", type=float, default=2400, help="seconds the supervisor may take")
    args = ap.parse_args()
    env = dict(os.environ, HPCRUN_SITE_FILES=str(args.files), HPCRUN_SITE_DBD_DOWN_S=str(args.dbd_down),
               HPCRUN_SITE_CTLD_DOWN_S=str(args.ctld_down), HPCRUN_SITE_TIMEOUT=str(args.timeout),
               HPCRUN_REQUIRE_CLUSTER="1")
    env.setdefault("HPCRUN_TEST_CLUSTER_DIR", "/tmp/hpcrun-test-cluster")
    argv = [sys.executable, "-m", "pytest", "tests/cluster/test_site_operations.py", "-k", "rides_out", "-q", "-s",
            "-p", "no:cacheprovider"]
    return subprocess.run(argv, cwd=REPO, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
