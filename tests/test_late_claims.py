"""Claims of several inputs (issue 55): a slot takes as many short inputs as make about CLAIM_S of work and runs them
through one run of the job script, told one at a time; each input keeps its own record, exit, output and run
directory. The real pilot script and agent, run by bash on the queue as in tests/test_late_binding.py."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpcrun.backends.late import runs
from hpcrun.backends.late.agent import Agent
from hpcrun.backends.late.queue import Queue
from hpcrun.backends.late.runs import CLAIM_HEADER, shares

from .test_late_binding import _claimed, _enqueue, _pilot, _pilots, _plan, _results, _spec, _wait

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/pgrep"), reason="pgrep (procps) is needed")


def _ledgered(tmp_path: Path, script: str) -> list:
    """A chain that appends '<input> <claim id>' to a ledger hpcrun never writes, then runs ``script``."""
    book = tmp_path / "ledger"
    book.write_text("")
    return ["/bin/sh", "-c", 'printf "%s %s\\n" "$0" "$HPCRUN_JOB_ID" >> "$2"; ' + script, "{input}", "{output}",
            str(book)]


def _ledgered_dirs(tmp_path: Path, script: str, named: bool = True) -> list:
    """As ``_ledgered``, each line saying too whether the input found its work directory made ('made', 'none'): the
    chain names {workdir} ($3) where ``named``."""
    book = tmp_path / "ledger"
    book.write_text("")
    return ["/bin/sh", "-c", 'w=none; [ "$#" -lt 3 ] || [ ! -d "$3" ] || w=made; '
            'printf "%s %s %s\\n" "$0" "$HPCRUN_JOB_ID" "$w" >> "$2"; ' + script, "{input}", "{output}", str(book),
            *(["{workdir}"] if named else [])]


def _runs(tmp_path: Path) -> dict:
    out: dict = {}
    for line in (tmp_path / "ledger").read_text().splitlines():
        src, cid = line.split(" ")
        out.setdefault(Path(src).stem, []).append(cid)
    return out


def test_a_claim_runs_several_inputs_through_one_script_and_each_keeps_its_own_record(tmp_path):
    chain = _ledgered(tmp_path, 'case "$0" in *r003*) exit 5 ;; esac; sleep 0.05; exec cp "$0" "$1"')
    data = _spec(tmp_path, 12, chain)
    data["jobs"]["pilot"].update(slots=1, input_time="1s")
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 12)
    logs = _wait(_pilot(plan, "801"), 60)
    results = _results(plan)
    assert sorted(results) == sorted(f"{qid}_{i}" for i in range(12)), logs
    # several inputs a run of the script: 2 in the first claim (1 s expected), more once they took about 0.05 s
    scripts = _claims_run(plan, "801")
    assert len(scripts) <= 6, scripts
    # each input its own claim id, exit status and state: the one that failed did not fail the others
    assert len({r[1] for r in results.values()}) == 12
    assert results[f"{qid}_3"][7] == "7" and results[f"{qid}_3"][8] == "FAILED", logs
    assert {r[8] for t, r in results.items() if t != f"{qid}_3"} == {"COMPLETED"}, logs
    cpus = [sum(float(x) for x in r[9].split("+")) for r in results.values()]   # each input's, from `times`
    assert min(cpus) >= 0 and sum(cpus) > 0, cpus
    runs = _runs(tmp_path)
    assert sorted(runs) == [f"r{i:03d}" for i in range(12)] and all(len(v) == 1 for v in runs.values()), runs
    records = _pilots(plan).records([qid], "")
    assert records[f"{qid}_3"].state == "FAILED"
    assert "chain(s) failed" in (plan / "run" / "latelocal.00004" / records[f"{qid}_3"].raw_id / "reason").read_text()
    for i in range(12):
        rec = records[f"{qid}_{i}"]
        job = f"latelocal.{i + 1:05d}"
        assert (plan / "run" / job / rec.raw_id / "exit_code").read_text().strip() == ("7" if i == 3 else "0")
        assert runs[f"r{i:03d}"] == [rec.raw_id]   # the claim id the input ran under is the record's
    assert sorted(p.name for p in (tmp_path / "out").glob("*.out")) == [f"r{i:03d}.out" for i in range(12) if i != 3]


def test_a_fenced_claim_returns_its_inputs_begun_or_not_without_an_attempt(tmp_path):
    chain = _ledgered(tmp_path, 'sleep 3; exec cp "$0" "$1"')
    data = _spec(tmp_path, 2, chain)
    data["jobs"]["pilot"].update(slots=1, input_time="1s")   # a claim of 2 (2 s of work): one begun, one told later
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 2)
    q = Queue(plan / "queue")
    pilot = _pilot(plan, "802")
    _claimed(q, 2)
    deadline = time.monotonic() + 20
    while not (tmp_path / "ledger").read_text():   # the first input began (its chain wrote its line)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert len(_claims_run(plan, "802")) == 1   # one run holds both
    assert q.fence("802")
    logs = _wait(pilot, 30)
    assert _results(plan) == {}, logs
    assert sorted(q.release()) == [f"{qid}_0", f"{qid}_1"]
    assert {r.state for r in _pilots(plan).records([qid], "").values()} == {"PENDING"}
    runs = _runs(tmp_path)   # the first input's 3 s were cut by the fence; the other, never told to start, never ran
    assert len(runs) == 1 and list(runs.values()) == [["802.0.0"]], runs


def test_an_input_that_runs_long_sends_its_claims_other_inputs_to_another_slot(tmp_path, monkeypatch):
    monkeypatch.setattr("hpcrun.backends.late.layout.chunk_count", lambda _n: 1)   # one chunk: claims in order
    chain = _ledgered(tmp_path, 'case "$0" in *r000*) sleep 12 ;; esac; exec cp "$0" "$1"')
    data = _spec(tmp_path, 4, chain)
    data["jobs"]["pilot"].update(slots=2, input_time="1s")   # claims of 2 (2 s of work): [0 1] [2 3], the long first
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 4)
    logs = _wait(_pilot(plan, "803"), 60)
    results = _results(plan)
    assert {r[8] for r in results.values()} == {"COMPLETED"}, logs
    assert results[f"{qid}_0"][1] == "803.0.0", logs   # the long one began the claim of both
    # the other went back to the queue once the long one had run 0.5 s (GIVE_BACK_S: 4x the median of slot 1's
    # quick inputs is less): slot 1, free, ran it under a claim of its own, long before the long one ended
    assert results[f"{qid}_1"][3] == "1" and results[f"{qid}_1"][1] != "803.0.1", logs
    assert float(results[f"{qid}_1"][6]) < float(results[f"{qid}_0"][6]) - 6, logs
    assert all(len(v) == 1 for v in _runs(tmp_path).values())


def test_the_agent_reads_a_claims_rows_for_it_even_from_a_tagged_copy_of_the_script(tmp_path):
    """A submission's script may be a tagged copy in the queue (queue/arrays/<id>.sh): the agent still finds the
    plan (the script's HPCRUN_PLAN_DIR) and reads each job's rows at its place in tasks.tsv, so the claim's script
    runs no process to find them."""
    from hpcrun.backends.late.agent import Agent
    from hpcrun.backends.late.runs import TaskTable
    plan = _plan(tmp_path, _spec(tmp_path, 5, ["/bin/true"]))
    script = next((plan / "jobs").glob("*"))
    qid = _pilots(plan).submit(script, name="latelocal.tag1", array="0-4", text=script.read_text())
    agent = Agent(plan / "queue", "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    copy, _limit, found, _worker = agent._descriptor(qid)
    assert copy.endswith(f"queue/arrays/{qid}.sh") and found == str(plan)
    rows = (plan / "tasks.tsv").read_text().splitlines(keepends=True)
    table = TaskTable()
    assert [table.rows(found, i) for i in (0, 4, 2)] == [rows[0], rows[4], rows[2]]
    assert table.rows(found, 5) == "" and table.rows(str(tmp_path / "nowhere"), 0) == ""


def test_a_claim_whose_task_was_fenced_tells_its_script_to_start_nothing_more(tmp_path):
    """The agent's side of the fence, without timing: the claim's next input is told to start only while its task
    file is still in the pilot's directory; once the supervisor renamed the directory away, the agent says no
    ``go`` and stops (a racing input would start only to be killed at its ``begin``)."""
    import subprocess

    from hpcrun.backends.late.agent import Agent
    from hpcrun.backends.late.runs import Item, Running
    q = Queue(tmp_path / "q")
    q.make()
    me = q.d("live") / "p"
    me.mkdir()
    agent = Agent(q.root, "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    for fenced in (False, True):
        for task in ("L1_0", "L1_1"):
            (me / task).touch()
        proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        r = Running(0, proc, [Item("L1_0", "p.0.0", "0", ""), Item("L1_1", "p.0.1", "1", "")], 60, fed=1)
        if fenced:
            (me / "L1_1").unlink()   # what the fence's rename of live/p looks like from here
        agent.stopping = ""
        agent._next(r)
        assert proc.stdin is not None
        proc.stdin.close()
        said = proc.stdout.read().decode() if proc.stdout else ""
        proc.wait()
        assert said == ("" if fenced else "go\t1\n"), said
        assert bool(agent.stopping) == fenced


def test_a_jobs_rows_are_read_whole_however_many_inputs_it_has(tmp_path):
    """A job of many inputs (files_per_job) has rows beyond one 64 KiB read: every row is read, none dropped."""
    from hpcrun.backends.late.runs import TaskTable
    rows = [f"0\tjob.00001\t1\t/data/{'x' * 200}/{k:05d}.dat\t-\ts{k}\ts{k}.out\t-\t1\n" for k in range(1000)]
    rows += ["1\tjob.00002\t1\t/data/last.dat\t-\tlast\tlast.out\t-\t1\n"]
    (tmp_path / "tasks.tsv").write_text("".join(rows))
    (tmp_path / "tasks.idx").write_text(f"{0:020d}\n{sum(len(r) for r in rows[:1000]):020d}\n")
    table = TaskTable()
    assert table.rows(str(tmp_path), 0) == "".join(rows[:1000])
    assert table.rows(str(tmp_path), 1) == rows[1000]


def test_inputs_told_to_start_but_never_begun_go_back_when_the_script_dies(tmp_path):
    """The script of a claim of three dies after the first input's end, having been told to start the second: the
    second (told, never begun) and the third (never told) go back to ready/; nothing stays in the pilot's directory
    for the pilot's whole life."""
    import resource
    import subprocess

    from hpcrun.backends.late.agent import Agent
    from hpcrun.backends.late.runs import Item, Running
    q = Queue(tmp_path / "q")
    q.make()
    me = q.d("live") / "p"
    me.mkdir()
    agent = Agent(q.root, "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    for task in ("L1_0", "L1_1", "L1_2"):
        (me / task).touch()
    (q.d("done") / "L1_0").write_text("committed earlier\n")   # the first one's result, as its end made it
    (me / "L1_0").unlink()
    proc = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    status = os.waitpid(proc.pid, 0)[1]
    items = [Item("L1_0", "p.0.0", "0", ""), Item("L1_1", "p.0.1", "1", ""), Item("L1_2", "p.0.2", "2", "")]
    r = Running(0, proc, items, 60, fed=2, begun=1)
    agent._ended(r, status, resource.getrusage(resource.RUSAGE_SELF))
    assert sorted(os.listdir(q.d("ready"))) == ["L1_1", "L1_2"]
    assert [n for n in os.listdir(me) if "_" in n] == []


def _claims_run(plan, pilot):
    """The claims' headers in the pilot's slot logs (a run of the script each): the ids each ran."""
    return [line for log in (plan / "run" / "pilots" / pilot / "claims").glob("*.log")
            for line in log.read_text().splitlines() if line.startswith(CLAIM_HEADER)]



def test_slots_freed_together_take_one_claim_between_them(tmp_path, monkeypatch):
    """A pilot's free slots claim together: one claim (one split of a backlog chunk) dealt out between them, not a
    claim each, so slots freed at once start at once; fewer tasks than slots leave the other slots free."""
    q = Queue(tmp_path / "queue")
    q.make()
    agent = Agent(q.root, "p", "n1", 4, 1e12, 60, 10, 0, 5, 600, 10, "", tmp_path / "run")   # 10 s: one a claim
    asked, started = [], {}
    offer = [[f"L1_{i}" for i in range(4)], [], ["L1_4", "L1_5"]]
    monkeypatch.setattr(agent, "_claim", lambda n: asked.append(n) or offer.pop(0))
    monkeypatch.setattr(agent, "_start", lambda tasks, slot: started.update({slot: tasks}) or agent.running.update(
        {slot: object()}))
    agent._fill()
    assert asked == [4] and started == {s: [f"L1_{s}"] for s in range(4)}
    agent.running.clear()
    started.clear()
    agent._fill()   # nothing to claim: no slot started, the next look later
    assert asked == [4, 4] and started == {} and agent.next_look > time.monotonic()
    agent.next_look = 0
    agent.pace.recent.extend([0.1] * 5)   # inputs of 0.1 s: 20 a claim, 80 asked for four slots; two came, 40 for two
    offer.append([])
    agent._fill()
    assert asked == [4, 4, 80, 40] and started == {0: ["L1_4"], 1: ["L1_5"]}
    # a TERM while the claim is dealt out: the shares not started stay the pilot's, handed back as it leaves
    agent.running.clear()
    started.clear()
    agent.pace.recent.clear()
    offer.append(["L1_6", "L1_7", "L1_8"])

    def start_then_term(tasks, slot):
        started[slot], agent.running[slot], agent.stopping = tasks, object(), "cancelled (SIGTERM)"

    monkeypatch.setattr(agent, "_start", start_then_term)
    agent._fill()
    assert started == {0: ["L1_6"]}


def test_a_slot_that_ends_claims_at_once_not_a_nap_after_its_end(tmp_path, monkeypatch):
    """A pilot whose slots are all busy sets no nap: the slot that ends next claims as it ends (a look put off by a
    nap while every slot was busy held that slot up to the nap: 200 ms a wave of 3-s inputs)."""
    q = Queue(tmp_path / "queue")
    q.make()
    agent = Agent(q.root, "p", "n1", 2, 1e12, 60, 10, 0, 5, 600, 10, "", tmp_path / "run")
    started = {}
    monkeypatch.setattr(agent, "_claim", lambda n: ["L1_0"])
    monkeypatch.setattr(agent, "_start", lambda tasks, slot: started.update({slot: tasks}) or agent.running.update(
        {slot: object()}))
    agent.running.update({0: object(), 1: object()})
    agent._fill()   # every slot busy: nothing to look at until one ends
    assert agent.next_look == float("inf") and started == {}
    agent._freed(1)
    assert agent.next_look <= time.monotonic() and 1 not in agent.running
    agent._fill()
    assert started == {1: ["L1_0"]}


def test_a_claim_is_dealt_out_evenly_in_order():
    assert shares(["a", "b", "c", "d", "e"], 2) == [["a", "b", "c"], ["d", "e"]]
    assert shares(["a", "b"], 4) == [["a"], ["b"]]
    assert shares([], 3) == []


# the claim's script (its main shell): each wait for an input followed by 0.3 s, so the pilot's TERM, sent just
# after the input's, comes while the input's pid is still kept; each kill of a group signals, then fails (ESRCH)
# as on a group already gone
GONE = """case $0 in */jobs/*)
  wait() { builtin wait "$@"; local rc=$?; [ "$BASHPID" != "$$" ] || sleep 0.3; return "$rc"; }
  kill() { builtin kill "$@"; local rc=$?; [ "$BASHPID" != "$$" ] || [ "${1:-}" != -TERM ] || [ "${2:-}" != -- ] || rc=1
           return "$rc"; } ;;
esac
"""


@pytest.mark.parametrize("gone", [False, True], ids=["as-it-comes", "input-already-gone"])
def test_a_claim_stopped_by_a_term_leaves_no_empty_directory_of_an_input_that_ended(tmp_path, gone):
    """The claim's run removes its inputs' empty work directories once, at its end; a TERM (a cancel, the drain)
    ends it early, and still the inputs that ended leave none behind. The pilot stops the running input's group,
    then the claim's script: when the input is gone before the script's TERM trap signals it, the trap's kill
    finds no group, and under the script's ``set -e`` that failed kill ended the trap before it tidied (CI saw
    it). ``input-already-gone`` makes that certain (BASH_ENV, ``GONE``)."""
    env = {}
    if gone:
        (tmp_path / "gone.sh").write_text(GONE)
        env["BASH_ENV"] = str(tmp_path / "gone.sh")
    marker = tmp_path / "first"
    # the chain names {workdir} ($3): the plan makes its inputs' work directories
    chain = _ledgered_dirs(tmp_path, f'if mkdir "{marker}" 2>/dev/null; then exec cp "$0" "$1"; else sleep 60; fi')
    data = _spec(tmp_path, 2, chain)
    data["jobs"]["pilot"].update(slots=1, input_time="1s")   # both inputs in one claim, one after the other
    plan = _plan(tmp_path, data)
    _enqueue(plan, 2)
    pilot = _pilot(plan, "806", **env)
    deadline = time.monotonic() + 30
    while len((tmp_path / "ledger").read_text().splitlines()) < 2:   # the second input runs
        assert time.monotonic() < deadline and pilot.poll() is None, _wait(pilot, 5)
        time.sleep(0.1)
    os.killpg(pilot.pid, signal.SIGTERM)
    logs = _wait(pilot, 60)
    lines = [line.split(" ") for line in (tmp_path / "ledger").read_text().splitlines()]
    (_, first, made1), (_, second, made2) = lines
    assert first.rsplit(".", 1)[0] == second.rsplit(".", 1)[0], logs   # one claim: <pilot>.<slot>.<n>
    assert made1 == made2 == "made", lines   # each input found its work directory
    work = tmp_path / "out" / ".hpcrun-work"
    left = sorted(str(p.relative_to(work)) for p in work.glob("*/*")) if work.exists() else []
    assert not any(p.endswith("/" + first) for p in left), (left, logs)   # the input that ended: removed
    # (the input stopped keeps its own if the script's TERM comes before the input's end, else it ended too)
    assert set(left) <= {p for p in left if p.endswith("/" + second)}, (left, logs)


@pytest.mark.parametrize("named", [False, True], ids=["no-work-directory", "work-directory"])
def test_a_claim_stopped_by_a_term_removes_the_directories_it_made_for_inputs_never_started(tmp_path, named):
    """A TERM while the second input of a claim of many runs: the inputs never told to start (sent back to the
    queue) leave none of the directories the claim's one mkdir made for them (their run directories and their jobs',
    their private output directories, their work directories and their jobs' where the plan makes them); the
    inputs that began keep theirs."""
    marker = tmp_path / "quick"
    # three quick inputs (the first claim's two, and the first of the next), then one that runs until the TERM
    script = f'for m in 1 2 3; do mkdir "{marker}.$m" 2>/dev/null && exec cp "$0" "$1"; done; sleep 60'
    data = _spec(tmp_path, 200, _ledgered_dirs(tmp_path, script, named))
    data["jobs"]["pilot"].update(slots=1, input_time="1s")   # the second claim sized from the quick ones: many
    plan = _plan(tmp_path, data)
    _enqueue(plan, 200)
    pilot = _pilot(plan, "807")
    deadline = time.monotonic() + 30
    while len((tmp_path / "ledger").read_text().splitlines()) < 4:   # the second claim's second input runs
        assert time.monotonic() < deadline and pilot.poll() is None, _wait(pilot, 5)
        time.sleep(0.1)
    log = next((plan / "run" / "pilots" / "807" / "claims").glob("*.log"))
    claims = [line.split()[3:] for line in log.read_text().splitlines() if line.startswith("# hpcrun claim ")]
    os.killpg(pilot.pid, signal.SIGTERM)
    logs = _wait(pilot, 60)
    lines = [line.split(" ") for line in (tmp_path / "ledger").read_text().splitlines()]
    began = sorted(cid for _, cid, _ in lines)
    assert {made for *_, made in lines} == {"made" if named else "none"}, lines   # each input found it made, or none
    assert len(claims) == 2 and len(claims[1]) > 2 and set(began) < set(claims[0] + claims[1]), (claims, logs)
    runs = plan / "run"
    assert sorted(p.name for p in runs.glob("latelocal.*/*")) == began, logs
    assert len(list(runs.glob("latelocal.*"))) == 4, (sorted(runs.iterdir()), logs)   # their jobs' too
    assert sorted(p.name for p in (tmp_path / "out" / ".hpcrun-claims").iterdir()) == began, logs
    work = tmp_path / "out" / ".hpcrun-work"
    assert work.exists() is named, logs
    if named:   # the quick ones' removed as they ended, none left of those never started (the stopped one's: as it
        # came, kept if the script's TERM came first, removed if the input's end did)
        assert {p.name for p in work.glob("*/*")} <= {began[-1]} and len(list(work.iterdir())) <= 1, logs


@pytest.mark.parametrize("named", [False, True], ids=["unused", "named-by-the-chain"])
def test_a_work_directory_is_made_only_where_the_plan_uses_one(tmp_path, named):
    """Nothing but a merge's parts, staged inputs, a container or a command naming {workdir} uses an input's work
    directory: without them the claim makes none (two directories an input fewer to make and remove, issue 55).
    A chain that names it finds it made, and it is removed with the claim once empty."""
    check = 'ls -d -- "$3" > /dev/null || exit 9; : > "$3/scratch"; rm -- "$3/scratch"; ' if named else ""
    chain = [*_ledgered(tmp_path, check + 'exec cp "$0" "$1"'), *(["{workdir}"] if named else [])]
    data = _spec(tmp_path, 3, chain)
    data["jobs"]["pilot"].update(slots=1, input_time="1s")
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 3)
    logs = _wait(_pilot(plan, "809"), 60)
    results = _results(plan)
    assert sorted(results) == [f"{qid}_{i}" for i in range(3)], logs
    assert {r[8] for r in results.values()} == {"COMPLETED"}, logs
    script = next((plan / "jobs").glob("*")).read_text()
    assert ("/.hpcrun-work/" in script.split("claim_dirs+=(", 1)[1].split("\n", 1)[0]) is named
    work = tmp_path / "out" / ".hpcrun-work"
    assert work.exists() is named, logs   # made where named (its root stays), never made otherwise
    assert not named or list(work.rglob("*")) == [], logs   # and once empty, removed with the claim


def test_a_claim_started_as_the_pilot_is_stopped_starts_no_input(tmp_path):
    """A TERM between a claim's start and its first input: the script is told nothing to run, the claim's inputs go
    back to the queue (never started: no attempt) and the script's input is closed, so it ends."""
    import subprocess

    from hpcrun.backends.late.runs import Item, Running
    q = Queue(tmp_path / "q")
    q.make()
    me = q.d("live") / "p"
    me.mkdir()
    agent = Agent(q.root, "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    for task in ("L1_0", "L1_1"):
        (me / task).touch()
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    r = Running(0, proc, [Item("L1_0", "p.0.0", "0", ""), Item("L1_1", "p.0.1", "1", "")], 60)
    agent.stopping = "cancelled (SIGTERM): its claims return to the queue"
    agent._next(r)
    assert proc.stdin is not None and proc.stdin.closed and proc.wait(timeout=10) == 0   # its input closed: it ended
    assert proc.stdout is not None and proc.stdout.read() == b"" and r.fed == 0   # told no "go"
    assert sorted(os.listdir(q.d("ready"))) == ["L1_0", "L1_1"]


def _spy(tmp_path: Path, names: list) -> Path:
    """Programs of these names first on the pilot's PATH: each notes its call in ``calls``, then runs the real one."""
    spy = tmp_path / "spy"
    spy.mkdir()
    for name in names:
        (spy / name).write_text(f'#!/bin/sh\necho {name} >> {tmp_path}/calls\nexec /usr/bin/{name} "$@"\n')
        (spy / name).chmod(0o755)
    return spy


def test_the_agent_sums_each_inputs_outputs_and_the_job_starts_no_program_for_them(tmp_path):
    """Late binding writes outputs.tsv from the agent (a thread, no process per output): each output's size and
    sha256 as the test computes them from the claim's output, and neither stat nor sha256sum started by the job."""
    import hashlib
    chain = ["/bin/sh", "-c", 'cp "$0" "$1"; printf "%s\\n" "$HPCRUN_JOB_ID" >> "$1"', "{input}", "{output}"]
    data = _spec(tmp_path, 6, chain)
    data["jobs"]["pilot"].update(slots=2, input_time="1s")
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 6)
    spy = _spy(tmp_path, ["sha256sum", "stat"])
    logs = _wait(_pilot(plan, "811", PATH=f"{spy}:/usr/bin:/bin"), 60)
    results = _results(plan)
    assert sorted(results) == sorted(f"{qid}_{i}" for i in range(6)) and {r[8] for r in results.values()} == {
        "COMPLETED"}, logs
    for i in range(6):
        cid = results[f"{qid}_{i}"][1]
        out = tmp_path / "out" / ".hpcrun-claims" / cid / f"r{i:03d}.out"   # not placed: no supervisor here
        body = out.read_bytes()
        assert body.endswith(f"{cid}\n".encode())
        tsv = (plan / "run" / f"latelocal.{i + 1:05d}" / cid / "outputs.tsv").read_text()
        assert tsv == f"r{i:03d}.out\t{len(body)}\tsha256:{hashlib.sha256(body).hexdigest()}\n"
    assert not (tmp_path / "calls").exists(), (tmp_path / "calls").read_text()


def test_an_output_the_agent_cannot_record_fails_its_input(tmp_path, monkeypatch):
    """The sums' record cannot be written (its run directory is gone): the input fails (exit 3) with why. An output
    that cannot be read keeps its size, its sum left empty and why in checksums.log, as the job's programs would."""
    from hpcrun.backends.late.runs import Item, Running, Summer, outputs_tsv
    r, w = os.pipe()
    summer = Summer(w)
    summer.start("first", ["a.out"], str(tmp_path), str(tmp_path / "gone"), "sha256")
    _woken(r)
    seen: list = []
    summer.finished(lambda then, why: seen.append((then, why)))
    assert summer.pending == 0 and seen[0][0] == "first" and "could not be written" in seen[0][1], seen
    (tmp_path / "a.out").write_bytes(b"abc")
    assert outputs_tsv(["a.out", "missing.out"], str(tmp_path), "md5") == (
        "a.out\t3\tmd5:900150983cd24fb0d6963f7d28e17f72\n", "")

    def unreadable(path: str, algo: str) -> str:
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(runs, "file_sum", unreadable)
    text, errors = outputs_tsv(["a.out"], str(tmp_path), "md5")
    assert text == "a.out\t3\t\n" and errors == f"{tmp_path}/a.out: Permission denied\n"
    with pytest.raises(FileNotFoundError):
        outputs_tsv(["a.out"], str(tmp_path / "nowhere"), "md5")
    # the agent: a sum that could not be recorded fails its input, committed with exit 3
    q = Queue(tmp_path / "q")
    q.make()
    (q.d("live") / "p").mkdir()
    (q.d("live") / "p" / "L1_0").touch()
    agent = Agent(q.root, "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    run = Running(0, None, [], 60)   # type: ignore[arg-type]
    agent._summed((run, Item("L1_0", "p.0.0", "0", ""), 0, "COMPLETED", 1.0, "0+0", ""), "its record: no room")
    assert (q.d("done") / "L1_0").read_text().split("\t")[7:9] == ["3", "FAILED"]


def _woken(r: int) -> None:
    """The summer's wake byte, or the test fails (a lost sum must not hang the suite)."""
    assert select.select([r], [], [], 10)[0], "no sum came back within 10 s"
    assert os.read(r, 1) == b"s"


@pytest.mark.parametrize("begun", [False, True])
def test_the_sums_threads_are_kept_and_a_slow_sum_holds_no_other(tmp_path, monkeypatch, begun):
    """An input's sum goes to an idle thread of the agent (none started an input once they exist), or to a new one
    while the others are busy: an input whose outputs take long to sum holds back no other input's commit, whether
    the next sum comes before the slow one began or while it runs (``begun``)."""
    import threading

    from hpcrun.backends.late.runs import Summer
    r, w = os.pipe()
    summer = Summer(w)
    (tmp_path / "a.out").write_bytes(b"abc")
    seen: list = []
    for name in ("first", "second", "third"):
        summer.start(name, ["a.out"], str(tmp_path), str(tmp_path), "md5")
        _woken(r)
        summer.finished(lambda then, why: seen.append((then, why)))
        deadline = time.monotonic() + 5
        while summer.idle < 1:   # its thread says it is idle once it handed the sum over
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert seen == [("first", None), ("second", None), ("third", None)] and summer.idle == 1
    real, go, entered = runs.outputs_tsv, threading.Event(), threading.Event()

    def slow(names, outdir, algo):
        if names == ["slow.out"]:
            entered.set()
            go.wait(10)
        return real(names, outdir, algo)
    monkeypatch.setattr(runs, "outputs_tsv", slow)
    summer.start("slow", ["slow.out"], str(tmp_path), str(tmp_path), "md5")   # the idle thread takes it and waits
    if begun:
        assert entered.wait(10)
    summer.start("quick", ["a.out"], str(tmp_path), str(tmp_path), "md5")    # a new thread: not behind it
    _woken(r)
    summer.finished(lambda then, why: seen.append((then, why)))
    assert seen[-1] == ("quick", None) and summer.pending == 1
    go.set()
    _woken(r)
    summer.finished(lambda then, why: seen.append((then, why)))
    assert seen[-1][0] == "slow" and summer.pending == 0


def test_an_input_is_committed_only_once_its_outputs_record_is_written(tmp_path, monkeypatch):
    """The commit (the link into done/) comes after outputs.tsv, never before: a reader of a committed input finds
    its sums."""
    import threading

    from hpcrun.backends.late.runs import Item, Running
    q = Queue(tmp_path / "q")
    q.make()
    me = q.d("live") / "p"
    me.mkdir()
    (me / "L1_0").touch()
    plan, base = tmp_path / "plan", tmp_path / "out" / ".hpcrun-claims"
    (plan / "run" / "job.00001" / "p.0.0").mkdir(parents=True)
    (base / "p.0.0").mkdir(parents=True)
    (base / "p.0.0" / "s.out").write_bytes(b"abc")
    agent = Agent(q.root, "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    wake_r, wake_w = os.pipe()
    agent.summer.wake = wake_w
    agent.scripts["L1"] = ("script", 60, str(plan))
    go = threading.Event()
    real = runs.outputs_tsv
    monkeypatch.setattr(runs, "outputs_tsv", lambda *a: (go.wait(10), real(*a))[1])
    run = Running(0, None, [], 60, sums=("md5", str(base)))   # type: ignore[arg-type]
    item = Item("L1_0", "p.0.0", "0", "0\tjob.00001\t1\t/in/s.dat\t-\ts\ts.out\t-\t3\n")
    agent._settle(run, item, 0, "COMPLETED", 1.0, "0+0", "")
    time.sleep(0.2)
    assert not (q.d("done") / "L1_0").exists() and agent.summer.pending == 1   # summing: not committed
    go.set()
    assert os.read(wake_r, 1) == b"s"
    agent.summer.finished(agent._summed)
    tsv = (plan / "run" / "job.00001" / "p.0.0" / "outputs.tsv").read_text()
    assert tsv == "s.out\t3\tmd5:900150983cd24fb0d6963f7d28e17f72\n"
    assert (q.d("done") / "L1_0").read_text().split("\t")[7:9] == ["0", "COMPLETED"]


@pytest.mark.parametrize("algo,program", [("md5", "md5sum"), ("sha256", "sha256sum"), ("adler32", "xrdadler32")])
def test_the_agents_sums_are_the_programs_sums(tmp_path, algo, program):
    """What the job's programs print for a file of several MiB (the agent reads 1 MiB at a time)."""
    import shutil
    import subprocess

    from hpcrun.backends.late.runs import file_sum
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed")
    path = tmp_path / "data"
    path.write_bytes(os.urandom(3 * (1 << 20) + 12345))
    said = subprocess.run([program, str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    assert file_sum(str(path), algo) == said.lower()


def test_a_pilot_done_for_good_commits_the_input_whose_outputs_it_still_sums(tmp_path):
    """The campaign's end comes while the last input's output (64 MiB) is being summed: the pilot commits it before
    it leaves, rather than hand it back to run again."""
    stop = tmp_path / "plan" / "queue" / "stop"   # the campaign's end, said by the queue as the supervisor says it
    # the end said first, and seen by the pilot before the input ends (its free slot finds nothing to claim)
    chain = ["/bin/sh", "-c", 'touch "$1" && sleep 3 && head -c 67108864 /dev/zero > "$0"', "{output}", str(stop)]
    plan = _plan(tmp_path, _spec(tmp_path, 1, chain))
    qid = _enqueue(plan, 1)
    logs = _wait(_pilot(plan, "812"), 60)
    assert [r[8] for r in _results(plan).values()] == ["COMPLETED"], logs
    cid = _results(plan)[f"{qid}_0"][1]
    zeros = "3b6a07d0d404fab4e23b6d34bc6696a6a312dd92821332385e5af7c01c421351"   # sha256 of 64 MiB of zero bytes
    tsv = (plan / "run" / "latelocal.00001" / cid / "outputs.tsv").read_text()
    assert tsv == f"r000.out\t67108864\tsha256:{zeros}\n"


@pytest.mark.parametrize("ready", ["ready\tsums\tmd5,sha256", "ready", "ready\tsums\tmd5"])
def test_a_script_sums_its_outputs_itself_unless_the_agent_says_it_will(tmp_path, ready):
    """The job script leaves the sums to an agent that says ``ready sums`` with its algorithm; told only ``ready`` (an
    agent of an older hpcrun, which would ignore ``sums``), or an agent that does not know its algorithm, each input
    writes its own outputs.tsv, as before."""
    import hashlib
    import subprocess

    from hpcrun.backends.late.runs import TaskTable
    plan = _plan(tmp_path, _spec(tmp_path, 1, ["/bin/cp", "{input}", "{output}"]))
    rows = TaskTable().rows(str(plan), 0)
    feed_r, feed_w = os.pipe()
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "HPCRUN_CLAIM_FEED": str(feed_w), "SLURMD_NODENAME": "n1"}
    proc = subprocess.run(["bash", str(next((plan / "jobs").glob("*")))], pass_fds=(feed_w,), env=env,
                          input=f"item\tL1_0\t0\tp.0.0\t{rows.count(chr(10))}\n{rows}{ready}\ngo\t0\n", text=True,
                          capture_output=True, timeout=60)
    os.close(feed_w)
    said = os.read(feed_r, 65536).decode()
    assert proc.returncode == 0 and "\nend\t0\t0\t" in "\n" + said, proc.stderr + said
    tsv = plan / "run" / "latelocal.00001" / "p.0.0" / "outputs.tsv"
    if "sha256" not in ready:
        body = (tmp_path / "out" / ".hpcrun-claims" / "p.0.0" / "r000.out").read_bytes()
        assert tsv.read_text() == f"r000.out\t{len(body)}\tsha256:{hashlib.sha256(body).hexdigest()}\n"
        assert "sums\t" not in said
    else:
        assert not tsv.exists()
        assert said.startswith(f"sums\tsha256\t{tmp_path}/out/.hpcrun-claims\n"), said


def test_an_input_whose_rows_the_agent_could_not_read_sums_its_own_outputs(tmp_path):
    """The agent cannot read the plan's rows (tasks.idx gone): the script finds them itself, and sums its outputs
    itself too; the inputs succeed with their sums."""
    import hashlib
    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/cp", "{input}", "{output}"]))
    qid = _enqueue(plan, 2)
    (plan / "tasks.idx").unlink()
    logs = _wait(_pilot(plan, "813"), 60)
    results = _results(plan)
    assert sorted(results) == [f"{qid}_0", f"{qid}_1"] and {r[8] for r in results.values()} == {"COMPLETED"}, logs
    for i in range(2):
        cid = results[f"{qid}_{i}"][1]
        body = (tmp_path / "out" / ".hpcrun-claims" / cid / f"r{i:03d}.out").read_bytes()
        tsv = (plan / "run" / f"latelocal.{i + 1:05d}" / cid / "outputs.tsv").read_text()
        assert tsv == f"r{i:03d}.out\t{len(body)}\tsha256:{hashlib.sha256(body).hexdigest()}\n"


class _Script:
    """A claim's script as the agent sees it, without a process: what it is told, and that it runs."""

    class _Stdin:
        def __init__(self) -> None:
            self.said, self.closed = b"", False

        def write(self, data: bytes) -> None:
            self.said += data

        def flush(self) -> None:
            pass

        def close(self) -> None:   # the script's last input: it ends
            self.closed = True

    def __init__(self) -> None:
        self.stdin = self._Stdin()

    def poll(self):
        return None


def _agent_with_claim(tmp_path: Path, tasks: list):
    from hpcrun.backends.late.runs import Item, Running
    for d in ("live/p", "ready", "cancel"):
        (tmp_path / "queue" / d).mkdir(parents=True, exist_ok=True)
    for t in tasks:
        (tmp_path / "queue" / "live" / "p" / t).write_text("")
    agent = Agent(tmp_path / "queue", "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    run = Running(0, _Script(), [Item(t, f"p.0.{i}", str(i), "") for i, t in enumerate(tasks)], 3600)  # type: ignore
    return agent, run


def test_an_inputs_time_in_a_claim_counts_from_the_end_of_the_one_before(tmp_path, monkeypatch):
    """The claim's size is judged from what each input takes of it: the loop's turn since the input before ended,
    not only its own run (at most 1 s of that, for a pilot that was stopped); the first input of a claim from its
    own start (the script's start, paid once a claim, would keep claims of one input small)."""
    agent, run = _agent_with_claim(tmp_path, ["q_0", "q_1", "q_2"])
    monkeypatch.setattr(agent, "_settle", lambda *a: None)   # the commit: not what is measured here
    monkeypatch.setattr(agent, "_next", lambda r: None)
    for n, (t0, t1) in enumerate([(100.3, 100.4), (100.45, 100.55), (102.0, 102.1)]):
        run.items[n].t0, run.at = t0, n
        agent._end(run, 0, t1, "")
    assert [round(x, 3) for x in agent.pace.recent] == [0.1, 0.15, 1.1]
    assert run.last_end == 102.1


@pytest.mark.parametrize("ran_s, told", [(1.4, True), (1.6, False)])
def test_a_claim_that_ran_one_and_a_half_times_its_share_sends_the_rest_back(tmp_path, ran_s, told):
    """A claim sized from a median that the machine's load makes too low still gives up its inputs not begun
    after 1.5 x CLAIM_S, so a long input at its end does not wait behind it (the tail case)."""
    from hpcrun.backends.late.runs import CLAIM_S
    agent, run = _agent_with_claim(tmp_path, ["q_0", "q_1", "q_2"])
    run.fed, run.batch_t0 = 1, time.monotonic() - ran_s * CLAIM_S
    agent._next(run)
    ready = sorted(p.name for p in (tmp_path / "queue" / "ready").iterdir())
    said = run.proc.stdin.said.decode()
    if told:
        assert said == "go\t1\n" and ready == [] and run.fed == 2 and not run.proc.stdin.closed
    else:
        assert said == "" and ready == ["q_1", "q_2"] and [i.task for i in run.items] == ["q_0"]
        assert run.proc.stdin.closed



def test_a_running_input_gives_its_claims_rest_back_after_four_medians_and_at_least_half_a_second(tmp_path):
    from hpcrun.backends.late.runs import GIVE_BACK_S
    agent, run = _agent_with_claim(tmp_path, ["q_0", "q_1", "q_2"])
    run.at, run.fed, run.began = 0, 1, 1000.0
    agent.pace.recent.extend([0.01] * 5)
    assert agent.pace.give_back_at(run) == 1000.0 + GIVE_BACK_S == 1000.5   # short inputs: the floor
    agent.pace.recent.clear()
    agent.pace.recent.extend([1.0] * 5)
    assert agent.pace.give_back_at(run) == 1004.0
    run.fed = 3   # every input told to start: nothing to give back
    assert agent.pace.give_back_at(run) == float("inf")
    run.fed, run.at = 1, -1   # none running
    assert agent.pace.give_back_at(run) == float("inf")


def test_a_reaped_scripts_pid_is_signalled_only_as_a_group(monkeypatch):
    """Once a claim's script was reaped its pid (and its input's) may be another process's: the pilot's way out
    signals what is left of their groups, never that pid alone."""
    def no_group(pid, sig):
        raise ProcessLookupError()

    proc = subprocess.Popen(["true"])
    sent = []
    monkeypatch.setattr(runs.os, "killpg", no_group)
    monkeypatch.setattr(runs.os, "kill", lambda pid, sig: sent.append(pid))
    r = runs.Running(0, proc, [runs.Item("q_0", "p.0.0", "0", "")], 60)
    r.at, r.items[0].pid = 0, 424242
    r.stop(signal.SIGKILL)          # not reaped yet: each is known to be the one meant
    assert sent == [424242, proc.pid]
    proc.wait()
    sent.clear()
    r.stop(signal.SIGKILL)
    assert sent == []


def test_a_wait_status_reads_as_subprocess_gives_it():
    """runs.exit_status (os.waitstatus_to_exitcode is Python 3.9's; a node may have 3.7): an exit code as it is,
    a signal's death as minus the signal."""
    for argv, kill, want in ((["sh", "-c", "exit 3"], False, 3), (["sleep", "30"], True, -9)):
        proc = subprocess.Popen(argv)
        if kill:
            proc.kill()
        _pid, status = os.waitpid(proc.pid, 0)
        assert runs.exit_status(status) == want, (argv, status)


def test_a_leaving_pilot_hands_its_claims_back_or_leaves_whatever_the_rename_says(tmp_path):
    """runs.hand_back, a pilot's last step: its directory renamed to fenced/ as a whole when it holds a claim (how
    many), removed when it holds none, and a rename the filesystem refuses (here: a directory in the way that is
    not empty) leaves it where it is, for the supervisor to fence, without raising on the agent's way out."""
    me, fenced = tmp_path / "live" / "p1", tmp_path / "fenced" / "p1"
    me.mkdir(parents=True)
    (tmp_path / "fenced").mkdir()
    (me / "Lq_1").write_text("")
    (me / "beat").write_text("")
    assert runs.hand_back(me, fenced, (".take.", ".rest.")) == 1 and (fenced / "Lq_1").exists() and not me.exists()
    me.mkdir()
    (me / "Lq_2").write_text("")
    assert runs.hand_back(me, fenced, (".take.", ".rest.")) is None   # fenced/p1 is there, not empty
    assert (me / "Lq_2").exists()
    (me / "Lq_2").unlink()
    assert runs.hand_back(me, fenced, (".take.", ".rest.")) is None and not me.exists()
