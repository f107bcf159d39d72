"""Many small files through arrays, driven by `hpcrun run` on every node of the test cluster, with
faults in 10% of first attempts: hpcrun's own CPU share, scheduler calls per minute, success rate,
files unaccounted and duplicates (issue 14). CI runs it small; benchmarks/campaign_scale.py runs
it at 5,000 files on 16 emulated nodes (HPCRUN_SCALE_FILES). Baseline, measured in the same run:
the same number of array tasks running the same copy command from one plain sbatch script,
waited for with squeue: Slurm's own pace for the work.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .campaigns import Campaign

pytestmark = pytest.mark.cluster

CHAIN = ('m="$0/$(basename "$1").fail"; if [ -e "$m" ]; then grep -q always "$m" || rm -f "$m"; '
         'echo "failing on purpose ($m)" >&2; exit 3; fi; cp "$1" "$2"')

# first on PATH for hpcrun: each call logged with its own CPU seconds (the command's, not hpcrun's)
COUNTING = """#!/usr/bin/python3
import os, resource, subprocess, sys, time
name = os.path.basename(sys.argv[0])
t0 = time.monotonic()
rc = subprocess.call(["/usr/bin/" + name] + sys.argv[1:])
use = resource.getrusage(resource.RUSAGE_CHILDREN)
self_use = resource.getrusage(resource.RUSAGE_SELF)
with open(os.environ["HPCRUN_TEST_CALLS"], "a") as f:
    f.write("%s %.3f %.4f\\n" % (name, time.monotonic() - t0,
            use.ru_utime + use.ru_stime + self_use.ru_utime + self_use.ru_stime))
sys.exit(rc)
"""


def _wrappers(cluster, workdir: Path) -> dict:
    bindir = workdir / "count-bin"
    bindir.mkdir()
    for name in ("sbatch", "sacct", "squeue"):
        cluster.write(bindir / name, COUNTING, mode=0o755)
    calls = workdir / "calls.log"
    cluster.write(calls, "")
    cluster.chown(bindir)
    return {"PATH": f"{bindir}:{cluster.user_env['PATH']}", "HPCRUN_TEST_CALLS": str(calls)}


def _inputs(cluster, raw: Path, markers: Path, files: int, rng: random.Random) -> tuple:
    raw.mkdir(parents=True)
    markers.mkdir()
    names = [f"f{i:06d}.dat" for i in range(files)]
    for name in names:
        (raw / name).write_bytes(name.encode() * 256)
    faulty = rng.sample(names, max(1, files // 10))
    hopeless = faulty[:max(1, files // 1000)]
    for name in faulty:
        (markers / f"{name}.fail").write_text("always\n" if name in hopeless else "once\n")
    cluster.chown(raw)
    cluster.chown(markers)
    return names, faulty, hopeless


def _drive(c: Campaign, env: dict, kills: int, rng: random.Random, timeout: float) -> dict:
    """hpcrun run as the test user; SIGKILLed ``kills`` times at random moments, then to the end."""
    cpu = wall_start = 0.0
    runs, sigkills = 0, 0
    wall_start = time.monotonic()
    for k in range(kills + 1):
        proc = subprocess.Popen([c.hpcrun, "run", str(c.plan), "--interval", "10", "--no-metrics"],
                                cwd=str(c.dir), env=dict(c.cluster.user_env, **env), user=c.cluster.uid,
                                group=c.cluster.gid, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        runs += 1
        limit = rng.uniform(2, 8) if k < kills else timeout
        deadline = time.monotonic() + limit
        status = None
        while status is None:
            pid, st, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status = st
                cpu += usage.ru_utime + usage.ru_stime
                break
            if time.monotonic() > deadline:
                proc.send_signal(signal.SIGKILL)
                _pid, status, usage = os.wait4(proc.pid, 0)
                cpu += usage.ru_utime + usage.ru_stime
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode == -signal.SIGKILL:
            sigkills += 1
        elif k == kills:
            assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
    return {"runs": runs, "sigkills": sigkills, "wall_s": time.monotonic() - wall_start, "cpu_total_s": cpu}


def _baseline(cluster, workdir: Path, raw: Path, names: list, throttle: int, nodes: int) -> tuple:
    """The same copies as one plain array (no hpcrun): submit, then squeue until it is gone.

    Returns (seconds, copies missing). A plain array has no retries: a task lost to an emulated
    node in trouble (16 slurmd on 2 cores can drain one with "Kill task failed") is simply missing,
    which the figures report; the test is about hpcrun's campaign, not about the baseline."""
    out = workdir / "baseline-out"
    out.mkdir()
    cluster.chown(out)
    listing = cluster.write(workdir / "baseline.list", "".join(f"{raw / n}\n" for n in names))
    script = cluster.write(workdir / "baseline.sbatch", (
        "#!/bin/bash\n#SBATCH --ntasks-per-node=1 --time=00:05:00 --no-requeue\n"
        f"#SBATCH --output={workdir}/baseline-%A_%a.log\n"
        f'f=$(sed -n "$(( SLURM_ARRAY_TASK_ID + OFFSET + 1 ))p" {listing})\n'
        f'srun --ntasks=1 cp "$f" {out}/\n'))
    start = time.monotonic()
    ids = []
    for first in range(0, len(names), 1001):   # arrays of at most 1001 tasks, as the plan makes them
        count = min(1001, len(names) - first)
        proc = cluster.sbatch_raw(script, f"--array=0-{count - 1}%{throttle}", f"--export=ALL,OFFSET={first}",
                                  "--job-name=e2e-scale-baseline")
        assert proc.returncode == 0, proc.stderr
        ids.append(proc.stdout.strip().split(";")[0])
    while cluster.run(["squeue", "-h", "-j", ",".join(ids)]).stdout.strip():
        time.sleep(2)
    elapsed = time.monotonic() - start
    return elapsed, len(names) - len(list(out.iterdir()))


def test_many_files_through_arrays_on_every_node(slurm_cluster, hpcrun_bin, example_root):
    files = int(os.environ.get("HPCRUN_SCALE_FILES", "60"))
    throttle = int(os.environ.get("HPCRUN_SCALE_THROTTLE", str(8 * len(slurm_cluster.nodes))))
    rng = random.Random(7)
    work = slurm_cluster.workdir
    raw, markers = slurm_cluster.pfs / "raw", work / "markers"
    names, faulty, hopeless = _inputs(slurm_cluster, raw, markers, files, rng)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "scale", burst_buffer=None, database=None, merge=None,
                 qa=None, inputs={"glob": str(raw / "*.dat"), "checksum": "none"}, walltime="00:05:00",
                 jobs={"files_per_job": 1, "chains_per_node": 1, "throttle": throttle},
                 chain={"command": ["/bin/sh", "-c", CHAIN, str(markers), "{input}", "{output}"]},
                 outputs={"location": str(work / "out"), "pattern": "{stem}.out"})
    slurm_cluster.chown(work)
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = _wrappers(slurm_cluster, work)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    drive = _drive(c, env, kills=2, rng=rng, timeout=float(os.environ.get("HPCRUN_SCALE_TIMEOUT", "1800")))

    calls = collections.Counter()
    called_cpu = 0.0
    for line in Path(env["HPCRUN_TEST_CALLS"]).read_text().splitlines():
        name, _secs, cpu = line.split()
        calls[name] += 1
        called_cpu += float(cpu)
    own_cpu = max(0.0, drive["cpu_total_s"] - called_cpu)
    st = json.loads(c.hp("status", str(c.plan), "--json", "--all", timeout=600).stdout)
    states = collections.Counter(j["status"] for j in st["jobs"])
    runs = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-u", slurm_cluster.user, "-S", started, "-o",
                           "JobID,JobName,State"], capture_output=True, text=True, env=slurm_cluster.env).stdout
    tasks = [line.split("|") for line in runs.splitlines() if line.split("|")[1].startswith(c.name + ".")]
    attempts = sum(j["attempts"] for j in st["jobs"])
    unaccounted = files - states["done"] - states["parked"]
    succeeded = states["done"] / (files - len(hopeless))
    minutes = drive["wall_s"] / 60
    figures = {
        "files": files, "nodes": len(slurm_cluster.nodes), "throttle": throttle, "faulty_first_attempts": len(faulty),
        "hopeless": len(hopeless), **drive, "hpcrun_cpu_s": round(own_cpu, 2),
        "hpcrun_cpu_share": round(own_cpu / drive["wall_s"], 4),
        "calls": dict(calls), "sacct_per_min": round(calls["sacct"] / minutes, 2),
        "squeue_per_min": round(calls["squeue"] / minutes, 2), "success_rate": round(succeeded, 4),
        "unaccounted": unaccounted, "tasks_run": len(tasks), "attempts": attempts,
        "duplicates": len(tasks) - attempts}
    print("\ncampaign_scale " + json.dumps(figures), flush=True)
    baseline, baseline_missing = _baseline(slurm_cluster, work, raw, names, throttle, len(slurm_cluster.nodes))
    figures.update(baseline_plain_array_s=round(baseline, 1), wall_vs_baseline=round(drive["wall_s"] / baseline, 2),
                   baseline_missing=baseline_missing)
    print("campaign_scale with baseline " + json.dumps(figures), flush=True)
    assert unaccounted == 0 and figures["duplicates"] == 0, figures
    assert states["parked"] == len(hopeless) and succeeded == 1.0, figures
    # The 2% target is the benchmark's, at full size. A CI-size campaign ends in seconds, where each
    # restart's start-up (Python and the imports: about 0.5 s of CPU) is most of hpcrun's CPU; what
    # this can check is that hpcrun does not busy-loop: start-ups plus 5% of the wall time.
    assert own_cpu < 1.0 * drive["runs"] + 0.05 * drive["wall_s"], figures
