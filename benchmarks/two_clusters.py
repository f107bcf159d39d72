#!/usr/bin/env python3
"""Issue 26's benchmark: a campaign of 200 inputs over the test set-up's two Slurm clusters
(one slurmdbd), with the second cluster's controller stopped for two minutes mid-campaign.

It runs tests/cluster/test_two_clusters.py's first test at full size
(HPCRUN_TWO_CLUSTER_FILES=200, HPCRUN_TWO_CLUSTER_DOWN_S=120); the test starts the second
cluster itself (`python3 tests/cluster/harness.py twin start`) on a running first one:

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/two_clusters.py [--files 200] [--down 120]

Prints: lost and duplicated inputs (both must be 0), completed runs per cluster, runs by
state, how many job ids both clusters used, and the supervisor's wall and CPU time (its own
and the Slurm commands it ran) as a share of one core. Needs root (jobs run as the test user).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the benchmarks folder
from cluster_test import run_cluster_test  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--down", type=float, default=120, help="seconds the second controller is stopped")
    args = ap.parse_args()
    return run_cluster_test("tests/cluster/test_two_clusters.py", "stopped_controller", {
        "HPCRUN_TWO_CLUSTER_FILES": str(args.files), "HPCRUN_TWO_CLUSTER_DOWN_S": str(args.down)})


if __name__ == "__main__":
    sys.exit(main())
