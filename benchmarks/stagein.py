#!/usr/bin/env python3
"""Stage-in through hpcrun's job against the fastest plain xrdcp, on a real XRootD server on loopback.

Usage (root: the job runs as the test user, as in tests/test_xrootd.py)::

    python3 benchmarks/stagein.py [--small 200] [--small-kb 256] [--large 4] [--large-mb 100]
                                  [--parallel 8] [--json]

No cluster needed: Debian's xrootd serves N small and M large files from a directory; the same files
are copied to local disk

* by plain xrdcp, each way timed and the fastest kept as the baseline: one ``xrdcp --parallel P``
  with every source and a directory as destination (without and with ``--cksum adler32:source``), and
  one xrdcp process per file, P at a time (``xargs -P``, with ``--cksum``);
* by hpcrun's job (one job holding every input; ``xrootd.parallel_copies: P``): its stage-in wall time
  as the job itself measured it (``stage.tsv``: from the first copy started to the last renamed), and
  with its checksum step (every input's adler32 against the plan's) against the fastest plain copy
  that verifies too;
* by hpcrun's job with the server's directory mapped to the local path the node sees it under
  (``xrootd.local_paths``): every input read in place. The server's log traces each open: it must
  show none of these inputs (no byte sent for them).

Printed: each time, hpcrun's stage-in as a ratio of the fastest plain xrdcp (goal: at most 1.1), and
the time saved by the mapping (stage-in and checksums: read in place, an input is summed once, where it is).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import readable_copy  # noqa: E402
from tests.xrootd import USER, Servers, why_not  # noqa: E402

GOAL = 1.1


def _timed(argv: List[str], **kw: Any) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]}... failed: {proc.stderr[-500:]}")
    return time.perf_counter() - t0


def raw_xrdcp(urls: List[str], dest: Path, parallel: int) -> Dict[str, float]:
    """Plain xrdcp, two ways, each into an empty directory."""
    out: Dict[str, float] = {}
    for label in ("one xrdcp --parallel", "one xrdcp --parallel --cksum", "xrdcp per file, xargs -P"):
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        cksum = ["--cksum", "adler32:source"] if "cksum" in label or "xargs" in label else []
        if label.startswith("one"):
            out[label] = _timed(["xrdcp", "--silent", "--nopbar", "--force", "--parallel", str(parallel), *cksum,
                                 *urls, f"{dest}/"])
        else:
            out[label] = _timed(["xargs", "-P", str(parallel), "-I{}", "xrdcp", "--silent", "--nopbar", "--force",
                                 *cksum, "{}", f"{dest}/"], input="\n".join(urls) + "\n")
    return out


def hpcrun_job(root: Path, name: str, urls: List[str], xrootd: Dict[str, Any]) -> Dict[str, Any]:
    """Plan one job holding every input and run it as the test user; its own stage-in figures."""
    import yaml

    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan

    case = root / name
    (case / "profiles").mkdir(parents=True)
    (case / "profiles" / "bench.yaml").write_text(yaml.safe_dump(
        {"name": "bench", "extends": "local-test", "xrootd": xrootd}))
    spec = {"name": f"stagein-{name}", "site": {"profile": "bench"}, "walltime": "00:30:00",
            "inputs": {"files": urls}, "jobs": {"files_per_job": len(urls), "chains_per_node": 1},
            "chain": {"command": ["/bin/true", "{input}"]}, "outputs": {"location": str(case / "out")}}
    (case / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    os.environ["HPCRUN_PROFILE_PATH"] = str(case / "profiles")
    try:
        write_plan(load_plan(case / "campaign.yaml"), case / "plan")
    finally:
        del os.environ["HPCRUN_PROFILE_PATH"]
    subprocess.run(["chown", "-R", USER, str(case)], check=True)
    env = {"PATH": f"{readable_copy('tests/fakes')}:/usr/bin:/bin", "SLURM_JOB_ID": "9001", "SLURM_JOB_NUM_NODES": "1",
           "HOME": "/tmp"}
    script = next((case / "plan" / "jobs").glob("*.sbatch"))
    t0 = time.perf_counter()
    proc = subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                           "bash", str(script)], capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    run = next((case / "plan" / "run").glob("*/9001"))
    if proc.returncode != 0:
        why = (run / "reason").read_text() if (run / "reason").exists() else proc.stderr[-800:]
        raise SystemExit(f"the job failed ({proc.returncode}): {why}")
    span_ms, _cpus = (run / "stage.tsv").read_text().split()
    verify = re.search(r"verified the adler32 checksum of \d+ input\(s\) in (\d+) ms", proc.stderr)
    rows = [line.split("\t") for line in (run / "transfers.tsv").read_text().splitlines()]
    ways: Dict[str, int] = {}
    for r in rows:
        ways[r[6]] = ways.get(r[6], 0) + 1
    verify_s = int(verify.group(1)) / 1000 if verify else 0.0
    return {"stage_in_s": int(span_ms) / 1000, "verify_s": verify_s, "with_verify_s": int(span_ms) / 1000 + verify_s,
            "job_s": wall, "ways": ways}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--small-kb", type=int, default=256)
    ap.add_argument("--large", type=int, default=4)
    ap.add_argument("--large-mb", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reason = why_not()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    os.environ["HPCRUN_PROFILE_PATH"] = str(REPO / "site-profiles")
    servers = Servers().start()
    root = Path(tempfile.mkdtemp(prefix="hpcrun-stagein-", dir="/tmp"))
    root.chmod(0o755)
    try:
        urls = [servers.put(f"store/bench/small{n:04d}.raw", os.urandom(args.small_kb * 1024))
                for n in range(args.small)]
        urls += [servers.put(f"store/bench/large{n}.raw", os.urandom(args.large_mb * 1024 * 1024))
                 for n in range(args.large)]
        total = sum((servers.data / "store" / "bench" / u.rsplit("/", 1)[1]).stat().st_size for u in urls)
        raw = raw_xrdcp(urls, root / "raw", args.parallel)
        best = min(raw.values())
        best_verified = min(v for k, v in raw.items() if "cksum" in k or "xargs" in k)
        staged = hpcrun_job(root, "server", urls, {"parallel_copies": args.parallel})
        opened_before = len(servers.opened())
        mapped = hpcrun_job(root, "local", urls, {"parallel_copies": args.parallel, "local_paths": {
            f"{servers.origin.url}//store/bench/": f"{servers.data}/store/bench/"}})
        opened = servers.opened()[opened_before:]
        result = {"files": len(urls), "bytes": total, "parallel": args.parallel, "raw_xrdcp_s": raw,
                  "best_raw_s": best, "best_raw_verified_s": best_verified, "hpcrun": staged, "hpcrun_local": mapped,
                  "ratio": staged["stage_in_s"] / best, "ratio_verified": staged["with_verify_s"] / best_verified,
                  "goal": GOAL, "server_opens_while_local": len(opened),
                  "saved_by_local_s": staged["with_verify_s"] - mapped["with_verify_s"]}
        result["ok"] = result["ratio"] <= GOAL and not opened and mapped["ways"] == {"local": len(urls)}
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"stage-in of {len(urls)} files ({args.small} x {args.small_kb} KiB, {args.large} x {args.large_mb} MiB; "
              f"{total / 1e6:.0f} MB), {args.parallel} at a time, adler32 verified:")
        for label, secs in raw.items():
            print(f"  plain {label:28s} {secs:7.2f} s  {total / 1e6 / secs:8.0f} MB/s")
        print(f"  hpcrun job (server)                {staged['stage_in_s']:7.2f} s  "
              f"{total / 1e6 / staged['stage_in_s']:8.0f} MB/s   ratio {result['ratio']:.2f} to the fastest plain "
              f"(goal <= {GOAL}); with its checksum step {staged['with_verify_s']:.2f} s: "
              f"{result['ratio_verified']:.2f} x the fastest plain with --cksum")
        print(f"  hpcrun job (read in place)         {mapped['stage_in_s']:7.2f} s  (with checksums "
              f"{mapped['with_verify_s']:.2f} s) ways {mapped['ways']}; server opens meanwhile: {len(opened)}; "
              f"saved {result['saved_by_local_s']:.2f} s")
        print("ok" if result["ok"] else "NOT OK")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
