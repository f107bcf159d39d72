"""The account's budget at plan time (issue 40): what Slurm will count, read from sshare/sacctmgr output
as Debian's Slurm 22.05 prints it, compared with the plan's need. Fake sshare and sacctmgr on PATH
answer as the test cluster did for an account with GrpTRESMins=cpu=N; the real cluster's turn is in
tests/cluster/test_budget.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from hpcrun.backends.scheduler.base import Allocation
from hpcrun.backends.scheduler.slurm_budget import is_budget_reason, parse_per_job, parse_share, tres_map
from hpcrun.plan.budget import escalated_walltime
from hpcrun.plan.load import load_plan

# sshare -n -P -a -A bx1 -o Cluster,Account,User,GrpTRESMins,GrpTRESRaw, on the test cluster after 4 cpu-minutes
SHARE = ("hpcrun|bx1||cpu=2|cpu=4,mem=0,energy=0,node=4,billing=4,fs/disk=0,vmem=0,pages=0,bb/lua=0\n"
         "hpcrun| bx1|hpcuser||cpu=4,mem=0,energy=0,node=4,billing=4,fs/disk=0,vmem=0,pages=0,bb/lua=0\n")


def test_share_output_gives_the_accounts_limit_and_usage_and_the_users_row():
    cluster, limits, used = parse_share(SHARE, "hpcuser")
    assert cluster == "hpcrun" and limits == [("account", "cpu", 2)]
    assert ("account", "cpu", 4.0) in used and ("user", "cpu", 4.0) in used
    other = parse_share(SHARE, "someone")[2]
    assert all(scope == "account" for scope, _, _ in other)   # another user's row is not ours


def test_the_tightest_limit_counts():
    a = Allocation("bx1", None, (("account", "cpu", 100), ("user", "cpu", 30)),
                   (("account", "cpu", 60.0), ("user", "cpu", 25.0)))
    assert a.left("cpu") == (5.0, 30) and a.left("billing") is None


def test_budget_reasons_are_the_group_minute_limits_only():
    for reason in ("AssocGrpCPUMinutesLimit", "(AssocGrpBillingMinutes)", "AssocGrpMemMinutes",
                   "QOSGrpCPUMinutesLimit"):
        assert is_budget_reason(reason), reason
    for reason in ("AssocGrpCPURunMinutesLimit", "AssocGrpCpuLimit", "Priority", "Resources", "AssocMaxJobsLimit"):
        assert not is_budget_reason(reason), reason
    assert tres_map("cpu=120,gres/gpu=4,x=bad") == {"cpu": 120.0, "gres/gpu": 4.0}
    assert parse_per_job("|cpu=600\nhpcuser|cpu=300\nother|cpu=1\n", "hpcuser") == [("cpu", 300)]


def _fakes(bin_dir: Path, share: str, maxmins: str = "|\n") -> None:
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("sshare", share), ("sacctmgr", maxmins)):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {bin_dir}/calls\nprintf '%s' '{text}'\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def budget_env(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_shared_partition_counts_one_cpu_per_chain(spec_factory):
    """5 one-chain jobs of 5 minutes on the shared local-test partition: 0.42 core-hours, not 3.3."""
    spec = spec_factory({"walltime": "00:05:00", "jobs": {"files_per_job": 1, "chains_per_node": 1}}, inputs=5)
    plan = load_plan(spec)
    assert round(plan.core_hours, 2) == 0.42 and plan.cpu_minutes == 25


def test_escalated_walltime_follows_the_time_limit_rule(spec_factory):
    spec = spec_factory({"walltime": "00:10:00", "retry": {"max_attempts": 3}})
    assert escalated_walltime(load_plan(spec)) == int(600 * 1.5 ** 2)
    spec = spec_factory({"walltime": "00:50:00"}, name="b.yaml")
    assert escalated_walltime(load_plan(spec)) == 3600   # capped at the partition's 1 h


def test_plan_notes_a_shortfall_with_both_figures(cli, spec_factory, budget_env, tmp_path):
    _fakes(budget_env, SHARE.replace("cpu=2|", "cpu=30|"))
    spec = spec_factory({"walltime": "00:30:00", "site": {"account": "bx1"}}, inputs=3)
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"), "--json")
    assert result.exit_code == 0, result.output
    [b] = json.loads(result.output)["budget"]
    # 3 jobs x 2 CPUs (2 chains, shared partition) x 30 min = 180 cpu-minutes; 30 - 4 used = 26 left
    assert b["need_minutes"] == 180 and b["left_minutes"] == 26 and b["limit_minutes"] == 30 and b["short"]
    assert "has 26 of 30 cpu-minutes left" in b["line"] and "needs 180 cpu-minutes" in b["line"], b["line"]
    assert "154 more than is left" in b["line"]
    text = cli("plan", str(spec), "--out", str(tmp_path / "q"))
    assert text.exit_code == 0 and "note: account bx1" in text.output.replace("\n", " ")
    calls = (budget_env / "calls").read_text()
    assert "--accounts=bx1" in calls and "account=bx1" in calls and "cluster=hpcrun" in calls


def test_enforced_budget_refuses_and_writes_nothing(cli, spec_factory, budget_env, tmp_path, monkeypatch):
    _fakes(budget_env, SHARE)
    prof = tmp_path / "profiles"
    prof.mkdir()
    (prof / "strict.yaml").write_text("name: strict\nextends: local-test\naccounting:\n  enforce_budget: true\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    spec = spec_factory({"site": {"profile": "strict", "account": "bx1"}})
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"))
    assert result.exit_code == 2, result.output
    assert "strict.yaml" in result.output and "accounting.enforce_budget" in result.output
    assert "more than is left" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "p").exists()


def test_no_scheduler_to_ask_says_so(cli, spec_factory, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sshare").write_text(
        "#!/bin/sh\necho 'sshare: error: resolve_ctls_from_dns_srv: res_nsearch error' >&2\nexit 1\n")
    (bin_dir / "sshare").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = spec_factory({"site": {"account": "bx1"}})
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"), "--json")
    [b] = json.loads(result.output)["budget"]
    assert result.exit_code == 0 and not b["checked"] and b["line"].startswith("could not check the budget")
    assert "no controller is configured" in b["why_unchecked"] and "res_nsearch" not in b["why_unchecked"]


def _set_reason(fake, job_id: str, reason: str) -> None:
    rows = []
    for row in fake.queue():
        jid, aid, name, state, _ = row.split("|")
        rows.append("|".join((jid, aid, name, state, reason if aid == job_id else _)))
    (fake.bin / "queue").write_text("".join(r + "\n" for r in rows))


def test_supervisor_holds_new_submissions_while_the_allocation_is_spent(tmp_path, spec_factory, fake_slurm,
                                                                        monkeypatch):
    """Room in the queue and a plan job waiting, but a job pends on the spent allocation: the round submits
    nothing, records it (outage row, audit trail, metrics, status), and submits again once none is held."""
    from hpcrun.operate.plandir import open_plan_store
    from hpcrun.operate.supervision.supervise import run
    from hpcrun.operate.tracking.track import poll
    from hpcrun.render.plandir import write_plan

    prof = tmp_path / "profiles"
    prof.mkdir()
    (prof / "q2.yaml").write_text("name: q2\nextends: local-test\nmax_queued_jobs: 2\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    hook = {"command": ["sh", "-c", "cat >> budget-events.jsonl; echo >> budget-events.jsonl"], "on": ["budget"]}
    spec = spec_factory({"jobs": {"array": "never"}, "site": {"profile": "q2"}, "events": hook}, inputs=3)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    run(plan_dir, once=True)
    first, second = [row.split("|")[1] for row in fake_slurm.queue()]
    assert len(fake_slurm.args()) == 2                       # the queue limit: one plan job waits
    fake_slurm.end(first)                                    # room for it now ...
    _set_reason(fake_slurm, second, "(AssocGrpCPUMinutesLimit)")   # ... but the allocation is spent
    report = run(plan_dir, once=True)
    assert len(fake_slurm.args()) == 2, fake_slurm.args()    # nothing submitted
    summary = report.rounds[-1].summary()
    assert "1 job(s) pend with AssocGrpCPUMinutesLimit; nothing new is submitted" in summary, summary
    metrics = (plan_dir / "metrics.prom").read_text()
    assert 'hpcrun_jobs_budget_held{campaign="test-campaign",cluster="",reason="AssocGrpCPUMinutesLimit"} 1' \
        in metrics, metrics
    # one run ended: the forecast is in the metrics file, with its bounds
    assert 'hpcrun_forecast_ready{campaign="test-campaign"} 1' in metrics, metrics
    for bound in ("point", "low", "high"):
        assert f'hpcrun_forecast_end_timestamp_seconds{{campaign="test-campaign",bound="{bound}"}}' in metrics, metrics
    status = poll(plan_dir, all_jobs=True)
    assert status.budget_held == {"": {"AssocGrpCPUMinutesLimit": 1}}
    [outage] = [o for o in status.outages if o["daemon"] == "allocation"]
    assert outage["ended_at"] is None and outage["text"].startswith("the allocation on the cluster spent since")
    assert [j.reason for j in status.jobs if j.reason] == ["AssocGrpCPUMinutesLimit"]
    from hpcrun.report.web import summary
    page = summary(plan_dir)   # the live page: the held jobs counted, by reason
    assert any("spent since" in o and "1 job(s) pend with AssocGrpCPUMinutesLimit" in o for o in page["outages"])
    assert any(label == "allocation" and "1 job(s) pend" in value for label, value in page["merit"]), page["merit"]

    _set_reason(fake_slurm, second, "(Priority)")            # the limit was raised: it will start
    run(plan_dir, once=True)
    assert len(fake_slurm.args()) == 3                       # the waiting plan job goes out
    with open_plan_store(plan_dir) as store:
        cid = store.get_campaign("test-campaign").id
        log = [e.detail for e in store.audit_log(cid) if e.command == "budget"]
        [row] = [o for o in store.outages(cid) if o.daemon == "allocation"]
    assert len(log) == 2 and "the allocation is spent" in log[0] and "submitting again" in log[1], log
    assert row.ended_at is not None and "was raised" in row.text()
    run(plan_dir, once=True)   # a later supervisor: nothing new to say
    told = [json.loads(line) for line in (plan_dir / "budget-events.jsonl").read_text().splitlines() if line]
    assert [(e["event"], e["cluster"], e["spent"]) for e in told] == [("budget", None, True), ("budget", None, False)]
    assert told[0]["held"].startswith("1 job(s) pend with AssocGrpCPUMinutesLimit") and told[0]["since"], told


def test_a_cluster_whose_allocation_is_spent_gets_no_new_work_the_others_do():
    """Per cluster: survey() turns a cluster with held jobs into a `budget` seat, never open; place()
    gives its share to the others (each cluster has its own accounts and limits)."""
    from hpcrun.backends.scheduler import scheduler_for
    from hpcrun.operate.plandir import ClusterInfo
    from hpcrun.operate.submission.placement import SPENT, Seat, place, survey

    spent = survey(ClusterInfo("a", scheduler_for("slurm", "a"), True), 2, 2, 600,
                   spent={"AssocGrpCPUMinutesLimit": 2})
    other = Seat(ClusterInfo("b", scheduler_for("slurm", "b"), True))   # answering, room (asked of no Slurm here)
    assert spent.state == SPENT and not spent.open
    assert spent.detail == ("the allocation is spent: 2 job(s) pend with AssocGrpCPUMinutesLimit; nothing new "
                            "is submitted there until the limit is raised")
    assert place([1, 2, 3], [spent, other]) == [] and other.given == [1, 2, 3] and spent.given == []


def test_a_billing_limit_is_compared_with_the_charge_in_the_sites_units(cli, spec_factory, budget_env, tmp_path,
                                                                         monkeypatch):
    """The profile charges node-hours x 2 ("units"); the account limits billing only: 3 jobs x 1 node x
    0.5 h x 2 = 3 units = 180 billing-minutes, against the 96 left of 100."""
    _fakes(budget_env, SHARE.replace("|cpu=2|", "|billing=100|"))
    prof = tmp_path / "profiles"
    prof.mkdir()
    (prof / "units.yaml").write_text("name: units\nextends: local-test\naccounting:\n  charge_unit: units\n"
                                     "partitions:\n  debug:\n    charge_per: node-hour\n    charge_factor: 2\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    spec = spec_factory({"site": {"profile": "units", "account": "bx1"}})
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"), "--json")
    assert result.exit_code == 0, result.output
    [b] = json.loads(result.output)["budget"]
    assert b["tres"] == "billing" and b["charge"] == 3.0 and b["need_minutes"] == 180 and b["left_minutes"] == 96
    assert b["short"] and "a charge of 3.0 units" in b["line"], b["line"]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["charge"] == {"unit": "units", "per_core_hour": 2 / 8}   # a node-hour is 8 CPU-hours here


def test_a_running_job_slurm_ends_on_the_spent_allocation_is_retried_unchanged(tmp_path, spec_factory, fake_slurm):
    """Slurm ends *running* jobs when the group's TRES-minutes run out, as TIMEOUT after a few seconds of a
    5-minute limit (seen on the test cluster): class allocation, retried with the same time limit; a
    TIMEOUT that ran its whole limit stays a time limit (more time next)."""
    from hpcrun.operate.plandir import open_plan_store
    from hpcrun.operate.supervision.supervise import run
    from hpcrun.render.plandir import write_plan

    spec = spec_factory({"jobs": {"array": "never"}}, inputs=2)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    run(plan_dir, once=True)
    first, second = [row.split("|")[1] for row in fake_slurm.queue()]
    fake_slurm.end(first, "TIMEOUT", "0:0", elapsed_s=9)
    fake_slurm.end(second, "TIMEOUT", "0:0", elapsed_s=30 * 60 + 20)
    run(plan_dir, once=True)
    again = fake_slurm.args()[2:]
    assert len(again) == 2 and sum("--time=00:45:00" in a for a in again) == 1, again   # only the one at its limit
    with open_plan_store(plan_dir) as store:
        cid = store.get_campaign("test-campaign").id
        assert store.attempts_by_class(cid) == {"allocation": 1, "time_limit": 1}


def test_real_slurm_commands_without_a_controller_say_so_in_one_line(cli, spec_factory, tmp_path, monkeypatch):
    """Slurm's own commands, installed but with no slurm.conf, SLURM_CONF or DNS SRV record (a laptop, a
    build host): plan says that in one line, not libslurm's three lines of resolver errors."""
    if shutil.which("sacctmgr") is None:
        pytest.skip("Slurm's commands are not installed (python3 tests/cluster/harness.py install)")
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("/etc/slurm/slurm.conf exists here: Slurm's commands have a controller to ask")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    spec = spec_factory({"site": {"account": "bx1"}})
    result = cli("plan", str(spec), "--out", str(tmp_path / "p"), "--json")
    assert result.exit_code == 0, result.output
    [b] = json.loads(result.output)["budget"]
    assert not b["checked"], b
    assert "no controller is configured" in b["line"] and "\n" not in b["line"], b["line"]
    assert "resolve_ctls_from_dns_srv" not in b["line"] and "_establish_config_source" not in b["line"], b["line"]
