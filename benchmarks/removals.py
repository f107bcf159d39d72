#!/usr/bin/env python3
"""A round's removals one at a time against several at once (issue 55: hpcrun.bulk.each_at_once).

    python3 benchmarks/removals.py [--runs 1000] [--dir DIR] [--pairs 2]

Makes --runs folded-run-like directories under --dir (``j<i>/c<i>/`` with ``chains/`` and four small files,
written and synced, as a run's record is by the time the supervisor folds it), then removes them the way the
fold does (an unlink a file, an rmdir a directory, then the job's directory): once with AT_ONCE = 1 and once
with the shipped AT_ONCE, alternately, --pairs times. Prints the wall and CPU time of each; the goal is the
ratio: several at once within half the wall time of one at a time, at the same CPU (each removal waits on the
filesystem: a metadata server, or on a local disk mounted with -o discard, the freed blocks' discard). Run it
on the filesystem that matters (a plan directory's); --dir defaults to a new directory under /tmp.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hpcrun.bulk as bulk  # noqa: E402

FILES = ("exit_code", "chains.tsv", "chains/0.log", "chains/0.timeline")


def make(base: str, runs: int) -> None:
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    for i in range(runs):
        run = f"{base}/j{i}/c{i}"
        os.makedirs(f"{run}/chains")
        for name in FILES:
            with open(f"{run}/{name}", "w") as f:
                f.write("0\n")
    os.sync()   # the blocks allocated, as they are minutes after the job wrote them


def removals(base: str, runs: int, at_once: int) -> tuple:
    def remove(i: int) -> None:
        run = f"{base}/j{i}/c{i}"
        for name in FILES:
            os.unlink(f"{run}/{name}")
        os.rmdir(f"{run}/chains")
        os.rmdir(run)
        os.rmdir(f"{base}/j{i}")

    shipped, bulk.AT_ONCE = bulk.AT_ONCE, at_once
    try:
        wall, cpu = time.monotonic(), time.process_time()
        bulk.each_at_once(remove, list(range(runs)))
        return time.monotonic() - wall, time.process_time() - cpu
    finally:
        bulk.AT_ONCE = shipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--dir", default="")
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    made = "" if args.dir else tempfile.mkdtemp(prefix="hpcrun-removals-")   # removed at the end if made here
    base = os.path.join(args.dir or made, "runs")
    walls = {1: [], bulk.AT_ONCE: []}
    for _ in range(args.pairs):
        for at_once in (1, bulk.AT_ONCE):
            make(base, args.runs)
            wall, cpu = removals(base, args.runs, at_once)
            walls[at_once].append(wall)
            print(f"AT_ONCE={at_once}: {args.runs} runs removed in {wall:.2f} s of wall time, {cpu:.2f} s of CPU")
    shutil.rmtree(base, ignore_errors=True)
    if made:
        shutil.rmtree(made, ignore_errors=True)
    ratio = min(walls[bulk.AT_ONCE]) / min(walls[1])
    met = ratio <= 0.5
    print(f"several at once / one at a time (best of each): {ratio:.2f}; goal <= 0.50" + ("" if met else "  MISSED"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
