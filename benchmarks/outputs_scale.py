#!/usr/bin/env python3
"""`hpcrun outputs --json` over 10^6 recorded outputs: streamed, in bounded memory.

Usage::

    python3 benchmarks/outputs_scale.py [--outputs 1000000] [--small 100000] [--json] [--workdir DIR]

No cluster needed. What is built (not timed): a plan of N one-input jobs (the shipped ``local-test``
profile, synthetic_campaign.py), its store with every input registered, and one provenance record per
input as the poll that sees a job complete writes it (every field filled, about 900 bytes of JSON).
The same for ``--small`` outputs.

What is measured, each in a child process (`python -m hpcrun.cli outputs PLAN --json`, its standard
output read through a pipe and counted here, record by record):

* wall time and peak resident memory (the child's ru_maxrss) for N and for the small campaign: the
  memory must not grow with the number of outputs (target: peak at N within 1.25x the small one's,
  and under 200 MB);
* the floor in the same run: a bare ``sqlite3`` loop in a child process writing the same records (one
  query, ``record`` column as stored) to the same pipe: hpcrun's time as a ratio of it (target: at
  most 3x at N; the pages are read by id through an index, so the time is linear in N).
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
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from synthetic_campaign import make_plan  # noqa: E402

MEMORY_RATIO_TARGET = 1.25
MEMORY_MB_TARGET = 200.0
FLOOR_RATIO_TARGET = 3.0   # hpcrun's time over the bare loop's, at N (pages read by id: linear in N)

# the child's own peak (VmHWM of the program it runs: a count taken before exec would include this
# process's pages, which a forked child shares until it execs)
PEAK = r"""
import atexit, sys
def peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                sys.stderr.write("peak_kb " + line.split()[1] + "\n")
atexit.register(peak)
"""

HPCRUN = PEAK + r"""
import runpy
sys.argv = ["hpcrun", *sys.argv[1:]]
runpy.run_module("hpcrun.cli", run_name="__main__")
"""

FLOOR = PEAK + r"""
import sqlite3
out = sys.stdout.write
conn = sqlite3.connect(sys.argv[1])
first = True
for (text,) in conn.execute("SELECT record FROM hpcrun_provenance ORDER BY id"):
    out(("[\n" if first else ",\n") + text)
    first = False
out("\n]\n")
"""


def build(work: Path, name: str, n: int) -> Path:
    """A plan of ``n`` jobs, every input registered and one provenance record each."""
    from hpcrun.operate.submission.submit import open_plan_store, read_manifest, register
    from hpcrun.store.records import ProvenanceRow

    plan = make_plan(work, name, n, "always")
    manifest = read_manifest(plan)
    with open_plan_store(plan) as store:
        campaign = register(store, manifest)
        rows: List[ProvenanceRow] = []
        for rec in store.inputs(campaign.id):
            out = f"/pfs/out/{name}/{Path(rec.path).stem}.reco.h5"
            record = {"output": out, "size": 1_234_567_890, "checksum": "adler32:0a1b2c3d",
                      "inputs": [{"path": rec.path, "checksum": "adler32:1a2b3c4d"}], "generation": 1,
                      "release": "SL24a", "runtime": "apptainer", "image": "/cvmfs/star/sl24a.sif",
                      "image_digest": None, "payload": "/pfs/conditions/2024-11",
                      "payload_identity": "f" * 64, "spec_digest": "a" * 64, "profile_digest": "b" * 64,
                      "cluster": "perlmutter", "job_id": str(1_000_000 + rec.id // 1000),
                      "array_task": rec.id % 1000, "node": f"nid{rec.id % 4096:06d}",
                      "started_at": "2026-11-22T08:00:00+00:00", "ended_at": "2026-11-22T08:10:00+00:00",
                      "exit_code": 0, "events_in": 1200, "events_out": 1198, "hpcrun_version": "0.x",
                      "recorded_by": "0.x"}
            rows.append(ProvenanceRow(rec.id, 1, out, 1_234_567_890, "adler32:0a1b2c3d", record))
            if len(rows) == 20_000:
                store.record_provenance(campaign.id, rows)
                rows = []
        store.record_provenance(campaign.id, rows)
    return plan


def measure(argv: List[str]) -> Dict[str, Any]:
    """Run ``argv``, read its output through a pipe counting the records; wall time, the child's peak memory."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS="200"))
    records = 0
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if line.startswith("{"):
            records += 1
    err = proc.stderr.read()
    proc.wait()
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, (argv, err[-2000:])
    peak = next(int(line.split()[1]) for line in err.splitlines() if line.startswith("peak_kb "))
    return {"seconds": wall, "records": records, "peak_mb": peak / 1024.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outputs", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ["HPCRUN_PROFILE_PATH"] = str(REPO / "site-profiles")
    work = Path(tempfile.mkdtemp(prefix="hpcrun-outputs-bench-", dir=args.workdir))
    try:
        result: Dict[str, Any] = {"outputs": args.outputs, "small": args.small}
        for label, n in (("small", args.small), ("large", args.outputs)):
            t0 = time.perf_counter()
            plan = build(work, f"outputs-{label}", n)
            result[f"{label}_setup_s"] = time.perf_counter() - t0
            hp = measure([sys.executable, "-c", HPCRUN, "outputs", str(plan), "--json"])
            assert hp["records"] == n, (hp, n)
            result[label] = hp
        floor = measure([sys.executable, "-c", FLOOR, str(plan / "state.db")])
        assert floor["records"] == args.outputs
        result["floor"] = floor
        small_mb, large_mb = result["small"]["peak_mb"], result["large"]["peak_mb"]
        result["memory_ratio"] = large_mb / small_mb
        result["time_ratio_to_floor"] = result["large"]["seconds"] / floor["seconds"]
        result["ok"] = bool(large_mb < MEMORY_MB_TARGET and result["memory_ratio"] <= MEMORY_RATIO_TARGET
                            and result["time_ratio_to_floor"] <= FLOOR_RATIO_TARGET)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"hpcrun outputs --json: {args.small} records in {result['small']['seconds']:.1f} s, peak "
              f"{small_mb:.0f} MB; {args.outputs} records in {result['large']['seconds']:.1f} s, "
              f"peak {large_mb:.0f} MB (x{result['memory_ratio']:.2f}; target <= {MEMORY_RATIO_TARGET}x and "
              f"< {MEMORY_MB_TARGET:.0f} MB)")
        print(f"floor (bare sqlite3 loop, same records): {floor['seconds']:.1f} s; hpcrun / floor = "
              f"{result['time_ratio_to_floor']:.2f} (target <= {FLOOR_RATIO_TARGET})")
        print("ok" if result["ok"] else "NOT OK")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
