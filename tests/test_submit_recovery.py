"""A submitter killed between sbatch and its record: the next one finds the job by its claim's name and records it,
never submitting it twice (the claim -> tag -> record protocol), even when the job already ended and the accounting
has no record of it yet. Fake sbatch/squeue/sacct (tests/fake_slurm.py)."""

from __future__ import annotations

import sqlite3

import pytest

from hpcrun.operate.submission import submit as submit_mod
from hpcrun.operate.submission.submit import submit
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan


def _killed_after_sbatch(monkeypatch, plan_dir) -> None:
    def killed(*_args, **_kwargs):
        raise KeyboardInterrupt("killed after sbatch returned, before the record")

    with monkeypatch.context() as m:
        m.setattr(submit_mod.Submitter, "_record", killed)
        with pytest.raises(KeyboardInterrupt):
            submit(plan_dir)


def _submissions(plan_dir):
    with sqlite3.connect(plan_dir / "state.db") as db:   # the default store
        return sorted({r[0] for r in db.execute("SELECT job_id FROM hpcrun_submission")})


@pytest.mark.parametrize("accounted", [True, False], ids=["in-accounting", "accounting-behind"])
def test_a_job_that_ended_before_its_record_is_found_not_submitted_again(tmp_path, spec_factory, fake_slurm,
                                                                          monkeypatch, accounted):
    plan_dir = write_plan(load_plan(spec_factory({"jobs": {"array": "always"}})), tmp_path / "plan").out_dir
    _killed_after_sbatch(monkeypatch, plan_dir)
    [first] = [a for a in fake_slurm.args() if "--job-name=test-campaign." in a]
    # the array ran and ended at once (a short job), before any submitter looked: squeue --states=all still
    # shows it (MinJobAge), and slurmdbd may not have its record yet
    fake_slurm.end("100", accounted=accounted, recent=True)
    report = submit(plan_dir)
    assert [a for a in fake_slurm.args() if "--job-name=test-campaign." in a] == [first], "submitted twice"
    assert report.recovered and not report.released, (report.recovered, report.released)
    assert _submissions(plan_dir) == ["100"]
