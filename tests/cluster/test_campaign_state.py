"""Campaign state on the real test cluster: submit at scale, kills and restarts, concurrent
submitters, retry and parking.

Kills use a wrapper around the real sbatch (first on PATH for the hpcrun under test): it
counts calls, can SIGKILL hpcrun just before or just after the real sbatch (the window
between sbatch returning and the record being written), and submits every job held
(``--hold``) so that all of them stay visible in ``squeue -r`` for counting.
"""

from __future__ import annotations

import collections
import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .campaigns import PY, Campaign
from .faults import install_sbatch_wrapper

pytestmark = pytest.mark.cluster

def make_raw(cluster, example_root: Path, raw: Path, files: int, events: int = 200) -> str:
    """``files`` raw inputs in ``raw`` (written by the test user); returns their glob."""
    src = cluster.dir / "example-src"
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from prepare import make_inputs; make_inputs(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))")
    proc = cluster.run_as_user([PY, "-c", code, str(src), str(raw), str(files), str(events)])
    assert proc.returncode == 0, proc.stderr
    return str(raw / "*.h5")


class Held:
    """The sbatch wrapper and the view of what Slurm holds for one campaign."""

    def __init__(self, cluster, campaign: Campaign):
        self.cluster, self.c = cluster, campaign
        self.env, self.counter = install_sbatch_wrapper(cluster, hold=True)
        self.cancel_all()  # left over by an earlier, interrupted run of the same test

    def submit(self, *args: str, kill: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
        env = dict(self.env, HPCRUN_TEST_KILL=kill, COLUMNS="200")
        return self.cluster.run_as_user([self.c.hpcrun, "submit", str(self.c.plan), *args], cwd=str(self.c.dir),
                                        env=env, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        env = dict(self.cluster.user_env, **self.env)
        return subprocess.Popen([self.c.hpcrun, "submit", str(self.c.plan), *args], cwd=str(self.c.dir), env=env,
                                user=self.cluster.uid, group=self.cluster.gid, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def queued(self) -> collections.Counter:
        """(script, array task) of every job of this campaign in the queue, with multiplicity."""
        proc = self.cluster.run(["squeue", "-h", "-r", "-u", self.cluster.user, "-o", "%i|%j|%o|%K"])
        assert proc.returncode == 0, proc.stderr
        seen: collections.Counter = collections.Counter()
        for line in proc.stdout.splitlines():
            _jid, name, command, task = line.split("|")
            if name.startswith(self.c.name + "."):
                seen[(Path(command).name, task)] += 1
        return seen

    def cancel_all(self) -> None:
        proc = self.cluster.run(["squeue", "-h", "-u", self.cluster.user, "-o", "%F|%j"])
        ids = {line.split("|")[0] for line in proc.stdout.splitlines() if line.split("|")[1].startswith(self.c.name)}
        for job_id in ids:
            self.cluster.scancel(job_id)


def _expected_per_job(c: Campaign) -> collections.Counter:
    manifest = json.loads((c.plan / "manifest.json").read_text())
    want: collections.Counter = collections.Counter()
    for s in manifest["scripts"]:
        name = Path(s["path"]).name
        if s["array"] is None:
            want[(name, "N/A")] = 1
        else:
            for k in range(s["jobs"][1] - s["jobs"][0] + 1):
                want[(name, str(k))] = 1
    return want


def _plan(c: Campaign) -> None:
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _status(c: Campaign, *args: str, timeout: float = 300) -> dict:
    fast = ["--interval", "2"] if "--wait" in args else []   # the test cluster's profile allows it
    proc = c.hp("status", str(c.plan), "--json", "--all", *args, *fast, timeout=timeout + 60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def raw8(slurm_cluster, example_root) -> str:
    return make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", 8)


@pytest.mark.parametrize("kill", ["before:1", "after:1", "before:5", "after:5", "after:8"])
def test_killed_submit_neither_duplicates_nor_loses(slurm_cluster, hpcrun_bin, example_root, raw8, kill):
    """hpcrun is SIGKILLed at an sbatch call (before it, or after it returned but before the
    record); a rerun recovers or releases that claim and submits the rest exactly once."""
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, f"kill-{kill.replace(':', '')}", inputs__glob=raw8)
    _plan(c)
    held = Held(slurm_cluster, c)
    try:
        first = held.submit(kill=kill)
        assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
        second = held.submit("--json")
        assert second.returncode == 0, second.stdout + second.stderr
        report = json.loads(second.stdout)
        # the 8 per-job scripts are one claim; the jobs sbatch took before the kill are found by name
        call = int(kill.split(":")[1])
        taken = call if kill.startswith("after") else call - 1
        assert len(report["recovered"]) == taken, report
        assert len(report["released"]) == (0 if taken == 8 else 1), report
        assert held.queued() == _expected_per_job(c)
        st = _status(c)
        assert st["counts"]["submitted"] == 8 and st["counts"]["pending"] == 0, st["counts"]
        again = held.submit()
        assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout
        assert held.queued() == _expected_per_job(c)
    finally:
        held.cancel_all()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_submit_killed_at_a_random_moment(slurm_cluster, hpcrun_bin, example_root, raw8, seed):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, f"random-kill-{seed}", inputs__glob=raw8)
    _plan(c)
    held = Held(slurm_cluster, c)
    try:
        proc = held.popen()
        time.sleep(random.Random(seed).uniform(0.3, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        rerun = held.submit()
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert held.queued() == _expected_per_job(c)
    finally:
        held.cancel_all()


def test_two_concurrent_submits_do_not_duplicate(slurm_cluster, hpcrun_bin, example_root, raw8):
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "concurrent", inputs__glob=raw8)
    _plan(c)
    held = Held(slurm_cluster, c)
    try:
        procs = [held.popen("--json"), held.popen("--json")]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        submitted = [len(json.loads(o)["submitted"]) for o, _ in outs]
        assert sorted(submitted) == [0, 8], submitted  # the lock serialised them: the second found no work
        assert held.queued() == _expected_per_job(c)
    finally:
        held.cancel_all()


def test_array_campaign_of_20_files_runs_to_completion(slurm_cluster, hpcrun_bin, example_root):
    """20 files through one throttled job array; the store agrees with sacct."""
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", 20)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "array20", burst_buffer=None,
                 inputs__glob=glob, jobs={"files_per_job": 1, "chains_per_node": 2, "throttle": 3})
    _plan(c)
    proc = c.hp("submit", str(c.plan), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [batch] = json.loads(proc.stdout)["submitted"]
    assert batch["array"] == "0-19%3" and len(batch["jobs"]) == 20
    st = _status(c, "--wait", "--timeout", "400", timeout=400)
    assert st["counts"]["done"] == 20, st["counts"]
    assert st["inputs"]["done"] == 20
    acct = slurm_cluster.sacct(batch["job_id"], fields="JobID,State,ElapsedRaw")
    tasks = {r["JobID"]: r for r in acct if "." not in r["JobID"]}
    assert len(tasks) == 20 and all(r["State"] == "COMPLETED" for r in tasks.values()), tasks
    by_id = {j["slurm_id"]: j for j in st["jobs"]}
    assert set(by_id) == set(tasks)
    for jid, row in tasks.items():
        h, m, s = (int(x) for x in by_id[jid]["elapsed"].split(":"))
        assert h * 3600 + m * 60 + s == int(row["ElapsedRaw"])
    for raw in sorted(Path(glob).parent.glob("*.h5")):
        assert (c.out / f"{raw.stem}.reco.h5").exists()
    again = c.hp("submit", str(c.plan))
    assert "nothing to submit" in again.stdout

    # the report's figures are sacct's, recomputed here from sacct itself
    proc = c.hp("report", str(c.plan), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    # (without -X: with it, sacct reports TotalCPU 0 on the allocation line, the steps are not summed)
    acct = slurm_cluster.sacct(batch["job_id"], fields="JobID,TotalCPU,ElapsedRaw,AllocCPUS,Start,End", steps=True)
    rows = [r for r in acct if "." not in r["JobID"]]
    cpu = sum(_cpu_seconds(r["TotalCPU"]) for r in rows)
    alloc = sum(int(r["ElapsedRaw"]) * int(r["AllocCPUS"]) for r in rows)
    assert rep["cpu_efficiency"] == pytest.approx(cpu / alloc, rel=1e-6)
    assert (rep["success_rate"], rep["succeeded"], rep["runs_completed"]) == (1.0, 20, 20)
    assert (rep["events_in"], rep["events_out"], rep["qa_passed"]) == (20 * 200, 20 * 200, 20)
    assert rep["attempts"] == {"1": 20} and rep["failures"] == []
    span = max(_epoch(r["End"]) for r in rows) - min(_epoch(r["Start"]) for r in rows)
    assert rep["span_s"] == pytest.approx(span)
    assert rep["throughput_events_per_s"] == pytest.approx(4000 / span)
    written = c.hp("report", str(c.plan), "--out", str(c.dir / "report"))
    assert written.returncode == 0, written.stdout + written.stderr
    for name in ("index.html", "report.json", "completed_vs_time.png", "cpu_efficiency.png",
                 "walltime_per_event.png"):
        assert (c.dir / "report" / name).stat().st_size > 0
    assert "e2e-array20" in (c.dir / "report" / "index.html").read_text()


def _cpu_seconds(text: str) -> float:
    days, _, clock = text.rpartition("-")
    parts = [float(x) for x in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _epoch(ts: str) -> float:
    return time.mktime(time.strptime(ts, "%Y-%m-%dT%H:%M:%S"))


def test_corrupted_input_is_caught_by_the_checksum_step(slurm_cluster, hpcrun_bin, example_root):
    """The plan records each file's adler32; a file changed after planning fails its job (exit 11)
    before the database or any chain starts, and the other job is untouched."""
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", 2)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "corrupt", inputs__glob=glob)
    _plan(c)
    manifest = json.loads((c.plan / "manifest.json").read_text())
    assert all(s.startswith("adler32:") for j in manifest["jobs"] for s in j["checksums"])
    victim = Path(glob).parent / "run1001.h5"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert c.hp("submit", str(c.plan)).returncode == 0
    st = _status(c, "--wait")
    rows = {j["job"]: j for j in st["jobs"]}
    bad, good = rows["e2e-corrupt.00002"], rows["e2e-corrupt.00001"]
    assert (bad["status"], bad["state"], bad["exit_code"]) == ("failed", "FAILED", "11:0"), bad
    assert "input checksum mismatch" in bad["reason"] and "run1001.h5" in bad["reason"], bad
    assert good["status"] == "done", good
    raw_id = slurm_cluster.sacct(bad["slurm_id"], fields="JobIDRaw")[0]["JobIDRaw"]
    assert not (c.plan / "run" / bad["job"] / raw_id / "db").exists()  # failed before the database
    _logs_of_a_failed_and_a_folded_job(c, bad, good, raw_id)
    rep = json.loads(c.hp("report", str(c.plan), "--json").stdout)
    assert [(f["reason"], f["count"]) for f in rep["failures"]] == [("input checksum mismatch (exit 11)", 1)]


def _logs_of_a_failed_and_a_folded_job(c: Campaign, bad: dict, good: dict, raw_id: str) -> None:
    """Issue 56: the poll that saw the good job complete folded its run directory; the failed one's is whole.
    `hpcrun logs` shows each with its Slurm log, by job name."""
    assert not (c.plan / "run" / good["job"]).exists(), "a successful job's run directory was not folded"
    proc = c.hp("logs", str(c.plan), bad["job"], "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(proc.stdout)
    (run,) = entry["runs"]
    assert run["run_id"] == raw_id and not run["folded"] and "input checksum mismatch" in run["files"]["reason"]
    assert set(run["files"]) == {p.relative_to(c.plan / "run" / bad["job"] / raw_id).as_posix()
                                 for p in (c.plan / "run" / bad["job"] / raw_id).rglob("*") if p.is_file()}
    (slurm_log,) = entry["scheduler_logs"]
    assert "input checksum mismatch" in slurm_log["text"], slurm_log
    (entry,) = json.loads(c.hp("logs", str(c.plan), good["job"], "--json").stdout)
    (run,) = entry["runs"]
    assert run["folded"] and "run/folded/" in run["where"], run
    assert {line.split("\t")[2] for line in run["files"]["chains.tsv"].splitlines()} == {"ok"}, run["files"]
    (slurm_log,) = entry["scheduler_logs"]   # folded with the run: logs/ keeps the failed job's only
    assert slurm_log["path"].endswith("scheduler.log") and "all steps succeeded" in slurm_log["text"], slurm_log
    jobs_logs = [p for p in (c.plan / "logs").glob(f"{c.name}.*.out") if ".finalize-" not in p.name]
    assert len(jobs_logs) == 1, sorted((c.plan / "logs").iterdir())


def test_retry_resubmits_exactly_the_failed_and_parks_the_hopeless(slurm_cluster, hpcrun_bin, example_root):
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", 6)
    markers = slurm_cluster.pfs / "markers"
    markers.mkdir()
    (markers / "run1001.h5.fail").write_text("always\n")
    (markers / "run1004.h5.fail").write_text("once\n")
    slurm_cluster.chown(markers)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "retry", burst_buffer=None, inputs__glob=glob,
                 chain_extra=["--fail-marked", str(markers)], retry={"max_attempts": 2},
                 jobs={"files_per_job": 1, "chains_per_node": 2, "throttle": 3})
    _plan(c)
    assert c.hp("submit", str(c.plan)).returncode == 0
    st = _status(c, "--wait")
    failed = sorted(j["job"] for j in st["jobs"] if j["status"] == "failed")
    assert failed == ["e2e-retry.00002", "e2e-retry.00005"], st["jobs"]
    assert all("chain(s) failed" in j["reason"] for j in st["jobs"] if j["status"] == "failed")

    proc = c.hp("retry", str(c.plan), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = json.loads(proc.stdout)
    assert first["requeued"] == failed and first["parked"] == []
    [batch] = first["submitted"]
    assert batch["array"] == "1,4%3"  # exactly the failed tasks of the same array script
    st = _status(c, "--wait")
    states = {j["job"]: (j["status"], j["attempts"]) for j in st["jobs"]}
    assert states["e2e-retry.00005"] == ("done", 2)
    assert states["e2e-retry.00002"] == ("failed", 2)
    assert all(states[f"e2e-retry.0000{i}"] == ("done", 1) for i in (1, 3, 4, 6))

    proc = c.hp("retry", str(c.plan), "--json")
    second = json.loads(proc.stdout)
    assert second["requeued"] == [] and second["parked"] == ["e2e-retry.00002"] and second["submitted"] == []
    st = _status(c)
    [parked] = [j for j in st["jobs"] if j["status"] == "parked"]
    assert parked["job"] == "e2e-retry.00002"
    assert "2 time(s) in 2 attempt(s)" in parked["reason"] and "chain(s) failed" in parked["reason"]
    table = c.hp("status", str(c.plan))
    assert "parked" in table.stdout and "e2e-retry.00002" in table.stdout


def test_cancelled_jobs_are_retried_only_on_request(slurm_cluster, hpcrun_bin, example_root):
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", 2)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "cancel", burst_buffer=None, inputs__glob=glob,
                 chain_extra=["--cpu-seconds", "15"], jobs={"files_per_job": 1, "chains_per_node": 2})
    _plan(c)
    proc = c.hp("submit", str(c.plan), "--json")
    [batch] = json.loads(proc.stdout)["submitted"]
    task = f"{batch['job_id']}_1"
    try:
        slurm_cluster.wait_until(lambda: slurm_cluster.squeue_ids(task) and _running(slurm_cluster, task),
                                 timeout=60)
        # the operators' cancellation (hpcrun cancel); one by anyone else is the site's, retried
        # (tests/cluster/test_site_operations.py)
        proc = c.hp("cancel", str(c.plan), "--jobs", "e2e-cancel.00002", "--json")
        assert json.loads(proc.stdout)["cancelled"] == {"e2e-cancel.00002": task}, proc.stdout + proc.stderr
        st = _status(c, "--wait")
        rows = {j["job"]: j for j in st["jobs"]}
        assert rows["e2e-cancel.00002"]["state"] == "CANCELLED" and rows["e2e-cancel.00002"]["status"] == "failed"
        assert rows["e2e-cancel.00002"]["reason"].startswith("cancelled by an operator ("), rows
        assert rows["e2e-cancel.00001"]["status"] == "done"
        plain = json.loads(c.hp("retry", str(c.plan), "--json").stdout)
        assert plain["requeued"] == [] and plain["submitted"] == []
        asked = json.loads(c.hp("retry", str(c.plan), "--cancelled", "--json").stdout)
        assert asked["requeued"] == ["e2e-cancel.00002"] and asked["submitted"][0]["array"] == "1"
        st = _status(c, "--wait")
        assert {j["status"] for j in st["jobs"]} == {"done"}
        assert {j["attempts"] for j in st["jobs"]} == {1, 2}
    finally:
        slurm_cluster.run(["scancel", "-u", slurm_cluster.user, "-n", ",".join(_names(c))])


def _running(cluster, job_id: str) -> bool:
    proc = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    return proc.stdout.strip() == "RUNNING"


def _names(c: Campaign) -> list:
    proc = c.cluster.run(["squeue", "-h", "-u", c.cluster.user, "-o", "%j"])
    return sorted({n for n in proc.stdout.split() if n.startswith(c.name + ".")}) or ["none"]


SUMMARY = ("import sys; paths = open(sys.argv[1]).read().split(); "
           "open(sys.argv[2], 'w').write(chr(10).join(sorted(paths)) + chr(10))")


def test_finalize_runs_once_after_every_reco_task(slurm_cluster, hpcrun_bin, example_root):
    """A 3-file array campaign with a finalize command that writes a summary of the outputs: the
    finalize job goes out with the array, chained by --dependency=afterany on the array id, starts
    only after every task ended (sacct Start/End), and a second submit does not send it again."""
    began = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))  # earlier runs stay out
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "raw", 3)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "finalize", burst_buffer=None, inputs__glob=glob,
                 jobs={"files_per_job": 1, "chains_per_node": 2, "array": "always"},
                 finalize={"command": [PY, "-c", SUMMARY, "{output_list}", "{outdir}/summary.txt"],
                           "walltime": "5m", "after": "any"})
    _plan(c)
    manifest = json.loads((c.plan / "manifest.json").read_text())
    assert manifest["finalize"]["job_name"] == "e2e-finalize.finalize"
    proc = c.hp("submit", str(c.plan), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = json.loads(proc.stdout)
    [batch] = first["submitted"]
    fin = first["finalize"]
    assert fin["action"] == "submitted", fin
    assert fin["dependency"] == f"afterany:{batch['job_id']}", fin
    st = _status(c, "--wait", "--timeout", "400", timeout=400)
    assert st["counts"]["done"] == 3, st["counts"]
    assert st["finalize"]["job_id"] == fin["job_id"] and st["finalize"]["status"] == "done", st["finalize"]

    outputs = sorted(str(c.out / f"{Path(p).stem}.reco.h5") for p in Path(glob).parent.glob("*.h5"))
    assert (c.out / "summary.txt").read_text().splitlines() == outputs
    tasks = [r for r in slurm_cluster.sacct(batch["job_id"], fields="JobID,State,Start,End") if "." not in r["JobID"]]
    assert len(tasks) == 3 and all(r["State"] == "COMPLETED" for r in tasks), tasks
    [final] = slurm_cluster.sacct(fin["job_id"], fields="JobID,JobName,State,Start,End")
    assert (final["JobName"], final["State"]) == ("e2e-finalize.finalize", "COMPLETED"), final
    assert _epoch(final["Start"]) >= max(_epoch(r["End"]) for r in tasks), (final, tasks)
    rundir = c.plan / "run" / "finalize" / fin["job_id"]
    assert (rundir / "exit_code").read_text().strip() == "0"

    proc = c.hp("submit", str(c.plan), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = json.loads(proc.stdout)
    assert again["submitted"] == [] and again["finalize"]["action"] == "earlier", again
    argv = ["sacct", "-n", "-X", "-P", "-S", began, "--name", "e2e-finalize.finalize", "-o", "JobID"]
    if slurm_cluster.accounting != "slurmdbd":
        argv.insert(1, "-c")
    named = slurm_cluster.run(argv)
    assert named.stdout.split() == [fin["job_id"]], named.stdout


def test_finalize_killed_after_sbatch_is_recovered_not_duplicated(slurm_cluster, hpcrun_bin, example_root, raw8):
    """hpcrun is SIGKILLed right after the finalize sbatch returned (the wrapper's 2nd call: the
    array is the 1st); the rerun finds the job by its name and records it."""
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "finalize-kill", inputs__glob=raw8, burst_buffer=None,
                 jobs={"files_per_job": 1, "chains_per_node": 2, "array": "always"},
                 finalize={"command": ["/bin/true"]})
    _plan(c)
    held = Held(slurm_cluster, c)
    try:
        first = held.submit(kill="after:2")
        assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
        second = held.submit("--json")
        assert second.returncode == 0, second.stdout + second.stderr
        report = json.loads(second.stdout)
        assert report["finalize"]["action"] == "recovered", report
        assert held.queued()[("finalize.sbatch", "N/A")] == 1
        third = json.loads(held.submit("--json").stdout)
        assert third["finalize"]["action"] == "earlier" and held.queued()[("finalize.sbatch", "N/A")] == 1
    finally:
        held.cancel_all()


@pytest.mark.parametrize("setting", ["accounting: false", "scheduler: {kind: slurm-queue-only}"])
def test_status_without_accounting_follows_squeue(slurm_cluster, hpcrun_bin, example_root, setting):
    """A site profile with `accounting: false`, or the queue-only Slurm scheduler: status never
    calls sacct (a sacct that fails is first on PATH) and still records each job's end from
    squeue and the job's own reason."""
    tag = "queueonly" if "scheduler" in setting else "noacct"
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / f"raw-{tag}", 2)
    markers = slurm_cluster.pfs / f"markers-{tag}"
    markers.mkdir()
    (markers / "run1001.h5.fail").write_text("always\n")
    slurm_cluster.chown(markers)
    profiles = slurm_cluster.workdir / f"profiles-{tag}"
    slurm_cluster.write(profiles / "local-noacct.yaml",
                        f"name: local-noacct\nextends: local-test\n{setting}\n")
    nosacct = slurm_cluster.workdir / f"nosacct-{tag}"
    slurm_cluster.write(nosacct / "sacct", "#!/bin/sh\necho 'sacct must not be called' >&2\nexit 1\n", mode=0o755)
    slurm_cluster.chown(profiles)
    slurm_cluster.chown(nosacct)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, tag, burst_buffer=None, inputs__glob=glob,
                 chain_extra=["--fail-marked", str(markers)], site={"profile": "local-noacct"},
                 jobs={"files_per_job": 1, "chains_per_node": 2})
    env = {"HPCRUN_PROFILE_PATH": str(profiles), "COLUMNS": "200",
           "PATH": f"{nosacct}:{slurm_cluster.user_env['PATH']}"}

    def hp(*args: str) -> subprocess.CompletedProcess:
        return slurm_cluster.run_as_user([c.hpcrun, *args], cwd=str(c.dir), env=env, timeout=400)

    assert hp("plan", str(c.spec), "--out", str(c.plan)).returncode == 0
    submit = json.loads((c.plan / "manifest.json").read_text())["submit"]
    assert submit["accounting"] is False
    assert submit["scheduler"] == ("slurm-queue-only" if "scheduler" in setting else "slurm")
    assert hp("submit", str(c.plan)).returncode == 0
    proc = hp("status", str(c.plan), "--wait", "--timeout", "240", "--interval", "2", "--json", "--all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {j["job"]: j for j in json.loads(proc.stdout)["jobs"]}
    assert (rows[f"e2e-{tag}.00001"]["status"], rows[f"e2e-{tag}.00001"]["state"]) == ("done", "COMPLETED")
    bad = rows[f"e2e-{tag}.00002"]
    assert (bad["status"], bad["state"]) == ("failed", "FAILED"), bad
    assert "chain(s) failed" in bad["reason"], bad
