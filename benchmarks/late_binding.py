#!/usr/bin/env python3
"""Late binding against array mode (issue 47), on the running test cluster (3 nodes x 8 CPUs).

    python3 tests/cluster/harness.py start --nodes 3
    python3 benchmarks/late_binding.py [--cases short,dispatch,tenth,tail,limit,faults,scale] [--scale 2000,...]

short     200 one-CPU inputs of 3 s: late binding (tests/cluster/test_late_binding.py) and array mode
          (tests/cluster/test_scheduler_rpcs.py) in the same run. Goal: late ends within 30 s of
          `hpcrun run` starting (the work's floor is 27 s), with one sbatch and at most 30 controller RPCs.
dispatch  2000 no-op inputs: inputs per second across the 3 nodes once the pilots run (goal: 200/s).
tenth     2000 inputs of 0.1 s: `hpcrun run` to its exit (goal: 2x the work's floor of 8.4 s).
tail      500 inputs of 0.1 s and 10 of 60 s at random places: `hpcrun run` to its exit (goal: 1.1x of 60 s).
limit     10^4 one-second inputs with max_queued_jobs: 10 (goal: it ends, every input done once).
faults    200 inputs of 6 s from an XRootD origin through the nodes' caches, 3 pilots x 2 slots: a second
          generation planned under way, root cancels a pilot, a node crashes under pilots, one reaches its
          walltime mid-input, the supervisor is SIGKILLed twice (issue 48; about 7 minutes). Goal: every
          input done once, under its own generation, no attempt charged.
scale     no-op inputs at 2,000, 100,000 and 1,000,000 (--scale), each for a window of --window seconds
          from its first output: outputs per second in the window, metadata operations per input (the
          agents' own count), the largest directory a pilot or the supervisor lists, the supervisor's
          longest round and read of the queue between rounds (wall and CPU) and peak memory. Goals: the
          rate at every size within 10% of the smallest's, no listed directory above 1,000 entries, rounds
          and reads under 1 s of CPU (the emulated nodes share this machine's cores: wall time measures
          their load) and the supervisor under 300 MB.

Each case prints the test's own JSON figures; a table follows. The exit status is 1 when a case failed or
missed its goal (each goal is in the table). Needs root (jobs run as the test user; root resets the RPC
counters).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

from cluster_test import run_cluster_test


def _late(inputs: int, work: str, extra: Optional[Dict[str, str]] = None) -> Optional[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        rc = run_cluster_test("tests/cluster/test_late_binding.py", "short_inputs",
                              {"HPCRUN_LATE_INPUTS": str(inputs), "HPCRUN_LATE_WORK_S": work,
                               "HPCRUN_LATE_RESULT": out.name, "HPCRUN_LATE_TIMEOUT": "7200", **(extra or {})})
        text = Path(out.name).read_text()
        return json.loads(text) if rc == 0 and text else None


def _scale(inputs: int, window: float, interval: str) -> Optional[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        rc = run_cluster_test("tests/cluster/test_late_binding.py", "at_scale",
                              {"HPCRUN_LATE_SCALE": str(inputs), "HPCRUN_LATE_WINDOW": str(window),
                               "HPCRUN_LATE_RESULT": out.name, "HPCRUN_LATE_INTERVAL": interval})
        text = Path(out.name).read_text()
        return json.loads(text) if rc == 0 and text else None


def _array(inputs: int, work: str) -> Optional[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        rc = run_cluster_test("tests/cluster/test_scheduler_rpcs.py", "asks_the_controller",
                              {"HPCRUN_RPC_INPUTS": str(inputs), "HPCRUN_RPC_INTERVAL": "5",
                               "HPCRUN_RPC_WORK_S": work, "HPCRUN_RPC_RESULT": out.name})
        text = Path(out.name).read_text()
        return json.loads(text) if rc == 0 and text else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="short,dispatch,tenth,tail,limit,faults,scale")
    ap.add_argument("--scale", default="2000,100000,1000000", help="the scale case's sizes (the first: the baseline)")
    ap.add_argument("--window", type=float, default=120.0, help="the scale case's window, seconds")
    ap.add_argument("--interval", default="", help="the scale case's poll interval (default: the site's)")
    args = ap.parse_args()
    cases = args.cases.split(",")
    rows = []
    missed = []   # cases that failed or missed their goal: the exit status says so

    def goal(case: str, met: bool) -> str:
        if not met:
            missed.append(case)
        return "" if met else "  MISSED"

    if "short" in cases:
        late, array = _late(200, "3"), _array(200, "3")
        if late:
            rows.append(("short: late, 200 x 3 s", f"{late['to_last_output_s']} s to the last output "
                         f"(run {late['run_wall_s']} s), {late['sbatch']} sbatch, "
                         f"{late['controller_user_total']} controller RPCs, {late['pilots']} pilots; goal: run "
                         f"<= 29 s, 1 sbatch, <= 30 RPCs" + goal("short", late["run_wall_s"] <= 29 and late["sbatch"]
                                                                   == 1 and late["controller_user_total"] <= 30)))
        if array:
            rows.append(("short: array, 200 x 3 s", f"run {array['wall_s']} s, "
                         f"{array['controller_user_total']} controller RPCs"))
        if late and array:
            rows.append(("short: late against array (run walls)", f"{late['run_wall_s'] / array['wall_s']:.2f}"))
        if not late or not array:
            rows.append(("short", "FAILED" + goal("short", False)))
    if "dispatch" in cases:
        d = _late(2000, "0")
        rows.append(("dispatch: 2000 no-op inputs", (f"{d['dispatch_per_s']} inputs/s from the first claim to "
                     f"the last end, {d['pilots']} pilots; goal 200/s" + goal("dispatch", d["dispatch_per_s"] >= 200))
                     if d else "FAILED" + goal("dispatch", False)))
    if "tenth" in cases:   # issue 55: 2,000 inputs of 0.1 s, floor 8.4 s on 24 slots; goal 2x the floor
        t = _late(2000, "0.1")
        rows.append(("tenth: 2000 x 0.1 s (floor 8.4 s)", (f"run {t['run_wall_s']} s to its exit, "
                     f"{t['dispatch_per_s']} inputs/s, {t['scripts']} runs of the job script; goal <= 16.8 s"
                     + goal("tenth", t["run_wall_s"] <= 16.8)) if t else "FAILED" + goal("tenth", False)))
    if "tail" in cases:    # issue 55: 500 x 0.1 s and 10 x 60 s at random places; floor 60 s, goal 1.1x
        t = _late(510, "0.1", {"HPCRUN_LATE_TAIL": "10x60"})
        rows.append(("tail: 500 x 0.1 s + 10 x 60 s (floor 60 s)", (f"run {t['run_wall_s']} s to its exit, "
                     f"{t['scripts']} runs of the job script; goal <= 66 s" + goal("tail", t["run_wall_s"] <= 66))
                     if t else "FAILED" + goal("tail", False)))
    if "limit" in cases:
        lim = _late(10000, "1", {"HPCRUN_LATE_MAX_QUEUED": "10"})
        rows.append(("limit: 10^4 x 1 s, max_queued_jobs 10", f"done once each in {lim['run_wall_s']} s, "
                     f"{lim['pilots']} pilots, {lim['sbatch']} sbatch" if lim else "FAILED" + goal("limit", False)))
    if "faults" in cases:
        rc = run_cluster_test("tests/cluster/test_late_binding.py", "survive", {"HPCRUN_LATE_FAULTS": "1"})
        rows.append(("faults: 200 x 6 s, two generations, node cache", "passed (its log above)" if rc == 0
                     else f"FAILED (pytest exit {rc})" + goal("faults", False)))
    if "scale" in cases:
        base = None
        for size in [int(s) for s in args.scale.split(",")]:
            s = _scale(size, args.window, args.interval)
            if not s:
                rows.append((f"scale: {size:,} no-op inputs", "FAILED" + goal("scale", False)))
                continue
            base = base or s["outputs_per_s"]
            ratio = s["outputs_per_s"] / base
            # a round not measured (none ended after the first within the window) is a goal missed, not met. A
            # round's time is its CPU time: the 3 emulated nodes' 24 slots share this machine's 2 cores with the
            # supervisor, so its wall time here measures their load (a login node does not run them); both print
            met = ratio >= 0.9 and s["largest_listed_dir"] <= 1000 and s.get("round_cpu_s_max") is not None \
                and s["round_cpu_s_max"] < 1 and (s.get("tick_cpu_s_max") or 0) < 1 \
                and s["supervisor_maxrss_mb"] is not None and s["supervisor_maxrss_mb"] < 300
            rows.append((f"scale: {size:,} no-op inputs", (
                f"{s['outputs_per_s']} outputs/s in {s['window_s']:.0f} s ({ratio:.2f} of the first size), "
                f"{s['metadata_ops_per_input']} metadata ops/input, largest listed dir {s['largest_listed_dir']} "
                f"({s['largest_listed']}), round max {s['round_s_max']} s, its CPU {s.get('round_cpu_s_max')} s "
                f"(first: {s.get('first_round_s')} s), {s.get('ticks')} queue reads between rounds, longest "
                f"{s.get('tick_s_max')} s (CPU {s.get('tick_cpu_s_max')} s), "
                f"supervisor {s['supervisor_maxrss_mb']} MB, "
                f"planned in {s['planned_s']} s; goal: rate >= 0.9, dir <= 1000, round and read < 1 s of CPU, < 300 MB"
                + goal("scale", met))))
    print()
    for what, value in rows:
        print(f"{what:<42} {value}")
    if missed:
        print(f"\nfailed or missed their goal: {', '.join(dict.fromkeys(missed))}")
    return 1 if missed or not rows else 0

if __name__ == "__main__":
    sys.exit(main())
