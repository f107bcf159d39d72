"""``hpcrun run`` against fake sbatch/squeue/sacct on PATH: rounds, the retry policy's changes,
the supervisor lock and heartbeat, metrics and events (the real cluster and SIGKILLs:
tests/cluster/test_supervisor.py)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import pytest

from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.supervision.supervise import SupervisorBusy, run
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.store.locking.lock import supervisor_lock

from .fake_slurm import FakeSlurm
from .test_finalize import FINALIZE

# every campaign test here runs on the plan's SQLite store and on PostgreSQL (store_backend,
# tests/conftest.py); the heartbeat-from-another-host check exists for SQLite's host-local flock only


def _plan(tmp_path, spec_factory, **over) -> Path:
    spec = spec_factory({"jobs": {"array": "never"}, **over}, inputs=3)
    return write_plan(load_plan(spec), tmp_path / "plan").out_dir


class Cluster:
    """Ends the fake jobs between rounds as a script says: plan job name -> states of its attempts."""

    def __init__(self, fake: FakeSlurm, fates):
        self.fake = fake
        self.fates = {k: list(v) for k, v in fates.items()}
        self.names: dict = {}    # Slurm job id -> plan job name, read from the store

    def after_round(self, _rnd) -> None:
        for row in self.fake.queue():
            jid, aid, name, _state, _reason = row.split("|")
            key = "finalize" if name.endswith(".finalize") else self.names[aid]
            fate = self.fates.get(key, [])
            state, code, *why = fate.pop(0) if fate else ("COMPLETED", "0:0")
            self.fake.end(aid, state, code, *why)


def _names_from_store(plan_dir: Path, cluster: Cluster) -> None:
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        cluster.names = {j.slurm_id: j.job_name for j in store.job_states(c.id) if j.slurm_id}


def test_run_drives_the_campaign_through_failures_to_the_end(tmp_path, spec_factory, fake_slurm, store_backend):
    plan_dir = _plan(tmp_path, spec_factory, finalize=FINALIZE)
    cluster = Cluster(fake_slurm, {
        "test-campaign.00001": [("FAILED", "7:0")],     # a chain fails once, then works
        "test-campaign.00002": [("TIMEOUT", "0:0")],    # a time limit: the retry gets 1.5x the time
        "test-campaign.00003": [("FAILED", "9:0")],     # QA failed: parked at once
    })
    rounds = []

    def between(rnd):
        rounds.append(rnd)
        _names_from_store(plan_dir, cluster)
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, on_round=between, sleep=lambda s: None, max_rounds=20)
    assert report.outcome == "finished", [r.summary() for r in rounds]
    last = report.rounds[-1]
    assert last.jobs == {"pending": 0, "submitted": 0, "running": 0, "done": 2, "failed": 0, "parked": 1}
    args = fake_slurm.args()
    retried = [a for a in args if "--time=" in a]
    assert len(retried) == 1 and "--time=00:45:00" in retried[0], args   # 30 min x 1.5
    assert len([a for a in args if ".finalize" in a]) == 1                 # the finalize job, once
    assert "--job-name=test-campaign.finalize" in args[-1] and "--dependency" not in args[-1]  # all settled first
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        assert store.attempts_by_class(c.id) == {"chain": 1, "time_limit": 1, "qa": 1}
        changes = [ch for _j, _a, ch in store.retry_changes(c.id)]
        assert "after time_limit: time limit 00:30:00 -> 00:45:00" in changes
        parked = [j for j in store.job_states(c.id) if j.state == "parked"]
        assert [j.job_name for j in parked] == ["test-campaign.00003"]
        assert "qa" in parked[0].last_reason and "not retried" in parked[0].last_reason
        beat = store.supervisor(c.id)
        assert beat.phase == "finished" and beat.rounds == len(report.rounds) and "finished" in beat.note
    metrics = (plan_dir / "metrics.prom").read_text()
    assert 'hpcrun_plan_jobs{campaign="test-campaign",state="done"} 2' in metrics
    assert 'hpcrun_campaign_finished{campaign="test-campaign"} 1' in metrics
    assert "# TYPE hpcrun_supervisor_rounds_total counter" in metrics
    events = (plan_dir / "events.log").read_text()
    assert " parked " in events and " done " in events
    from hpcrun.report.gather import campaign_report
    report, _ = campaign_report(plan_dir)
    assert report.attempts_by_class == {"chain": 1, "time_limit": 1, "qa": 1}
    assert [(job, change) for job, _sid, change in report.retry_changes] == [
        ("test-campaign.00001", "after chain: resubmitted unchanged"),
        ("test-campaign.00002", "after time_limit: time limit 00:30:00 -> 00:45:00")]


def test_one_supervisor_per_campaign(tmp_path, spec_factory, fake_slurm, store_backend):
    plan_dir = _plan(tmp_path, spec_factory)
    with open_plan_store(plan_dir) as store:
        store.register_campaign("test-campaign", json.loads((plan_dir / "manifest.json").read_text())
                                ["digests"]["spec"], json.loads((plan_dir / "manifest.json").read_text())
                                ["digests"]["profile"])
        with supervisor_lock(store.engine, store.location, "test-campaign"):
            with pytest.raises(SupervisorBusy, match="supervisor lock is held by .* pid") as exc:
                run(plan_dir, once=True, sleep=lambda s: None)
            assert exc.value.exit_code == 4
    assert fake_slurm.args() == []      # the refused supervisor submitted nothing
    report = run(plan_dir, once=True, sleep=lambda s: None)   # the lock died with its holder
    assert report.outcome == "once" and report.rounds[0].submitted == 3


def test_a_fresh_heartbeat_from_another_host_refuses_unless_take_over(tmp_path, spec_factory, fake_slurm, cli):
    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, once=True, sleep=lambda s: None)
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        store.begin_supervising(c.id, "op@login07.example.org:4242")   # a supervisor on another login node
        assert store.beat(c.id, "op@login07.example.org:4242", rounds=3, phase="running", note="x",
                          poll_interval_s=60)
    with pytest.raises(SupervisorBusy, match="login07.example.org.* --take-over"):
        run(plan_dir, once=True, sleep=lambda s: None)
    report = run(plan_dir, once=True, take_over=True, sleep=lambda s: None)
    assert report.took_over == "op@login07.example.org:4242"
    result = cli("status", str(plan_dir))
    assert result.exit_code == 0 and ": stopped, round 1, last heartbeat" in result.output
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        # the other one, if it was alive after all, finds its name gone from the row and stops
        assert not store.beat(c.id, "op@login07.example.org:4242", rounds=4, phase="running", note="x",
                              poll_interval_s=60)
        assert store.supervisor(c.id).age_s(dt.datetime.now(dt.timezone.utc)) < 60


def test_the_event_hook_gets_the_event_without_a_shell(tmp_path, spec_factory, fake_slurm, store_backend):
    seen = tmp_path / "seen.txt"
    hook = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'a').write("
            "os.environ['HPCRUN_EVENT'] + ' ' + sys.stdin.read() + chr(10))", str(seen)]
    plan_dir = _plan(tmp_path, spec_factory, events={"command": hook, "on": ["parked"]})
    cluster = Cluster(fake_slurm, {"test-campaign.00002": [("FAILED", "3:0")]})   # setup: not retried

    def between(rnd):
        _names_from_store(plan_dir, cluster)
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, on_round=between, sleep=lambda s: None, max_rounds=10)
    assert report.outcome == "finished"
    lines = seen.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parked {")      # done is logged, not hooked (on: parked)
    event = json.loads(lines[0].split(" ", 1)[1])
    assert event["jobs"] == ["test-campaign.00002"] and event["campaign"] == "test-campaign"
    assert " done " in (plan_dir / "events.log").read_text()


def test_run_command_line(tmp_path, spec_factory, fake_slurm, cli, store_backend):
    plan_dir = _plan(tmp_path, spec_factory)
    result = cli("run", str(plan_dir), "--once", "--no-metrics")
    assert result.exit_code == 0, result.output
    assert "round 1: jobs 3 submitted; submitted 3" in result.output
    assert not (plan_dir / "metrics.prom").exists()
    result = cli("run", str(plan_dir), "--once", "--json")
    data = json.loads(result.output)
    assert data["outcome"] == "once" and data["rounds"][0]["jobs"]["submitted"] == 3


def test_follow_keeps_supervising_after_the_end(tmp_path, spec_factory, fake_slurm, store_backend):
    plan_dir = _plan(tmp_path, spec_factory)
    cluster = Cluster(fake_slurm, {})

    def between(rnd):
        _names_from_store(plan_dir, cluster)
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, follow=True, max_rounds=5, on_round=between, sleep=lambda s: None)
    assert report.outcome == "rounds" and len(report.rounds) == 5
    assert [r.finished for r in report.rounds][-2:] == [True, True]   # finished, and still watching
    with open_plan_store(plan_dir) as store:
        assert store.supervisor(store.get_campaign("test-campaign").id).phase == "stopped"


def test_a_stall_runs_the_hook_once_per_period(tmp_path, spec_factory, fake_slurm, monkeypatch, store_backend):
    """Nothing ever ends (the fake queue keeps the jobs): after events.stall_after the hook hears of it."""
    import hpcrun.operate.supervision.supervise as supervise

    clock = [1000.0]

    def monotonic():
        clock[0] += 20.0      # every look at the clock is 20 s later
        return clock[0]

    monkeypatch.setattr(supervise.time, "monotonic", monotonic)
    seen = tmp_path / "seen.txt"
    hook = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'a').write(os.environ['HPCRUN_EVENT'] + chr(10))",
            str(seen)]
    plan_dir = _plan(tmp_path, spec_factory, events={"command": hook, "on": ["stalled"], "stall_after": "1m"})
    report = run(plan_dir, interval=1, max_rounds=8, sleep=lambda s: None)
    assert report.outcome == "rounds"
    stalls = seen.read_text().splitlines()
    assert stalls and set(stalls) == {"stalled"} and len(stalls) < 8   # not every round
    assert '"held": 0' in (plan_dir / "events.log").read_text()


def test_the_forecast_is_made_again_in_the_pause_not_in_a_round(tmp_path, spec_factory, fake_slurm, monkeypatch):
    """At 10^6 inputs the forecast costs 0.7 s of CPU: the supervisor makes it again in its pause when due, and a
    round's metrics file carries the one kept (made at the first round, and at the end)."""
    from hpcrun.operate.campaign import forecast
    from hpcrun.operate.supervision import round_metrics, supervise

    monkeypatch.setattr(round_metrics, "UNREADY_EVERY_S", 0.0)
    monkeypatch.setattr(round_metrics, "FORECAST_EVERY_S", 0.0)
    paused, made = [False], []
    real_between, real_forecast = supervise.Supervisor.between_rounds, forecast.of_store

    def between(self):
        paused[0] = True
        try:
            return real_between(self)
        finally:
            paused[0] = False

    def of_store(*args, **kwargs):
        made.append(paused[0])
        return real_forecast(*args, **kwargs)
    monkeypatch.setattr(supervise.Supervisor, "between_rounds", between)
    monkeypatch.setattr(forecast, "of_store", of_store)
    plan_dir = _plan(tmp_path, spec_factory)
    report = run(plan_dir, interval=2, max_rounds=3, sleep=lambda s: None)   # the fake jobs never end
    assert report.outcome == "rounds"
    assert made.count(False) == 1 and made.count(True) >= 2, made
    assert "hpcrun_forecast_ready" in (plan_dir / "metrics.prom").read_text()
