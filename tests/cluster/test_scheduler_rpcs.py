"""What a campaign costs the site's scheduler, counted by the scheduler itself (issue 46).

A campaign of single-node, one-chain inputs in array mode, driven to its end by `hpcrun run` as the test
user. Before it, root resets the counters (`sdiag -r`, `sacctmgr clear stats`); after it, the test reads
the controller's RPCs by message type and by user (`sdiag`) and slurmdbd's (`sacctmgr show stats`), and
splits the controller's into submission, tracking and in-job (the steps a job creates). CI runs 200
inputs, the issue's figure; benchmarks/scheduler_rpcs.py runs 200 and 2000 and compares the tracking
RPCs per hour (HPCRUN_RPC_INPUTS).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Dict, Tuple

import pytest

from hpcrun.operate.supervision import array_ends

from .campaigns import Campaign, footprint

pytestmark = pytest.mark.cluster

# the controller's message types by who sends them on a campaign's behalf
SUBMISSION = {"REQUEST_SUBMIT_BATCH_JOB", "REQUEST_SUBMIT_BATCH_HET_JOB", "REQUEST_JOB_WILL_RUN"}
IN_JOB_USER = {"REQUEST_HET_JOB_ALLOC_INFO", "REQUEST_JOB_ALLOCATION_INFO", "REQUEST_JOB_STEP_CREATE",
               "REQUEST_STEP_LAYOUT", "REQUEST_JOB_SBCAST_CRED"}
IN_JOB_DAEMONS = {"REQUEST_STEP_COMPLETE", "REQUEST_COMPLETE_BATCH_SCRIPT", "MESSAGE_EPILOG_COMPLETE",
                  "REQUEST_COMPLETE_PROLOG", "MESSAGE_NODE_REGISTRATION_STATUS", "REQUEST_PING"}
_ROW = re.compile(r"^\s+(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)")


def parse_rpc_stats(text: str) -> Tuple[Dict[str, int], Dict[str, int]]:
    """sdiag's or `sacctmgr show stats`' text -> (count by message type, count by user)."""
    by_type: Dict[str, int] = {}
    by_user: Dict[str, int] = {}
    section = None
    for line in text.splitlines():
        if "statistics by message type" in line:
            section = by_type
        elif "statistics by user" in line:
            section = by_user
        elif line.strip() and not line.startswith(("\t", " ")):
            section = None
        elif section is not None:
            m = _ROW.match(line)
            if m:
                section[m.group(1)] = section.get(m.group(1), 0) + int(m.group(3))
    return by_type, by_user


def test_parse_rpc_stats_reads_both_tables():
    text = ("Remote Procedure Call statistics by message type\n"
            "\tREQUEST_SUBMIT_BATCH_JOB                ( 4003) count:2      ave_time:3272   total_time:6544\n"
            "\tREQUEST_JOB_STEP_CREATE                 ( 5001) count:50     ave_time:810    total_time:40540\n"
            "\nRemote Procedure Call statistics by user\n"
            "\thpcuser         (    1001) count:52    ave_time:1071   total_time:194009\n"
            "\nPending RPC statistics\n\tNo pending RPCs\n")
    by_type, by_user = parse_rpc_stats(text)
    assert by_type == {"REQUEST_SUBMIT_BATCH_JOB": 2, "REQUEST_JOB_STEP_CREATE": 50}
    assert by_user == {"hpcuser": 52}


def _reset(cluster) -> None:
    for argv in (["sdiag", "-r"], ["sacctmgr", "-i", "clear", "stats"]):
        proc = cluster.run(argv)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _read(cluster) -> Tuple[Dict[str, int], Dict[str, int], Dict[str, int], Dict[str, int]]:
    ctl = cluster.run(["sdiag"])
    dbd = cluster.run(["sacctmgr", "show", "stats"])
    assert ctl.returncode == 0 and dbd.returncode == 0, ctl.stderr + dbd.stderr
    return (*parse_rpc_stats(ctl.stdout), *parse_rpc_stats(dbd.stdout))


def split(by_type: Dict[str, int], user_total: int) -> Dict[str, int]:
    """The job user's controller RPCs as submission, in-job and tracking (the rest the user sent)."""
    submission = sum(n for t, n in by_type.items() if t in SUBMISSION)
    in_job = sum(n for t, n in by_type.items() if t in IN_JOB_USER)
    return {"submission": submission, "in_job": in_job, "tracking": user_total - submission - in_job,
            "in_job_daemons": sum(n for t, n in by_type.items() if t in IN_JOB_DAEMONS)}


def test_a_campaign_of_one_node_inputs_asks_the_controller_little(slurm_cluster, hpcrun_bin, example_root):
    inputs = int(os.environ.get("HPCRUN_RPC_INPUTS", "200"))
    interval = os.environ.get("HPCRUN_RPC_INTERVAL", "5")
    work_s = os.environ.get("HPCRUN_RPC_WORK_S", "0")   # each input's seconds of work (the benchmark evens out walls)
    work = slurm_cluster.workdir
    raw = slurm_cluster.pfs / f"rpc-raw-{inputs}"
    raw.mkdir(parents=True, exist_ok=True)
    for i in range(inputs):
        (raw / f"r{i:05d}.dat").write_bytes(b"x" * 512)
    slurm_cluster.chown(raw)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, f"rpc{inputs}", burst_buffer=None, database=None,
                 merge=None, qa=None, inputs={"glob": str(raw / "*.dat"), "checksum": "none"}, walltime="00:05:00",
                 jobs={"files_per_job": 1, "chains_per_node": 1},
                 chain={"command": ["/bin/sh", "-c", 'sleep "$0"; exec cp "$1" "$2"', work_s, "{input}", "{output}"]},
                 outputs={"location": "", "pattern": "{stem}.out"})   # the location: the campaign's own
    slurm_cluster.chown(work)
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan), "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    planned = json.loads(proc.stdout)
    assert planned["launch"]["in_batch"] and planned["expected_rpcs"]["in_job_user"] == 0, planned

    _reset(slurm_cluster)
    t0 = time.monotonic()
    proc = c.hp("run", str(c.plan), "--interval", interval, timeout=float(os.environ.get("HPCRUN_RPC_TIMEOUT", "1500")))
    wall_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    by_type, by_user, dbd_type, dbd_user = _read(slurm_cluster)
    rounds = len(re.findall(r"^\S+ \S+ round \d+:", proc.stdout, re.M))

    user = slurm_cluster.user
    total = by_user.get(user, 0)
    parts = split(by_type, total)
    st = json.loads(c.hp("status", str(c.plan), "--json", "--all", timeout=600).stdout)
    done = sum(1 for j in st["jobs"] if j["status"] == "done")
    outputs = len(list(c.out.glob("*.out")))
    per_k = 1000 / inputs
    figures = {"inputs": inputs, "wall_s": round(wall_s, 1), "done": done, "outputs": outputs,
               "controller_user_total": total, **{f"controller_{k}": v for k, v in parts.items()},
               "controller_per_1000_inputs": {k: round(v * per_k, 1) for k, v in
                                              {"total": total, **parts}.items()},
               "tracking_per_hour": round(parts["tracking"] * 3600 / wall_s, 1),
               "rounds": rounds, "tracking_per_round": round(parts["tracking"] / max(1, rounds), 2),
               "slurmdbd_user_total": dbd_user.get(user, 0),
               "slurmdbd_user_per_1000_inputs": round(dbd_user.get(user, 0) * per_k, 1),
               "controller_by_type": by_type, "slurmdbd_by_type": dbd_type, **footprint(c, inputs)}
    print("\nscheduler_rpcs " + json.dumps(figures), flush=True)
    assert done == inputs and outputs == inputs, figures
    # no step inside a one-node job: nothing the job user sends grows with the inputs
    assert parts["in_job"] == 0, figures
    # tracking asks the queue at most once a poll (3 RPCs: why jobs wait), whatever the number of inputs
    assert figures["tracking_per_round"] <= 4, figures
    if inputs <= 200 and float(work_s) == 0:   # the figure (was 419: two srun RPCs per job)
        assert total <= 30, figures
    Path(os.environ.get("HPCRUN_RPC_RESULT", os.devnull)).write_text(json.dumps(figures))


def test_an_array_campaign_is_finished_at_its_last_result_not_a_poll_later(slurm_cluster, hpcrun_bin, example_root):
    """Array mode (issue 55): the supervisor polls once a minute, but once few jobs are open it looks for their exit
    codes between polls, so the campaign is reported finished seconds after its last job ended, not a poll later;
    the scheduler is asked no more often than a few times at the end."""
    raw = slurm_cluster.pfs / "arrayend-raw"
    raw.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        (raw / f"r{i:05d}.dat").write_bytes(b"x" * 512)
    slurm_cluster.chown(raw)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "arrayend", burst_buffer=None, database=None,
                 merge=None, qa=None, inputs={"glob": str(raw / "*.dat"), "checksum": "none"}, walltime="00:05:00",
                 jobs={"files_per_job": 1, "chains_per_node": 1},
                 chain={"command": ["/bin/sh", "-c", 'sleep "$0"; exec cp "$1" "$2"', "3", "{input}", "{output}"]},
                 outputs={"location": "", "pattern": "{stem}.out"})
    slurm_cluster.chown(slurm_cluster.workdir)
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = c.hp("run", str(c.plan), "--interval", "60", timeout=300)
    ended = time.time()
    assert proc.returncode == 0 and "finished: 4 inputs, 4 done" in proc.stdout, proc.stdout[-3000:] + proc.stderr
    outputs = list(c.out.glob("*.out"))
    assert len(outputs) == 4, outputs
    late = ended - max(p.stat().st_mtime for p in outputs)
    rounds = len(re.findall(r"^\S+ \S+ round \d+:", proc.stdout, re.M))
    print(f"\narray_end: finished {late:.1f} s after the last output, {rounds} rounds", flush=True)
    assert late < 15 and rounds <= 2 + array_ends.QUICK_ROUNDS, (late, proc.stdout)   # a poll later: about 60 s
