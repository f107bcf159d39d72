"""A scheduler that answers slowly on purpose (issue 46): every Slurm command hpcrun runs waits first, as a
throttled libslurm does under Slurm 23.02+'s rate limiting (Slurm 22.05 here has none), and the first
sbatch's answer is lost after the job was made. `hpcrun run` must end the campaign with every input done
once, run no two commands at once, lengthen its pause, and say since when the scheduler is slow.

CI runs a small campaign with a short delay (thresholds lowered to match); benchmarks/slow_scheduler.py
runs the issue's figures: 50 inputs, every command delayed by 30 s, the lost sbatch answer after the
default 120-s command timeout.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

from .campaigns import Campaign

pytestmark = pytest.mark.cluster

COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "sacctmgr", "sinfo", "scontrol", "sshare", "sdiag", "sprio")

# each call logged (start, end, pid) so that overlapping commands are seen; the delay first, as a
# throttled client sleeps before its RPC goes out
WRAPPER = """#!/bin/bash
log={log}
start=$(date +%s.%N)
sleep {delay}
if [ {name} = sbatch ] && mkdir {lost} 2>/dev/null; then
  /usr/bin/sbatch "$@" > {lost}/answer 2>&1   # the job is made, its answer never arrives
  printf '%s %s %s %s lost\\n' {name} "$start" "$(date +%s.%N)" $$ >> "$log"
  exec sleep {lost_for}
fi
/usr/bin/{name} "$@"
rc=$?
printf '%s %s %s %s %s\\n' {name} "$start" "$(date +%s.%N)" $$ "$rc" >> "$log"
exit $rc
"""


def test_a_slow_scheduler_and_a_lost_sbatch_answer_leave_every_input_done_once(slurm_cluster, hpcrun_bin,
                                                                                example_root):
    inputs = int(os.environ.get("HPCRUN_SLOW_INPUTS", "12"))
    delay = float(os.environ.get("HPCRUN_SLOW_DELAY", "3"))
    timeout = os.environ.get("HPCRUN_SLOW_TIMEOUT", "20")             # HPCRUN_SCHEDULER_TIMEOUT
    slow = os.environ.get("HPCRUN_SLOW_THRESHOLD", str(max(1.0, delay - 1)))
    work = slurm_cluster.workdir
    raw = slurm_cluster.pfs / "slow-raw"
    raw.mkdir(parents=True, exist_ok=True)
    for i in range(inputs):
        (raw / f"s{i:04d}.dat").write_bytes(b"y" * 256)
    slurm_cluster.chown(raw)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "slow", burst_buffer=None, database=None,
                 merge=None, qa=None, inputs={"glob": str(raw / "*.dat"), "checksum": "none"}, walltime="00:05:00",
                 jobs={"files_per_job": 1, "chains_per_node": 1},
                 chain={"command": ["/bin/cp", "{input}", "{output}"]},
                 outputs={"location": "", "pattern": "{stem}.out"})
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bindir, log, lost = work / "slow-bin", work / "slow-calls.log", work / "lost-sbatch"
    bindir.mkdir()
    for name in COMMANDS:
        slurm_cluster.write(bindir / name, WRAPPER.format(name=name, delay=delay, log=log, lost=lost,
                                                          lost_for=float(timeout) + 30), mode=0o755)
    slurm_cluster.write(log, "")
    slurm_cluster.chown(work)
    env = {"PATH": f"{bindir}:{slurm_cluster.user_env['PATH']}", "HPCRUN_SCHEDULER_TIMEOUT": timeout,
           "HPCRUN_SCHEDULER_SLOW": slow, "COLUMNS": "200"}
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    proc = slurm_cluster.run_as_user([c.hpcrun, "run", str(c.plan), "--interval", "2"], cwd=str(c.dir), env=env,
                                     timeout=float(os.environ.get("HPCRUN_SLOW_WALL", "900")))
    wall = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]                             # no supervisor exit
    assert (lost / "answer").exists(), "the first sbatch's answer was not lost: nothing was tested"

    st = json.loads(c.hp("status", str(c.plan), "--json", "--all").stdout)
    rows = st["jobs"]
    assert len(rows) == inputs and all(r["status"] == "done" for r in rows), rows   # 0 lost
    assert sum(r["attempts"] for r in rows) == inputs, rows
    runs = slurm_cluster.run(["sacct", "-n", "-P", "-X", "-D", "-u", slurm_cluster.user, "-S", started,
                              "-o", "JobID,JobName,State"])
    tasks = [line.split("|") for line in runs.stdout.splitlines() if line.split("|")[1].startswith(c.name + ".")]
    ran = collections.Counter(t[1] for t in tasks if t[2] == "COMPLETED")
    assert sum(ran.values()) == inputs, (tasks, out[-3000:])            # 0 duplicated: one array, made once
    assert len(list(c.out.glob("*.out"))) == inputs

    calls = [line.split() for line in log.read_text().splitlines() if line]
    spans = sorted((float(start), float(end), name) for name, start, end, *_ in calls)
    overlaps = [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1] - 0.05]
    assert not overlaps, overlaps                                         # never two commands at once
    assert sum(1 for call in calls if call[0] == "sbatch") >= 1
    audit = c.hp("status", str(c.plan), "--json").stdout
    assert "the scheduler of the cluster slow since" in audit, audit[-3000:]
    figures = {"inputs": inputs, "delay_s": delay, "wall_s": round(wall), "calls": len(calls),
               "by_command": collections.Counter(call[0] for call in calls)}
    print(f"\nslow_scheduler {json.dumps(figures)}")
