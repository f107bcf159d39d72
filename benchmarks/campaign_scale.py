#!/usr/bin/env python3
"""Issue 14's campaign at scale: 5,000 small files through arrays on 16 emulated nodes, driven by
`hpcrun run` (SIGKILLed twice and restarted), with faults in 10% of first attempts.

    python3 benchmarks/campaign_scale.py [--files 5000] [--nodes 16] [--throttle 128] [--timeout 3600]

It (re)starts the test cluster with --nodes (root), then runs tests/cluster/test_campaign_scale.py
at that size and prints its figures as one JSON line: wall time, hpcrun's own CPU seconds and
their share of the wall time (target < 2%; the CPU of the sbatch/sacct/squeue it ran is measured
apart and not counted), sbatch/sacct/squeue calls and calls per minute, success rate after
retries excluding the hopeless inputs (target >= 99.5%), files unaccounted (target 0),
duplicates (every run of every job id in `sacct -D` minus the attempts recorded; target 0), and
the baseline measured in the same run: the same copies as one plain sbatch array waited for
with squeue (Slurm's own pace), with the ratio of the two wall times.
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
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--throttle", type=int, default=None, help="array throttle (default 8 per node)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds the last supervisor run may take")
    ap.add_argument("--dir", default=os.environ.get("HPCRUN_TEST_CLUSTER_DIR", "/tmp/hpcrun-test-cluster"))
    args = ap.parse_args()
    start = subprocess.run([sys.executable, str(REPO / "tests/cluster/harness.py"), "start", "--dir", args.dir,
                            "--nodes", str(args.nodes)])
    if start.returncode != 0:
        return start.returncode
    env = dict(os.environ, HPCRUN_TEST_CLUSTER_DIR=args.dir, HPCRUN_REQUIRE_CLUSTER="1",
               HPCRUN_SCALE_FILES=str(args.files), HPCRUN_SCALE_TIMEOUT=str(args.timeout))
    if args.throttle:
        env["HPCRUN_SCALE_THROTTLE"] = str(args.throttle)
    argv = [sys.executable, "-m", "pytest", "tests/cluster/test_campaign_scale.py", "-q", "-s", "-p",
            "no:cacheprovider"]
    return subprocess.run(argv, cwd=REPO, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
