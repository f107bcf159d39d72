#!/usr/bin/env python3
"""The full fault campaign of issue 13: `hpcrun run` alone drives 200 files with injected faults
to the end on the test cluster, SIGKILLed at random moments (mid-submit included) and restarted.

It runs tests/cluster/test_supervisor.py at full size: HPCRUN_FAULT_FILES=200 and a node
failure (a node's slurmd SIGKILLed while it runs a job of the campaign, started again once
Slurm has marked the node down), which needs a cluster of several emulated nodes:

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/campaign_faults.py [--files 200] [--no-node-failure] [--timeout 2400]

Prints the test's summary line: supervisor runs, SIGKILLs, wall time, failed attempts by
class, the success rate excluding the hopeless inputs, how many tasks Slurm ran, and the
fault log (what was killed and restored when). Needs root (jobs run as the test user).
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
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--no-node-failure", action="store_true", help="skip the slurmd kill")
    ap.add_argument("--timeout", type=float, default=2400, help="seconds the last supervisor run may take")
    args = ap.parse_args()
    env = dict(os.environ, HPCRUN_FAULT_FILES=str(args.files), HPCRUN_FAULT_TIMEOUT=str(args.timeout),
               HPCRUN_FAULT_SLURMD="0" if args.no_node_failure else "1", HPCRUN_REQUIRE_CLUSTER="1")
    env.setdefault("HPCRUN_TEST_CLUSTER_DIR", "/tmp/hpcrun-test-cluster")
    argv = [sys.executable, "-m", "pytest", "tests/cluster/test_supervisor.py", "-q", "-s", "-p", "no:cacheprovider"]
    return subprocess.run(argv, cwd=REPO, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
