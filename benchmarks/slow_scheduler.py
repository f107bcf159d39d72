#!/usr/bin/env python3
"""A slow-answering scheduler at the issue's figures (issue 46): tests/cluster/test_slow_scheduler.py with
50 inputs, every Slurm command delayed by 30 s, and the first sbatch's answer lost after hpcrun's
default 120-s command timeout (the job was made). Slurm 22.05 has no RPC rate limiter; this is what a
throttled libslurm looks like to hpcrun (it sleeps and retries without a word).

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/slow_scheduler.py [--inputs 50] [--delay 30]

Passes when `hpcrun run` ends with every input done, none lost, none run twice, no two commands at
once, and `status` saying since when the scheduler is slow. Prints the wall time and the calls.
Needs root (jobs run as the test user).
"""

from __future__ import annotations

import argparse
import sys

from cluster_test import run_cluster_test


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=50)
    ap.add_argument("--delay", type=float, default=30.0, help="seconds every Slurm command waits first")
    args = ap.parse_args()
    return run_cluster_test("tests/cluster/test_slow_scheduler.py", "slow_scheduler", {
        "HPCRUN_SLOW_INPUTS": str(args.inputs), "HPCRUN_SLOW_DELAY": str(args.delay),
        "HPCRUN_SLOW_TIMEOUT": "120", "HPCRUN_SLOW_THRESHOLD": "10", "HPCRUN_SLOW_WALL": "3600"})


if __name__ == "__main__":
    sys.exit(main())
