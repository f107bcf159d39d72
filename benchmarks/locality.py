#!/usr/bin/env python3
"""Issue 27's benchmark: the same 200 URL inputs read by two campaigns in a row on the test cluster
(3 nodes, each with its own cache directory), once with ``jobs.locality: prefer`` for the second
pass and once without, and once with late binding (issue 48: pilots that claim the inputs their
node's cache holds first; goal: a second-pass hit ratio of at least 0.95).

It runs tests/cluster/test_locality.py's two-pass tests at full size (HPCRUN_LOCALITY_FILES) on a
running cluster and a real XRootD origin on loopback (tests/xrootd.py):

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/locality.py [--files 200] [--size 1000000]

Prints, for each variant (array binding with and without locality, late binding with it): the second
pass's hit ratio ("hit ratio 0.93"), the bytes it read from the origin against the first pass's, and
both passes' wall time. The second pass lists the inputs
in reverse order (a later train does not read its datasets in the first one's order), so without
locality a job finds its input in its node's cache by chance only (about 1 in 3). Needs root.
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
    ap.add_argument("--size", type=int, default=1_000_000, help="bytes per input")
    args = ap.parse_args()
    return run_cluster_test("tests/cluster/test_locality.py", "second_pass", {
        "HPCRUN_LOCALITY_FILES": str(args.files), "HPCRUN_LOCALITY_SIZE": str(args.size)})


if __name__ == "__main__":
    sys.exit(main())
