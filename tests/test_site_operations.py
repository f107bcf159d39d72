"""What the site does to a running campaign, against fake sbatch/squeue/sacct on PATH: cancellations
that were not the campaign's (retried, class site_cancel) beside an operator's (left alone), an
accounting outage (slurmdbd down: the queue is used, nothing is called lost, nothing submitted twice)
and a controller outage (nothing submitted, the supervisor never exits). The same on the real Slurm:
tests/cluster/test_site_operations.py."""

from __future__ import annotations

import json
import os

import pytest

from hpcrun.backends.scheduler import slurm, slurm_run
from hpcrun.backends.scheduler.base import AccountingUnreachable, Unreachable
from hpcrun.backends.scheduler.slurm_acct import ACCT_FIELDS, parse_acct
from hpcrun.operate.plandir import open_plan_store, read_manifest
from hpcrun.operate.supervision.supervise import run
from hpcrun.operate.tracking import track

from .test_supervise import Cluster, _names_from_store, _plan


@pytest.fixture
def no_backoff(monkeypatch):
    """Slurm commands are retried with a backoff of 1+2+4 s on a transient error: not here."""
    monkeypatch.setattr(slurm_run.time, "sleep", lambda _s: None)


def _calls(fake) -> int:
    return len([a for a in fake.args() if "--job-name=" in a])


def _ids(plan_dir) -> dict:
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        return {j.job_name: j.slurm_id for j in store.job_states(c.id) if j.slurm_id}


def _submitted(tmp_path, spec_factory, monkeypatch):
    """The plan's jobs submitted by one round of the supervisor, anything unseen called lost at once (no 60 s)."""
    monkeypatch.setattr(track, "LOST_AFTER_S", 0.0)
    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    return plan_dir, _ids(plan_dir)


def _to_the_end(plan_dir, fake):
    """`hpcrun run` to the end, the fake jobs completing between rounds."""
    cluster = Cluster(fake, {})

    def between(rnd):
        _names_from_store(plan_dir, cluster)
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, on_round=between, sleep=lambda s: None, max_rounds=10)
    assert report.outcome == "finished", [r.summary() for r in report.rounds]
    return report


def test_slurmdbd_down_is_an_accounting_outage_and_slurmctld_down_a_controller_one(fake_slurm, no_backoff):
    fake_slurm.stop("slurmdbd")
    with pytest.raises(AccountingUnreachable) as caught:
        slurm.Slurm().records(["1"], "now-1days")
    assert caught.value.daemon == "accounting" and "accounting (slurmdbd)" in str(caught.value)
    assert "Problem talking to the database" in str(caught.value)
    assert slurm.Slurm().queue(job_ids=["1"]) == []          # the controller still answers
    fake_slurm.start("slurmdbd")
    fake_slurm.stop("slurmctld")
    with pytest.raises(Unreachable) as caught:
        slurm.Slurm().queue(job_ids=["1"])
    assert caught.value.daemon == "controller" and not isinstance(caught.value, AccountingUnreachable)
    assert slurm.Slurm().records(["1"], "now-1days") == {}   # accounting still answers
    # what the supervisor asks a daemon recorded as down, to see the outage end when nothing else asks it
    assert "Unable to contact slurm controller" in slurm.Slurm().unanswered("controller")
    assert slurm.Slurm().unanswered("accounting") == ""
    fake_slurm.start("slurmctld")
    fake_slurm.stop("slurmdbd")
    assert "Problem talking to the database" in slurm.Slurm().unanswered("accounting")
    assert slurm.Slurm().unanswered("controller") == ""


def test_sacct_names_the_canceller_in_the_reason():
    line = "|".join({"JobID": "7", "JobIDRaw": "7", "JobName": "x", "State": "CANCELLED by 0",
                     "ExitCode": "0:15", "Reason": "None", "ElapsedRaw": "3"}.get(f, "") for f in ACCT_FIELDS)
    rec = parse_acct(line)["7"]
    assert rec.state == "CANCELLED" and rec.reason == "cancelled by uid 0 (root)"


def test_a_site_cancel_is_retried_and_an_operator_cancel_is_not(tmp_path, spec_factory, fake_slurm, cli,
                                                                 store_backend):
    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    ids = _ids(plan_dir)
    assert cli("cancel", str(plan_dir), "--jobs", "test-campaign.00001").exit_code == 0
    fake_slurm.end(ids["test-campaign.00001"], "CANCELLED", "0:15")             # the operator's (hpcrun cancel)
    fake_slurm.end(ids["test-campaign.00002"], "CANCELLED by 0", "0:15")        # root's scancel
    report = _to_the_end(plan_dir, fake_slurm)
    rounds = [r.summary() for r in report.rounds]
    assert _calls(fake_slurm) == 4                                  # job 2 once more, job 1 never
    assert rounds[-1].endswith("finished: 3 inputs, 2 done, 0 parked, 1 cancelled by an operator, 0 lost"), rounds
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        assert store.attempts_by_class(c.id) == {"cancelled": 1, "site_cancel": 1}
        jobs = {j.job_name: j for j in store.job_states(c.id)}
    assert jobs["test-campaign.00001"].state == "failed" and jobs["test-campaign.00002"].state == "done"
    status = json.loads(cli("status", str(plan_dir), "--json").output)
    assert status["outcome"] == {"done": 2, "parked": 0, "cancelled_by_operator": 1, "not_ended": 0}
    [row] = [j for j in status["jobs"] if j["status"] == "failed"]
    assert row["job"] == "test-campaign.00001" and row["reason"].startswith("cancelled by an operator ("), row
    figures = json.loads(cli("report", str(plan_dir), "--json").output)
    assert figures["outcome"] == {"done": 2, "parked": 0, "cancelled_by_operator": 1, "not_ended": 0}
    assert figures["attempts_by_class"] == {"cancelled": 1, "site_cancel": 1}


def test_an_accounting_outage_is_ridden_out_with_nothing_lost_or_doubled(tmp_path, spec_factory, fake_slurm, cli,
                                                                         monkeypatch, no_backoff, store_backend):
    monkeypatch.setattr(track, "ACCOUNTING_CATCHUP_S", 0.0)
    plan_dir, ids = _submitted(tmp_path, spec_factory, monkeypatch)
    fake_slurm.stop("slurmdbd")
    queue = (fake_slurm.bin / "queue")
    queue.write_text(queue.read_text().replace("|PENDING|(Dependency)", "|RUNNING|nid00001"))
    report = run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    assert report.rounds[-1].jobs["running"] == 3, report.rounds[-1].summary()    # the queue's word
    fake_slurm.end(ids["test-campaign.00001"])                  # ends while accounting cannot say so
    report = run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=3)
    assert report.outcome == "rounds", [r.summary() for r in report.rounds]   # never exits on the outage
    last = report.rounds[-1]
    assert last.jobs["running"] == 3 and last.jobs["failed"] == 0, last.summary()   # none lost, none done yet
    assert "waiting out: accounting (slurmdbd) of the cluster not answering since" in last.summary()
    status = cli("status", str(plan_dir), "--json")
    assert status.exit_code == 0, status.output
    [outage] = json.loads(status.output)["outages"]
    assert (outage["daemon"], outage["ended_at"]) == ("accounting", None) and "Problem talking" in outage["detail"]
    shown = cli("status", str(plan_dir)).output
    assert "accounting (slurmdbd) of the cluster not answering since" in shown, shown

    fake_slurm.start("slurmdbd")
    report = _to_the_end(plan_dir, fake_slurm)
    assert _calls(fake_slurm) == 3                               # none submitted twice
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        assert store.attempts_by_class(c.id) == {}
        assert {j.state for j in store.job_states(c.id)} == {"done"}
        [ended] = store.outages(c.id)
        log = [e.detail for e in store.audit_log(c.id) if e.command == "outage"]
    assert ended.ended_at is not None
    assert log[0].startswith("accounting (slurmdbd) of the cluster does not answer: sacct"), log
    assert "answered again" in log[-1], log
    assert 'hpcrun_scheduler_daemon_up{campaign="test-campaign",cluster="",daemon="accounting"} 1' in \
        (plan_dir / "metrics.prom").read_text()


def test_a_controller_outage_holds_submissions_and_the_supervisor_waits(tmp_path, spec_factory, fake_slurm,
                                                                        no_backoff, store_backend):
    plan_dir = _plan(tmp_path, spec_factory)
    fake_slurm.stop("slurmctld")
    report = run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=2)
    assert report.outcome == "rounds" and _calls(fake_slurm) == 0
    assert "waiting out: controller (slurmctld) of the cluster not answering" in report.rounds[-1].summary()
    fake_slurm.start("slurmctld")
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    ids = _ids(plan_dir)
    fake_slurm.end(ids["test-campaign.00001"], "FAILED", "7:0")   # a chain failure: retried
    fake_slurm.stop("slurmctld")
    report = run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=2)
    assert report.outcome == "rounds" and _calls(fake_slurm) == 3
    assert report.rounds[-1].jobs["pending"] == 1, report.rounds[-1].summary()   # its retry waits
    fake_slurm.start("slurmctld")
    report = _to_the_end(plan_dir, fake_slurm)
    assert _calls(fake_slurm) == 4 and "waiting out" not in report.rounds[-1].summary()


def test_the_live_page_names_the_daemon_not_answering(tmp_path, spec_factory, fake_slurm, no_backoff,
                                                      store_backend):
    import threading
    import urllib.request

    from hpcrun.report.web import make_server

    from . import browser

    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    fake_slurm.stop("slurmdbd")
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    srv = make_server(plan_dir, port=0, min_age=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        with urllib.request.urlopen(base + "/api/summary.json", timeout=10) as r:
            data = json.loads(r.read().decode())
        [text] = data["outages"]
        assert text.startswith("accounting (slurmdbd) of the cluster not answering since"), text
        assert "waiting out: accounting (slurmdbd)" in data["heartbeat"]["note"], data["heartbeat"]
        reason = browser.why_not()
        if reason:
            pytest.skip(f"no headless browser: {reason}")

        def check(page):
            assert page.is_visible("#outages") and "accounting (slurmdbd)" in page.text_content("#outages")

        browser.open_page(base + "/", "dashboard-accounting-outage.png", check)
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("command, words, daemon", [
    ("squeue", "squeue: error: slurm_receive_msg: Zero Bytes were transmitted or received", "controller"),
    ("squeue", "squeue: error: Socket timed out on send/recv operation", "controller"),
    ("sacct", "sacct: error: Problem talking to the database: Connection refused", "accounting"),
    ("sacct", "sacct: error: Socket timed out on send/recv operation", "accounting"),
])
def test_what_a_restarting_daemon_prints_is_an_outage(tmp_path, monkeypatch, no_backoff, command, words, daemon):
    """A restart's other words (seen on sites): the query is an outage of the right daemon, never an error."""
    script = tmp_path / command
    script.write_text(f"#!/bin/sh\necho '{words}' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(Unreachable) as caught:
        slurm_run._run([command, "-h"])
    assert caught.value.daemon == daemon, caught.value


def test_a_job_seen_running_whose_record_lags_behind_is_not_called_lost(tmp_path, spec_factory, fake_slurm,
                                                                         monkeypatch, no_backoff):
    """slurmdbd answers but lags behind the controller (its agent queue backed up: no outage to record). A job seen
    running ends and leaves the queue (past MinJobAge) before its record comes: it ran, so its record will come. It
    is not called LOST (retried, it would run twice) until its walltime and the catch-up have passed since it was
    seen running; its record, once it comes, ends it."""
    plan_dir, ids = _submitted(tmp_path, spec_factory, monkeypatch)
    queue = (fake_slurm.bin / "queue")
    queue.write_text(queue.read_text().replace("|PENDING|(Dependency)", "|RUNNING|nid00001"))
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)   # seen running
    fake_slurm.end(ids["test-campaign.00001"], accounted=False)   # gone from squeue, no record yet
    report = run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    last = report.rounds[-1]
    assert last.jobs["running"] == 3 and last.jobs["failed"] == 0, last.summary()   # not lost
    fake_slurm.catch_up()
    report = run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    assert report.rounds[-1].jobs["done"] == 1 and report.rounds[-1].jobs["running"] == 2, report.rounds[-1].summary()
    # another ends the same way, and its record never comes: lost once the longest walltime it may have had, the
    # queue's MinJobAge and the catch-up have passed since it was seen running (the bound moved to 30 s before
    # now, then 30 s after: seen a moment ago)
    fake_slurm.end(ids["test-campaign.00002"], accounted=False)
    m = read_manifest(plan_dir)
    longest = max(m.walltime_seconds, int(m.submit.limits.get("max_walltime_s") or 0))
    monkeypatch.setattr(track, "ACCOUNTING_CATCHUP_S", 30.0 - longest - track.MIN_JOB_AGE_S)
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    assert _calls(fake_slurm) == 3                               # within the bound: waited for
    monkeypatch.setattr(track, "ACCOUNTING_CATCHUP_S", -30.0 - longest - track.MIN_JOB_AGE_S)
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    assert _calls(fake_slurm) == 4                               # the lost one submitted again, the others not
    with open_plan_store(plan_dir) as store:
        assert store.attempts_by_class(store.get_campaign("test-campaign").id) == {"lost": 1}


def test_a_job_that_leaves_the_queue_during_an_accounting_outage_is_not_called_lost(tmp_path, spec_factory,
                                                                                  fake_slurm, monkeypatch,
                                                                                  no_backoff):
    """A job last seen pending that ends and leaves the queue while slurmdbd is down: nothing may be concluded of
    it (its record will come), so it is not called LOST; once slurmdbd answers, its record ends it, run once."""
    monkeypatch.setattr(track, "ACCOUNTING_CATCHUP_S", 0.0)
    plan_dir, ids = _submitted(tmp_path, spec_factory, monkeypatch)
    fake_slurm.stop("slurmdbd")
    fake_slurm.end(ids["test-campaign.00001"])                  # ran and ended between two polls
    report = run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    assert report.rounds[-1].jobs["failed"] == 0 and _calls(fake_slurm) == 3, report.rounds[-1].summary()
    fake_slurm.start("slurmdbd")
    _to_the_end(plan_dir, fake_slurm)
    assert _calls(fake_slurm) == 3
    with open_plan_store(plan_dir) as store:
        assert store.attempts_by_class(store.get_campaign("test-campaign").id) == {}
