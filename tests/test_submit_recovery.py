"""A submitter killed between sbatch and its record: the next one finds the job by its claim's name and records it,
never submitting it twice (the claim -> tag -> record protocol), even when the job already ended and the accounting
has no record of it yet. Fake sbatch/squeue/sacct (tests/fake_slurm.py)."""

from __future__ import annotations

import json
import sqlite3
from types import SimpleNamespace
from typing import Any, Callable, Dict, List

import pytest

from hpcrun.backends.scheduler import slurm_run
from hpcrun.backends.scheduler.base import SubmitUncertain
from hpcrun.backends.scheduler.slurm import Slurm
from hpcrun.operate.plandir import open_plan_store
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


def _uncertain_second_sbatch(monkeypatch, made: str, nth: int = 2) -> Dict[str, Callable[[], Any]]:
    """The second (``nth``) sbatch times out: the job was made at once, later (``later``: call it), or never, and
    hpcrun cannot tell."""
    real, calls = Slurm.submit, {"n": 0, "later": lambda: None}

    def flaky(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == nth:
            if made == "at once":
                real(self, *a, **kw)
            else:   # made after the controller answered the submitter's look, or never
                calls["later"] = lambda: real(self, *a, **kw) if made == "later" else None
            raise SubmitUncertain("sbatch: error: Batch job submission failed: Socket timed out on send/recv")
        return real(self, *a, **kw)

    monkeypatch.setattr(Slurm, "submit", flaky)
    return calls


def _killed_before_sbatch(monkeypatch, plan_dir) -> None:
    """A submitter killed between its claim and sbatch: a claim the scheduler never got."""
    def killed(*_a, **_kw):
        raise KeyboardInterrupt("killed before sbatch")

    with monkeypatch.context() as m:
        m.setattr(Slurm, "submit", killed)
        with pytest.raises(KeyboardInterrupt):
            submit(plan_dir)


def _two_clusters(tmp_path, spec_factory, inputs: int, **spec: Any):
    """A plan of per-job scripts on two clusters, alpha and beta (the local-test profile under two names)."""
    profiles = []
    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nextends: local-test\nscheduler:\n  cluster: {name}\n")
        profiles.append(str(tmp_path / f"{name}.yaml"))
    data = spec_factory({"site": {"profile": profiles}, "jobs": {"array": "never"}, **spec}, inputs=inputs)
    return write_plan(load_plan(data), tmp_path / "plan").out_dir


def _pending(plan_dir) -> List[int]:
    with open_plan_store(plan_dir) as store:
        return store.pending_jobs(store.get_campaign("test-campaign").id)


def _names(fake_slurm) -> List[str]:
    return [a.split("--job-name=", 1)[1].split()[0] for a in fake_slurm.args() if "--job-name=test-campaign." in a]


@pytest.mark.parametrize("made", ["at once", "later", "never"])
def test_a_timed_out_sbatch_among_per_job_submissions_doubles_nothing(tmp_path, spec_factory, fake_slurm,
                                                                       monkeypatch, made):
    """Per-job scripts (a group of submissions under one claim): the second sbatch times out. What was submitted is
    recorded once, the timed-out job is recorded if the controller made it, and nothing is submitted twice: the
    jobs after it go at once when it was found, and at the next submit (its settle) when it was not."""
    plan_dir = write_plan(load_plan(spec_factory({"jobs": {"array": "never"}}, inputs=3)), tmp_path / "plan").out_dir
    with monkeypatch.context() as m:
        calls = _uncertain_second_sbatch(m, made)
        if made == "at once":
            report = submit(plan_dir)
            assert len(report.batches) == 2 and _submissions(plan_dir) == ["100", "101"]
            # the third was never submitted: pending again, and counted as left (submit --follow goes on)
            assert report.left_pending == 1 and _pending(plan_dir) == [2], (report.left_pending, _pending(plan_dir))
        else:
            with pytest.raises(SubmitUncertain):
                submit(plan_dir)
            assert _submissions(plan_dir) == ["100"]   # the second is neither recorded nor released yet
            calls["later"]()   # the controller makes the job after it answered the look
    report = submit(plan_dir)   # the next round: settles the claim, then submits what was never submitted
    names = _names(fake_slurm)
    assert len(names) == len(set(names)) == 3, names
    assert len(_submissions(plan_dir)) == 3


def test_a_timed_out_retry_found_keeps_its_changes(tmp_path, spec_factory, fake_slurm, monkeypatch):
    """Retries that carry changes (not on a node), per-job scripts, the second sbatch times out and the controller
    made the job: its submission, recorded by the handler's settle, keeps the retry's changes as the others do."""
    from hpcrun.store.store import StateStore
    plan_dir = write_plan(load_plan(spec_factory({"jobs": {"array": "never"}}, inputs=3)), tmp_path / "plan").out_dir
    adjust = '{"exclude": ["nid00003"], "changes": "not on nid00003"}'
    monkeypatch.setattr(StateStore, "pending_adjustments", lambda self, _c: dict.fromkeys(range(3), adjust))
    _uncertain_second_sbatch(monkeypatch, "at once")
    submit(plan_dir)
    with sqlite3.connect(plan_dir / "state.db") as db:
        rows = sorted(db.execute("SELECT job_id, changes FROM hpcrun_submission"))
    assert rows == [("100", "not on nid00003"), ("101", "not on nid00003")], rows
    assert all("--exclude=nid00003" in a for a in fake_slurm.args() if "--job-name=test-campaign." in a)


def test_a_claim_waits_while_the_accounting_catches_up_after_an_outage(tmp_path, spec_factory, fake_slurm,
                                                                       monkeypatch):
    """The job ended long ago (gone from every squeue: past MinJobAge) and slurmdbd, back from an outage a minute
    ago, has not sent its record yet: the claim is neither recorded nor released (its inputs would run twice), and
    is recorded once the record comes."""
    plan_dir = write_plan(load_plan(spec_factory({"jobs": {"array": "always"}})), tmp_path / "plan").out_dir
    _killed_after_sbatch(monkeypatch, plan_dir)
    fake_slurm.end("100", accounted=False)
    store = open_plan_store(plan_dir)
    campaign = store.get_campaign("test-campaign")
    store.record_outage(campaign.id, None, "accounting", "sacct: error: Problem talking to the database")
    store.end_outage(campaign.id, None, "accounting")   # it answers again: what it kept comes over minutes
    report = submit(plan_dir)
    assert not report.released and not report.recovered and not report.batches, report
    assert len(_names(fake_slurm)) == 1 and _submissions(plan_dir) == [], "submitted again"
    fake_slurm.catch_up()
    report = submit(plan_dir)
    assert report.recovered and not report.released and _submissions(plan_dir) == ["100"]
    assert len(_names(fake_slurm)) == 1


def test_an_outage_left_open_ends_when_the_settle_reaches_the_accounting_and_the_wait_is_bounded(
        tmp_path, spec_factory, fake_slurm, monkeypatch):
    """An accounting outage a stopped supervisor left open, and a claim whose submitter was killed before sbatch:
    the settle's own sacct answers, so the outage ends now and the claim waits out the catch-up (no finalize job
    meanwhile: its dependency would miss the claim's jobs), then is released and its jobs submitted once."""
    spec = spec_factory({"jobs": {"array": "never"}, "finalize": {"command": ["/bin/true"]}}, inputs=2)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    _killed_before_sbatch(monkeypatch, plan_dir)
    assert not _names(fake_slurm)
    with open_plan_store(plan_dir) as store:
        cid = store.get_campaign("test-campaign").id
        store.record_outage(cid, None, "accounting", "sacct: error: Problem talking to the database")
    report = submit(plan_dir)
    assert not report.released and not report.batches and report.left_pending == 2, report
    assert report.finalize is not None and report.finalize.action == "waiting", report.finalize
    assert "finalize" not in " ".join(fake_slurm.args())
    with open_plan_store(plan_dir) as store:
        [outage] = [o for o in store.outages(cid) if o.daemon == "accounting"]
        assert not outage.open, "the settle's own sacct answered: the outage ends"
        store.pause(cid)
    assert submit(plan_dir).left_pending == 2   # paused: the waiting claims still count as left
    with open_plan_store(plan_dir) as store:
        store.resume(cid)
    monkeypatch.setattr(submit_mod, "ACCOUNTING_CATCHUP_S", 0.0)   # the catch-up is over
    report = submit(plan_dir)
    assert report.released and len(report.batches) == 2, report
    names = [n for n in _names(fake_slurm) if not n.endswith(".finalize")]
    assert len(names) == len(set(names)) == 2, names


def test_no_finalize_job_while_a_cluster_that_does_not_answer_may_hold_a_claims_job(tmp_path, spec_factory,
                                                                                   fake_slurm, monkeypatch):
    """Two clusters; a claim whose submitter was killed before sbatch, and one cluster's accounting away: the claim
    cannot be settled (its job may be there), so it counts as left and the finalize job waits (its dependency
    would miss that job)."""
    from hpcrun.backends.scheduler.slurm_run import SlurmAccountingUnreachable

    plan_dir = _two_clusters(tmp_path, spec_factory, 2, finalize={"command": ["/bin/true"]})
    _killed_before_sbatch(monkeypatch, plan_dir)
    real = Slurm.records

    def records(self, *a, **kw):
        if self.cluster == "beta":
            raise SlurmAccountingUnreachable("sacct: error: Problem talking to the database: Connection refused")
        return real(self, *a, **kw)

    monkeypatch.setattr(Slurm, "records", records)
    report = submit(plan_dir)
    assert report.finalize is not None and report.finalize.action == "waiting", report.finalize
    assert report.left_pending >= 1, report
    assert not [a for a in fake_slurm.args() if "--job-name=test-campaign.finalize" in a], fake_slurm.args()


def test_a_timed_out_sbatch_whose_look_another_cluster_does_not_answer_leaves_its_own_cluster_up(
        tmp_path, spec_factory, fake_slurm, monkeypatch):
    """Two clusters, per-job scripts: alpha's second sbatch times out (the controller made the job), and beta's
    accounting does not answer the look for it. Alpha is not marked down with beta's words, and beta still gets
    its share: the claim waits for the next round's settle (as when the job is not found), which records alpha's
    job once beta answers."""
    from hpcrun.backends.scheduler.slurm_run import SlurmAccountingUnreachable

    plan_dir = _two_clusters(tmp_path, spec_factory, 4)
    real, away = Slurm.records, {"beta": True}

    def records(self, *a, **kw):
        if away.get(self.cluster or ""):
            raise SlurmAccountingUnreachable("sacct: error: Problem talking to the database: Connection refused")
        return real(self, *a, **kw)

    monkeypatch.setattr(Slurm, "records", records)
    with monkeypatch.context() as m:
        _uncertain_second_sbatch(m, "at once")
        report = submit(plan_dir)
    sent = [a for a in fake_slurm.args() if "--job-name=test-campaign." in a]
    assert "--clusters=alpha" in sent[1], sent   # the one that timed out
    assert report.clusters["alpha"]["state"] == "up" and "timed out" in report.clusters["alpha"]["detail"], report
    assert report.clusters["beta"]["state"] == "up" and sum(b.cluster == "beta" for b in report.batches) == 2
    assert report.left_pending == 1 and _submissions(plan_dir) == ["100", "102", "103"], report   # alpha's 2nd waits
    away["beta"] = False
    submit(plan_dir)
    names = _names(fake_slurm)
    assert len(names) == len(set(names)) == 4, names
    assert len(_submissions(plan_dir)) == 4


def test_jobs_sent_back_by_a_timed_out_sbatch_on_one_of_two_clusters_count_as_left(tmp_path, spec_factory,
                                                                                    fake_slurm, monkeypatch):
    """Two clusters, per-job scripts: the second sbatch times out and its job was made; the jobs after it in its
    claim, never submitted, go back to pending and the round says so (``submit --follow`` goes on for them)."""
    plan_dir = _two_clusters(tmp_path, spec_factory, 6)
    with monkeypatch.context() as m:
        _uncertain_second_sbatch(m, "at once")
        report = submit(plan_dir)
    pending = _pending(plan_dir)
    assert pending and report.left_pending == len(pending), (report.left_pending, pending)
    submit(plan_dir)
    names = _names(fake_slurm)
    assert len(names) == len(set(names)) == 6, names


def test_an_outage_of_an_accounting_the_plan_does_not_ask_holds_no_claim(tmp_path, spec_factory, fake_slurm,
                                                                         monkeypatch):
    """An accounting outage left open in the store, on a plan whose cluster has no accounting (queue-only Slurm):
    nothing the settle asks can end it, and it says nothing of the claim's job, so the claim of a submitter killed
    before sbatch is released and its job submitted once."""
    profile = tmp_path / "queue-only.yaml"
    profile.write_text("name: queue-only\nextends: local-test\nscheduler: {kind: slurm-queue-only}\n")
    plan_dir = write_plan(load_plan(spec_factory({"site": {"profile": str(profile)}, "jobs": {"array": "always"}})),
                          tmp_path / "plan").out_dir
    _killed_before_sbatch(monkeypatch, plan_dir)
    with open_plan_store(plan_dir) as store:
        store.record_outage(store.get_campaign("test-campaign").id, None, "accounting", "sacct: error: refused")
    report = submit(plan_dir)
    assert report.released and len(_names(fake_slurm)) == 1, (report, _names(fake_slurm))


def test_submit_follow_waits_out_a_controller_that_stops_answering(tmp_path, spec_factory, fake_slurm, monkeypatch,
                                                                   cli):
    """``submit --follow`` under a queue limit: between two rounds slurmctld stops answering (a restart). The next
    round says so and waits; the one after submits the rest, once. (The first round's failure is still an error:
    no Slurm there is not an outage.)"""
    (tmp_path / "capped.yaml").write_text("name: capped\nextends: local-test\nmax_queued_jobs: 1\n")
    spec = spec_factory({"site": {"profile": str(tmp_path / "capped.yaml")}, "jobs": {"array": "never"}}, inputs=2)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    steps = iter([lambda: (fake_slurm.end("100"), fake_slurm.stop("slurmctld")),   # after the first round
                  lambda: fake_slurm.start("slurmctld")])                          # after the round that waited
    monkeypatch.setattr(slurm_run.time, "sleep", lambda _s: None)   # no backoff of 1+2+4 s between sbatch's tries
    monkeypatch.setattr(submit_mod, "time", SimpleNamespace(sleep=lambda _s: next(steps)()))   # follow's own pause
    result = cli("submit", str(plan_dir), "--follow", "--interval", "1")
    assert result.exit_code == 0, result.output
    assert "does not answer" in result.output and "waiting for it" in result.output, result.output
    names = _names(fake_slurm)
    assert len(names) == len(set(names)) == 2 and _submissions(plan_dir) == ["100", "101"], names
    fake_slurm.stop("slurmctld")
    other_plan = write_plan(load_plan(spec), tmp_path / "other").out_dir

    def waited(_s: float) -> None:
        raise AssertionError("follow waited in its first round")
    monkeypatch.setattr(submit_mod, "time", SimpleNamespace(sleep=waited))
    result = cli("submit", str(other_plan), "--follow", "--interval", "1")
    assert result.exit_code == 3 and "does not answer" in result.output, result.output
    assert "waiting for it" not in result.output, result.output


def test_submit_follow_shows_what_a_round_cut_short_by_a_timed_out_sbatch_sent(tmp_path, spec_factory, fake_slurm,
                                                                               monkeypatch, cli):
    """``submit --follow`` on one cluster, per-job scripts in one group: the group's second sbatch times out (no job
    made). The job its first sbatch made is recorded, and now shown and counted too; the next round releases the
    claim of the one never made and submits it, once."""
    (tmp_path / "capped.yaml").write_text("name: capped\nextends: local-test\nmax_queued_jobs: 2\n")
    spec = spec_factory({"site": {"profile": str(tmp_path / "capped.yaml")}, "jobs": {"array": "never"}}, inputs=4)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    _uncertain_second_sbatch(monkeypatch, "never", nth=4)
    steps = iter([lambda: (fake_slurm.end("100"), fake_slurm.end("101")), lambda: None, lambda: None])
    monkeypatch.setattr(submit_mod, "time", SimpleNamespace(sleep=lambda _s: next(steps)()))
    result = cli("submit", str(plan_dir), "--follow", "--interval", "1", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output[result.output.index("{"):])
    assert sorted(b["job_id"] for b in shown["submitted"]) == ["100", "101", "102", "103"], shown["submitted"]
    names = _names(fake_slurm)
    assert len(names) == len(set(names)) == 4, names
