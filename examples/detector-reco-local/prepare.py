#!/usr/bin/env python3
"""Prepare the detector-reco-local example on the test cluster's "parallel filesystem".

Creates raw input files of events (h5py), a MariaDB conditions payload with per-channel
calibration constants, and copies the chain/merge/QA programs next to them. Run it as the
user who will submit the jobs (the payload files must be readable by the job).

    python3 prepare.py --root /tmp/hpcrun-test-cluster/pfs/detector-reco --files 3 --events 2000
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

CHANNELS = 8


def make_inputs(raw: Path, files: int, events: int, seed: int = 1) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(files):
        with h5py.File(raw / f"run{1000 + i}.h5", "w") as f:
            f["adc"] = rng.integers(100, 4000, size=(events, CHANNELS), dtype=np.uint16)
            f["event_id"] = np.arange(events, dtype=np.int64) + i * 1_000_000
            f.attrs["run"] = 1000 + i


def make_payload(payload: Path) -> None:
    if payload.exists():
        shutil.rmtree(payload)
    payload.mkdir(parents=True)
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={payload}", "--skip-test-db",
                    "--auth-root-authentication-method=normal"], check=True, capture_output=True)
    rows = ",".join(f"({c},{1.0 + 0.01 * c},{50 + c})" for c in range(CHANNELS))
    sql = ("CREATE DATABASE conditions;\n"
           "CREATE TABLE conditions.calib (channel INT PRIMARY KEY, gain DOUBLE, pedestal DOUBLE);\n"
           f"INSERT INTO conditions.calib VALUES {rows};\n")
    with tempfile.TemporaryFile("w+") as f:
        f.write(sql)
        f.seek(0)
        server = shutil.which("mariadbd") or "/usr/sbin/mariadbd"  # sbin is not on users' PATH
        subprocess.run([server, "--no-defaults", f"--datadir={payload}", "--bootstrap",
                        "--skip-grant-tables", "--log-error=/dev/null"], stdin=f, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/hpcrun-test-cluster/pfs/detector-reco"))
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--events", type=int, default=2000)
    args = ap.parse_args()
    make_inputs(args.root / "raw", args.files, args.events)
    make_payload(args.root / "conditions")
    bin_dir = args.root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for prog in (Path(__file__).parent / "programs").glob("*.py"):
        shutil.copy(prog, bin_dir / prog.name)
    (args.root / "out").mkdir(exist_ok=True)
    print(f"prepared {args.files} raw files x {args.events} events, payload and programs in {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
