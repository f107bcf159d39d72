#!/usr/bin/env python3
"""What a campaign costs the site's scheduler (issue 46): tests/cluster/test_scheduler_rpcs.py at 200 and
2000 single-node one-chain inputs in array mode, on the running test cluster.

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/scheduler_rpcs.py [--inputs 200,2000] [--interval 5]

For each size: the controller's RPCs from the job user (sdiag, reset before the run) split into
submission, tracking and in-job, per 1000 inputs; slurmdbd's from the job user (sacctmgr show stats);
and the tracking RPCs per hour. Then the ratio of tracking RPCs per hour between the sizes (issue 46:
within 10%). Needs root (jobs run as the test user; root resets the counters).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from cluster_test import run_cluster_test


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", default="200,2000", help="comma-separated campaign sizes")
    ap.add_argument("--interval", default="5", help="hpcrun run --interval (seconds)")
    ap.add_argument("--work", type=float, default=6.0, help="seconds of work of each input")
    args = ap.parse_args()
    results = []
    for n in [int(x) for x in args.inputs.split(",")]:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            rc = run_cluster_test("tests/cluster/test_scheduler_rpcs.py", "asks_the_controller",
                                  {"HPCRUN_RPC_INPUTS": str(n), "HPCRUN_RPC_INTERVAL": args.interval,
                                   # the same seconds of work per input at every size: jobs end at the same
                                   # pace, so each size's rounds see changes alike and back off alike
                                   "HPCRUN_RPC_WORK_S": f"{args.work:g}",
                                   "HPCRUN_RPC_RESULT": out.name, "HPCRUN_RPC_TIMEOUT": "3600"})
            if rc != 0:
                return rc
            results.append(json.loads(Path(out.name).read_text()))
    print(f"\n{'inputs':>7} {'wall s':>7} {'ctl/user':>8} {'submit':>6} {'track':>6} {'in-job':>6} "
          f"{'per 1000 inputs (ctl)':>22} {'track/h':>8} {'rounds':>6} {'track/round':>11} {'dbd/user':>8} "
          f"{'dbd/1000':>8}")
    for r in results:
        k = r["controller_per_1000_inputs"]
        print(f"{r['inputs']:>7} {r['wall_s']:>7.0f} {r['controller_user_total']:>8} "
              f"{r['controller_submission']:>6} {r['controller_tracking']:>6} {r['controller_in_job']:>6} "
              f"{k['total']:>22.1f} {r['tracking_per_hour']:>8.0f} {r['rounds']:>6} {r['tracking_per_round']:>11.2f} "
              f"{r['slurmdbd_user_total']:>8} "
              f"{r['slurmdbd_user_per_1000_inputs']:>8.1f}")
    if len(results) >= 2 and results[0]["tracking_per_round"]:
        per = results[-1]["tracking_per_round"] / results[0]["tracking_per_round"]
        print(f"tracking RPCs per round, {results[-1]['inputs']} against {results[0]['inputs']} inputs: {per:.2f}")
    if len(results) >= 2 and results[0]["tracking_per_hour"]:
        ratio = results[-1]["tracking_per_hour"] / results[0]["tracking_per_hour"]
        print(f"tracking RPCs per hour, {results[-1]['inputs']} against {results[0]['inputs']} inputs: "
              f"{ratio:.2f} (target within 10%: {'PASS' if abs(ratio - 1) <= 0.10 else 'FAIL'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
