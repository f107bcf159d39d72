#!/usr/bin/env python3
"""A campaign that outlives its store (issue 57): PostgreSQL stopped for 20 minutes, then started again.

    python3 benchmarks/store_outage.py [--minutes 20] [--cases array,late,standby]

Runs tests/test_store_outage.py's campaigns with an outage of --minutes and the supervisor's own pauses (1, 2,
4, ... then every 120 s), not the tests' shortened ones: the array campaign (fake Slurm), the late-bound one (the
real pilot), and the failover to a promoted standby. Each test asserts that the supervisor is still running at
the end, that no input was lost or run twice, and that what ended meanwhile is recorded by the first round after
the store's return (within one pause of 120 s). Prints each case's outcome and wall time; exit 1 when one failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = {"array": "array_jobs_that_end", "late": "late_bound_results", "standby": "promoted_after"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--cases", default="array,late,standby")
    args = ap.parse_args()
    env = {**os.environ, "HPCRUN_OUTAGE_S": str(args.minutes * 60), "HPCRUN_OUTAGE_REAL_WAITS": "1"}
    failed = []
    for case in args.cases.split(","):
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", CASES[case],
                             "tests/test_store_outage.py"], cwd=REPO, env=env,
                            timeout=args.minutes * 60 + 1800).returncode
        print(f"store_outage {case}: {'passed' if rc == 0 else 'FAILED'} with a {args.minutes:g}-minute outage, "
              f"{time.monotonic() - t0:.0f} s in all", flush=True)
        if rc:
            failed.append(case)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
