#!/usr/bin/env python3
"""Job-side overhead of a generated job on the real Slurm test cluster.

Measured in one run, as the unprivileged test user, with the detector-reco-local example:
  * payload copy: the job's node-local copy of the MariaDB payload (timed by the DB
    supervisor) vs a plain `cp -a` of the same payload by the same user, same node, same run
    (target <= 1.2x);
  * DB ready time: from the server start to the first successful probe;
  * input checksum step: time the job took to verify its inputs' checksums (adler32 by
    default) before starting anything, and the rate in MB/s, from the job's own log line;
  * chain CPU efficiency: TotalCPU of the chain step / (step elapsed x chains), from sacct,
    for a job whose chains (one per real core by default) each burn about --cpu-seconds of
    CPU (target >= 0.95).

Needs the cluster (`python3 tests/cluster/harness.py start`) and root (jobs run as the
test user). Usage: python3 benchmarks/job_overhead.py [--cpu-seconds 60] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cluster.pytest_cluster import read_env_file  # noqa: E402

PY = "/usr/bin/python3"


def sh(argv, user=None, env=None, **kw):
    if user:
        argv = ["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in (env or {}).items()], *argv]
    elif env is not None:
        kw["env"] = env
    return subprocess.run(argv, capture_output=True, text=True, check=True, **kw)


def seconds(text: str) -> float:
    m = re.match(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$", text)
    if not m:
        return float("nan")
    d, h, mi, s = m.groups()
    return ((int(d or 0) * 24 + int(h or 0)) * 60 + int(mi)) * 60 + float(s)


def checksum_step(plan: Path, job_id: str, raw: Path):
    """(milliseconds the job's checksum step took, bytes of input it read), from the job log
    line 'verified the <algo> checksum of N input(s) in M ms'; (None, bytes) without one."""
    input_bytes = sum(p.stat().st_size for p in raw.glob("*.h5"))
    for log in plan.glob(f"logs/*-{job_id}.out"):
        m = re.search(r"verified the \w+ checksum of \d+ input\(s\) in (\d+) ms", log.read_text())
        if m:
            return float(m.group(1)), input_bytes
    return None, input_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.environ.get("HPCRUN_TEST_CLUSTER_DIR", "/tmp/hpcrun-test-cluster"))
    ap.add_argument("--cpu-seconds", type=float, default=60.0)
    ap.add_argument("--payload-mb", type=int, default=512,
                    help="pad the payload with a file of this size so copy times are measurable")
    ap.add_argument("--chains", type=int, default=os.cpu_count() or 2, help="chains (default: real cores)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cdir = Path(args.dir)
    env = read_env_file(cdir / "env")
    user = env["HPCRUN_TEST_USER"]
    uenv = {"PATH": f"{env['HPCRUN_TEST_BIN']}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
            "SLURM_CONF": env["SLURM_CONF"], "USER": user}
    hpcrun = cdir / "venv" / "bin" / "hpcrun"
    if not hpcrun.exists():
        sys.exit("run the cluster tests once first (they build DIR/venv with hpcrun for the test user)")
    root = Path(env["HPCRUN_TEST_PFS"]) / "bench"
    work = Path(env["HPCRUN_TEST_WORK"]) / "bench"
    for d in (root, work):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        shutil.chown(d, user)
    ex = work / "example"
    shutil.copytree(REPO / "examples" / "detector-reco-local", ex)
    sh(["chown", "-R", user, str(ex)])
    sh([PY, str(ex / "prepare.py"), "--root", str(root), "--files", "1", "--events", "4000"], user=user, env=uenv)
    filler = root / "conditions" / "filler.bin"
    sh(["dd", "if=/dev/urandom", f"of={filler}", "bs=1M", f"count={args.payload_mb}", "status=none"],
       user=user, env=uenv)

    def plain_cp() -> float:
        target = Path("/tmp") / f"bench-cp-{os.getpid()}"
        sh(["rm", "-rf", str(target)])
        sh(["mkdir", "-p", str(target)], user=user, env=uenv)
        t0 = time.perf_counter()
        sh(["cp", "-a", f"{root / 'conditions'}/.", f"{target}/"], user=user, env=uenv)
        elapsed = (time.perf_counter() - t0) * 1000
        sh(["rm", "-rf", str(target)])
        return elapsed

    cp_before = plain_cp()
    spec = (ex / "campaign.yaml").read_text().replace("/tmp/hpcrun-test-cluster/pfs/detector-reco", str(root))
    spec = spec.replace('--socket, "{db_socket}"]', f'--socket, "{{db_socket}}", --cpu-seconds, "{args.cpu_seconds}"]')
    spec = spec.replace('walltime: "00:10:00"', 'walltime: "00:30:00"')
    # one chain per real core: the emulated node declares 8 CPUs on a smaller machine
    spec = spec.replace("chains_per_node: 4", f"chains_per_node: {args.chains}")
    (work / "campaign.yaml").write_text(spec)
    shutil.chown(work / "campaign.yaml", user)
    plan = work / "plan"
    sh([str(hpcrun), "plan", str(work / "campaign.yaml"), "--out", str(plan)], user=user, env=uenv, cwd=work)
    submitted = sh([str(hpcrun), "submit", str(plan), "--json"], user=user, env=uenv, cwd=work)
    job_id = json.loads(submitted.stdout)["submitted"][0]["job_id"]
    out = sh([str(hpcrun), "status", str(plan), "--wait", "--json", "--timeout", str(args.cpu_seconds * 4 + 120)],
             user=user, env=uenv, cwd=work)
    [row] = json.loads(out.stdout)["jobs"]
    if row["state"] != "COMPLETED":
        sys.exit(f"job did not complete: {row}")
    node = env["HPCRUN_TEST_NODES"].split(",")[0]
    run = next(plan.glob(f"run/*/{job_id}"))
    copy_ms = float((run / "db" / f"{node}.copied").read_text().split()[0])
    payload = root / "conditions"
    cp_ms = (cp_before + plain_cp()) / 2  # plain cp measured before and after the job
    log = (run / "db" / f"{node}.log").read_text().splitlines()
    started = next(line for line in log if "started" in line)
    ready_epoch = float((run / "db" / f"{node}.ready").read_text())
    start_epoch = time.mktime(time.strptime(started.split()[0], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    acct = sh(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,ElapsedRaw,TotalCPU,NTasks"],
              env={**os.environ, "SLURM_CONF": env["SLURM_CONF"]}).stdout
    steps = {r.split("|")[0]: r.split("|") for r in acct.splitlines() if r}
    chain_step = steps[f"{job_id}.1"]
    elapsed, cpu, ntasks = float(chain_step[1]), seconds(chain_step[2]), int(chain_step[3])
    eff = cpu / (elapsed * ntasks) if elapsed else float("nan")
    verify_ms, input_bytes = checksum_step(plan, job_id, root / "raw")
    result = {
        "payload_bytes": sum(p.stat().st_size for p in payload.rglob("*") if p.is_file()),
        "payload_copy_ms_job": copy_ms, "payload_copy_ms_plain_cp": round(cp_ms, 1),
        "copy_ratio": round(copy_ms / cp_ms, 2) if cp_ms else None,
        "db_ready_seconds_upper_bound": round(ready_epoch - start_epoch, 2),
        "chain_step_elapsed_s": elapsed, "chain_step_total_cpu_s": cpu, "chains": ntasks,
        "chain_cpu_efficiency": round(eff, 3),
        "checksum_input_bytes": input_bytes, "checksum_step_ms": verify_ms,
        "checksum_MB_per_s": round(input_bytes / 1e3 / verify_ms, 1) if verify_ms else None,
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for k, v in result.items():
            print(f"{k:32s} {v}")
        print(f"copy ratio target <= 1.2: {'PASS' if result['copy_ratio'] and result['copy_ratio'] <= 1.2 else 'FAIL'}")
        print(f"chain CPU efficiency target >= 0.95: {'PASS' if eff >= 0.95 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
