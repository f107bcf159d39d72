"""A campaign a team operates on a shared PostgreSQL store (issue 25): leases fence a holder that lost
its lock, the supervisor rides out dropped sessions and stops (exit 4, naming the new holder) when
another took the campaign meanwhile. Fake sbatch/squeue/sacct (tests/fake_slurm.py); the real
cluster versions are in tests/cluster/test_team_cluster.py."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.supervision.supervise import run
from hpcrun.store.locking.fence import Fenced
from hpcrun.store.locking.lock import supervisor_lock
from hpcrun.store.records import NewInput

from .test_supervise import Cluster, _plan


def test_a_lease_taken_over_fences_the_old_holder(tmp_path, store_backend):
    with open_plan_store(tmp_path, store_backend) as a, open_plan_store(tmp_path, store_backend) as b:
        c = a.register_campaign("fenced", "s" * 64, "p" * 64)
        first = a.take_lease(c.id, "supervisor", "op1@login01:11")
        a.add_inputs(c.id, [NewInput("/d/1.raw", size=1, job_index=0)])      # its own epoch: fine
        second = b.take_lease(c.id, "supervisor", "op2@login02:22")
        assert (first.epoch, second.epoch) == (1, 2)
        with pytest.raises(Fenced) as exc:
            a.add_inputs(c.id, [NewInput("/d/2.raw", size=1, job_index=1)])
        assert exc.value.exit_code == 4
        assert "op1@login01:11" in str(exc.value) and "op2@login02:22" in str(exc.value)
        with pytest.raises(Fenced):
            a.check_fences()
        assert [i.path for i in b.inputs(c.id)] == ["/d/1.raw"]             # nothing of the refused write


def _terminate_sessions(url: str) -> int:
    """What a server restart or an operator's pg_terminate_backend does to every other session."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")).all())
    finally:
        admin.dispose()


@pytest.mark.postgres
def test_the_supervisor_reconnects_when_its_sessions_are_dropped(tmp_path, spec_factory, fake_slurm, pg_server):
    from tests.pg import fresh_database
    url = fresh_database(pg_server)
    plan_dir = _plan(tmp_path, spec_factory)
    cluster = Cluster(fake_slurm, {})
    dropped = []

    def between(rnd):
        _names_from_store_url(url, cluster)
        cluster.after_round(rnd)
        if rnd.number == 1:
            dropped.append(_terminate_sessions(url))

    report = run(plan_dir, db=url, interval=1, on_round=between, sleep=lambda s: None, max_rounds=20)
    assert dropped and dropped[0] >= 1
    assert report.outcome == "finished" and report.outages, report.as_dict()
    assert "reconnecting" in report.outages[0]
    assert len([a for a in fake_slurm.args() if "--job-name=" in a]) == 3      # each job once, none twice
    with open_plan_store(plan_dir, url) as store:
        c = store.get_campaign("test-campaign")
        assert {j.state for j in store.job_states(c.id)} == {"done"}


@pytest.mark.postgres
def test_a_supervisor_cut_off_while_another_took_over_stops_with_exit_4(tmp_path, spec_factory, fake_slurm,
                                                                         pg_server):
    from tests.pg import fresh_database
    url = fresh_database(pg_server)
    plan_dir = _plan(tmp_path, spec_factory)
    cluster = Cluster(fake_slurm, {})
    other = contextlib.ExitStack()
    submitted_before = []

    def between(rnd):
        _names_from_store_url(url, cluster)
        if rnd.number == 1:
            submitted_before.append(len(fake_slurm.args()))
            _terminate_sessions(url)
            # S2 on another login node takes the campaign over while S1 is cut off
            s2 = other.enter_context(open_plan_store(plan_dir, url))
            c = s2.get_campaign("test-campaign")
            other.enter_context(supervisor_lock(s2.engine, s2.location, c.name))
            s2.begin_supervising(c.id, "op2@login02.example.org:2222")
            s2.take_lease(c.id, "supervisor", "op2@login02.example.org:2222")

    try:
        with pytest.raises(Fenced) as exc:
            run(plan_dir, db=url, interval=1, on_round=between, sleep=lambda s: None, max_rounds=20)
    finally:
        other.close()
    assert exc.value.exit_code == 4
    text_ = str(exc.value)
    assert "op2@login02.example.org:2222" in text_ and "nothing since" in text_, text_
    assert len(fake_slurm.args()) == submitted_before[0]      # nothing handed to the scheduler after


def _names_from_store_url(url: str, cluster: Cluster) -> None:
    with open_plan_store(Path("."), url) as store:
        c = store.get_campaign("test-campaign")
        cluster.names = {j.slurm_id: j.job_name for j in store.job_states(c.id) if j.slurm_id}



def _sbatch_calls(fake) -> int:
    return len([a for a in fake.args() if "--job-name=" in a])


def test_pause_holds_new_submissions_until_resume_and_everything_is_in_the_log(tmp_path, spec_factory, fake_slurm,
                                                                               cli, store_backend):
    plan_dir = _plan(tmp_path, spec_factory)
    paused = cli("pause", str(plan_dir), "--note", "bad calibration")
    assert paused.exit_code == 0 and "paused" in paused.output, paused.output
    assert "already paused by" in cli("pause", str(plan_dir)).output
    report = run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=3)
    assert len(report.rounds) == 3 and _sbatch_calls(fake_slurm) == 0        # polled, submitted nothing
    status = cli("status", str(plan_dir))
    assert "paused by" in status.output and "(bad calibration)" in status.output, status.output
    status_json = json.loads(cli("status", str(plan_dir), "--json").output)
    assert status_json["paused"].startswith("paused by ")
    resumed = cli("resume", str(plan_dir))
    assert resumed.exit_code == 0 and "resumed (paused by" in resumed.output
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    assert _sbatch_calls(fake_slurm) == 3
    log = json.loads(cli("log", str(plan_dir), "--json").output)
    commands = [e["command"] for e in log]
    assert commands[:2] == ["pause", "run"] and "resume" in commands and commands[-1] == "submit", commands
    assert all("@" in e["who"] for e in log) and "bad calibration" in log[0]["detail"]
    assert "submitted 3 job(s)" in log[-1]["detail"]
    text_log = cli("log", str(plan_dir)).output
    assert " pause: new submissions held: bad calibration" in text_log


def test_cancel_goes_through_the_scheduler_and_is_not_retried(tmp_path, spec_factory, fake_slurm, cli,
                                                               store_backend):
    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, interval=1, sleep=lambda s: None, once=True)
    assert _sbatch_calls(fake_slurm) == 3
    refused = cli("cancel", str(plan_dir))
    assert refused.exit_code == 2 and "--jobs NAME" in refused.output
    unknown = cli("cancel", str(plan_dir), "--jobs", "test-campaign.00009")
    assert unknown.exit_code == 2 and "has no job named test-campaign.00009" in unknown.output
    done = cli("cancel", str(plan_dir), "--jobs", "test-campaign.00001", "--json")
    assert done.exit_code == 0, done.output
    cancelled = json.loads(done.output)["cancelled"]
    [(name, job_id)] = cancelled.items()
    assert name == "test-campaign.00001"
    assert (fake_slurm.bin / "scancel-calls").read_text().split() == [job_id]
    cluster = Cluster(fake_slurm, {"test-campaign.00001": [("CANCELLED", "0:15")]})
    _names_from_store_url(store_backend, cluster) if store_backend else _names_from_plan(plan_dir, cluster)
    cluster.after_round(None)
    report = run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=5)
    assert report.outcome == "finished", [r.summary() for r in report.rounds]
    assert _sbatch_calls(fake_slurm) == 3                                      # not retried
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        jobs = {j.job_name: j for j in store.job_states(c.id)}
        assert (jobs["test-campaign.00001"].state, jobs["test-campaign.00001"].slurm_state) == ("failed", "CANCELLED")
        assert {j.state for n, j in jobs.items() if n != "test-campaign.00001"} == {"done"}
    log = cli("log", str(plan_dir)).output
    assert f"cancel: cancelled test-campaign.00001 ({job_id})" in log, log


def _names_from_plan(plan_dir: Path, cluster: Cluster) -> None:
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        cluster.names = {j.slurm_id: j.job_name for j in store.job_states(c.id) if j.slurm_id}


def _figures_of_one_campaign(root: Path, spec_factory, monkeypatch, db) -> dict:
    """The same scripted campaign (fake Slurm: one chain failure, one time limit, one QA failure)
    driven to the end on one store; what report, status, the live page and the API say of it."""
    import hpcrun
    from hpcrun.report.web import summary

    from .fake_slurm import FakeSlurm

    root.mkdir()
    fake = FakeSlurm(root)
    monkeypatch.setenv("PATH", f"{fake.bin}:{os.environ['PATH']}")
    if db:
        monkeypatch.setenv("HPCRUN_STATE_DB", db)
    else:
        monkeypatch.delenv("HPCRUN_STATE_DB", raising=False)
    plan_dir = _plan(root, spec_factory)
    cluster = Cluster(fake, {"test-campaign.00001": [("FAILED", "7:0")], "test-campaign.00002": [("TIMEOUT", "0:0")],
                             "test-campaign.00003": [("FAILED", "9:0")]})

    def between(_rnd):
        _names_from_plan(plan_dir, cluster)
        cluster.after_round(_rnd)

    assert run(plan_dir, interval=1, on_round=between, sleep=lambda s: None, max_rounds=20).outcome == "finished"
    report = hpcrun.campaign_report(plan_dir).to_dict()
    status = hpcrun.status(plan_dir).to_dict()
    page = summary(plan_dir)
    for volatile in ("generated_at", "store"):
        report.pop(volatile, None)
        status.pop(volatile, None)
        page.pop(volatile, None)
    for made in (report, status):   # the forecast's moment
        (made.get("forecast") or {}).pop("made_at", None)
    page.pop("heartbeat", None)
    page.pop("audit", None)
    for made in (status, page):   # where each campaign's plan directory is
        for fs in made.get("footprint") or []:
            fs.pop("path", None)
            fs.pop("cells", None)
    status.pop("supervisor", None)
    return {"report": report, "status": status, "page": page}


@pytest.mark.postgres
def test_the_same_campaign_gives_the_same_figures_on_sqlite_and_postgresql(tmp_path, spec_factory, monkeypatch,
                                                                            pg_server):
    from tests.pg import fresh_database
    on_sqlite = _figures_of_one_campaign(tmp_path / "sqlite", spec_factory, monkeypatch, None)
    on_pg = _figures_of_one_campaign(tmp_path / "pg", spec_factory, monkeypatch, fresh_database(pg_server))
    assert on_sqlite["report"]["attempts_by_class"] == {"chain": 1, "time_limit": 1, "qa": 1}
    for what in ("report", "status", "page"):
        assert json.loads(json.dumps(on_pg[what], default=str)) == json.loads(
            json.dumps(on_sqlite[what], default=str)), what
