"""Late binding without a cluster: the plan's refusals, and the real pilot script run by bash on the queue.

The pilot (bin/hpcrun-pilot.sh) runs here as Slurm would start it (its job identity in the environment),
claiming the tasks that the operate side's Pilots scheduler put in the queue: claims, commits, fencing,
an operator's cancel and an input's own time limit, in seconds. tests/cluster/test_late_binding.py runs
the same on real Slurm.
"""

from __future__ import annotations

import calendar
import os
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from hpcrun.backends.late import ledger
from hpcrun.backends.late.pilots import Pilots, _indices
from hpcrun.backends.late.queue import Queue
from hpcrun.errors import InputError
from hpcrun.operate.manifest import read_manifest
from hpcrun.operate.plandir import scheduler_of
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.resources import templates_dir

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/pgrep"), reason="pgrep (procps) is needed")
RUN = {"direct": True}   # how a pilot runs each input (jobs.pilot.direct): every test here runs both ways


@pytest.fixture(autouse=True, params=["direct", "script"])
def _mode(request):
    """Each test with the pilot's Python worker running the inputs (direct) and with the job script's bash."""
    RUN["direct"] = request.param == "direct"
    yield request.param
    RUN["direct"] = True


def _spec(root: Path, n: int, chain: List[str], **changes) -> dict:
    raw = root / "raw"
    raw.mkdir(exist_ok=True)
    for i in range(n):
        (raw / f"r{i:03d}.dat").write_text(f"input {i}\n")
    data = {
        "name": "latelocal", "site": {"profile": "local-test"}, "walltime": "00:01:00",
        "container": {"runtime": "none"}, "inputs": {"glob": str(raw / "*.dat"), "checksum": "none"},
        "jobs": {"files_per_job": 1, "chains_per_node": 1, "binding": "late",
                 "pilot": {"walltime": "00:10:00", "slots": 2, "idle_release": "2s",
                           # claims of two inputs at first where they run direct (a claim of one runs the script)
                           "input_time": "1s" if RUN["direct"] else "5s", "direct": RUN["direct"]}},
        "chain": {"command": chain}, "outputs": {"location": str(root / "out"), "pattern": "{stem}.out"},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return data


def _plan(root: Path, data: dict) -> Path:
    (root / "out").mkdir(exist_ok=True)
    (root / "campaign.yaml").write_text(yaml.safe_dump(data))
    write_plan(load_plan(root / "campaign.yaml"), root / "plan")
    return root / "plan"


COPY = ["/bin/sh", "-c", 'sleep "$0"; exec cp "$1" "$2"', "0.2", "{input}", "{output}"]


def _pilots(plan: Path) -> Pilots:
    sched = scheduler_of(read_manifest(plan))
    assert isinstance(sched, Pilots)
    return sched


def _enqueue(plan: Path, n: int) -> str:
    sched = _pilots(plan)
    script = next((plan / "jobs").glob("*"))
    return sched.submit(script, name="latelocal.tag1", array=f"0-{n - 1}%4")


def _pilot(plan: Path, job_id: str, **env: str) -> subprocess.Popen:
    environ = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "SLURM_JOB_ID": job_id, "SLURM_JOB_NUM_NODES": "1",
               "SLURM_ARRAY_TASK_ID": "0", "SLURMD_NODENAME": "n1", **env}
    return subprocess.Popen(["env", "-i", *[f"{k}={v}" for k, v in environ.items()], "bash",
                             str(plan / "bin" / "hpcrun-pilot.sh")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait(proc: subprocess.Popen, timeout: float = 60) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def _claimed(q: Queue, n: int, timeout: float = 20) -> None:
    """Wait until the pilots hold ``n`` claims."""
    deadline = time.monotonic() + timeout
    while sum(1 for _ in q.claims(("live",))) < n:
        assert time.monotonic() < deadline, "the pilot claimed nothing"
        time.sleep(0.1)


def _results(plan: Path) -> Dict[str, List[str]]:
    """Every committed result, in done/ or folded into a ledger by a poll that recorded it."""
    return {r[0]: r for r in ledger.results(plan / "queue")}


def test_two_pilots_run_every_input_once_and_the_records_say_how(tmp_path):
    plan = _plan(tmp_path, _spec(tmp_path, 12, COPY))
    qid = _enqueue(plan, 12)
    a, b = _pilot(plan, "501"), _pilot(plan, "502")
    logs = _wait(a) + _wait(b)
    results = _results(plan)
    assert sorted(results) == sorted(f"{qid}_{i}" for i in range(12)), logs
    assert {r[8] for r in results.values()} == {"COMPLETED"}, logs
    assert {r[2] for r in results.values()} <= {"501", "502"}
    assert not list((tmp_path / "out").glob("*.out")), "a pilot moved an output into place itself"
    # what operate reads: every task as the scheduler's record of an array task would say it; the reading
    # places the committed claims' outputs
    records = _pilots(plan).records([qid], "")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.out")) == [f"r{i:03d}.out" for i in range(12)]
    assert not list((tmp_path / "out" / ".hpcrun-claims").glob("*")), "claims' outputs left behind"
    assert {r[11] for r in _results(plan).values()} == {"placed"}
    assert len(records) == 12 and {r.state for r in records.values()} == {"COMPLETED"}
    rec = records[f"{qid}_0"]
    assert rec.nodes == "n1" and rec.raw_id.split(".")[0] in ("501", "502") and rec.elapsed_s >= 0.2
    assert rec.name == "latelocal.tag1" and rec.exit_code == "0:0"
    # the claim's run directory is run/<job>/<claim id>, as an array task's is run/<job>/<job id>
    assert (plan / "run" / "latelocal.00001" / rec.raw_id / "exit_code").read_text().strip() == "0"
    # both pilots stopped by themselves (idle), holding nothing
    assert not list((plan / "queue" / "live").iterdir())
    assert "nothing to claim for 2 s: released" in logs


# the program's session and process group, then its claim script's pid and group (the input's shell's parent): from
# /proc, "pid (comm) state ppid pgrp session ..."
WHERE = ('read -r _ _ _ shell pgrp sid _ < /proc/$$/stat; read -r _ _ _ claim sgrp _ < /proc/$shell/stat; '
         'read -r _ _ _ _ cgrp _ < /proc/$claim/stat; echo "$sid $$ $pgrp $shell $sgrp $claim $cgrp" > "$1"')


def test_a_claims_script_leads_a_group_of_its_own_in_the_pilots_session(tmp_path, _mode):
    """Its own process group (a signal to it reaches its inputs), not a session of its own: where the kernel groups
    the CPU by session, 8 slots would weigh as 8 jobs (and starve the login node's supervisor on the test cluster)."""
    n = 4 if _mode == "direct" else 2   # two claims of two inputs run direct: a claim of one runs the script
    plan = _plan(tmp_path, _spec(tmp_path, n, ["/bin/sh", "-c", WHERE, "{input}", "{output}"]))
    _enqueue(plan, n)
    # the agent runs under the pilot's python3 (the PATH _pilot gives it): before 3.11, a session of its own
    new = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "python3", "-c", "import sys; print(sys.version_info "
                          ">= (3, 11))"], capture_output=True, text=True).stdout.strip() == "True"
    pilot = _pilot(plan, "503")   # its own session, as slurmstepd starts a batch script
    logs = _wait(pilot)
    for out in sorted((tmp_path / "out" / ".hpcrun-claims").glob("*/*.out")):
        sid, me, pgrp, shell, sgrp, claim, cgrp = (int(w) for w in out.read_text().split())
        if _mode == "direct":   # the program's parent is the claim's worker, which leads its own group
            assert sid == (pilot.pid if new else shell), (out, logs)   # the pilot's session, all the way down
            assert sgrp == shell != pilot.pid and pgrp == me != sgrp   # and the program its own
            continue
        assert sid == (pilot.pid if new else claim), (out, logs)   # the pilot's session, all the way down
        assert cgrp == claim != pilot.pid         # the claim's script leads its own group
        assert pgrp == shell != cgrp              # and each input its own (set -m), its program in it
    assert len(list((tmp_path / "out" / ".hpcrun-claims").glob("*/*.out"))) == n, logs


def test_a_fenced_pilot_records_nothing_and_its_claims_return(tmp_path):
    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/sh", "-c", 'sleep 4; exec cp "$0" "$1"', "{input}", "{output}"]))
    qid = _enqueue(plan, 2)
    q = Queue(plan / "queue")
    pilot = _pilot(plan, "601")
    _claimed(q, 2)
    assert {r.state for r in _pilots(plan).records([qid], "").values()} == {"RUNNING"}
    assert q.fence("601")                       # its lease expired: the supervisor gives up on it
    logs = _wait(pilot, 30)
    assert _results(plan) == {}, logs           # nothing committed by the fenced pilot
    assert not list((tmp_path / "out").glob("*.out")), "a fenced claim moved its output into place"
    before = sorted(str(p.relative_to(plan)) for p in (plan / "queue").rglob("*"))
    claims = "".join(p.read_text() for p in sorted(plan.glob("run/**/claims/*.log")))
    returned = sorted(q.release())
    # a claim whose split the fence cut short (its chunk not let go yet: a loaded machine) goes back whole to the
    # backlog rather than as a returned claim (CI saw it once); both wait again either way (PENDING below, then
    # run once by the next pilot), and no attempt is counted
    assert returned and set(returned) <= {f"{qid}_0", f"{qid}_1"}, (returned, logs, before, claims)
    assert {r.state for r in _pilots(plan).records([qid], "").values()} == {"PENDING"}
    assert (plan / "queue" / "ended" / "601").is_dir()
    # another pilot then runs them
    again = _pilot(plan, "602")
    logs = _wait(again, 60)
    assert {r[8] for r in _results(plan).values()} == {"COMPLETED"}, logs
    assert {r.state for r in _pilots(plan).records([qid], "").values()} == {"COMPLETED"}
    assert len(list((tmp_path / "out").glob("*.out"))) == 2


def test_an_operator_cancel_and_an_input_time_limit_end_their_inputs(tmp_path):
    # r001's program says it was stopped: the input's time limit stops it (TERM) before the input fails, as a
    # chain's own process did; the group is KILLed only at the limit itself
    stopped = tmp_path / "r001.stopped"
    slow = ["/bin/sh", "-c", 'case "$0" in *r000*) sleep 30 ;; *r001*) trap "touch $2; exit 143" TERM; sleep 300 & '
            'wait ;; esac; exec cp "$0" "$1"', "{input}", "{output}", str(stopped)]
    data = _spec(tmp_path, 3, slow, walltime="00:00:20")
    data["jobs"]["pilot"]["slots"] = 3
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 3)
    # an input's time limit from the queue's descriptor (a retry may change it); signal before: 2 s
    pilot = _pilot(plan, "701")
    deadline = time.monotonic() + 20
    while not (plan / "queue" / "live" / "701" / f"{qid}_0").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1)
    _pilots(plan).cancel([f"{qid}_0"])           # hpcrun cancel --inputs of a running input
    logs = _wait(pilot, 90)
    results = _results(plan)
    assert results[f"{qid}_0"][8] == "CANCELLED" and results[f"{qid}_0"][7] == "143", logs   # the input's TERM trap
    assert results[f"{qid}_2"][8] == "COMPLETED", logs
    # past its limit the input got the job's own pre-timeout signal: exit 10 (time limit), as in array mode
    assert results[f"{qid}_1"][7] == "10" and results[f"{qid}_1"][8] == "FAILED", logs
    assert 10 <= float(results[f"{qid}_1"][6]) - float(results[f"{qid}_1"][5]) <= 30
    assert stopped.exists(), logs
    assert (plan / "run" / "latelocal.00002").is_dir()
    timeout_reason = "".join(p.read_text() for p in (plan / "run" / "latelocal.00002").glob("*/reason"))
    assert "time limit" in timeout_reason, timeout_reason


def test_an_inputs_chain_run_in_its_own_shell_keeps_its_rows_records_and_names_to_itself(tmp_path):
    """One chain run by the input's shell (no fork, issue 55), over a job of three files: a program that reads
    its stdin takes no other file's row, the second file's failure fails the job (exit 7) after the third ran,
    each file has its begin and end in the timeline, the chain's rc and ending are recorded, and the spec's
    chain.env and the chain's own names are not left set for the job's later steps (its exit trap's log)."""
    prog = ["/bin/sh", "-c", 'cat > /dev/null; [ "$LEAK" = chain ] || exit 5; case "$0" in *r001*) exit 3 ;; esac; '
            'exec cp "$0" "$1"', "{input}", "{output}"]
    data = _spec(tmp_path, 3, prog, jobs__files_per_job=3)
    data["chain"]["env"] = {"LEAK": "chain"}
    plan = _plan(tmp_path, data)
    script = next((plan / "jobs").glob("*"))   # the one array's script, as _enqueue submits it
    text = script.read_text()
    assert "  hpcrun_chain_here || chains_rc=$?\n" in text
    # the job's exit trap says what the chain left set: nothing of the chain's own names
    said = '  log "job finished with exit code $rc"\n'
    assert said in text
    script.write_text(text.replace(said, '  log "job finished with exit code $rc; left:${LEAK:-}${stem:-}"\n'))
    qid = _enqueue(plan, 1)
    logs = _wait(_pilot(plan, "801"), 60)
    result = _results(plan)[f"{qid}_0"]
    assert result[7] == "7" and result[8] == "FAILED", logs
    run = plan / "run" / "latelocal.00001" / result[1]
    assert (run / "chains.tsv").read_text() == "0\t3\tfailed\n"
    # its status is the call's (chains.tsv above), its rows the input's own: neither is a file of its own (issue 55)
    assert not (run / "chains" / "0.rc").exists() and not (run / "inputs.tsv").exists()
    timeline = (run / "chains" / "0.timeline").read_text().split("\n")
    assert [w.split()[0] + w.split()[2] for w in timeline if w.startswith(("begin", "end"))] == [
        "beginr000", "endr000", "beginr001", "endr001", "beginr002", "endr002"], timeline
    assert [w.split()[3] for w in timeline if w.startswith("end")] == ["0", "3", "0"], timeline
    assert timeline[-2].startswith("stop ") and timeline[-2].endswith(" 3")
    assert sorted(p.name for p in (tmp_path / "out" / ".hpcrun-claims" / result[1]).iterdir()) == ["r000.out",
                                                                                                 "r002.out"]
    claims = "".join(p.read_text() for p in plan.glob("run/pilots/*/claims/*.log"))
    assert "job finished with exit code 7; left:\n" in claims, claims


def test_a_sites_own_chain_script_runs_as_a_process_of_its_own(tmp_path, monkeypatch):
    """Only hpcrun's chain script is written to be sourced (it returns, leaves the input's traps alone): a site's
    copy of it (a template override) runs forked, as before, so its exit and its traps stay its own."""
    site = tmp_path / "site-templates"
    site.mkdir()
    (site / "hpcrun-chain.sh.j2").write_text((templates_dir() / "hpcrun-chain.sh.j2").read_text())
    monkeypatch.setenv("HPCRUN_TEMPLATE_PATH", str(site))
    text = next((_plan(tmp_path, _spec(tmp_path, 1, COPY)) / "jobs").glob("*")).read_text()
    assert "hpcrun_chain_here" not in text
    assert "  HPCRUN_TASK_RANK=0 HPCRUN_TASK_COUNT=1 hpcrun_chain &\n" in text


@pytest.mark.parametrize("block", ["sourced", "forked"])
def test_a_sites_copy_of_the_job_template_still_gives_its_chain_rows_and_reads_its_status(tmp_path, monkeypatch,
                                                                                          block):
    """A site's copy of job.sh.j2 made before issue 55 spared inputs.tsv and chains/0.rc: its chains block calls the
    chain without ``chain_own`` (sourced, or forked as a process), which reads its rows from inputs.tsv and leaves its
    status in chains/0.rc. The plan then writes inputs.tsv, the chain writes its .rc, and the input runs and
    succeeds (before, it was recorded a success with nothing run, or failed as killed on every input)."""
    site = tmp_path / "site-templates"
    site.mkdir()
    text = (templates_dir() / "job.sh.j2").read_text()
    old = text.replace("local chain_here=1 chain_own=1 ", "local chain_here=1 ")
    old = old.replace('  if [ -n "$chain_here_rc" ]; then rc=$chain_here_rc; else read -r rc 2>/dev/null < '
                      '"$HPCRUN_RUNDIR/chains/$k.rc" || true; fi\n',
                      '  read -r rc 2>/dev/null < "$HPCRUN_RUNDIR/chains/$k.rc" || true\n')
    if block == "forked":
        assert "  hpcrun_chain_here || chains_rc=$?\n" in old
        old = old.replace("  hpcrun_chain_here || chains_rc=$?\n",
                          "  HPCRUN_TASK_RANK=0 HPCRUN_TASK_COUNT=1 hpcrun_chain &\n  CHAIN_PID=$!\n")
    assert old.count("chain_own") == 1 and "chain_here_rc; else read" not in old and old != text
    (site / "job.sh.j2").write_text(old)
    monkeypatch.setenv("HPCRUN_TEMPLATE_PATH", str(site))
    plan = _plan(tmp_path, _spec(tmp_path, 1, COPY))
    qid = _enqueue(plan, 1)
    logs = _wait(_pilot(plan, "811"), 60)
    result = _results(plan)[f"{qid}_0"]
    assert result[7] == "0" and result[8] == "COMPLETED", logs
    run = plan / "run" / "latelocal.00001" / result[1]
    assert (run / "inputs.tsv").is_file() and (run / "chains" / "0.rc").read_text() == "0\n", logs
    assert (run / "chains.tsv").read_text() == "0\t0\tok\n"
    assert [p.name for p in (tmp_path / "out" / ".hpcrun-claims" / result[1]).iterdir()] == ["r000.out"]


def test_an_inputs_chain_that_never_ran_in_its_shell_is_killed_not_failed(tmp_path, _mode):
    """The chain's script could not be read (gone from the shared filesystem): the chain run by the input's shell
    never ran, so it left no status; it counts as killed (14, retried elsewhere), as a forked chain that left no
    .rc does, not as a program that failed by itself (7)."""
    if _mode == "direct":
        pytest.skip("the job script's own call of the chain's script: a direct run reads no chain script")
    plan = _plan(tmp_path, _spec(tmp_path, 1, COPY))
    (plan / "bin" / "hpcrun-chain.sh").unlink()
    qid = _enqueue(plan, 1)
    logs = _wait(_pilot(plan, "812"), 60)
    result = _results(plan)[f"{qid}_0"]
    assert result[7] == "14", logs
    run = plan / "run" / "latelocal.00001" / result[1]
    assert (run / "chains.tsv").read_text() == "0\tmissing\tkilled\n", logs


def test_a_claims_inputs_run_the_chain_its_shell_read_once(tmp_path, _mode):
    """The claim's shell reads and parses the chain's steps once for all its inputs (issue 55): the first input's
    work removes the chain's script, and the claim's other inputs still run their chain; the inputs of a later claim,
    whose shell found no script, count as killed (14), as in the test above."""
    if _mode == "direct":
        pytest.skip("the job script's own call of the chain's script: a direct run reads no chain script")
    gone = ["/bin/sh", "-c", 'rm -f "$HPCRUN_PLAN_DIR/bin/hpcrun-chain.sh"; exec cp "$0" "$1"', "{input}", "{output}"]
    data = _spec(tmp_path, 12, gone)
    data["jobs"]["pilot"].update({"slots": 1, "input_time": "0.1s"})
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 12)
    logs = _wait(_pilot(plan, "813"), 60)
    results = _results(plan)
    assert len(results) == 12, logs
    slot_log = next((plan / "run" / "pilots").glob("*/claims/0.log")).read_text()
    claims = [line.split()[3:] for line in slot_log.splitlines() if line.startswith("# hpcrun claim ")]
    assert len(claims[0]) > 1, slot_log   # a claim of several inputs
    by_cid = {r[1]: r for r in results.values()}
    assert [by_cid[c][7] for c in claims[0]] == ["0"] * len(claims[0]), slot_log
    later = [by_cid[c][7] for claim in claims[1:] for c in claim if c in by_cid]
    assert later and set(later) == {"14"}, slot_log
    assert {r[0].rpartition("_")[0] for r in results.values()} == {qid}


def test_an_idle_pilot_leaves_within_a_second_of_the_campaigns_end(tmp_path):
    """A pilot that runs nothing, whose looks at the queue are already seconds apart (its naps grow after each
    miss), sees queue/stop within half a second and leaves (issue 55: the pilots stop at once), not at its next
    look or beat."""
    data = _spec(tmp_path, 1, COPY)
    data["jobs"]["pilot"].update({"slots": 1, "idle_release": "60s"})
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 1)
    proc = _pilot(plan, "814")
    deadline = time.monotonic() + 30
    while f"{qid}_0" not in _results(plan):
        assert time.monotonic() < deadline and proc.poll() is None, "the input never ended"
        time.sleep(0.1)
    time.sleep(4.5)   # misses 0.05 + 0.2 + 0.5 + 1 + 2 s apart: the next look is 5 s off, the beat 10 s after start
    (plan / "queue" / "stop").write_text("")
    stopped = time.monotonic()
    logs = _wait(proc, 30)
    assert time.monotonic() - stopped < 1.5, logs
    assert "the campaign is done" in logs, logs


@pytest.mark.parametrize("own", ["base.sh.j2", "_shell.j2", "job.sh.j2", "profile"])
def test_inputs_tsv_is_spared_only_with_hpcruns_own_job_templates(tmp_path, monkeypatch, own):
    """A site's copy of a job template (found first on the template path) or a template its profile names may run
    the chain as a process, which reads inputs.tsv: the plan then writes it for every input."""
    spared = '[ "$HPCRUN_NCHAINS" -eq 1 ] || printf \'%s\\n\' "$HPCRUN_TASK_ROWS" > "$HPCRUN_RUNDIR/inputs.tsv"'
    shipped = _dir(tmp_path / "shipped")
    text = next((_plan(shipped, _spec(shipped, 1, COPY)) / "jobs").glob("*")).read_text()
    assert spared in text
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    data = _spec(_dir(tmp_path / "copy"), 1, COPY)
    if own == "profile":
        (site / "mysite.yaml").write_text("name: mysite\nextends: local-test\ntemplate: mysite\n")
        (site / "templates" / "mysite.sh.j2").write_text('{% extends "job.sh.j2" %}\n')
        monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(site))
        data["site"] = {"profile": "mysite"}
    else:
        (site / "templates" / own).write_text((templates_dir() / own).read_text())
        monkeypatch.setenv("HPCRUN_TEMPLATE_PATH", str(site / "templates"))
    text = next((_plan(tmp_path / "copy", data) / "jobs").glob("*")).read_text()
    assert spared not in text and 'printf \'%s\\n\' "$HPCRUN_TASK_ROWS" > "$HPCRUN_RUNDIR/inputs.tsv"\n' in text


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_a_chain_that_reads_no_input_row_fails_rather_than_succeeding_with_nothing_run(tmp_path):
    """The chain script reads its rows from inputs.tsv unless the job's own call gives them: a file that is not
    there (a job template that did not write it) is no input at all, so the chain fails (3) and says why,
    instead of ending 0 with no program run."""
    plan = _plan(tmp_path, _spec(tmp_path, 1, COPY))
    run = tmp_path / "run"
    (run / "chains").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "HPCRUN_TASK_RANK": "0", "HPCRUN_TASK_COUNT": "1", "HPCRUN_RUNDIR": str(run),
           "HPCRUN_INPUT_DIR": "", "HPCRUN_WORKDIR": str(tmp_path), "HPCRUN_OUTDIR": str(tmp_path / "out")}
    proc = subprocess.run(["bash", str(plan / "bin" / "hpcrun-chain.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "chain 0 read no input row: nothing ran" in (run / "chains" / "0.log").read_text()
    assert (run / "chains" / "0.rc").read_text() == "3\n"


def test_the_queue_completes_an_enqueue_cut_short_and_cancels_waiting_tasks(tmp_path):
    q = Queue(tmp_path / "queue")
    q.make()
    (q.d("backlog") / ".L1").mkdir()   # cut short after its descriptor: one chunk published, one still staged
    (q.d("backlog") / ".L1" / "L1.1").write_text("2,5\n")
    (q.d("backlog") / "L1.0").write_text("0-1\n")
    (q.d("arrays") / "L1").write_text("script.sh\t60\ttag\t0-2,5\n")
    from .test_late_queue import _where
    assert q.waiting() == {"L1": {0, 1}}
    assert q.repair() == 1 and not (q.d("backlog") / ".L1").exists()
    assert _where(q.root) == {f"L1_{i}": 1 for i in (0, 1, 2, 5)}   # each file counted: none published twice
    assert q.repair() == 0
    q.cancel(["L1_2"])
    assert q.in_state("cancelled") == {"L1": {2}} and q.waiting() == {"L1": {0, 1, 5}}
    assert _indices("0-3,7%2") == [0, 1, 2, 3, 7] and _indices(None) == [0]


def test_the_lease_is_read_against_the_heartbeat_itself(tmp_path):
    q = Queue(tmp_path / "queue")
    q.make()
    (q.d("live") / "9").mkdir()
    beat = q.d("live") / "9" / "beat"
    beat.touch()
    os.utime(beat, (1, 1))          # a node whose clock is decades behind: not a silent pilot
    assert q.beat_changed("9", 1000.0) == 0.0
    assert q.beat_changed("9", 1100.0) == 100.0        # unchanged for 100 s of our clock
    os.utime(beat, (2, 2))
    assert q.beat_changed("9", 1200.0) == 0.0           # renewed


@pytest.mark.parametrize("change, key", [
    ({"jobs__nodes": 2}, "jobs.nodes"),
    ({"jobs__array": "never"}, "jobs.array"),
    ({"jobs__pilot": {"walltime": "00:01:30", "drain_margin": "60s"}}, "jobs.pilot.walltime"),
    ({"jobs__pilot": {"slots": 9}}, "jobs.pilot.slots"),
])
def test_what_cannot_be_bound_late_is_refused_with_its_key(tmp_path, change, key):
    data = _spec(tmp_path, 2, COPY)
    data["merge"] = {"command": ["/bin/true", "{output}", "{parts}"]}   # two nodes: two chains' parts
    for k, v in change.items():
        data["jobs"][k.split("__")[1]] = v
    with pytest.raises(InputError) as err:
        _plan(tmp_path, data)
    assert key in str(err.value), str(err.value)


def test_an_explicit_stage_out_cannot_be_bound_late(tmp_path):
    data = _spec(tmp_path, 2, COPY)
    data["burst_buffer"] = {"capacity": "1GB", "stage_out": [{"source": "logs", "destination": str(tmp_path),
                                                               "type": "directory"}]}
    with pytest.raises(InputError) as err:
        _plan(tmp_path, data)
    assert "burst_buffer.stage_out" in str(err.value) and "pilot's buffer ends" in str(err.value), str(err.value)


def test_a_pilot_buffer_holds_its_slots_and_its_claims_copy_in_and_out_with_sums(tmp_path):
    """The pilot asks for one #DW jobdw for its slots' inputs; no stage lines per input. Run by bash with the
    buffer's variable set (a directory here, the DataWarp emulation in tests/cluster), each claim copies its
    input into its share of the buffer and its output out, both summed; its share is gone when it ends. An
    input missing at its claim fails that input alone."""
    data = _spec(tmp_path, 6, COPY)
    data["burst_buffer"] = {"capacity": "auto", "stage_inputs": True, "stage_outputs": True}
    plan = _plan(tmp_path, data)
    pilot = (plan / "bin" / "hpcrun-pilot.sh").read_text()
    jobdw = [line for line in pilot.splitlines() if line.startswith("#DW")]
    assert len(jobdw) == 1 and jobdw[0].startswith("#DW jobdw capacity=") and "pool=" in jobdw[0], jobdw
    script = next((plan / "jobs").glob("*")).read_text()
    assert not [line for line in script.splitlines() if line.startswith("#DW")]
    manifest = yaml.safe_load((plan / "manifest.json").read_text())
    assert any("one buffer of" in n and "2 slot(s)" in n for n in manifest["notes"]), manifest["notes"]
    (tmp_path / "raw" / "r005.dat").unlink()   # gone from the filesystem after the plan
    qid = _enqueue(plan, 6)
    buffer = tmp_path / "bb" / "striped"
    buffer.mkdir(parents=True)
    logs = _wait(_pilot(plan, "601", DW_JOB_STRIPED=f"{buffer}/"))
    results = _results(plan)
    states = {k: r[8] for k, r in results.items()}
    assert states == {**{f"{qid}_{i}": "COMPLETED" for i in range(5)}, f"{qid}_5": "FAILED"}, logs
    assert results[f"{qid}_5"][7] == "3"
    _pilots(plan).records([qid], "")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.out")) == [f"r{i:03d}.out" for i in range(5)]
    assert (tmp_path / "out" / "r002.out").read_text() == "input 2\n"
    assert not list((buffer / "claims").iterdir()), "a claim's share of the buffer was left behind"
    import hashlib
    for k in range(5):
        rundir = plan / "run" / f"latelocal.{k + 1:05d}" / results[f"{qid}_{k}"][1]
        rows = [line.split("\t") for line in (rundir / "copies.tsv").read_text().splitlines()]
        assert [r[0] for r in rows] == ["in", "out"], rows
        src = tmp_path / "raw" / f"r{k:03d}.dat"
        assert rows[0][1] == str(src) and rows[0][2].startswith(f"{buffer}/claims/")
        assert rows[0][4] == "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
        assert rows[1][2] == str(tmp_path / "out" / ".hpcrun-claims" / results[f"{qid}_{k}"][1] / f"r{k:03d}.out")
        assert rows[1][4] == rows[0][4]    # the output is a copy of the input here
        cid = results[f"{qid}_{k}"][1]   # a claim's lines are in the log of the run of the script that ran it
        said = [line for log in (plan / "run" / "pilots" / "601" / "claims").glob("*.log")
                for line in log.read_text().splitlines() if f"hpcrun[{cid}]" in line]
        assert any("copied 1 input(s) into the pilot's buffer" in line for line in said), said


def test_run_tends_the_pilots_and_the_live_page_shows_them(tmp_path, fake_slurm):
    """`hpcrun run` on a fake scheduler (its pilot submission goes nowhere) while a pilot run by bash claims the
    inputs: the supervisor records each input from the queue, stops the pilot at the end, and the live page
    (headless Chromium) lists the pilot and its inputs while it runs."""
    from hpcrun.operate.supervision.supervise import run
    from hpcrun.report.web import summary

    from . import browser

    chain = ["/bin/sh", "-c", 'sleep 5; exec cp "$0" "$1"', "{input}", "{output}"]
    plan = _plan(tmp_path, _spec(tmp_path, 6, chain))
    pilots: List[subprocess.Popen] = []
    seen: Dict[str, object] = {}

    def between(rnd):
        if not pilots and Queue(plan / "queue").waiting():
            pilots.append(_pilot(plan, "900"))
        if "page" not in seen and (plan / "queue" / "live" / "900").exists() and \
                any(Queue(plan / "queue").claims(("live",))):
            seen["summary"] = summary(plan)
            seen["page"] = _live_page(plan)

    report = run(plan, interval=1, on_round=between, sleep=time.sleep, max_rounds=120)
    assert report.outcome == "finished", report
    logs = _wait(pilots[0], 60)
    assert "the campaign is done" in logs or "released" in logs or "pilot ends" in logs, logs
    assert len(list((tmp_path / "out").glob("*.out"))) == 6
    assert len(_results(plan)) == 6
    assert not list((plan / "queue" / "done").iterdir()), "a recorded commit was not folded"
    assert any("--job-name=latelocal.pilot" in a and "--array=0-2" in a for a in fake_slurm.args()), \
        fake_slurm.args()   # one array of pilots for 6 inputs of 2 slots (3 nodes), no per-input sbatch
    assert sum(1 for a in fake_slurm.args() if "--job-name=latelocal.pilot" in a) == 1
    live = seen["summary"]["pilots"]
    assert live["pilots"][0]["pilot"] == "900" and live["pilots"][0]["node"] == "n1", live
    assert (plan / "queue" / "stop").exists()
    reason = browser.why_not()
    if reason:
        pytest.skip(f"the live page was not opened: no headless browser ({reason})")
    assert seen["page"] == ("900", "n1"), seen["page"]


def _live_page(plan: Path):
    """The pilots' table of `hpcrun serve`'s page in headless Chromium, or None without one."""
    from hpcrun.report.web import make_server

    from . import browser
    if browser.why_not():
        return None
    import threading
    srv = make_server(plan, port=0, min_age=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    got = {}

    def check(page):
        assert not page.is_hidden("#pilots-part")
        cells = page.eval_on_selector_all("#pilots tr td", "tds => tds.map(t => t.textContent)")
        got["row"] = (cells[0], cells[1])
        assert "running" in cells[2], cells

    try:
        browser.open_page(f"http://127.0.0.1:{srv.server_address[1]}/", "dashboard-pilots.png", check)
    finally:
        srv.shutdown()
        srv.server_close()
    return got.get("row")


def test_pilots_claim_their_nodes_hinted_inputs_and_leave_the_others_to_their_node(tmp_path):
    """Locality hints (queue/near/<node>/<task>): two pilots on nodes n1 and n2 each run exactly the inputs
    hinted to their node; a hint that is stale (no such waiting task) costs nothing."""
    plan = _plan(tmp_path, _spec(tmp_path, 8, COPY))
    qid = _enqueue(plan, 8)
    q = Queue(plan / "queue")
    near = {f"{qid}_{i}": ("n1" if i % 2 else "n2") for i in range(8)}
    assert q.hint({**near, f"{qid}_99": "n1"}) == 9
    assert q.hint(near) == 8 and not (q.d("near") / "n1" / f"{qid}_99").exists()   # stale hints removed
    script = plan / "bin" / "hpcrun-pilot.sh"   # jobs.locality_wait of 10 min (the plan has no node cache)
    assert "\nsteal_s=0 " in script.read_text()
    script.write_text(script.read_text().replace("\nsteal_s=0 ", "\nsteal_s=600 "))
    a = _pilot(plan, "701", SLURMD_NODENAME="n1")
    b = _pilot(plan, "702", SLURMD_NODENAME="n2")
    logs = _wait(a) + _wait(b)
    results = _results(plan)
    assert len(results) == 8, logs
    for task, r in results.items():
        assert r[4] == near[task], (task, r, logs)   # the node that ran it is the one its cache is on


def test_a_first_round_asks_the_accounting_nothing(tmp_path, monkeypatch):
    """No pilot submitted yet nor seen in the queue: the round submits the pilots without asking the accounting
    for pilots of the campaign's name first (a tenth of a second before the first claim); once submitted, it asks."""
    import datetime as dt

    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/sh", "-c", 'exec cp "$0" "$1"', "{input}", "{output}"]))
    sched = _pilots(plan)
    inner = next(iter(sched.scheds.values()))
    asked: List[int] = []
    monkeypatch.setattr(inner, "records", lambda *a, **k: asked.append(1) or {})
    monkeypatch.setattr(inner, "submit", lambda *a, **k: "77")
    since = dt.datetime.now(dt.timezone.utc)
    first = sched.tend(since=since, settled=False, paused=False, spent=False, work=2)
    assert asked == [] and first.added == 1, first
    sched.tend(since=since, settled=False, paused=False, spent=False, work=2)
    assert asked == [1]



def test_the_round_that_finds_the_campaign_settled_stops_the_pilots_before_asking_the_accounting(tmp_path,
                                                                                                  monkeypatch):
    """Settled (nothing pending or in flight): the pilots are told to stop before the accounting is asked about
    them (its answer takes a tenth of a second on the test cluster, issue 55); a round with work again lifts the
    stop, before its question too."""
    import datetime as dt

    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/sh", "-c", 'exec cp "$0" "$1"', "{input}", "{output}"]))
    sched = _pilots(plan)
    inner = next(iter(sched.scheds.values()))
    stopped_when_asked: List[bool] = []
    monkeypatch.setattr(inner, "records", lambda *a, **k: stopped_when_asked.append(sched.q.d("stop").exists()) or {})
    monkeypatch.setattr(inner, "submit", lambda *a, **k: "77")
    since = dt.datetime.now(dt.timezone.utc)
    sched.tend(since=since, settled=False, paused=False, spent=False, work=2)   # submits: nothing to ask yet
    sched.tend(since=since, settled=True, paused=False, spent=False, work=0)
    sched.tend(since=since, settled=False, paused=False, spent=False, work=2)
    assert stopped_when_asked == [True, False]


def test_an_inputs_log_lines_carry_the_utc_second_they_were_written_in(tmp_path):
    """The job's log stamps are UTC whatever the node's zone (9 h east of Greenwich here), and a stamp worked out
    once a second (issue 55: no zone files read for every line) is never one an earlier second left behind: each
    input's first line is stamped at its start, its last at its end, 1.3 s later."""
    plan = _plan(tmp_path, _spec(tmp_path, 4, ["/bin/sh", "-c", 'sleep 1.3; cp "$0" "$1"', "{input}", "{output}"]))
    _enqueue(plan, 4)
    out = _wait(_pilot(plan, "501", TZ="JST-9"))   # a zone of its own, no zone file needed
    results = _results(plan)
    assert len(results) == 4, out
    lines = [line for p in plan.glob("run/pilots/*/claims/*.log") for line in p.read_text().splitlines()]

    def stamps(cid: str, words: str) -> List[float]:
        return [calendar.timegm(time.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%SZ"))
                for line in lines if f" hpcrun[{cid}]: {words}" in line]

    for r in results.values():
        cid, t0, t1 = r[1], float(r[5]), float(r[6])
        [first], [last] = stamps(cid, "job latelocal."), stamps(cid, "all steps succeeded")
        assert int(t0) - 1 <= first <= t0 + 0.5, (cid, first, t0, lines)   # the input may log before its t0
        assert int(t1) - 1 <= last <= t1 + 0.5 and last >= first + 1, (cid, last, t1, lines)


def test_a_released_tokens_file_is_never_written_by_the_next_claim(tmp_path):
    """A claim's begin makes its token a new file (a temporary renamed over it): the file a released claim's
    token was, which a fenced agent that stalled may still hold open, is neither written by the next pilot nor
    linked as its committed ``done/<task>``. Written in place, a stalled agent's late write would land in the
    next pilot's committed result (docs/late-binding.md, "A token cut short reads as not begun")."""
    plan = _plan(tmp_path, _spec(tmp_path, 1, COPY))
    qid = _enqueue(plan, 1)
    q = plan / "queue"
    for chunk in (q / "backlog").iterdir():
        chunk.unlink()
    old = "900.0.0\t0\tn9\t1.000000\t99\n"   # the fenced pilot's begin line, as a release leaves the token
    token = q / "ready" / f"{qid}_0"
    token.write_text(old)
    held = tmp_path / "held-open"   # the stalled agent's handle on that file
    os.link(token, held)
    out = _wait(_pilot(plan, "501"))
    done = q / "done" / f"{qid}_0"
    assert done.read_text().split("\t")[:3] == [f"{qid}_0", "501.0.0", "501"], out
    assert held.read_text() == old and held.stat().st_nlink == 1 and not os.path.samefile(held, done)


def test_the_log_stamp_is_made_again_when_its_second_is_past_and_kept_within_it(tmp_path):
    """``log_clock`` as the job script defines it: a stamp left by an earlier second (a claim's shell inherits
    its parent's) is made again, in UTC whatever TZ says; one of this second is kept (no zone file read)."""
    plan = _plan(tmp_path, _spec(tmp_path, 1, COPY))
    script = next((plan / "jobs").glob("*")).read_text()
    start = script.index("log_clock() {")
    helpers = script[start:script.index("\n", script.index("\nlog() {", start) + 1) + 1]
    code = helpers + (
        'set -euo pipefail\n'
        'hpcrun_log_second=1 hpcrun_log_stamp=STALE; log one\n'
        'hpcrun_log_second=$EPOCHSECONDS hpcrun_log_stamp=KEPT; log two\n')
    before = int(time.time())
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                          env={"TZ": "JST-9", "PATH": "/usr/bin:/bin"})
    one, two = proc.stderr.splitlines()
    stamp = calendar.timegm(time.strptime(one.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%SZ"))
    assert before <= stamp <= time.time() and one.endswith("hpcrun[local]: one"), proc.stderr
    assert two == "KEPT hpcrun[local]: two", proc.stderr   # unless the second turned between two commands
