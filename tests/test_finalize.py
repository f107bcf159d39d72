"""The campaign's finalize job (hpcrun/operate/submission/finalize.py): spec checks, the rendered script run locally,
and submission against fake sbatch/squeue/sacct on PATH (the real cluster runs in
tests/cluster/test_campaign_state.py).

The fakes keep Slurm's view in files: ``queue`` (what squeue shows, ``id|array id|name|state|reason``)
and ``acct`` (sacct lines in ACCT_FIELDS order). sbatch appends what it submits to ``queue`` and
its argv to ``args``; a test ends jobs by moving them from ``queue`` to ``acct``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hpcrun.errors import InputError
from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.submission.submit import submit
from hpcrun.operate.tracking.track import poll
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.store.store import StateStore

from .conftest import shellcheck_cmd

FINALIZE = {"command": ["summarize", "--dir", "{outdir}", "--list", "{output_list}", "--name", "{campaign}"]}

# every test here runs on the plan's SQLite store and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("store_backend")


def _plan(tmp_path, spec_factory, finalize=None, inputs=3, array="never") -> Path:
    spec = spec_factory({"jobs": {"array": array}, "finalize": finalize or FINALIZE}, inputs=inputs)
    return write_plan(load_plan(spec), tmp_path / "plan").out_dir


def _dependency(line: str) -> str:
    return next((a.split("=", 1)[1] for a in line.split() if a.startswith("--dependency=")), "")


# ---- spec and plan --------------------------------------------------------------------------


def test_manifest_and_script(tmp_path, spec_factory):
    plan_dir = _plan(tmp_path, spec_factory, {**FINALIZE, "walltime": "15m", "after": "ok"})
    manifest = json.loads((plan_dir / "manifest.json").read_text())
    fin = manifest["finalize"]
    assert fin["path"] == "jobs/finalize.sbatch" and fin["after"] == "ok"
    assert fin["job_name"] == "test-campaign.finalize" and len(fin["sha256"]) == 64
    assert all(s["path"] != fin["path"] for s in manifest["scripts"])  # not a plan job's script
    text = (plan_dir / fin["path"]).read_text()
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=test-campaign.finalize", "#SBATCH --partition=debug", "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1", "#SBATCH --time=00:15:00", "#SBATCH --signal=B:USR1@60", "#SBATCH --no-requeue",
        f"#SBATCH --output={plan_dir}/logs/%x-%j.out", "#SBATCH --comment=hpcrun:test-campaign"]
    assert "#DW" not in text and "hpcrun-db" not in text and "hpcrun-chain" not in text
    proc = subprocess.run(shellcheck_cmd() + ["-s", "bash", "-S", "style", str(plan_dir / fin["path"])],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_no_finalize_section_means_no_script(tmp_path, spec_factory):
    spec = spec_factory({"jobs": {"array": "never"}})
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    assert json.loads((plan_dir / "manifest.json").read_text())["finalize"] is None
    assert not (plan_dir / "jobs" / "finalize.sbatch").exists()


@pytest.mark.parametrize("finalize, key, words", [
    ({"command": ["merge-all", "{output}"]}, "finalize.command", "unknown placeholder {output}"),
    ({"command": ["x"], "walltime": "3d"}, "finalize.walltime", "exceeds the maximum"),
    ({"command": ["x"], "after": "always"}, "finalize.after", "any"),
    ({"command": ["x"], "extra": 1}, "finalize.extra", ""),
])
def test_finalize_errors_point_at_the_key(tmp_path, spec_factory, finalize, key, words):
    spec = spec_factory({"finalize": finalize})
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    assert any(p.key == key and words in p.message for p in exc.value.problems), exc.value.problems


def test_finalize_script_runs_locally(tmp_path, spec_factory):
    """The script lists the outputs that exist, runs the command with the placeholders filled in,
    and fails with exit 12 and a reason when the command fails."""
    out = tmp_path / "out dir 'quoted'"
    summary = tmp_path / "summary.txt"
    cmd = ["bash", "-c", 'printf "%s %s %s\\n" "$1" "$2" "$3" > "$4"; cat "$2" >> "$4"; exit "$5"', "finalize",
           "{campaign}", "{output_list}", "{outdir}", str(summary), "{env:FINALIZE_RC}"]
    spec = spec_factory({"jobs": {"array": "never"}, "finalize": {"command": cmd},
                         "outputs": {"location": str(out)}})
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    out.mkdir()
    (out / "run000.reco").write_text("a")
    (out / "run002.reco").write_text("c")
    script = plan_dir / "jobs" / "finalize.sbatch"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(script)], env={**env, "FINALIZE_RC": "0"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rundir = plan_dir / "run" / "finalize" / "local"
    listed = (rundir / "outputs.txt").read_text().splitlines()
    assert listed == [str(out / "run000.reco"), str(out / "run002.reco")]
    lines = summary.read_text().splitlines()
    assert lines[0] == f"test-campaign {rundir / 'outputs.txt'} {out}" and lines[1:] == listed
    assert "2 of 3 planned output(s) exist" in proc.stderr
    proc = subprocess.run(["bash", str(script)], env={**env, "FINALIZE_RC": "4"}, capture_output=True, text=True)
    assert proc.returncode == 12
    assert "finalize command failed with exit code 4" in (rundir / "reason").read_text()
    assert (rundir / "exit_code").read_text().strip() == "12"


# ---- submission against fake Slurm commands --------------------------------------------------


def test_no_finalize_while_work_is_pending(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    report = submit(plan_dir, limit=2)
    assert report.left_pending == 1
    assert report.finalize is not None and report.finalize.action == "waiting"
    assert "1 still pending" in report.finalize.message
    assert fake_slurm.finalize_calls("test-campaign") == []
    dry = submit(plan_dir, dry_run=True)
    assert dry.finalize is not None and dry.finalize.action == "would-submit"
    assert fake_slurm.finalize_calls("test-campaign") == []


def test_dependency_lists_only_still_queued_jobs(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    submit(plan_dir, limit=2)                       # jobs 100 and 101
    fake_slurm.end("100")                           # 100 ended (and left the queue) meanwhile
    report = submit(plan_dir)                       # job 102, then the finalize job
    assert [b.job_id for b in report.batches] == ["102"]
    fin = report.finalize
    assert fin is not None and (fin.action, fin.job_id, fin.dependency) == ("submitted", "103", "afterany:101:102")
    [call] = fake_slurm.finalize_calls("test-campaign")
    assert _dependency(call) == "afterany:101:102" and call.endswith("jobs/finalize.sbatch")
    with open_plan_store(plan_dir) as store:
        [rnd] = store.finalize_rounds(store.get_campaign("test-campaign").id)
    assert (rnd.round, rnd.job_id, rnd.dependency, rnd.tag) == (1, "103", "afterany:101:102", "test-campaign.finalize")
    again = submit(plan_dir)                        # a second submit does not submit it again
    assert again.finalize is not None and again.finalize.action == "earlier" and not again.batches
    assert len(fake_slurm.finalize_calls("test-campaign")) == 1


def test_array_campaign_depends_on_the_array_id(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory, {**FINALIZE, "after": "ok"}, array="always")
    report = submit(plan_dir)
    assert [b.array_spec for b in report.batches] == ["0-2"]
    assert report.finalize is not None and report.finalize.dependency == "afterok:100"


def test_no_dependency_when_every_job_has_ended(tmp_path, spec_factory, fake_slurm, monkeypatch):
    plan_dir = _plan(tmp_path, spec_factory)
    from hpcrun.backends.scheduler import slurm as slurm_mod
    real = slurm_mod.sbatch

    def sbatch(script, extra=(), **kw):
        if script.name == "finalize.sbatch":
            raise KeyboardInterrupt("killed just before the finalize sbatch")
        return real(script, extra, **kw)

    with monkeypatch.context() as m:
        m.setattr(slurm_mod, "sbatch", sbatch)
        with pytest.raises(KeyboardInterrupt):
            submit(plan_dir)
    # every plan job ended before the finalize job went out: nothing is left to depend on
    for job_id in ("100", "101", "102"):
        fake_slurm.end(job_id)
    report = submit(plan_dir)
    assert report.finalize is not None and report.finalize.action == "submitted"
    assert report.finalize.dependency == "" and "without a dependency" in report.finalize.message
    [call] = fake_slurm.finalize_calls("test-campaign")
    assert "--dependency" not in call


def test_finalize_recovered_by_name_after_a_kill_between_sbatch_and_record(tmp_path, spec_factory, fake_slurm,
                                                                           monkeypatch):
    plan_dir = _plan(tmp_path, spec_factory)

    def killed(*_args, **_kwargs):
        raise KeyboardInterrupt("killed after sbatch returned, before the record")

    with monkeypatch.context() as m:
        m.setattr(StateStore, "record_finalize_job", killed)
        with pytest.raises(KeyboardInterrupt):
            submit(plan_dir)
    assert len(fake_slurm.finalize_calls("test-campaign")) == 1   # sbatch took it: job 103
    report = submit(plan_dir)
    assert report.finalize is not None and (report.finalize.action, report.finalize.job_id) == ("recovered", "103")
    assert len(fake_slurm.finalize_calls("test-campaign")) == 1   # not submitted twice
    # the job may already have ended and left the queue: sacct --name finds it as well
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        assert store.finalize_rounds(c.id)[-1].job_id == "103"


def test_finalize_recovered_from_accounting_when_it_left_the_queue(tmp_path, spec_factory, fake_slurm, monkeypatch):
    plan_dir = _plan(tmp_path, spec_factory)
    with monkeypatch.context() as m:
        m.setattr(StateStore, "record_finalize_job", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            submit(plan_dir)
    for job_id in ("100", "101", "102", "103"):
        fake_slurm.end(job_id)
    report = submit(plan_dir)
    assert report.finalize is not None and (report.finalize.action, report.finalize.job_id) == ("recovered", "103")
    assert len(fake_slurm.finalize_calls("test-campaign")) == 1


def test_killed_before_sbatch_submits_once(tmp_path, spec_factory, fake_slurm, monkeypatch):
    plan_dir = _plan(tmp_path, spec_factory)
    from hpcrun.backends.scheduler import slurm as slurm_mod
    real = slurm_mod.sbatch

    def sbatch(script, extra=(), **kw):
        if script.name == "finalize.sbatch":
            raise KeyboardInterrupt("killed before sbatch")
        return real(script, extra, **kw)

    with monkeypatch.context() as m:
        m.setattr(slurm_mod, "sbatch", sbatch)
        with pytest.raises(KeyboardInterrupt):
            submit(plan_dir)
    assert fake_slurm.finalize_calls("test-campaign") == []
    report = submit(plan_dir)
    assert report.finalize is not None and report.finalize.action == "submitted"
    assert len(fake_slurm.finalize_calls("test-campaign")) == 1


def test_after_ok_is_not_submitted_when_a_job_failed(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory, {**FINALIZE, "after": "ok"})
    submit(plan_dir, limit=2)                        # 100, 101
    fake_slurm.end("101", "FAILED", "7:0")
    report = submit(plan_dir)                        # 102, then the decision: a poll first sees 101 failed
    assert [b.job_id for b in report.batches] == ["102"]
    assert report.finalize is not None and report.finalize.action == "skipped"
    assert "1 plan job(s) failed" in report.finalize.message
    assert fake_slurm.finalize_calls("test-campaign") == []


def test_sbatch_rejection_keeps_the_round_for_the_next_submit(tmp_path, spec_factory, fake_slurm, monkeypatch):
    plan_dir = _plan(tmp_path, spec_factory)
    from hpcrun.backends.scheduler import slurm as slurm_mod
    monkeypatch.setenv("FAKE_SBATCH_FAIL_FINALIZE", "sbatch: error: Batch job submission failed: Invalid qos")
    with pytest.raises(slurm_mod.SlurmError, match="Invalid qos") as exc:
        submit(plan_dir)
    assert "jobs/finalize.sbatch" in str(exc.value)
    st = poll(plan_dir)
    assert st.finalize is not None and st.finalize["status"] == "pending" and "Invalid qos" in st.finalize["reason"]
    monkeypatch.delenv("FAKE_SBATCH_FAIL_FINALIZE")
    report = submit(plan_dir)
    assert report.finalize is not None and report.finalize.action == "submitted"


def test_status_follows_the_finalize_job(tmp_path, spec_factory, fake_slurm, cli):
    plan_dir = _plan(tmp_path, spec_factory)
    st = poll(plan_dir)
    assert st.finalize is not None and st.finalize["status"] == "pending" and st.finalize["job_id"] == ""
    submit(plan_dir)
    st = poll(plan_dir)
    assert st.finalize is not None and (st.finalize["job_id"], st.finalize["status"]) == ("103", "submitted")
    assert st.finalize["reason"] == "Dependency" and st.finalize_in_flight
    for job_id in ("100", "101", "102", "103"):
        fake_slurm.end(job_id)
    st = poll(plan_dir)
    assert (st.finalize["status"], st.finalize["state"], st.finalize["exit_code"]) == ("done", "COMPLETED", "0")
    assert not st.finalize_in_flight and st.as_dict()["finalize"]["job_id"] == "103"
    table = cli("status", str(plan_dir))
    assert "finalize (round 1, after any): job 103 COMPLETED" in table.output
    data = json.loads(cli("status", str(plan_dir), "--json").output)
    assert data["finalize"]["status"] == "done"


def test_finalize_again_after_retried_work(tmp_path, spec_factory, fake_slurm, cli):
    plan_dir = _plan(tmp_path, spec_factory)
    submit(plan_dir)                                       # 100..102, finalize 103
    refused = submit(plan_dir, finalize_again=True)        # 103 still queued: no second one yet
    assert refused.finalize is not None and refused.finalize.action == "refused"
    assert "(or `scancel 103` it first)" in refused.finalize.message   # the backend's own words
    fake_slurm.end("100")
    fake_slurm.end("101", "FAILED", "7:0")
    fake_slurm.end("102")
    fake_slurm.end("103")
    result = cli("retry", str(plan_dir), "--json")         # resubmits 101 as 104; says how to finalize again
    data = json.loads(result.output)
    assert data["requeued"] == ["test-campaign.00002"] and data["finalize"]["action"] == "earlier"
    assert "--finalize-again" in data["finalize"]["message"]
    assert len(fake_slurm.finalize_calls("test-campaign")) == 1
    report = submit(plan_dir, finalize_again=True)
    assert report.finalize is not None and (report.finalize.action, report.finalize.round) == ("submitted", 2)
    assert report.finalize.dependency == "afterany:104"
    assert len(fake_slurm.finalize_calls("test-campaign")) == 2
    again = submit(plan_dir)
    assert again.finalize is not None and again.finalize.action == "earlier" and again.finalize.round == 2


def test_submit_cli_prints_the_finalize_line(tmp_path, spec_factory, fake_slurm, cli):
    plan_dir = _plan(tmp_path, spec_factory)
    result = cli("submit", str(plan_dir))
    assert "finalize: submitted finalize job 103 (test-campaign.finalize) after afterany:100:101:102" in result.output
    data = json.loads(cli("submit", str(plan_dir), "--json").output)
    assert data["finalize"]["action"] == "earlier" and data["finalize"]["job_id"] == "103"



def test_report_carries_the_finalize_job(tmp_path, spec_factory, fake_slurm, cli):
    plan_dir = _plan(tmp_path, spec_factory)
    submit(plan_dir)
    for job_id in ("100", "101", "102", "103"):
        fake_slurm.end(job_id)
    data = json.loads(cli("report", str(plan_dir), "--poll", "--json").output)
    assert data["finalize"]["job_id"] == "103" and data["finalize"]["status"] == "done"


def test_the_documented_example_plans(tmp_path, spec_factory):
    import yaml

    from .test_docs import CAMPAIGN_DOC, _example

    example = yaml.safe_load(_example(CAMPAIGN_DOC, "finalize"))
    plan_dir = _plan(tmp_path, spec_factory, example["finalize"])
    text = (plan_dir / "jobs" / "finalize.sbatch").read_text()
    assert "#SBATCH --time=00:30:00" in text and '--list "${HPCRUN_OUTPUT_LIST}"' in text


def test_retry_opens_the_plan_once(tmp_path, spec_factory, fake_slurm, monkeypatch):
    """One `hpcrun retry`: the manifest read once and the store opened once, for the poll, the
    requeue and the resubmission alike (it used to be three and four times)."""
    import hpcrun.operate.plandir as plandir
    import hpcrun.operate.retries.retry as retry_module

    plan_dir = _plan(tmp_path, spec_factory)
    first = submit(plan_dir)
    ids = [b.job_id for b in first.batches]
    fake_slurm.end(ids[0], "FAILED", "7:0")
    for job_id in ids[1:]:
        fake_slurm.end(job_id)
    reads, opens = [], []
    real_read, real_open = retry_module.read_manifest, plandir.open_store
    import hpcrun.operate.submission.submit as submit_module
    import hpcrun.operate.tracking.track as track_module

    for module in (retry_module, submit_module, track_module):
        monkeypatch.setattr(module, "read_manifest", lambda *a, **k: reads.append(a) or real_read(*a, **k))
    monkeypatch.setattr(plandir, "open_store", lambda *a, **k: opens.append(a) or real_open(*a, **k))
    report = retry_module.retry(plan_dir)
    assert report.requeued == ["test-campaign.00001"] and report.submit is not None
    assert [b.jobs for b in report.submit.batches] == [[0]]
    assert (len(reads), len(opens)) == (1, 1)


def test_a_finalize_job_seen_running_whose_record_lags_is_not_called_lost(tmp_path, spec_factory, fake_slurm,
                                                                           monkeypatch):
    """The finalize job runs, ends and leaves the queue before slurmdbd (answering, but behind) has its record: not
    LOST while its record may come (the bound: the longest walltime, MinJobAge and the catch-up since it was seen
    running); its record ends it. Past the bound it is LOST."""
    from hpcrun.operate.tracking import track
    monkeypatch.setattr(track, "LOST_AFTER_S", 0.0)            # anything unseen would be called lost at once
    plan_dir = _plan(tmp_path, spec_factory)
    submit(plan_dir)
    for job_id in ("100", "101", "102"):
        fake_slurm.end(job_id)
    queue = fake_slurm.bin / "queue"
    queue.write_text(queue.read_text().replace("|PENDING|(Dependency)", "|RUNNING|nid00001"))
    st = poll(plan_dir)
    assert st.finalize is not None and st.finalize["state"] == "RUNNING", st.finalize
    fake_slurm.end("103", accounted=False)                      # gone from squeue, its record not there yet
    st = poll(plan_dir)
    assert st.finalize is not None and st.finalize["state"] == "RUNNING", st.finalize   # not lost
    monkeypatch.setattr(track, "ACCOUNTING_CATCHUP_S", -10.0 ** 9)   # the bound passed
    st = poll(plan_dir)
    assert st.finalize is not None and st.finalize["state"] == "LOST", st.finalize
