"""Gentle on the scheduler (issue 46): which launch a job uses, the job's own launcher run for real with
bash (ranks, CPU binding, signals, exit status), the pace of the scheduler's commands, and the steps
read only of jobs that ended. The real cluster's side: tests/cluster/test_scheduler_rpcs.py and
tests/cluster/test_slow_scheduler.py."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpcrun.backends.scheduler.base import TERMINAL, Pace, Record, unchanged
from hpcrun.backends.scheduler.slurm_acct import ended_ids, fold_steps
from hpcrun.operate.plandir import MAX_PAUSE_S, paced_interval
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.store.records import Outage

from .conftest import REPO, shellcheck_cmd


def _rec(job_id: str, state: str, rss=None) -> Record:
    return Record(job_id, job_id.replace("_", "0"), "n", state, "0:0", "", 1.0, 1.0, 1, "nid1", None, None, rss)


# ---- which launch -------------------------------------------------------------------------------

def test_one_node_jobs_launch_in_the_batch_step_and_the_plan_says_so(spec_factory):
    plan = load_plan(spec_factory({}))
    assert plan.launch.in_batch and plan.launch.steps_per_job == 0
    assert plan.expected_rpcs["in_job_user"] == 0 and plan.expected_rpcs["steps"] == 0
    assert "launcher.single_node: batch" in plan.launch.why


def test_a_spec_that_asks_for_steps_gets_them_with_their_rpcs(spec_factory):
    plan = load_plan(spec_factory({"chain": {"launch": "step"}}))
    assert not plan.launch.in_batch and "chain.launch: step" in plan.launch.why
    steps = 1 + (plan.database is not None)
    assert plan.launch.steps_per_job == steps and plan.launch.user_rpcs_per_job == 2 * steps
    assert plan.expected_rpcs["in_job_user"] == 2 * steps * len(plan.jobs)


def test_a_profile_that_asks_for_steps_gets_them(spec_factory, tmp_path, monkeypatch):
    prof = tmp_path / "profiles"
    prof.mkdir()
    (prof / "steps.yaml").write_text("name: steps\nextends: local-test\nlauncher:\n  single_node: step\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    plan = load_plan(spec_factory({"site": {"profile": "steps"}}))
    assert not plan.launch.in_batch and "launcher.single_node: step" in plan.launch.why
    out = write_plan(plan, tmp_path / "plan").out_dir
    assert "srun --overlap" in "".join(p.read_text() for p in (out / "jobs").glob("*.sbatch"))


def test_several_nodes_always_use_the_launcher(spec_factory):
    plan = load_plan(spec_factory({"jobs": {"nodes": 2}}))
    assert not plan.launch.in_batch and "only the launcher reaches the other nodes" in plan.launch.why


def test_a_wrong_launch_value_is_refused_with_what_is_valid(cli, spec_factory, tmp_path):
    spec = spec_factory({"chain": {"launch": "mpirun"}})
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"))
    assert result.exit_code == 2 and "chain.launch" in result.output and "'step'" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "p").exists()


# ---- the job's own launcher, run for real --------------------------------------------------------

AFFINITY = ("import os, sys, time; open(sys.argv[1], 'w').write('%s %s %s %s\\n' % (os.environ['HPCRUN_CHAIN'], "
            "os.environ['HPCRUN_NCHAINS'], os.environ.get('HPCRUN_NODE'), "
            "','.join(map(str, sorted(os.sched_getaffinity(0)))))); time.sleep(float(sys.argv[2]))")


def _plan(spec_factory, tmp_path: Path, chains: int, sleep: float) -> Path:
    spec = spec_factory({"jobs": {"chains_per_node": chains},
                         "chain": {"command": ["python3", "-c", AFFINITY, "{output}", str(sleep)]},
                         "merge": {"command": ["/bin/sh", "-c", 'cat "$@" > "$0"', "{output}", "{parts}"]}},
                        inputs=1)
    return write_plan(load_plan(spec), tmp_path / "plan").out_dir


def _chains_said(tmp_path: Path) -> list:
    """What each chain wrote into its part (merged in chain order into the one output)."""
    [out] = (tmp_path / "out").glob("*.reco")
    return out.read_text().splitlines()


def _start(plan_dir: Path, node_cpus: int) -> subprocess.Popen:
    env = dict(os.environ, PATH=os.environ["PATH"], SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="1",
               SLURMD_NODENAME="node7", SLURM_CPUS_ON_NODE=str(node_cpus))
    script = next((plan_dir / "jobs").glob("*.sbatch"))
    return subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def test_chains_get_their_rank_and_their_share_of_the_jobs_cpus(spec_factory, tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU here: no share to bind each chain to")
    plan_dir = _plan(spec_factory, tmp_path, 2, 0)
    proc = _start(plan_dir, len(allowed))   # the job holds exactly the CPUs it may use: bound, as srun binds
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    got = [line.split() for line in _chains_said(tmp_path)]
    assert [g[:3] for g in got] == [["0", "2", "node7"], ["1", "2", "node7"]], got
    half = len(allowed) // 2
    assert [g[3] for g in got] == [",".join(map(str, allowed[:half])), ",".join(map(str, allowed[half:2 * half]))]
    assert "srun" not in "".join(p.read_text() for p in (plan_dir / "jobs").glob("*.sbatch"))


def test_chains_are_not_bound_where_the_job_is_not_confined_to_its_cpus(spec_factory, tmp_path):
    allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    plan_dir = _plan(spec_factory, tmp_path, 2, 0)
    proc = _start(plan_dir, 1000)   # the scheduler gave fewer CPUs than the batch step may use: not confined
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert [line.split()[3] for line in _chains_said(tmp_path)] == [allowed, allowed]


def test_the_pre_timeout_signal_stops_in_batch_chains_and_names_the_time_limit(spec_factory, tmp_path):
    plan_dir = _plan(spec_factory, tmp_path, 2, 60)
    proc = _start(plan_dir, len(os.sched_getaffinity(0)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(list(tmp_path.rglob("*.part[01]"))) < 2:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGUSR1)   # --signal=B:USR1: the batch shell alone
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 10, out
    run = next((plan_dir / "run").glob("*/77"))
    assert "time limit" in (run / "reason").read_text()
    assert sorted(p.read_text().strip() for p in (run / "chains").glob("*.rc")) == ["143", "143"]
    left = subprocess.run(["pgrep", "-f", re.escape(str(tmp_path))], capture_output=True, text=True)
    assert not left.stdout.strip(), "a chain outlived its job"


# ---- the pace of the scheduler's commands -------------------------------------------------------

def test_a_slow_command_starts_a_slow_spell_that_a_quick_round_ends():
    pace = Pace()
    pace.slow_s = 0.05
    with pace.command() as answered:
        answered()
    assert pace.end_round() < 0.05 and pace.slow_since is None
    with pace.command():   # slow but failed (a daemon down): the outage's business, not a slow spell
        time.sleep(0.08)
    assert pace.slow_since is None and pace.end_round() == 0.0
    with pace.command() as answered:
        time.sleep(0.08)
        answered()
    assert pace.slow_since is not None and pace.commands == 3
    assert pace.end_round() >= 0.05 and pace.slow_since is not None    # still slow until a quick round
    with pace.command() as answered:
        answered()
    assert pace.end_round() < 0.05 and pace.slow_since is None


def test_a_slow_scheduler_lengthens_the_pause_up_to_ten_minutes_never_shortens_it():
    assert paced_interval(60, 2.0, 10) == 60          # quick: as it was
    assert paced_interval(60, 30.0, 10) == 120        # four times the slowest command
    assert paced_interval(300, 30.0, 10) == 300       # never shorter than the backed-off pause
    assert paced_interval(60, 400.0, 10) == MAX_PAUSE_S == 600


def test_the_slow_spell_reads_as_a_sentence():
    since = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone.utc)
    o = Outage(None, "slow", "its slowest command took 31 s; polling every 124 s", since, since)
    assert o.text().startswith("the scheduler of the cluster slow since 2026-11-27 12:00:00 UTC")
    ended = Outage("beta", "slow", "", since, since, since + dt.timedelta(minutes=5))
    assert ended.text() == "the scheduler of cluster beta answered at its usual pace again at 12:05:00 UTC after 5 min"


# ---- steps only of jobs that ended ----------------------------------------------------------------

def test_steps_are_asked_only_of_jobs_in_flight_that_ended():
    records = {"10_0": _rec("10_0", "COMPLETED"), "10_1": _rec("10_1", "RUNNING"),
               "11_0": _rec("11_0", "COMPLETED"), "11_1": _rec("11_1", "FAILED"),
               "12": _rec("12", "TIMEOUT"), "13": unchanged("RUNNING"), "14": _rec("14", "COMPLETED")}
    in_flight = {"10_0", "10_1", "11_0", "11_1", "12", "13"}          # 14 ended at an earlier poll
    # array 11 ended whole: asked by its array id; array 10 still runs: its ended task alone
    assert sorted(ended_ids(records, in_flight)) == ["10_0", "11", "12"]
    assert ended_ids({"13": unchanged("RUNNING")}, {"13"}) == []


def test_what_the_steps_say_goes_into_the_ended_jobs_records():
    records = {"12": _rec("12", "FAILED"), "13": _rec("13", "RUNNING")}
    records["12"].cpu_s = 0.0   # sacct -X: a job's TotalCPU is the sum over steps it did not read
    stepped = _rec("12", "OUT_OF_MEMORY", 2 << 30)
    stepped.cpu_s = 41.5
    fold_steps(records, {"12": stepped, "13": _rec("13", "RUNNING", 5)})
    assert records["12"].state == "OUT_OF_MEMORY" and records["12"].max_rss_bytes == 2 << 30
    assert records["12"].cpu_s == 41.5
    assert records["13"].max_rss_bytes is None                          # still running: untouched
    assert "OUT_OF_MEMORY" in TERMINAL


def test_the_launcher_function_is_shellcheck_clean(spec_factory, tmp_path):
    plan_dir = _plan(spec_factory, tmp_path, 2, 0)
    proc = subprocess.run([*shellcheck_cmd(), "-s", "bash", *map(str, (plan_dir / "jobs").glob("*.sbatch"))],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout
