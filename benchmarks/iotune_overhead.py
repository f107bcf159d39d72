#!/usr/bin/env python3
"""Harness overhead of `hpcrun iotune run` against running the same fio commands directly.

Measured in one run, on this node, with the same fio command lines (taken from hpcrun's own
plan, so both sides do exactly the same I/O):
  * direct: a plain loop that makes each point's directory, runs each fio command with its
    output to a file, and removes the directory (what a user would script by hand);
  * local:  `python -m hpcrun.cli iotune run --local ...` in a fresh process, end to end
    (start-up, validation, planning, the runs, collect, results.json, the PNG plot, history);
  * job:    `hpcrun iotune run` rendering the batch script, the script run with bash (no
    Slurm), then `hpcrun iotune collect`; job-sh: the script alone (run_step, bookkeeping
    files: the overhead inside the allocation).
Each figure is the fastest of --repeat rounds; the modes alternate within a round so that
drift of the disk or page cache hits all of them alike. Target: ratio <= 1.05 (5%).

Usage: python3 benchmarks/iotune_overhead.py [--target $TMPDIR] [--transfer-sizes 64k,1m,4m]
       [--writers 1,2] [--block 512m] [--repeat 2] [--json]
No cluster, no installation: the package of this checkout runs (PYTHONPATH=<checkout>); needs fio.
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

from hpcrun.cli.iotune import load_profile_or_local  # noqa: E402
from hpcrun.iotune.sweeps import local as local_mode  # noqa: E402
from hpcrun.iotune.sweeps.plan import plan_sweep  # noqa: E402
from hpcrun.iotune.sweeps.presets import load_sweep  # noqa: E402

TARGET_RATIO = 1.05


def sweep_args(args: argparse.Namespace, target: str) -> list:
    return ["--name", "bench", "--transfer-size", args.transfer_sizes, "--writers", args.writers,
            "--block-size", args.block, "--engine", "fio", "--target", target]


def run_direct(args: argparse.Namespace, target: str, work: Path) -> float:
    """The same fio argv as hpcrun's plan, in a plain loop."""
    overrides = {"name": "bench", "transfer_sizes": args.transfer_sizes.split(","),
                 "writers": [int(w) for w in args.writers.split(",")], "block_sizes": [args.block],
                 "engine": "fio", "targets": [target]}
    sweep, src = load_sweep(None, overrides)
    loaded = load_profile_or_local(None, True)
    plan = plan_sweep(sweep, src, loaded.profile, loaded.source, loaded.files, True)
    raw = work / "direct-raw"
    raw.mkdir(parents=True)
    started = time.perf_counter()
    top = Path(target) / f"direct.{os.getpid()}"
    top.mkdir()
    for point in plan.points:
        pdir = top / point.id
        pdir.mkdir()
        for step in plan.steps_of(point):
            argv = local_mode.argv_for(plan, step, str(pdir), str(raw))
            with open(raw / step.stdout, "wb") as out:
                subprocess.run(argv, stdout=out, stderr=subprocess.DEVNULL, check=True)
        shutil.rmtree(pdir)
    shutil.rmtree(top)
    elapsed = time.perf_counter() - started
    shutil.rmtree(raw)
    return elapsed


def _hpcrun(argv: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrun.cli", *argv], env=env, capture_output=True,
                          text=True, cwd=str(REPO))


def run_local(args: argparse.Namespace, target: str, work: Path, env: dict) -> float:
    out = work / "local"
    started = time.perf_counter()
    proc = _hpcrun(["iotune", "run", "--local", *sweep_args(args, target), "--out", str(out), "--json"], env)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"hpcrun iotune run --local failed: {proc.stderr[-2000:]}")
    results = json.loads(proc.stdout)
    bad = [r["error"] for r in results["results"] if r["error"]]
    if bad:
        raise RuntimeError(f"points failed: {bad[:3]}")
    shutil.rmtree(out)
    return elapsed


def run_job(args: argparse.Namespace, target: str, work: Path, env: dict) -> tuple:
    """(render + job + collect, the job script alone)"""
    out = work / "job"
    started = time.perf_counter()
    proc = _hpcrun(["iotune", "run", *sweep_args(args, target), "--profile", "local-test", "--out", str(out),
                    "--json"], env)
    if proc.returncode != 0:
        raise RuntimeError(f"rendering the job failed: {proc.stderr[-2000:]}")
    job_started = time.perf_counter()
    job = subprocess.run(["bash", str(out / "iotune.sbatch")], capture_output=True, text=True)
    job_only = time.perf_counter() - job_started
    if job.returncode != 0:
        raise RuntimeError(f"the job failed: {job.stderr[-2000:]}")
    proc = _hpcrun(["iotune", "collect", str(out), "--json"], env)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"collect failed: {proc.stderr[-2000:]}")
    shutil.rmtree(out)
    return elapsed, job_only


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=tempfile.gettempdir(), help="where the sweep writes (default $TMPDIR)")
    ap.add_argument("--transfer-sizes", default="64k,1m,4m")
    ap.add_argument("--writers", default="1,2")
    ap.add_argument("--block", default="512m", help="bytes per writer (default 512m)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="table on stderr, JSON on stdout")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 1
    table = sys.stderr if args.json else sys.stdout
    times: dict = {"direct": [], "local": [], "job": [], "job-sh": []}
    with tempfile.TemporaryDirectory(prefix="iotune-bench-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, PYTHONPATH=str(REPO), HPCRUN_IOTUNE_HISTORY=str(work / "history.jsonl"),
                   HPCRUN_PROFILE_PATH="")
        target = os.path.abspath(args.target)
        for r in range(args.repeat):
            order = [("direct", run_direct), ("local", run_local), ("job", run_job)]
            order = order[r % 3:] + order[:r % 3]
            for name, fn in order:
                rundir = work / f"{name}-{r}"
                rundir.mkdir()
                if name == "direct":
                    times[name].append(fn(args, target, rundir))
                elif name == "job":
                    total, script_only = fn(args, target, rundir, env)
                    times["job"].append(total)
                    times["job-sh"].append(script_only)
                else:
                    times[name].append(fn(args, target, rundir, env))
                shutil.rmtree(rundir, ignore_errors=True)
    best = {k: min(v) for k, v in times.items()}
    ratios = {k: best[k] / best["direct"] for k in ("local", "job", "job-sh")}
    npoints = len(args.transfer_sizes.split(",")) * len(args.writers.split(","))
    print(f"{'mode':>8} {'best_s':>8} {'runs_s':>30} {'ratio':>7} {'overhead_s':>10}", file=table)
    for k in ("direct", "local", "job", "job-sh"):
        runs = " ".join(f"{t:.2f}" for t in times[k])
        ratio = f"{best[k] / best['direct']:.3f}"
        print(f"{k:>8} {best[k]:8.2f} {runs:>30} {ratio:>7} {best[k] - best['direct']:10.2f}", file=table)
    for k in ("local", "job", "job-sh"):
        verdict = "PASS" if ratios[k] <= TARGET_RATIO else "FAIL"
        print(f"ratio {k}/direct {ratios[k]:.3f} <= {TARGET_RATIO} [{verdict}]", file=table)
    print(f"({npoints} points x write+read, {args.block} per writer, target {args.target}, "
          f"best of {args.repeat})", file=table)
    if args.json:
        print(json.dumps({"target": args.target, "transfer_sizes": args.transfer_sizes, "writers": args.writers,
                          "block": args.block, "repeat": args.repeat, "points": npoints, "times_s": times,
                          "best_s": best, "ratios": ratios, "target_ratio": TARGET_RATIO,
                          "pass": {k: ratios[k] <= TARGET_RATIO for k in ratios}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
