"""The late-binding protocol's windows (issue 54), each tried on the real pilot run by bash.

Every "once" here is counted from a ledger the inputs' own command writes (each run appends its input and
claim id; each output carries the claim id that made it), never from hpcrun's queue or store: a second run,
or an output replaced after its input's commit, shows there whatever hpcrun's records say.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from hpcrun.backends.late import queue as pilot_queue
from hpcrun.backends.late.queue import Queue

from .test_late_binding import _enqueue, _pilot, _pilots, _plan, _results, _spec, _wait

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/pgrep"), reason="pgrep (procps) is needed")


def _ledgered(root: Path, sleep: float = 0.3) -> List[str]:
    """A chain that appends '<input> <claim id>' to root/ledger and writes the claim id into its output."""
    return ["/bin/sh", "-c", 'sleep "$0"; printf "%s %s\\n" "$1" "$HPCRUN_JOB_ID" >> "$3"; '
            'printf "%s\\n" "$HPCRUN_JOB_ID" > "$2"', str(sleep), "{input}", "{output}", str(root / "ledger")]


def _ledger(root: Path) -> Dict[str, List[str]]:
    """input stem -> the claim ids that ran it, from the inputs' own ledger."""
    runs: Dict[str, List[str]] = {}
    path = root / "ledger"
    for line in (path.read_text().splitlines() if path.exists() else []):
        src, cid = line.split(" ")
        runs.setdefault(Path(src).stem, []).append(cid)
    return runs


def _until(check, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


STALL = """
# the pilot's agent, stalled at its first commit: its link of a result into done/ stops the agent itself
# (SIGSTOP, as a process stuck on a hung filesystem call) until SIGCONT
import os, signal, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hpcrun_pilot_real as agent
real_link = os.link
def link(src, dst, *a, **k):
    flag = os.environ["HPCRUN_TEST_FLAG"]
    if "/queue/done/" in str(dst) and not os.path.exists(flag):
        os.mkdir(flag)
        with open(os.path.join(flag, "pid"), "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return real_link(src, dst, *a, **k)
os.link = link
sys.exit(agent.main())
"""


def _stalling(plan: Path) -> None:
    """The plan's agent replaced by one that stalls at its first commit (the real one imported, unchanged)."""
    real = plan / "bin" / "hpcrun-pilot.py"
    (plan / "bin" / "hpcrun_pilot_real.py").write_text(real.read_text())
    real.write_text(STALL)


def test_a_pilot_stalled_at_its_commit_and_fenced_never_places_an_output(tmp_path):
    """Pilot 701 stops at its commit's link; the supervisor fences it and returns its claim; pilot 702 runs the
    input again and commits; 701 then wakes. The output in place is 702's, the record names 702's claim."""
    plan = _plan(tmp_path, _spec(tmp_path, 1, _ledgered(tmp_path)))
    qid = _enqueue(plan, 1)
    _stalling(plan)
    flag = tmp_path / "stalled"
    stalled = _pilot(plan, "701", HPCRUN_TEST_FLAG=str(flag))
    _until(lambda: (flag / "pid").exists() and (flag / "pid").read_text().strip(), what="the stalled commit")
    mv_pid = int((flag / "pid").read_text())
    (plan / "bin" / "hpcrun-pilot.py").write_text((plan / "bin" / "hpcrun_pilot_real.py").read_text())
    q = Queue(plan / "queue")
    assert q.fence("701") and q.release() == [f"{qid}_0"]        # its lease expired: claim returned
    logs = _wait(_pilot(plan, "702"), 60)
    records = _pilots(plan).records([qid], "")
    assert records[f"{qid}_0"].state == "COMPLETED", logs
    winner = records[f"{qid}_0"].raw_id
    assert winner.startswith("702."), winner
    os.kill(mv_pid, signal.SIGCONT)                              # the stalled pilot wakes
    logs += _wait(stalled, 60)
    _pilots(plan).records([qid], "")
    runs = _ledger(tmp_path)
    assert len(runs["r000"]) == 2 and runs["r000"][1] == winner, runs   # ran twice, by 701 then 702
    assert (tmp_path / "out" / "r000.out").read_text().strip() == winner, logs   # never replaced by 701's
    assert _results(plan)[f"{qid}_0"][1] == winner


def test_an_output_that_cannot_be_moved_fails_its_input_and_is_kept(tmp_path):
    """A committed claim whose output cannot be moved into place (a directory of its name is in the way, as a
    quota or a full disk would refuse it): its input fails with exit 12, the output stays in the claim's
    directory; the other inputs are placed."""
    plan = _plan(tmp_path, _spec(tmp_path, 2, _ledgered(tmp_path, 0.1)))
    qid = _enqueue(plan, 2)
    (tmp_path / "out" / "r000.out" / "keep").mkdir(parents=True)   # in the way of r000.out
    logs = _wait(_pilot(plan, "801"))
    assert len(_results(plan)) == 2, logs
    records = _pilots(plan).records([qid], "")
    bad, good = records[f"{qid}_0"], records[f"{qid}_1"]
    assert bad.state == "FAILED" and bad.exit_code == "12:0", bad
    assert "could not be moved into place" in bad.reason and ".hpcrun-claims" in bad.reason, bad.reason
    kept = tmp_path / "out" / ".hpcrun-claims" / bad.raw_id / "r000.out"
    assert kept.read_text().strip() == bad.raw_id                 # never deleted
    assert good.state == "COMPLETED" and (tmp_path / "out" / "r001.out").read_text().strip() == good.raw_id
    # read again: the same answer, nothing moved or lost meanwhile
    assert _pilots(plan).records([qid], "")[f"{qid}_0"].state == "FAILED" and kept.exists()
    from hpcrun.model.failures import classify
    assert classify("FAILED", 12) == "placement"


def test_a_pilot_terminated_during_a_claim_stops_its_slots_and_hands_its_claims_back(tmp_path):
    """SIGTERM to the pilot's own shell while its two slots run claims: it exits only once its slots are gone
    (none can claim after it looked at what it holds), its directory goes to fenced/ with both claims, and the
    supervisor's release returns them: every input is somewhere."""
    data = _spec(tmp_path, 5, _ledgered(tmp_path, 4))
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 5)
    q = Queue(plan / "queue")
    pilot = _pilot(plan, "901")
    # both begun: a claim still being started when the TERM comes goes straight back to ready/ (never begun)
    _until(lambda: sum(1 for c in q.claims(("live",)) if c.start) == 2, what="two claims begun")
    os.kill(pilot.pid, signal.SIGTERM)                            # the batch shell alone, not its group
    logs = _wait(pilot, 30)
    left = subprocess.run(["pgrep", "-s", str(pilot.pid), "-f", "hpcrun-pilot|hpcrun_late_direct"], capture_output=True,
                          text=True)
    assert left.stdout.strip() == "", f"slots outlived their pilot: {left.stdout}\n{logs}"
    assert not (q.d("live") / "901").exists() and (q.d("fenced") / "901").is_dir(), logs
    time.sleep(5)   # the stopped claims' chains would have ended by now: none wrote on
    assert _ledger(tmp_path) == {}, _ledger(tmp_path)
    returned = q.release()
    # the two begun, and any claimed with them and not begun (claims of several, run direct): all it handed back
    assert len(returned) >= 2 and f"its {len(returned)} claim(s) handed back" in logs, (returned, logs)
    from .test_late_queue import _where
    assert _where(q.root) == {f"{qid}_{i}": 1 for i in range(5)}, (_where(q.root), logs)   # each waits, once
    logs += _wait(_pilot(plan, "902"), 90)   # every input then runs once, each output its committed claim's
    records = _pilots(plan).records([qid], "")
    runs = _ledger(tmp_path)
    assert sorted(runs) == [f"r{i:03d}" for i in range(5)] and all(len(v) == 1 for v in runs.values()), runs
    for i in range(5):
        assert (tmp_path / "out" / f"r{i:03d}.out").read_text().strip() == records[f"{qid}_{i}"].raw_id


@pytest.mark.parametrize("domain", ["", ".cluster.example.org"])
def test_locality_hints_are_taken_on_fully_qualified_node_names(tmp_path, domain):
    """The cache index names nodes by their short name; a site whose nodes report n1.cluster.example.org still
    has its hints taken (each pilot runs exactly its node's hinted inputs)."""
    plan = _plan(tmp_path, _spec(tmp_path, 6, _ledgered(tmp_path, 0.1)))
    qid = _enqueue(plan, 6)
    q = Queue(plan / "queue")
    near = {f"{qid}_{i}": ("n1" if i % 2 else "n2") for i in range(6)}
    assert q.hint(near) == 6
    script = plan / "bin" / "hpcrun-pilot.sh"
    script.write_text(script.read_text().replace("\nsteal_s=0 ", "\nsteal_s=600 "))
    a = _pilot(plan, "701", SLURMD_NODENAME=f"n1{domain}")
    b = _pilot(plan, "702", SLURMD_NODENAME=f"n2{domain}")
    logs = _wait(a) + _wait(b)
    results = _results(plan)
    assert len(results) == 6, logs
    for task, r in results.items():
        assert r[4] == near[task] + domain, (task, r, logs)


def _comma_locale(root: Path) -> Path:
    out = root / "locales"
    out.mkdir()
    made = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(out / "de_DE.UTF-8")],
                          capture_output=True, text=True)
    probe = subprocess.run(["bash", "-c", "echo $EPOCHREALTIME"], capture_output=True, text=True,
                           env={"LOCPATH": str(out), "LC_ALL": "de_DE.UTF-8", "PATH": "/usr/bin:/bin"})
    if made.returncode not in (0, 1) or "," not in probe.stdout:
        pytest.skip(f"no locale with a decimal comma could be made here (localedef: {made.stderr.strip()[:200]})")
    return out


def test_a_pilot_in_a_decimal_comma_locale_records_times_python_reads(tmp_path):
    """LC_ALL=de_DE.UTF-8 on the node: bash's $EPOCHREALTIME then says 1795882445,128100. The records still
    carry times and elapsed seconds, and every input is read."""
    locales = _comma_locale(tmp_path)
    plan = _plan(tmp_path, _spec(tmp_path, 2, _ledgered(tmp_path, 0.3)))
    qid = _enqueue(plan, 2)
    logs = _wait(_pilot(plan, "711", LOCPATH=str(locales), LC_ALL="de_DE.UTF-8"))
    records = _pilots(plan).records([qid], "")
    assert {r.state for r in records.values()} == {"COMPLETED"}, logs
    for r in records.values():
        assert r.elapsed_s is not None and 0.3 <= r.elapsed_s < 30 and r.start, r
    for r in _results(plan).values():
        assert "," not in r[5] + r[6], r


def test_a_slot_tries_different_waiting_tasks_whatever_their_number(tmp_path):
    """Twenty waiting tasks, nineteen of them hinted to another node: a claim tries eight different ones from a
    random place, so it finds the free one about two times in five (a stride that tried the same name again, as
    ``(k + tries * 7) % n`` did when n was a multiple of 7, finds it one time in twenty)."""
    from hpcrun.backends.late.agent import Agent
    q = Queue(tmp_path / "q")
    q.make()
    (q.d("live") / "p").mkdir()
    agent = Agent(q.root, "p", "n1", 1, 1e12, 60, 10, 0, 5, 600, 1, "", tmp_path / "run")
    found = 0
    for _ in range(200):
        for i in range(20):
            (q.d("ready") / f"L1_{i}").touch()
        agent.flags["hinted"] = {f"L1_{i}" for i in range(20) if i != 5}
        got = agent._claim(1)
        assert got in ([], ["L1_5"])
        found += got == ["L1_5"]
        for name in os.listdir(q.d("ready")) + ["L1_5"]:
            (q.d("ready") / name).unlink(missing_ok=True)
            (q.d("live") / "p" / name).unlink(missing_ok=True)
    assert 50 <= found <= 110, found   # 8 of 20 tried: 80 expected


def _committed_claim(root: Path, cid: str, state: str = "COMPLETED") -> Queue:
    """A queue whose task L1_0 was committed by claim ``cid`` (its outputs not yet placed)."""
    q = Queue(root / "queue")
    q.make()
    (q.d("done") / "L1_0").write_text("\t".join(["L1_0", cid, "p", "0", "n1", "1.0", "2.0", "0", state, "", ""]) + "\n")
    return q


def _claim_dir(outputs: Path, cid: str) -> Path:
    private = outputs / ".hpcrun-claims" / cid
    (private / "qa-failed").mkdir(parents=True)
    (private / "a.out").write_text(cid)
    (private / "qa-failed" / "b.out").write_text(cid)
    return private


def test_two_readers_placing_the_same_claim_both_see_it_placed(tmp_path, monkeypatch):
    """`hpcrun status` and the supervisor may read at once: a reader whose move finds the file already moved by
    the other counts it as moved, and a mark once written stands."""
    out = tmp_path / "out"
    q = _committed_claim(tmp_path, "p.0.0")
    _claim_dir(out, "p.0.0")
    q.remember(str(out))
    real = os.replace
    other: Dict[str, List[str]] = {}

    def replace(src, dst):
        if not other:   # the first move of reader A: reader B reads (and places) the whole claim first
            monkeypatch.setattr(pilot_queue.os, "replace", real)
            other["b"] = Queue(q.root).committed("L1_0", str(out))
            monkeypatch.setattr(pilot_queue.os, "replace", replace)
        return real(src, dst)

    monkeypatch.setattr(pilot_queue.os, "replace", replace)
    a = q.committed("L1_0", str(out))
    monkeypatch.setattr(pilot_queue.os, "replace", real)
    assert other["b"][8] == "COMPLETED" and other["b"][11] == "placed", other
    assert a[8] == "COMPLETED" and a[11] == "placed" and a[12] == "", a
    assert (out / "a.out").read_text() == "p.0.0" and (out / "qa-failed" / "b.out").read_text() == "p.0.0"
    assert not (out / ".hpcrun-claims" / "p.0.0").exists()


def test_a_claim_under_an_earlier_generations_outputs_location_is_placed_there(tmp_path):
    """A generation-1 job run after generation 2 named another outputs location writes under its own: its claim's
    directory is found among the locations the queue knows, and placed beside it, never marked placed unmoved."""
    old, new = tmp_path / "gen1", tmp_path / "gen2"
    q = _committed_claim(tmp_path, "p.0.1")
    _claim_dir(old, "p.0.1")
    q.remember(str(old))
    q.remember(str(new))
    res = q.committed("L1_0", str(new))
    assert res[11] == "placed" and (old / "a.out").read_text() == "p.0.1" and not (new / "a.out").exists()


def test_an_input_that_failed_by_itself_keeps_its_state_when_its_outputs_cannot_be_placed(tmp_path):
    """A cancelled input whose outputs cannot be moved stays CANCELLED (an operator's cancel is not retried as a
    placement failure); the reason says where the outputs are."""
    out = tmp_path / "out"
    q = _committed_claim(tmp_path, "p.0.2", state="CANCELLED")
    private = _claim_dir(out, "p.0.2")
    (out / "a.out" / "x").mkdir(parents=True)   # in the way
    q.remember(str(out))
    res = q.committed("L1_0", str(out))
    assert res[8] == "CANCELLED" and res[7] == "0", res
    assert "could not be moved into place" in res[12] and str(private) in res[12], res
    assert (private / "a.out").exists()


@pytest.mark.parametrize("cid", ["", ".", "..", "p.0.3/../p.0.4"])
def test_a_record_that_names_no_claim_of_its_own_places_nothing(tmp_path, cid):
    """A committed record whose claim id is empty or not a name of its own (a record damaged by hand, say) would
    have the claims' common directory (or another claim's) moved into the outputs location: other claims' outputs,
    a fenced one's among them. It places nothing and fails as unplaced (retried); every claim's outputs stay."""
    out = tmp_path / "out"
    q = _committed_claim(tmp_path, cid)
    others = [_claim_dir(out, c) for c in ("p.0.3", "p.0.4")]
    q.remember(str(out))
    res = q.committed("L1_0", str(out))
    assert res[11].startswith("unplaced:") and res[7] == "12" and res[8] == "FAILED", res
    assert all((o / "a.out").read_text() == o.name for o in others) and not (out / "a.out").exists(), res
    assert sorted(p.name for p in out.iterdir()) == [".hpcrun-claims"]


@pytest.mark.parametrize("errno_name, raised", [("ESTALE", True), ("EACCES", True), ("ENOENT", False)])
def test_a_placement_that_cannot_look_at_a_directory_is_tried_again_not_marked_unplaced(tmp_path, monkeypatch,
                                                                                        errno_name, raised):
    """A directory the move cannot look at (an NFS handle gone stale, a permission) stops the placement with the
    error, as pathlib's is_dir did, so the next poll tries again: nothing moved, no mark, no attempt charged. A path
    that is not there is no directory (the move goes on)."""
    import errno

    from hpcrun.backends.late import layout
    out = tmp_path / "out"
    q = _committed_claim(tmp_path, "p.0.5")
    private = _claim_dir(out, "p.0.5")
    (out / "qa-failed").mkdir()   # merged into: both sides looked at
    q.remember(str(out))
    real = os.lstat

    def lstat(path, *args, **kwargs):
        if str(path).endswith("qa-failed"):
            raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(layout.os, "lstat", lstat)
    if raised:
        with pytest.raises(OSError):
            q.committed("L1_0", str(out))
        monkeypatch.setattr(layout.os, "lstat", real)
        assert (private / "qa-failed" / "b.out").exists() and q.result("L1_0")[11:] == [], q.result("L1_0")
        res = q.committed("L1_0", str(out))   # the next poll
    else:   # taken as no directory: renamed whole (over the empty one), as a file would be
        res = q.committed("L1_0", str(out))
        monkeypatch.setattr(layout.os, "lstat", real)
    assert res[11] == "placed" and (out / "qa-failed" / "b.out").read_text() == "p.0.5", res


def test_a_commit_never_replaces_a_result_already_there(tmp_path):
    """A task that is (wrongly) both waiting and committed runs again, but its second commit is refused: the first
    result stands and the second claim's outputs are never placed."""
    plan = _plan(tmp_path, _spec(tmp_path, 1, _ledgered(tmp_path, 0.1)))
    qid = _enqueue(plan, 1)
    first = "\t".join([f"{qid}_0", "600.0.0", "600", "0", "n1", "1.0", "2.0", "0", "COMPLETED", "", ""]) + "\n"
    (plan / "queue" / "done" / f"{qid}_0").write_text(first)
    logs = _wait(_pilot(plan, "602"))
    assert _ledger(tmp_path)["r000"][0].startswith("602."), logs      # it ran again
    assert (plan / "queue" / "done" / f"{qid}_0").read_text() == first, logs
    assert "its result is dropped" in logs, logs
    _pilots(plan).records([qid], "")
    assert not (tmp_path / "out" / "r000.out").exists()


def test_a_fenced_pilot_stops_its_claims_scripts_and_their_chains(tmp_path):
    """The supervisor fences a live pilot (its lease expired) while two inputs of 25 s run: at its next beat the
    pilot stops, and so do its claims' scripts and chains (each in a process group of its own): none runs on to
    write its output or the ledger while its input runs again elsewhere."""
    plan = _plan(tmp_path, _spec(tmp_path, 2, _ledgered(tmp_path, 25)))
    qid = _enqueue(plan, 2)
    q = Queue(plan / "queue")
    pilot = _pilot(plan, "611")
    _until(lambda: sum(1 for c in q.claims(("live",)) if c.start) == 2, what="two claims begun")
    assert q.fence("611")
    logs = _wait(pilot, 40)                       # within a beat (10 s) and the claims' stop
    assert sorted(q.release()) == [f"{qid}_0", f"{qid}_1"], logs
    time.sleep(26)                                # any chain still running would have written by now
    assert _ledger(tmp_path) == {}, _ledger(tmp_path)
    assert not list((tmp_path / "out").rglob("*.out")), list((tmp_path / "out").rglob("*"))


def test_a_token_read_while_its_line_is_written_counts_as_not_begun(tmp_path):
    """The agent writes a claim's result line into its token in place, just before the commit: a reader may find it
    cut short. Such a token is not begun: none of its fields is read as a begin line's (slot, node, start), and a
    fenced pilot's release returns it and drops no outputs by it."""
    out = tmp_path / "out"
    q = _committed_claim(tmp_path, "p.0.1")      # L1_0: committed by claim p.0.1, its outputs not yet placed
    kept = _claim_dir(out, "p.0.1")
    q.remember(str(out))
    cut = "L1_5\tp.0.12\tp\t1"                  # "L1_5\tp.0.12\tp\t1\tn1\t5.0\t6.0\t0\tCOMPLETED..." cut short
    for state in ("live", "fenced"):
        (q.d(state) / "p").mkdir(parents=True)
        (q.d(state) / "p" / "info").write_text("n1\t2\t\t\n")
        (q.d(state) / "p" / "L1_5").write_text(cut)
    [claim] = [c for c in q.claims(("live",))]
    assert (claim.task, claim.claim_id, claim.slot, claim.node, claim.start) == ("L1_5", "L1_5", "", "n1", ""), claim
    (q.d("live") / "p" / "L1_5").write_text("p.0.12\t1\tn1\t5.0\t42\n")   # a begin line, written whole: read
    [claim] = [c for c in q.claims(("live",))]
    assert (claim.claim_id, claim.slot, claim.node, claim.start) == ("p.0.12", "1", "n1", "5.0"), claim
    assert q.release() == ["L1_5"]
    assert (kept / "a.out").read_text() == "p.0.1"


def _python(version: str) -> Optional[str]:
    """That Python's own executable, if this machine has it (on PATH, or a pyenv version: not its shim, which
    needs pyenv set up)."""
    root = Path(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv")))
    for exe in [shutil.which(f"python{version}"), *sorted(map(str, root.glob(f"versions/{version}.*/bin/python3")))]:
        if exe is None:
            continue
        proc = subprocess.run([exe, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    return None


@pytest.mark.parametrize("version", ["3.6", "3.7"])
def test_a_nodes_older_python_runs_the_agent_or_is_refused_in_one_line(tmp_path, version):
    """A node's python3 may be older than the login node's (RHEL 8: 3.6): the agent runs on 3.7 and later, and on
    an older one the pilot says so in one line and exits 3 (its pilots failing at their start hold new ones)."""
    exe = _python(version)
    if exe is None:
        pytest.skip(f"python{version} is not installed here (pyenv install {version})")
    first = tmp_path / "node-bin"
    first.mkdir()
    (first / "python3").symlink_to(exe)
    plan = _plan(tmp_path, _spec(tmp_path, 3, _ledgered(tmp_path, 0.1)))
    qid = _enqueue(plan, 3)
    proc = _pilot(plan, "701", PATH=f"{first}:/usr/bin:/bin")
    logs = _wait(proc)
    if version == "3.6":
        assert proc.returncode == 3, logs
        assert f"Python {version}" in logs and "needs Python 3.7 or later" in logs and "Traceback" not in logs, logs
        assert not _results(plan)
    else:
        assert proc.returncode == 0 and "Traceback" not in logs, logs
        assert sorted(_results(plan)) == [f"{qid}_{i}" for i in range(3)], logs


def test_a_pilot_on_its_way_out_signals_a_claims_pid_only_as_a_group(tmp_path):
    """A pilot whose agent was killed stops its claims' scripts by the pids their tokens name, each the leader of a
    process group. A script that already ended may have been reaped and its pid taken by another process of the
    user: no group then, and that process is left alone (a pid alone is never signalled)."""
    plan = _plan(tmp_path, _spec(tmp_path, 1, _ledgered(tmp_path, 0.1)))
    _enqueue(plan, 1)
    bystander = subprocess.Popen(["sleep", "60"])   # in the test's process group, not leading one of its own
    try:
        proc = _pilot(plan, "801")
        me = plan / "queue" / "live" / "801"
        _until(lambda: me.is_dir(), what="the pilot's directory")
        (me / "L9_9").write_text(f"801.0.9\t0\tn1\t1.0\t{bystander.pid}\n")   # a claim whose script was reaped
        logs = _wait(proc)
        time.sleep(0.5)
        assert bystander.poll() is None, f"the pilot signalled pid {bystander.pid} alone\n{logs}"
    finally:
        bystander.kill()
        bystander.wait()
