#!/usr/bin/env python3
"""What a campaign leaves on the shared filesystem (issue 56), on the running test cluster (3 nodes x 8 CPUs).

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/footprint.py [--inputs 2000] [--modes late,array]

A campaign of --inputs no-op inputs that all succeed, run by `hpcrun run` in each mode (late binding:
tests/cluster/test_late_binding.py's short-inputs test; array mode, ``files_per_job: 1``:
tests/cluster/test_scheduler_rpcs.py's test). After it, the entries (files and directories) under the plan
directory and the outputs location are counted and divided by the inputs. Goals: at most 2.0 per input
for late binding and 3.0 for array mode, each output included; the plan's forecast of the end within 10%
of the count.

Prints each test's JSON figures, then a table; the exit status is 1 when a case failed or missed a goal.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

from cluster_test import run_cluster_test

GOALS = {"late": 2.0, "array": 3.0}
FORECAST_WITHIN = 0.10


def _case(mode: str, inputs: int) -> Optional[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        if mode == "late":
            rc = run_cluster_test("tests/cluster/test_late_binding.py", "short_inputs",
                                  {"HPCRUN_LATE_INPUTS": str(inputs), "HPCRUN_LATE_WORK_S": "0",
                                   "HPCRUN_LATE_RESULT": out.name, "HPCRUN_LATE_TIMEOUT": "3600"})
        else:
            rc = run_cluster_test("tests/cluster/test_scheduler_rpcs.py", "asks_the_controller",
                                  {"HPCRUN_RPC_INPUTS": str(inputs), "HPCRUN_RPC_INTERVAL": "5",
                                   "HPCRUN_RPC_WORK_S": "0", "HPCRUN_RPC_RESULT": out.name})
        text = Path(out.name).read_text()
        return json.loads(text) if rc == 0 and text else None


def forecast_end(forecast: Any) -> Optional[int]:
    """The files the plan forecast at the campaign's end, over every filesystem it writes to."""
    if not isinstance(forecast, dict):
        return None
    rows = forecast.get("filesystems") or []
    return sum(int((r.get("end") or {}).get("files", 0)) for r in rows) or None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=2000)
    ap.add_argument("--modes", default="late,array")
    args = ap.parse_args()
    rows: Dict[str, Dict[str, Any]] = {}
    missed: List[str] = []
    for mode in args.modes.split(","):
        got = _case(mode, args.inputs)
        if got is None:
            missed.append(f"{mode}: the test failed")
            continue
        counted = sum(got["entries"].values())
        forecast = forecast_end(got.get("forecast"))
        off = None if forecast is None else abs(forecast - counted) / counted
        rows[mode] = {"entries": got["entries"], "per_input": got["entries_per_input"], "goal": GOALS[mode],
                      "forecast_end_files": forecast, "forecast_off": None if off is None else round(off, 3)}
        if got["entries_per_input"] > GOALS[mode]:
            missed.append(f"{mode}: {got['entries_per_input']} entries per input (goal {GOALS[mode]})")
        if off is None or off > FORECAST_WITHIN:
            missed.append(f"{mode}: the forecast {forecast} is not within 10% of {counted}")
    print("\nfootprint " + json.dumps(rows))
    print(f"{'mode':<6} {'plan dir':>9} {'outputs':>8} {'per input':>10} {'goal':>5} {'forecast':>9} {'off':>6}")
    for mode, r in rows.items():
        print(f"{mode:<6} {r['entries']['plan']:>9} {r['entries']['outputs']:>8} {r['per_input']:>10} "
              f"{r['goal']:>5} {str(r['forecast_end_files']):>9} {str(r['forecast_off']):>6}")
    for m in missed:
        print("MISSED " + m)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
