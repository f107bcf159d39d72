#!/usr/bin/env python3
"""One reconstruction chain: calibrate its slice of the events of one raw file.

Reads the gain and pedestal of every channel from the per-node MariaDB server the job
started (over its Unix socket), re-reads them every --refresh events as a real
conditions-DB client would (retrying while the server restarts), and writes the
calibrated energy of each event of its slice.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np


def calibration(socket: str, defaults: str = "", deadline_s: float = 90.0) -> dict:
    delay = 0.2
    start = time.monotonic()
    # --defaults: the job's client option file ({db_defaults}): its socket, and in tcp mode the
    # job's own account and password; else the socket alone
    connect = [f"--defaults-file={defaults}"] if defaults else ["--no-defaults", f"--socket={socket}"]
    while True:
        proc = subprocess.run(
            ["mariadb", *connect, "-N", "-B", "-e",
             "SELECT channel, gain, pedestal FROM conditions.calib ORDER BY channel"],
            capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            rows = [line.split("\t") for line in proc.stdout.strip().splitlines()]
            return {int(c): (float(g), float(p)) for c, g, p in rows}
        if time.monotonic() - start > deadline_s:
            sys.exit(f"conditions DB not reachable on {socket}: {proc.stderr.strip()}")
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--chain", type=int, required=True, help="this chain's rank (0-based)")
    ap.add_argument("--nchains", type=int, required=True, help="chains sharing the file")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--defaults", default="", help="client option file ({db_defaults}); used instead of --socket")
    ap.add_argument("--crash-chain", type=int, default=-1, help="test hook: this chain dies of SIGSEGV")
    ap.add_argument("--linger", type=float, default=0.0, help="test hook: stay this many seconds (idle) first")
    ap.add_argument("--hold", type=Path, default=None, help=(
        "test hook: wait (at most 120 s) while the file HOLD exists, with the DB connected once"))
    ap.add_argument("--refresh", type=int, default=200, help="re-read constants every N events")
    ap.add_argument("--cpu-seconds", type=float, default=0.0, help="CPU work per chain")
    ap.add_argument("--fail-chain", type=int, default=-1, help="test hook: this chain exits 3")
    ap.add_argument("--fail-marked", type=Path, default=None, help=(
        "test hook: exit 3 when DIR/<input file name>.fail exists (removed first if it says 'once')"))
    ap.add_argument("--slow-marked", type=Path, default=None, help=(
        "test hook: sleep until killed when DIR/<input file name>.slow exists (removed first: once)"))
    args = ap.parse_args()
    chain = args.chain
    if chain == args.crash_chain:
        print(f"chain {chain}: crashing on purpose (--crash-chain)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    if args.linger:
        time.sleep(args.linger)
    if args.hold is not None:
        calibration(args.socket, args.defaults)
        end = time.monotonic() + 120
        while args.hold.exists() and time.monotonic() < end:
            time.sleep(0.2)
    if chain == args.fail_chain:
        print(f"chain {chain}: failing on purpose (--fail-chain)", file=sys.stderr)
        return 3
    if args.fail_marked is not None:
        marker = args.fail_marked / (Path(args.input).name + ".fail")
        try:
            once = marker.read_text().strip() == "once"
        except OSError:
            once = None
        if once is not None:
            if once:
                marker.unlink(missing_ok=True)
            print(f"chain {chain}: failing on purpose ({marker})", file=sys.stderr)
            return 3
    if args.slow_marked is not None:
        slow = args.slow_marked / (Path(args.input).name + ".slow")
        if slow.exists():
            slow.unlink(missing_ok=True)
            print(f"chain {chain}: hanging on purpose ({slow}) until the time limit", file=sys.stderr)
            time.sleep(3600)
    with h5py.File(args.input, "r") as f:
        total = len(f["event_id"])
        first = chain * total // args.nchains
        last = (chain + 1) * total // args.nchains
        adc = f["adc"][first:last]
        ids = f["event_id"][first:last]
    energy = np.zeros(len(ids))
    per_batch = args.cpu_seconds / max(1, -(-len(ids) // args.refresh))
    for start in range(0, len(ids), args.refresh):
        calib = calibration(args.socket, args.defaults)
        gain = np.array([calib[c][0] for c in range(adc.shape[1])])
        ped = np.array([calib[c][1] for c in range(adc.shape[1])])
        batch = adc[start:start + args.refresh].astype(float)
        energy[start:start + args.refresh] = ((batch - ped) * gain).sum(axis=1)
        burn(per_batch)
    with h5py.File(args.output, "w") as out:
        out["event_id"] = ids
        out["energy"] = energy
    print(f"chain {chain}: {len(ids)} events {first}..{last - 1} of {total} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
