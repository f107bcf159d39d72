"""Parsing of Slurm command output (the commands themselves run in tests/cluster)."""

import json
import os
from pathlib import Path

import pytest

from hpcrun.backends.scheduler import slurm
from hpcrun.backends.scheduler.base import unchanged
from hpcrun.errors import InputError
from hpcrun.model.failures import classify
from hpcrun.operate.submission.submit import ScriptInfo, compress_indices, plan_batches, submit
from hpcrun.store.store import open_store

SACCT = """\
17_0|18|detector-reco-local|COMPLETED|0:0|None|00:00:04|2026-11-22T05:00:01|2026-11-22T05:00:05|localhost
17_1|19|detector-reco-local|FAILED|7:0|NonZeroExitCode|00:00:03|2026-11-22T05:00:01|2026-11-22T05:00:04|localhost
17_1.batch|19.batch|batch|FAILED|7:0||00:00:03|2026-11-22T05:00:01|2026-11-22T05:00:04|localhost
20|20|x.00001|CANCELLED by 1001|0:15|None|00:00:01|2026-11-22T05:00:01|2026-11-22T05:00:02|localhost
21|21|x.00002|PENDING|0:0|BurstBufferOperation|00:00:00|Unknown|Unknown|None assigned
"""


def test_parse_sacct_rows():
    rows = slurm.parse_sacct(SACCT)
    assert [r.job_id for r in rows] == ["17_0", "17_1", "20", "21"]
    assert rows[1].raw_id == "19" and rows[1].exit_code == "7:0"
    assert rows[2].state == "CANCELLED" and rows[2].terminal
    assert not rows[3].terminal


def test_sbatch_rejection_is_verbatim(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
                                 "Invalid account' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    with pytest.raises(slurm.SlurmError) as exc:
        slurm.sbatch(script)
    assert str(script) in str(exc.value) and "Invalid account" in str(exc.value)


def test_sbatch_env_drops_sbatch_variables(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\nenv | grep -c '^SBATCH_' > \"$(dirname \"$0\")/count\"\n"
                                 "echo '42;cluster'\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "1")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    assert slurm.sbatch(script) == "42"
    assert (fake / "count").read_text().strip() == "0"


def _fake_sbatch(tmp_path, monkeypatch, body: str) -> Path:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\n" + body)
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    return fake


def _plan_dir(tmp_path, spec_factory, inputs=3):
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan
    return write_plan(load_plan(spec_factory({"jobs": {"array": "never"}}, inputs=inputs)), tmp_path / "plan").out_dir


def test_submit_names_each_job_by_its_claim_and_records_it(tmp_path, monkeypatch, spec_factory):
    """Every sbatch gets --job-name=<campaign>.<claim>; the store links each job id to its inputs."""
    plan_dir = _plan_dir(tmp_path, spec_factory)
    fake = _fake_sbatch(tmp_path, monkeypatch,
                        'n=$(cat "$(dirname "$0")/n" 2>/dev/null || echo 100); echo $((n+1)) > "$(dirname "$0")/n"\n'
                        'echo "$@" >> "$(dirname "$0")/args"; echo "$n;cluster"\n')
    report = submit(plan_dir)
    assert [b.job_id for b in report.batches] == ["100", "101", "102"]
    args = (fake / "args").read_text().splitlines()
    assert [a.split()[0] for a in args] == [f"--parsable --job-name={b.tag}".split()[0] for b in report.batches]
    assert all(f"--job-name={b.tag}" in line for b, line in zip(report.batches, args))
    assert len({b.tag for b in report.batches}) == 3
    with open_store(plan_dir) as store:
        c = store.get_campaign(report.campaign)
        jobs = store.job_states(c.id)
    assert [(j.state, j.slurm_id, j.attempts) for j in jobs] == [("submitted", str(100 + i), 1) for i in range(3)]


def test_submit_rejection_is_verbatim_and_releases_the_claim(tmp_path, monkeypatch, spec_factory):
    plan_dir = _plan_dir(tmp_path, spec_factory, inputs=2)
    _fake_sbatch(tmp_path, monkeypatch, "echo 'sbatch: error: Batch job submission failed: Invalid qos' >&2\nexit 1\n")
    with pytest.raises(slurm.SlurmError) as exc:
        submit(plan_dir)
    assert "Invalid qos" in str(exc.value) and "jobs/job00001.sbatch" in str(exc.value)
    with open_store(plan_dir) as store:
        c = store.get_campaign(json.loads((plan_dir / "manifest.json").read_text())["campaign"])
        states = store.job_states(c.id)
    assert [j.state for j in states] == ["pending", "pending"]
    assert "Invalid qos" in (states[0].last_reason or "")


def test_submit_dry_run_creates_no_store(tmp_path, monkeypatch, spec_factory):
    plan_dir = _plan_dir(tmp_path, spec_factory, inputs=2)
    _fake_sbatch(tmp_path, monkeypatch, "exit 99\n")
    report = submit(plan_dir, dry_run=True)
    assert [b.script.path for b in report.batches] == ["jobs/job00001.sbatch", "jobs/job00002.sbatch"]
    assert not (plan_dir / "state.db").exists()


@pytest.mark.parametrize("indices, text", [([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3], "3"), ([], ""),
                                           ([4, 2, 3, 3], "2-4")])
def test_compress_indices(indices, text):
    assert compress_indices(indices) == text


def test_plan_batches_respects_budget_and_scripts():
    scripts = [ScriptInfo("jobs/array001.sbatch", "x", 0, 9, True),
               ScriptInfo("jobs/array002.sbatch", "y", 10, 14, True)]
    batches, left = plan_batches(scripts, [1, 2, 3, 9, 10, 12], budget=5, throttle=2)
    assert [(b.script.path, b.array_spec, b.jobs) for b in batches] == [
        ("jobs/array001.sbatch", "1-3,9%2", [1, 2, 3, 9]), ("jobs/array002.sbatch", "0%2", [10])]
    assert left == 1


def test_parse_acct_folds_steps():
    text = ("361|361|t.abc|COMPLETED|0:0|None|6|00:06.021|2|localhost|2026-11-22T07:51:42|2026-11-22T07:51:48|"
            "4G|\n"
            "361.batch|361.batch|batch|COMPLETED|0:0||6|00:03.012|2|localhost|2026-11-22T07:51:42|"
            "2026-11-22T07:51:48||12516K\n"
            "361.0|361.0|python3|COMPLETED|0:0||3|01:02:03.5|2|localhost|2026-11-22T07:51:45|2026-11-22T07:51:48|"
            "|2.5G\n"
            "362_[1-3%2]|362|t.def|PENDING|0:0|JobArrayTaskLimit|0|00:00:00|2|None assigned|Unknown|Unknown|"
            "1000Mc|\n")
    recs = slurm.parse_acct(text)
    assert set(recs) == {"361", "362_[1-3%2]"}
    r = recs["361"]
    assert (r.elapsed_s, r.cpu_s, r.alloc_cpus, r.max_rss_bytes) == (6.0, 6.021, 2, int(2.5 * 1024 ** 3))
    assert r.req_mem_bytes == 4 * 1024 ** 3
    assert recs["362_[1-3%2]"].start is None
    assert recs["362_[1-3%2]"].req_mem_bytes == 2 * 1000 * 1024 ** 2   # per CPU, times 2 CPUs
    assert slurm.parse_req_mem("16Gn", 8) == 16 * 1024 ** 3 and slurm.parse_req_mem("0", 8) is None
    assert slurm.parse_cpu_time("1-02:03:04") == 93784 and slurm.parse_cpu_time("bogus") is None


def test_a_step_killed_for_memory_makes_a_failed_job_out_of_memory():
    # what sacct prints when the cgroup OOM handler killed a chain step (the job itself only FAILED
    # with the job script's exit code); a job whose own state says more (TIMEOUT) keeps it
    text = ("700|700|t.a|FAILED|14:0|NonZeroExitCode|60|00:30.0|2|n1|2026-11-22T08:00:00|2026-11-22T08:01:00|4G|\n"
            "700.batch|700.batch|batch|FAILED|14:0||60|00:01.0|2|n1|2026-11-22T08:00:00|2026-11-22T08:01:00||9M\n"
            "700.1|700.1|bash|OUT_OF_MEMORY|0:125||50|00:29.0|2|n1|2026-11-22T08:00:05|2026-11-22T08:00:55||4000M\n"
            "701|701|t.b|TIMEOUT|0:0|TimeLimit|60|00:30.0|2|n1|2026-11-22T08:00:00|2026-11-22T08:01:00|4G|\n"
            "701.1|701.1|bash|OUT_OF_MEMORY|0:125||50|00:29.0|2|n1|2026-11-22T08:00:05|2026-11-22T08:00:55||4000M\n"
            "702|702|t.c|FAILED|14:0|NonZeroExitCode|60|00:30.0|2|n1|2026-11-22T08:00:00|2026-11-22T08:01:00|4G|\n"
            "702.1|702.1|bash|FAILED|137:0||50|00:29.0|2|n1|2026-11-22T08:00:05|2026-11-22T08:00:55||40M\n")
    recs = slurm.parse_acct(text)
    assert recs["700"].state == "OUT_OF_MEMORY" and recs["700"].max_rss_bytes == 4000 * 1024 ** 2
    assert recs["701"].state == "TIMEOUT" and recs["702"].state == "FAILED"
    assert classify(recs["700"].state, 14) == "out_of_memory"
    assert classify(recs["702"].state, 14) == "chain_killed" and classify("FAILED", 7) == "chain"
    # a step whose name holds the separator is not a whole line: no MaxRSS from it, its OOM still counts;
    # whole-KiB MaxRSS (read without the general parser) and other units agree
    odd = ("703|703|t.d|FAILED|14:0|NonZeroExitCode|60|00:30.0|2|n1|2026-11-22T08:00:00|2026-11-22T08:01:00|4G|\n"
           "703.0|703.0|a|b|OUT_OF_MEMORY|0:125||50|00:29.0|2|n1|2026-11-22T08:00:05|2026-11-22T08:00:55||4000M\n"
           "703.1|703.1|bash|COMPLETED|0:0||50|00:29.0|2|n1|2026-11-22T08:00:05|2026-11-22T08:00:55||2048K\n")
    recs = slurm.parse_acct(odd)
    assert recs["703"].state == "OUT_OF_MEMORY" and recs["703"].max_rss_bytes == 2048 * 1024


def test_parse_acct_answers_known_unchanged_jobs_with_the_shared_record():
    text = ("500_1|501|t.a|RUNNING|0:0|None|42|00:00:00|2|n1|2026-11-22T08:00:00|Unknown|4G|\n"
            "500_1.batch|501.batch|batch|RUNNING|0:0||42|00:00:00|2|n1|2026-11-22T08:00:00|Unknown||900K\n"
            "500_2|502|t.b|COMPLETED|0:0|None|6|00:06.021|2|n1|2026-11-22T08:00:00|2026-11-22T08:00:06|4G|\n"
            "500_2.batch|502.batch|batch|COMPLETED|0:0||6|00:03.0|2|n1|2026-11-22T08:00:00|"
            "2026-11-22T08:00:06||12516K\n"
            "500_3|503|t.c|RUNNING|0:0|None|7|00:00:00|2|n2|2026-11-22T08:00:00|Unknown|4G|\n")
    # 500_1 still running as known; 500_2 ended in the known state too (an end is always answered in
    # full); 500_3 was pending before
    recs = slurm.parse_acct(text, {"500_1": "RUNNING", "500_2": "COMPLETED", "500_3": "PENDING"})
    assert recs["500_1"] is unchanged("RUNNING") and recs["500_1"].max_rss_bytes is None
    assert recs["500_2"].raw_id == "502" and recs["500_2"].max_rss_bytes == 12516 * 1024
    assert recs["500_3"].raw_id == "503" and recs["500_3"].elapsed_s == 7.0
    assert slurm.parse_acct(text)["500_1"].raw_id == "501"     # nothing known: every record in full


def test_submit_needs_a_plan(tmp_path):
    with pytest.raises(InputError) as exc:
        submit(Path(tmp_path))
    assert "not a plan directory" in str(exc.value)


def test_squeue_rows_with_and_without_the_raw_id(tmp_path, monkeypatch):
    """squeue -o '%i|%F|%j|%T|%R|%A'; a reason may hold '|', an older stand-in prints five fields."""
    _fake_squeue = tmp_path / "bin"
    _fake_squeue.mkdir()
    (_fake_squeue / "squeue").write_text(
        "#!/bin/sh\n"
        "echo '123_4|123|camp.abc|COMPLETED|None|127'\n"
        "echo '123_[5-9%2]|123|camp.abc|PENDING|(burst_buffer/lua: a|b)|123'\n"
        "echo '130|130|camp.def|RUNNING|nid001'\n")
    (_fake_squeue / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{_fake_squeue}:{os.environ['PATH']}")
    rows = slurm.squeue_jobs(job_ids=["123", "130"], ended=True)
    assert [(r.job_id, r.array_job_id, r.state, r.reason, r.raw_id) for r in rows] == [
        ("123_4", "123", "COMPLETED", "None", "127"),
        ("123_[5-9%2]", "123", "PENDING", "(burst_buffer/lua: a|b)", "123"),
        ("130", "130", "RUNNING", "nid001", "")]


def test_queue_only_slurm_never_runs_sacct(tmp_path, monkeypatch, spec_factory):
    """The second scheduler: Slurm without accounting. A sacct that fails is first on PATH;
    records() asks nothing, state_of() reads the queue, and its plans record accounting: false."""
    from hpcrun.backends.scheduler import scheduler_for
    from hpcrun.plan.load import load_plan

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacct").write_text("#!/bin/sh\necho 'sacct must not be called' >&2\nexit 1\n")
    (fake / "squeue").write_text("#!/bin/sh\necho '130|130|iotune-x|COMPLETED|None|130'\n")
    for tool in ("sacct", "squeue"):
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    sched = scheduler_for("slurm-queue-only")
    assert sched.records(["130"], "now-1days") == {}
    assert sched.state_of("130") == "COMPLETED"
    with pytest.raises(slurm.SlurmError):
        scheduler_for("slurm").state_of("130")   # the accounting one does call sacct
    profile = tmp_path / "queue-only.yaml"
    profile.write_text("name: queue-only\nextends: local-test\nscheduler: {kind: slurm-queue-only}\n")
    plan = load_plan(spec_factory({"site": {"profile": str(profile)}}))
    assert (plan.scheduler, plan.accounting) == ("slurm-queue-only", False)
    assert plan.scripts[0].request is not None
