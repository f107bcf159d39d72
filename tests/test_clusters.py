"""A campaign on several clusters, without a cluster: the spec and profile checks, the rendered
plan directory, placement and the retry changes that follow it, the maintenance windows Slurm
prints. The campaign on two real clusters is tests/cluster/test_two_clusters.py."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.backends.scheduler.base import Maintenance
from hpcrun.backends.scheduler.slurm import Slurm, parse_maintenance
from hpcrun.errors import InputError
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import ClusterInfo, clusters_of
from hpcrun.operate.submission.placement import DOWN, MAINTENANCE, Seat, on_cluster, place
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

# what `scontrol -M beta show reservation --oneliner` printed on the test set-up
RESERVATIONS = (
    "ReservationName=maint1 StartTime=2026-11-25T23:44:41 EndTime=2026-11-26T00:14:41 Duration=00:30:00 "
    "Nodes=bet[00001-00002] NodeCnt=2 CoreCnt=16 Features=(null) PartitionName=(null) "
    "Flags=MAINT,IGNORE_JOBS,SPEC_NODES,ALL_NODES TRES=cpu=16 Users=root State=INACTIVE\n"
    "ReservationName=course StartTime=2026-11-25T23:00:00 EndTime=2026-11-26T01:00:00 Duration=02:00:00 "
    "Nodes=bet00001 NodeCnt=1 Flags=SPEC_NODES Users=hpcuser State=ACTIVE\n")


def _profile(tmp_path: Path, name: str, cluster: str | None, extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    text = f"name: {name}\nextends: local-test\n" + (f"scheduler:\n  cluster: {cluster}\n" if cluster else "")
    path.write_text(text + extra)
    return path


def _spec(spec_factory, tmp_path: Path, profiles: list, **site) -> Path:
    return spec_factory({"site": {"profile": profiles, **site}})


@pytest.fixture(autouse=True)
def no_scheduler_to_ask(monkeypatch):
    """Planning asks the scheduler which clusters it knows; here it cannot say (as on a laptop)."""
    monkeypatch.setattr(Slurm, "known_clusters", lambda self: None)


def test_two_profiles_plan_one_directory_with_each_clusters_scripts(spec_factory, tmp_path):
    a = _profile(tmp_path, "alpha", "alpha")
    b = _profile(tmp_path, "beta", "beta", "partitions:\n  debug:\n    nodes: 2\n")
    spec = _spec(spec_factory, tmp_path, [str(a), {"profile": str(b), "share": 2, "max_queued_jobs": 5}],
                 move_pending_after="15m")
    plan = load_plan(spec)
    assert [p.seat.name for p in plan.all_clusters] == ["alpha", "beta"]
    out = write_plan(plan, tmp_path / "plan").out_dir
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["move_pending_after_s"] == 900
    first, second = manifest["clusters"]
    assert (first["name"], first["share"], first["max_queued_jobs"]) == ("alpha", 1.0, None)
    assert (second["name"], second["share"], second["max_queued_jobs"]) == ("beta", 2.0, 5)
    assert [s["path"] for s in second["scripts"]] == ["clusters/beta/jobs/array001.sbatch"]
    body = (out / "clusters/beta/jobs/array001.sbatch").read_text()
    assert 'bash "$HPCRUN_PLAN_DIR/clusters/beta/bin/hpcrun-chain.sh"' in body
    assert 'HPCRUN_RUNDIR="$HPCRUN_PLAN_DIR/run/$HPCRUN_JOB/beta-${HPCRUN_JOB_ID:-local}"' in body
    assert "export HPCRUN_CLUSTER=beta" in body
    assert 'bash "$HPCRUN_PLAN_DIR/bin/hpcrun-chain.sh"' in (out / "jobs/array001.sbatch").read_text()
    infos = clusters_of(Manifest.from_dict(manifest))
    assert [(c.name, c.sched.cluster, c.run_prefix) for c in infos] == [("alpha", "alpha", "alpha-"),
                                                                          ("beta", "beta", "beta-")]


def test_one_unnamed_profile_plans_as_before(spec_factory, tmp_path):
    out = write_plan(load_plan(spec_factory()), tmp_path / "plan").out_dir
    manifest = json.loads((out / "manifest.json").read_text())
    assert "clusters" not in manifest and not (out / "clusters").exists()
    [only] = clusters_of(Manifest.from_dict(manifest))
    assert only.name is None and only.sched.cluster is None


def test_two_profiles_naming_the_same_cluster_are_refused(spec_factory, tmp_path, cli):
    a, b = _profile(tmp_path, "a", "same"), _profile(tmp_path, "b", "same")
    result = cli("plan", str(_spec(spec_factory, tmp_path, [str(a), str(b)])), "--out", str(tmp_path / "p"))
    assert result.exit_code == 2
    assert "key 'scheduler.cluster'" in result.output and "both name cluster 'same'" in result.output
    assert str(b) in result.output and not (tmp_path / "p").exists()


def test_a_listed_profile_must_name_its_cluster(spec_factory, tmp_path):
    a, b = _profile(tmp_path, "a", "alpha"), _profile(tmp_path, "b", None)
    with pytest.raises(InputError) as exc:
        load_plan(_spec(spec_factory, tmp_path, [str(a), str(b)]))
    [problem] = exc.value.problems
    assert problem.key == "scheduler.cluster" and "names no cluster" in problem.message


def test_a_cluster_the_scheduler_does_not_know_is_refused_with_those_it_knows(spec_factory, tmp_path, monkeypatch):
    monkeypatch.setattr(Slurm, "known_clusters", lambda self: ["hpcrun", "beta"])
    a, b = _profile(tmp_path, "a", "hpcrun"), _profile(tmp_path, "b", "betta")
    with pytest.raises(InputError) as exc:
        load_plan(_spec(spec_factory, tmp_path, [str(a), str(b)]))
    [problem] = exc.value.problems
    assert problem.file == str(b) and problem.line == 4 and problem.key == "scheduler.cluster"
    assert "knows no cluster 'betta'" in problem.message and "beta, hpcrun" in problem.message


def test_problems_are_reported_per_cluster(spec_factory, tmp_path):
    a = _profile(tmp_path, "a", "alpha")
    b = _profile(tmp_path, "b", "beta", "partitions:\n  debug:\n    max_walltime: '00:10:00'\n")
    with pytest.raises(InputError) as exc:
        load_plan(_spec(spec_factory, tmp_path, [str(a), str(b)]))
    text = "\n".join(p.render() for p in exc.value.problems)
    assert "on cluster 'beta' (profile b)" in text and "walltime" in text and "'alpha'" not in text


def test_clusters_may_script_the_same_jobs_differently(spec_factory, tmp_path):
    """One cluster allows arrays, the other none: each has its own scripts over the same plan jobs."""
    a = _profile(tmp_path, "a", "alpha")
    b = _profile(tmp_path, "b", "beta", "max_array_size: 0\n")
    out = write_plan(load_plan(_spec(spec_factory, tmp_path, [str(a), str(b)])), tmp_path / "plan").out_dir
    first, second = json.loads((out / "manifest.json").read_text())["clusters"]
    assert [(s["path"], s["jobs"]) for s in first["scripts"]] == [("jobs/array001.sbatch", [0, 2])]
    assert [(s["path"], s["jobs"]) for s in second["scripts"]] == [
        (f"clusters/beta/jobs/job0000{i + 1}.sbatch", [i, i]) for i in range(3)]


def test_clusters_that_cut_the_inputs_into_other_jobs_are_refused(spec_factory, tmp_path):
    import dataclasses

    from hpcrun.model.yamlsrc import load_yaml
    from hpcrun.plan.load import _same_jobs
    spec = _spec(spec_factory, tmp_path, [str(_profile(tmp_path, "a", "alpha")), str(_profile(tmp_path, "b", "beta"))])
    plan = load_plan(spec)
    other = dataclasses.replace(plan.others[0], jobs=plan.others[0].jobs[:2])
    [problem] = _same_jobs([plan, other], load_yaml(spec))
    assert problem.key == "jobs" and "cluster 'beta' cuts the inputs into 2 jobs" in problem.message
    assert _same_jobs([plan, plan.others[0]], load_yaml(spec)) == []


def test_an_empty_profile_list_is_refused(spec_factory, tmp_path):
    with pytest.raises(InputError) as exc:
        load_plan(_spec(spec_factory, tmp_path, []))
    assert "empty" in exc.value.problems[0].message


def _seat(name, share=1.0, room=None, pending=0, state="up", slow=False):
    info = ClusterInfo(name, scheduler_for("slurm", name), True, share=share)
    return Seat(info, state=state, room=room, pending=pending, slow=slow)


def test_placement_fills_by_share_and_room():
    a, b = _seat("a"), _seat("b", share=3.0)
    assert place(list(range(8)), [a, b]) == []
    assert (len(a.given), len(b.given)) == (2, 6)
    c, d = _seat("c", room=1), _seat("d", room=2)
    assert place(list(range(5)), [c, d]) == [3, 4] and (c.given, d.given) == ([0], [1, 2])


def test_placement_prefers_the_shorter_queue_and_skips_down_maintenance_and_slow_clusters():
    busy, idle = _seat("busy", pending=10), _seat("idle")
    place([1, 2, 3], [busy, idle])
    assert busy.given == [] and idle.given == [1, 2, 3]
    down, maint, up = _seat("x", state=DOWN), _seat("y", state=MAINTENANCE), _seat("z", room=1)
    assert place([1, 2], [down, maint, up]) == [2] and up.given == [1] and not down.given and not maint.given
    slow, fast = _seat("slow", slow=True), _seat("fast", room=1, pending=5)
    place([1, 2], [slow, fast])
    assert fast.given == [1] and slow.given == [2]      # the slow one only once the other is full


def test_a_retry_avoids_its_nodes_only_on_the_cluster_they_belong_to():
    adjust = json.dumps({"exclude": ["nid00003"], "changes": "not on nid00003"})
    assert on_cluster(adjust, "hpcrun", "hpcrun") == adjust
    moved = json.loads(on_cluster(adjust, "hpcrun", "beta"))
    assert "exclude" not in moved and moved["changes"] == "not on nid00003"
    plain = json.dumps({"walltime_s": 600})
    assert on_cluster(plain, "hpcrun", "beta") == plain


def test_maintenance_reservations_are_read_and_meet_a_walltime():
    [window] = parse_maintenance(RESERVATIONS)          # the course reservation is not maintenance
    assert window.name == "maint1" and window.start is not None and window.end is not None
    before = window.start - dt.timedelta(hours=1)
    assert window.overlaps(before, 2 * 3600) and not window.overlaps(before, 1800)
    assert not window.overlaps(window.end, 3600) and window.overlaps(window.start, 1)
    assert Maintenance("open", None, None).overlaps(before, 1)


def test_commands_go_to_the_named_cluster(tmp_path, monkeypatch):
    """Every command a cluster's scheduler runs carries --clusters; an unreachable one raises Unreachable."""
    from hpcrun.backends.scheduler.base import Unreachable
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in ("squeue", "scancel", "scontrol"):
        (bin_dir / cmd).write_text(
            f'#!/bin/sh\necho "{cmd} $*" >> {calls}\n'
            "echo \"{cmd}: error: 'beta' can't be reached now, or it is an invalid entry for --cluster.\" >&2\nexit 1\n"
            .replace("{cmd}", cmd))
        (bin_dir / cmd).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    beta = scheduler_for("slurm", "beta")
    for call in (lambda: beta.queue(user="me"), lambda: beta.cancel(["5"]), beta.maintenance):
        with pytest.raises(Unreachable, match="cluster beta does not answer"):
            call()
    assert [line.split()[1] for line in calls.read_text().splitlines()] == ["--clusters=beta"] * 3
    assert "--clusters=beta" in beta.submit_command("x.sbatch")


# what the test set-up's first cluster printed (scontrol show partition --oneliner, sinfo, scontrol show burst)
PARTITIONS = ("PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
              "DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 Nodes=nid[00001-00003] "
              "OverSubscribe=NO State=UP TotalCPUs=24 TotalNodes=3 DefMemPerNode=UNLIMITED\n"
              "PartitionName=long AllowQos=normal,long Default=NO MaxTime=2-00:00:00 Nodes=nid00003 "
              "OverSubscribe=EXCLUSIVE TotalCPUs=8 TotalNodes=1\n")
SINFO = "debug*|8|16000|3\nlong|8|16000|1\n"
BURST = ("Name=lua DefaultPool=(null) Granularity=1 TotalSpace=0 FreeSpace=0 UsedSpace=0\n"
         "  PoolName[0]=wlm_pool Granularity=1GiB TotalSpace=100GiB FreeSpace=100GiB UsedSpace=0\n"
         "  Flags=TeardownFailure\n")


def _facts():
    from hpcrun.backends.scheduler.base import ClusterFacts
    from hpcrun.backends.scheduler.slurm_describe import parse_partitions, parse_pools
    plugin, pools = parse_pools(BURST)
    return ClusterFacts("hpcrun", parse_partitions(PARTITIONS, SINFO), 1001, 40, (("normal", None),), plugin, pools)


def test_the_live_cluster_is_read_from_what_slurm_prints():
    from hpcrun.backends.scheduler.slurm_describe import parse_config, parse_max_submit, slurm_time_s
    debug, long = _facts().partitions
    assert (debug.name, debug.nodes, debug.cpus_per_node, debug.memory_per_node_mb, debug.max_time_s,
            debug.default, debug.exclusive, debug.qos) == ("debug", 3, 8, 16000, None, True, False, ())
    assert (long.max_time_s, long.exclusive, long.qos) == (2 * 86400, True, ("normal", "long"))
    assert _facts().pools[0].granularity_bytes == 2 ** 30 and _facts().burst_buffer == "lua"
    assert parse_config("ClusterName             = beta\nMaxArraySize            = 1001\n") == {
        "ClusterName": "beta", "MaxArraySize": "1001"}
    assert (slurm_time_s("30"), slurm_time_s("infinite"), slurm_time_s("01:00:00")) == (1800, None, 3600)
    assert parse_max_submit("\n40\n\n") == 40 and parse_max_submit("\n\n") is None


def test_a_draft_validates_and_agrees_with_its_cluster_until_the_cluster_changes(tmp_path):
    import dataclasses

    from hpcrun.model.live import draft_profile, live_differences
    from hpcrun.model.profiles import load_profile
    path = tmp_path / "drafted.yaml"
    path.write_text(draft_profile(_facts(), "drafted", "hpcrun"))
    profile = load_profile(str(path)).profile
    assert profile.scheduler.cluster == "hpcrun" and profile.max_queued_jobs == 40
    assert profile.partitions["long"].exclusive and profile.partitions["long"].max_walltime == 2 * 86400
    assert profile.burst_buffer.system == "slurm-lua" and profile.burst_buffer.pools[0].granularity == 2 ** 30
    assert live_differences(profile, _facts()) == []
    facts = _facts()
    lowered = dataclasses.replace(facts, partitions=(facts.partitions[0], dataclasses.replace(
        facts.partitions[1], max_time_s=3600)), pools=(), max_array_size=100, name="other")
    found = live_differences(profile, lowered)
    assert any(f.startswith("partitions.long.max_walltime: the profile allows 2-00:00:00") for f in found), found
    assert any(f.startswith("burst_buffer.pools.0: pool 'wlm_pool' is gone") for f in found), found
    assert any(f.startswith("max_array_size:") for f in found) and any(f.startswith("scheduler.cluster") for f in found)
    gone = dataclasses.replace(facts, partitions=facts.partitions[:1])
    assert live_differences(profile, gone) == ["partitions.long: partition 'long' is gone (the cluster has debug)"]


def test_a_cluster_that_cannot_be_checked_is_noted_and_an_unknown_one_refused_with_one_profile(
        spec_factory, tmp_path, monkeypatch, cli):
    a = _profile(tmp_path, "a", "alpha")
    plan = load_plan(spec_factory({"site": {"profile": str(a)}}))          # known_clusters: None (autouse)
    assert plan.seat.name == "alpha"
    assert any("could not check that cluster 'alpha' exists" in n for n in plan.notes), plan.notes
    monkeypatch.setattr(Slurm, "known_clusters", lambda self: ["hpcrun"])
    result = cli("plan", str(spec_factory({"site": {"profile": str(a)}})), "--out", str(tmp_path / "p"))
    assert result.exit_code == 2 and "knows no cluster 'alpha'; it knows: hpcrun" in result.output
    assert f"{a}, line 4, key 'scheduler.cluster'" in result.output and not (tmp_path / "p").exists()


class _Answering:
    """A scheduler that answers: no maintenance, ``queued`` jobs of this user in its queue."""

    cluster = "x"

    def __init__(self, queued: int = 0, windows=()):
        self.queued, self.windows = queued, list(windows)

    def maintenance(self):
        return self.windows

    def queued_count(self, user):
        return self.queued


def test_a_cluster_takes_a_backlog_of_two_waves_within_its_limits():
    from hpcrun.operate.submission.placement import survey
    info = ClusterInfo("x", _Answering(queued=95), True, max_queued_jobs=50, site_max_queued_jobs=100,
                       capacity_jobs=6)
    assert survey(info, in_flight=10, pending=4, walltime_s=600).room == 5          # the site: 100 - 95
    info.site_max_queued_jobs = None
    assert survey(info, in_flight=10, pending=4, walltime_s=600).room == 8          # 2 waves of 6, 4 waiting
    assert survey(info, in_flight=48, pending=0, walltime_s=600).room == 2          # the campaign's cap: 50 - 48
    now = dt.datetime.now(dt.timezone.utc)
    info.sched = _Answering(windows=[Maintenance("m", now + dt.timedelta(minutes=5), None)])
    seat = survey(info, in_flight=0, pending=0, walltime_s=600, now=now)
    assert seat.state == MAINTENANCE and "maintenance reservation m" in seat.detail and not seat.open
    assert survey(info, in_flight=0, pending=0, walltime_s=60, now=now).state == "up"   # ends before it starts


# -- late binding on several clusters -------------------------------------------------------------------

class _Cluster:
    """One cluster's scheduler as the pilots' care asks it: its pilots' records, windows, what it was sent."""

    def __init__(self, name: str):
        self.cluster, self.name = name, "slurm"
        self.records_: dict = {}
        self.windows: list = []
        self.sent: list = []
        self.cancelled: list = []

    def records(self, job_ids, since, *, names=(), known=None, in_flight=None):
        return dict(self.records_)

    def submit(self, script, *, name, array=None, dependency="", adjust=None, text=None):
        self.sent.append((str(script), array))
        return str(100 + len(self.sent))

    def maintenance(self):
        return list(self.windows)

    def cancel(self, job_ids):
        self.cancelled += list(job_ids)

    def queue(self, **kwargs):
        return []

    def since_text(self, moment):
        return ""

    def budget_reason(self, reason):
        return False

    def parse_time(self, text):
        return None


def _late_two_clusters(spec_factory, tmp_path: Path):
    a = _profile(tmp_path, "alpha", "alpha")
    b = _profile(tmp_path, "beta", "beta", "partitions:\n  debug:\n    nodes: 2\n")
    spec = spec_factory({"site": {"profile": [str(a), {"profile": str(b), "share": 2}], "move_pending_after": "15s"},
                         "jobs": {"binding": "late", "pilot": {"walltime": "01:00:00"}}}, inputs=40)
    out = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    return out, json.loads((out / "manifest.json").read_text())


def test_late_pilots_of_two_clusters_each_run_their_clusters_scripts_under_ids_that_name_it(spec_factory, tmp_path):
    out, manifest = _late_two_clusters(spec_factory, tmp_path)
    seats = manifest["pilots"]["seats"]
    assert [(s["cluster"], s["prefix"], s["share"]) for s in seats] == [("alpha", "alpha-", 1.0),
                                                                         ("beta", "beta-", 2.0)]
    assert seats[1]["script"] == f"{out}/clusters/beta/bin/hpcrun-pilot.sh" and seats[1]["max_pilots"] == 2
    beta = (out / "clusters/beta/bin/hpcrun-pilot.sh").read_text()
    assert "pilot_prefix=beta-" in beta and "seat_dir=clusters/beta/" in beta
    assert "pilot_prefix=alpha-" in (out / "bin/hpcrun-pilot.sh").read_text()
    # a claim's id names its pilot, whose id names the cluster: the run records need no prefix of their own
    body = (out / "clusters/beta/jobs/array001.sbatch").read_text()
    assert 'HPCRUN_RUNDIR="$HPCRUN_PLAN_DIR/run/$HPCRUN_JOB/${HPCRUN_JOB_ID:-local}"' in body
    [info] = clusters_of(Manifest.from_dict(manifest))   # tasks go to the one queue, bound to no cluster
    assert set(info.sched.scheds) == {"alpha", "beta"}


def _care(manifest: dict):
    from hpcrun.backends.late.pilots import Pilots
    [info] = clusters_of(Manifest.from_dict(manifest))
    sched = info.sched
    assert isinstance(sched, Pilots)
    sched.scheds = {"alpha": _Cluster("alpha"), "beta": _Cluster("beta")}
    return sched


def _tend(sched, work: int = 40):
    return sched.tend(since=dt.datetime.now(dt.timezone.utc), settled=False, paused=False, spent=False, work=work)


def test_late_pilots_go_to_each_cluster_by_share_and_room(spec_factory, tmp_path):
    _out, manifest = _late_two_clusters(spec_factory, tmp_path)
    sched = _care(manifest)
    rnd = _tend(sched)
    alpha, beta = sched.scheds["alpha"], sched.scheds["beta"]
    # beta's share is twice alpha's, but it has 2 nodes: both of them, and alpha the rest of the need
    assert beta.sent == [(manifest["pilots"]["seats"][1]["script"], "0-1")], beta.sent
    assert alpha.sent and alpha.sent[0][0] == manifest["pilots"]["seats"][0]["script"]
    assert rnd.added == 2 + int(alpha.sent[0][1].split("-")[1]) + 1
    rows = (Path(manifest["pilots"]["queue"]) / "submitted.tsv").read_text().splitlines()
    assert sorted(r.split("\t")[3] for r in rows) == ["alpha", "beta"]


def test_maintenance_drains_that_clusters_pilots_and_gets_it_none(spec_factory, tmp_path):
    from hpcrun.backends.scheduler.base import Record
    _out, manifest = _late_two_clusters(spec_factory, tmp_path)
    sched = _care(manifest)
    q = Path(manifest["pilots"]["queue"])
    for pilot in ("alpha-7", "beta-7"):      # the same job id on both clusters: two pilots
        (q / "live" / pilot).mkdir(parents=True)
        (q / "live" / pilot / "beat").touch()
    start = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=10)
    sched.scheds["beta"].windows = [Maintenance("maint1", start, start + dt.timedelta(hours=1))]
    for name in ("alpha", "beta"):
        sched.scheds[name].records_ = {"7_0": Record("7_0", "7", manifest["pilots"]["name"], "RUNNING", "", "", None,
                                                     None, None, "n1", None, None)}
    rnd = _tend(sched)
    assert (q / "live" / "beta-7" / "until").read_text().strip() == str(int(start.timestamp()))
    assert not (q / "live" / "alpha-7" / "until").exists()
    assert rnd.drained == [("beta-7", "maint1")]
    assert sched.scheds["beta"].sent == [] and sched.scheds["alpha"].sent, "new pilots go to alpha only"
    assert _tend(sched).drained == []    # told once


def test_pilots_pending_too_long_on_one_cluster_are_handed_off(spec_factory, tmp_path):
    import time

    from hpcrun.backends.scheduler.base import Record
    _out, manifest = _late_two_clusters(spec_factory, tmp_path)
    sched = _care(manifest)
    q = Path(manifest["pilots"]["queue"])
    q.mkdir(parents=True, exist_ok=True)
    (q / "submitted.tsv").write_text(f"55\t2\t{time.time() - 100:.0f}\tbeta\n")
    sched.scheds["beta"].records_ = {f"55_{i}": Record(f"55_{i}", f"5{i}", manifest["pilots"]["name"], "PENDING",
                                                       "", "(Resources)", None, None, None, "", None, None)
                                     for i in range(2)}
    rnd = _tend(sched)
    assert sorted(sched.scheds["beta"].cancelled) == ["55_0", "55_1"]
    assert rnd.handed == [("beta", 2, 15.0)]
    assert float((q / "slow" / "beta").read_text()) > time.time() + 40    # three times move_pending_after
    assert sched.scheds["beta"].sent == [] and sched.scheds["alpha"].sent, "the others take the work"
