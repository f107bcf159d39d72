#!/usr/bin/env python3
"""Submission throughput of `hpcrun submit` against a raw sbatch loop, on the real test cluster.

Usage::

    python3 benchmarks/submit_scale.py [--jobs 200] [--array-tasks 100000] [--dir DIR] [--json]

Needs the test cluster (``python3 tests/cluster/harness.py start``); run as root or as a user
Slurm accepts jobs from. Every job is submitted **held** (a one-line ``sbatch`` wrapper first on
PATH adds ``--hold``, for both sides alike), so nothing runs and the queue is cleaned with
``scancel`` after each measurement. Both sides run in one process per measurement and are
timed around the submitting code only (imports excluded; the CLI's own start-up, about 0.3 s,
is reported separately as ``cli_startup_s``).

* **individual jobs** (``--jobs N``, default 200): a plan with ``jobs.array: never`` (N
  scripts). Baseline: a Python loop ``subprocess.run(["sbatch", "--parsable", script])``
  over the same N scripts. Measured in the order raw, hpcrun, hpcrun, raw (each hpcrun run on
  a fresh plan); the better of each side's two runs counts. hpcrun:
  ``hpcrun.operate.submission.submit.submit(plan)`` — registering the inputs, and per job a claim,
  ``sbatch --job-name=<tag>`` and the record, each in its own transaction
  in ``state.db``. Reported: jobs per second of each and the ratio (target >= 0.9).
* **array tasks** (``--array-tasks N``, default 100000): a plan of N jobs packed into arrays
  of 1001 (local-test's ``max_array_size``). hpcrun: the same ``submit()`` call: N inputs
  registered, one claim, ``sbatch --array=...`` and N submission records per array script.
  Target: < 10 s. Baseline for reference: the raw ``sbatch`` of the same array scripts.

The plans are made away from the data (``inputs.list_file`` with sizes, files that do not
exist; ``inputs.checksum: none``), as production plans are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from synthetic_campaign import make_plan  # noqa: E402

from tests.cluster.pytest_cluster import read_env_file  # noqa: E402

WRAPPER = '#!/bin/sh\nexec /usr/bin/sbatch --hold "$@"\n'


def cancel(name_prefix: str, env: dict) -> None:
    out = subprocess.run(["squeue", "-h", "-o", "%F|%j"], capture_output=True, text=True, env=env).stdout
    ids = sorted({line.split("|")[0] for line in out.splitlines() if line.split("|")[1].startswith(name_prefix)})
    for chunk in range(0, len(ids), 500):
        subprocess.run(["scancel", *ids[chunk:chunk + 500]], env=env, check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%j", "-t", "PD,R"], capture_output=True, text=True,
                             env=env).stdout
        if not any(n.startswith(name_prefix) for n in out.split()):
            return
        time.sleep(0.5)


def raw_loop(scripts: list, name: str) -> float:
    t0 = time.perf_counter()
    for script in scripts:
        proc = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", str(script)], capture_output=True,
                              text=True, cwd=script.parent)
        if proc.returncode != 0:
            raise SystemExit(f"raw sbatch failed: {proc.stderr}")
    return time.perf_counter() - t0


def hpcrun_submit(plan: Path) -> tuple:
    from hpcrun.operate.submission.submit import submit

    t0 = time.perf_counter()
    report = submit(plan)
    return time.perf_counter() - t0, report.submitted_jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.environ.get("HPCRUN_TEST_CLUSTER_DIR", "/tmp/hpcrun-test-cluster"))
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--array-tasks", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cenv = read_env_file(Path(args.dir) / "env")
    work = Path(tempfile.mkdtemp(prefix="hpcrun-submit-bench-", dir=cenv.get("HPCRUN_TEST_WORK", "/tmp")))
    (work / "bin").mkdir()
    (work / "bin" / "sbatch").write_text(WRAPPER)
    (work / "bin" / "sbatch").chmod(0o755)
    os.environ.update({k: v for k, v in cenv.items() if k.startswith(("SLURM_", "HPCRUN_TEST_"))})
    os.environ["PATH"] = f"{work / 'bin'}:{os.environ['PATH']}"
    os.environ["HPCRUN_PROFILE_PATH"] = str(REPO / "site-profiles")
    env = dict(os.environ)
    result: dict = {"jobs": args.jobs, "array_tasks": args.array_tasks}
    try:
        # A B B A: the controller slows down a little as cancelled jobs pile up (MinJobAge), so
        # each side is measured once early and once late, and the better of its two counts
        raws, hps = [], []
        for k, side in enumerate(("raw", "hpcrun", "hpcrun", "raw")):
            single = make_plan(work, f"bench-single{k}", args.jobs, "never")
            scripts = sorted((single / "jobs").glob("*.sbatch"))
            if side == "raw":
                raws.append(raw_loop(scripts, "bench-raw"))
                cancel("bench-raw", env)
            else:
                hp_s, n = hpcrun_submit(single)
                cancel(f"bench-single{k}.", env)
                assert n == args.jobs, n
                hps.append(hp_s)
        raw_s, hp_s = min(raws), min(hps)
        result["single"] = {"raw_s": raw_s, "hpcrun_s": hp_s, "raw_runs_s": raws, "hpcrun_runs_s": hps,
                            "raw_jobs_per_s": args.jobs / raw_s, "hpcrun_jobs_per_s": args.jobs / hp_s,
                            "ratio": raw_s / hp_s,
                            "target": ">= 0.9", "pass": raw_s / hp_s >= 0.9}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hpcrun.cli", "--version"], capture_output=True, check=True,
                       env={**env, "PYTHONPATH": str(REPO)})
        result["cli_startup_s"] = time.perf_counter() - t0

        if args.array_tasks:
            t0 = time.perf_counter()
            arrays = make_plan(work, "bench-array", args.array_tasks, "always")
            result["array_plan_s"] = time.perf_counter() - t0
            array_scripts = sorted((arrays / "jobs").glob("*.sbatch"))
            raw_a = raw_loop(array_scripts, "bench-rawarray")
            cancel("bench-rawarray", env)
            hp_a, n = hpcrun_submit(arrays)
            cancel("bench-array.", env)
            assert n == args.array_tasks, n
            result["array"] = {"scripts": len(array_scripts), "raw_sbatch_s": raw_a, "hpcrun_s": hp_a,
                               "tasks_per_s": args.array_tasks / hp_a, "target": "< 10 s", "pass": hp_a < 10.0}
    finally:
        cancel("bench-", env)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        s = result["single"]
        print(f"individual jobs ({args.jobs}): raw sbatch loop {s['raw_jobs_per_s']:.1f} jobs/s, hpcrun submit "
              f"{s['hpcrun_jobs_per_s']:.1f} jobs/s, ratio {s['ratio']:.2f} (target >= 0.9: "
              f"{'PASS' if s['pass'] else 'FAIL'}); CLI start-up {result['cli_startup_s']:.2f} s")
        if "array" in result:
            a = result["array"]
            print(f"array tasks ({args.array_tasks} in {a['scripts']} scripts): hpcrun submit {a['hpcrun_s']:.2f} s "
                  f"(target < 10 s: {'PASS' if a['pass'] else 'FAIL'}); raw sbatch of the same scripts "
                  f"{a['raw_sbatch_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
