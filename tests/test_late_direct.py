"""A claim's inputs run by the pilot's Python worker (jobs.pilot.direct, issue 55) against the same inputs run by the
job script's bash: the program sees the same environment, signals, umask and descriptors, and each input leaves the
same records, exit codes and log lines. Real pilots (bin/hpcrun-pilot.sh) on the queue, as tests/test_late_binding.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import pytest

from hpcrun.backends.late import direct
from hpcrun.plan.intake import placeholders as ph
from hpcrun.plan.job.pilots import AGENT_DIRECT
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from tests.test_late_binding import _enqueue, _pilot, _pilots, _plan, _results, _spec, _wait

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/pgrep"), reason="pgrep (procps) is needed")

# each input's stem says what its program does: tell what it was given, fail, be killed, crash, or not be found
PROGRAM = ('cat /proc/$PPID/comm > "$1.parent"; '
           'case "$0" in *r000*) env | LC_ALL=C sort > "$1.env"; umask > "$1.umask"; '
           'while read -r k v; do case $k in SigIgn:|SigBlk:) echo "$k $v" ;; esac; done < /proc/$$/status > "$1.sig"; '
           'ls /proc/$$/fd > "$1.fds"; '
           'readlink /proc/$$/fd/0 > "$1.stdin"; echo "said on stdout"; echo "said on stderr" >&2 ;; '
           '*r001*) exit 3 ;; *r002*) kill -KILL $$ ;; *r003*) kill -SEGV $$ ;; esac; cp "$0" "$1"')
KINDS = 6   # r004: its input is gone before it runs; r005 runs as r000 does, without the records


def _run(root: Path, direct_run: bool) -> Dict[str, object]:
    """The campaign run by one pilot, and what each input left, with the paths that name ``root`` made alike."""
    root.mkdir()
    data = _spec(root, KINDS, ["/bin/sh", "-c", PROGRAM, "{input}", "{output}"])
    # one slot, claims of two inputs and more (a claim of one runs the script)
    data["jobs"]["pilot"].update(direct=direct_run, input_time="1s", slots=1)
    data["chain"]["env"] = {"CHAIN_SAYS": "a value with\ta tab, $HOME and 'quotes'"}
    plan = _plan(root, data)
    script = next((plan / "jobs").glob("*")).read_text()
    assert (direct.DIRECT_MARK in script) == direct_run
    (root / "raw" / "r004.dat").unlink()
    qid = _enqueue(plan, KINDS)
    logs = _wait(_pilot(plan, "901", HPCRUN_FROM_PILOT="kept"), 60)
    results = _results(plan)
    assert len(results) == KINDS, logs
    seen: Dict[str, object] = {}
    for i in range(KINDS):
        r = results[f"{qid}_{i}"]
        run = plan / "run" / f"latelocal.{i + 1:05d}" / r[1]
        files = {p.relative_to(run).as_posix(): p for p in sorted(run.rglob("*")) if p.is_file()}
        text = {k: p.read_text() for k, p in files.items() if not k.endswith(".timeline")}
        timeline = [line.split()[0] for line in files["chains/0.timeline"].read_text().splitlines()] \
            if "chains/0.timeline" in files else []
        seen[f"r{i:03d}"] = (r[7], r[8], sorted(files), text, timeline)
    out = root / "out" / ".hpcrun-claims" / results[f"{qid}_0"][1]
    for name in ("env", "umask", "sig", "fds", "stdin"):
        seen[name] = (out / f"r000.out.{name}").read_text()
    seen["parent"] = {(root / "out" / ".hpcrun-claims" / results[f"{qid}_{i}"][1] / f"r{i:03d}.out.parent").read_text()
                      for i in range(KINDS) if i != 4}   # who started each program (r004's never started)
    claims = "".join(p.read_text() for p in sorted(plan.glob("run/pilots/*/claims/*.log")))
    seen["log"] = sorted(re.sub(r"^\S+ hpcrun\[[^]]*\]: ", "", line) for line in claims.splitlines()
                         if " hpcrun[" in line)
    body = repr(seen).replace(str(root), "<root>")
    for cid in sorted((r[1] for r in results.values()), key=len, reverse=True):   # claim ids: in the order claimed
        body = body.replace(cid, "<claim>")
    return eval(body)  # noqa: S307 - our own repr, made alike: compared as values below


def test_a_direct_run_gives_the_program_and_the_records_what_the_script_does(tmp_path):
    script, worker = _run(tmp_path / "a", False), _run(tmp_path / "b", True)
    env = {k: dict(line.split("=", 1) for line in v.splitlines() if "=" in line)   # type: ignore[union-attr]
           for k, v in (("script", script.pop("env")), ("worker", worker.pop("env")))}
    # what bash itself adds to what it starts: its level, the program's path; the rest is the same
    for k in ("SHLVL", "_", "OLDPWD", "HPCRUN_CLAIM_FEED"):   # (the agent's pipe: any descriptor's number)
        env["script"].pop(k, None)
        env["worker"].pop(k, None)
    for e in env.values():   # a hash of the plan's directory: each run's own
        assert e.pop("HPCRUN_NODE_KEY") == e.pop("HPCRUN_PILOT_NODE_KEY")
    assert env["script"] == env["worker"]
    assert env["worker"]["CHAIN_SAYS"] == "a value with\ta tab, $HOME and 'quotes'"
    assert env["worker"]["HPCRUN_FROM_PILOT"] == "kept" and env["worker"]["HPCRUN_STEM"] == "r000"
    assert "HPCRUN_DIRECT_RECIPE" not in env["worker"]
    # glibc's posix_spawn leaves its own two signals (32, 33: threads' cancel and setxid) ignored in the program it
    # starts; its C library sets them again as a program starts threads
    ignored = {k: dict(line.rstrip(":").split(": ") for line in v.pop("sig").splitlines()) for k, v in  # type: ignore
               (("script", script), ("worker", worker))}
    assert ignored["script"]["SigBlk"] == ignored["worker"]["SigBlk"] == "0000000000000000"
    assert int(ignored["script"]["SigIgn"], 16) & ~0x180000000 == int(ignored["worker"]["SigIgn"], 16) & ~0x180000000
    assert int(ignored["worker"]["SigIgn"], 16) & 0x6 == 0x6   # SIGINT and SIGQUIT, as the script's bash has them
    assert (script.pop("parent"), worker.pop("parent")) == ({"bash\n"}, {"python3\n"})   # who started them
    assert script == worker
    # and what they are: exit codes and records as the job script decides them
    assert script["r000"][:2] == ("0", "COMPLETED") and script["r001"][:2] == ("7", "FAILED")
    assert script["r002"][:2] == ("14", "FAILED") and script["r003"][:2] == ("7", "FAILED")
    assert script["r004"][:2] == ("3", "FAILED")
    assert script["r003"][3]["chains.tsv"] == "0\t139\tcrashed\n"


def test_the_recipe_names_the_programs_words_and_no_shell():
    assert AGENT_DIRECT == "bin/" + direct.WORKER   # where the plan ships the worker, and where the agent finds it
    parts = ph.to_parts(["/bin/sh", "-c", "x 'y' $z", "--in={input}.x", "{env:HOME}", "{{braces}}"])
    env = {"HPCRUN_INPUT": "a b;c", "HOME": "/home/u"}
    assert direct.words(parts or [], env) == (["/bin/sh", "-c", "x 'y' $z", "--in=a b;c.x", "/home/u", "{braces}"],
                                              "")
    assert direct.words(parts or [], {"HOME": "/h"}) == ([], "HPCRUN_INPUT")
    assert ph.to_parts(["merge", "{parts}"]) is None


LATE = {"jobs": {"chains_per_node": 1, "binding": "late"}, "merge": None, "inputs": {"checksum": "none"},
        "chain": {"command": ["reco", "--in", "{input}", "--out", "{output}", "--events", "{first_event}:{nevents}"]}}


@pytest.mark.parametrize("change, direct_run", [
    ({}, True),
    ({"chain": {"env": {"GEOMETRY": "v2; rm -rf $HOME"}}}, True),
    ({"jobs": {"pilot": {"direct": False}}}, False),
    ({"jobs": {"binding": "array"}}, False),
    ({"jobs": {"chains_per_node": 2}, "merge": {"command": ["merge", "{output}", "{parts}"]}}, False),
    ({"jobs": {"files_per_job": 2}}, False),
    ({"qa": {"command": ["check", "{output}"]}}, False),
    ({"chain": {"command": ["reco", "{input}", "{output}", "{workdir}"]}}, False),
    ({"software": {"modules": ["root/6.30"]}}, False),
    ({"burst_buffer": {"capacity": "1GB", "stage_inputs": False}}, False),
    ({"inputs": {"checksum": "adler32"}}, False),
    ({"chain": {"command": ["reco", "{input}", "{output}", "--home", "{env:HOME}"]}}, False),
], ids=["plain", "chain-env", "turned-off", "array", "two-chains", "two-files", "qa", "workdir",
        "modules", "burst-buffer", "input-checksums", "env-placeholder"])
def test_the_renderer_gives_a_job_a_recipe_only_where_its_inputs_need_nothing_more(spec_factory, tmp_path, change,
                                                                                  direct_run):
    """render/direct.py: a job script carries the recipe (and the agent runs its inputs with the worker) only where an
    input needs nothing of the script but its one program; its words and environment are values, never shell."""
    from tests.conftest import _deep_update
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in LATE.items()}
    _deep_update(data, change)
    out = write_plan(load_plan(spec_factory(data)), tmp_path / "p").out_dir
    text = "".join(p.read_text() for p in sorted((out / "jobs").glob("*")))
    assert (direct.DIRECT_MARK in text) is direct_run
    if not direct_run:
        return
    script = next((out / "jobs").glob("*"))
    rec = direct.recipe(str(script))
    assert rec is not None and rec["argv"] == [["=reco"], ["=--in"], ["$HPCRUN_INPUT"], ["=--out"], ["$HPCRUN_OUTPUT"],
                                               ["=--events"], ["$HPCRUN_FIRST_EVENT", "=:", "$HPCRUN_NEVENTS"]]
    assert dict(rec["env"])["HPCRUN_PLAN_DIR"] == str(out) and rec["killed"] == [129, 130, 137, 143, 152]
    assert dict(rec["chain_env"]) == data["chain"].get("env", {})
    # the plan's own copy of the agent's helpers picks the plan's worker, and hands it the recipe it read
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import hpcrun_late_runs as R, marshal; "
            "argv, env = R.worker(sys.argv[2]); print(argv[-2:]); "
            "print(marshal.loads(bytes.fromhex(env['HPCRUN_DIRECT_RECIPE'])) == R.D.recipe(sys.argv[2]))")
    said = subprocess.run([sys.executable, "-c", code, str(out / "bin"), str(script)], capture_output=True, text=True)
    assert said.stdout.splitlines() == [repr([str(out / "bin" / direct.WORKER), str(script)]), "True"], said.stderr


def test_a_direct_run_ends_a_cancelled_input_and_one_past_its_time_limit_as_the_script_does(tmp_path):
    """Run by the worker (two slots, each a claim of two inputs): the operator's cancel of a running input ends it
    CANCELLED, exit 143, though its program ignores TERM (KILLed at its time limit, still CANCELLED);
    an input past its time limit gets the warning, its program TERM, and it fails with exit 10 and its reason; the
    others complete. Each claim's second input is the one stopped (the first cannot be sent back to the queue by
    it), told by its claim id."""
    stopped, cancel_me = tmp_path / "stopped", tmp_path / "cancel-me"
    slow = ["/bin/sh", "-c", 'cat /proc/$PPID/comm > "$1.parent"; case "$HPCRUN_CLAIM_ID" in '
            '*.1) trap "" TERM; echo "$HPCRUN_ARRAY_INDEX" > "$3"; sleep 300 ;; '
            '*.3) trap "touch $2; exit 143" TERM; sleep 300 & wait ;; esac; exec cp "$0" "$1"',
            "{input}", "{output}", str(stopped), str(cancel_me)]
    data = _spec(tmp_path, 4, slow, walltime="00:00:25")
    data["jobs"]["pilot"].update(direct=True, input_time="1s", slots=2)   # four claimed at once: two a slot
    # the warning 5 s before the limit: the limit's KILL (25 s) comes before the worker's own, 30 s after the cancel
    # (seen at the agent's next beat, within 10 s of the begin: before the warning, at 20 s)
    (tmp_path / "warned.yaml").write_text("extends: local-test\nsignal_before_timeout: 5s\n")
    data["site"]["profile"] = "warned.yaml"
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 4)
    pilot = _pilot(plan, "702")
    deadline = time.monotonic() + 30
    while not cancel_me.exists() or not cancel_me.read_text().strip():
        assert time.monotonic() < deadline, "the claim's second input never began"
        time.sleep(0.1)
    _pilots(plan).cancel([f"{qid}_{cancel_me.read_text().strip()}"])
    logs = _wait(pilot, 90)
    by_claim = {r[1]: r for r in _results(plan).values()}
    assert sorted(by_claim) == ["702.0.0", "702.0.1", "702.1.2", "702.1.3"], logs   # two claims of two
    for cid in ("702.0.1", "702.1.3"):   # both run by the worker
        assert (tmp_path / "out" / ".hpcrun-claims" / cid).glob("*.parent").__next__().read_text() == "python3\n"
    assert by_claim["702.0.1"][8] == "CANCELLED" and by_claim["702.0.1"][7] == "143", logs
    # KILLed at its limit, 25 s after its begin, and still CANCELLED (not a TIMEOUT): not left running beyond
    assert float(by_claim["702.0.1"][6]) - float(by_claim["702.0.1"][5]) <= 35, "its program was left running"
    assert by_claim["702.1.3"][7] == "10" and by_claim["702.1.3"][8] == "FAILED", logs
    assert 10 <= float(by_claim["702.1.3"][6]) - float(by_claim["702.1.3"][5]) <= 30
    assert stopped.exists(), logs
    reason = {cid: "".join(p.read_text() for p in plan.glob(f"run/*/{cid}/reason")) for cid in by_claim}
    assert "time limit" in reason["702.1.3"] and "cancelled" in reason["702.0.1"], reason
    assert {by_claim[c][8] for c in ("702.0.0", "702.1.2")} == {"COMPLETED"}, logs


@pytest.mark.parametrize("stuck_on, program, rc, ends", [
    ("chains/0.log", 'exec cp "$0" "$1"', "10", (11, 20)),
    ("chains.tsv", 'exec cp "$0" "$1"', "10", (11, 20)),
    ("reason", 'trap "" TERM; sleep 60', "137", (40, 52)),
], ids=["before-its-program", "after-it", "after-its-kill"])
def test_a_direct_run_stuck_on_its_filesystem_is_ended_by_its_time_limit_and_counted(tmp_path, stuck_on, program,
                                                                                    rc, ends):
    """The worker says an input began before it makes or opens anything of it, as the script does right after its
    fork, and that its program ended (``pid`` 0) before it writes the records: an input stuck on a file before or
    after its program (here a FIFO nobody reads, as a hung mount would hold it) is ended by its time limit (12 s,
    warned at 7 s), its worker TERMed, and fails, counted (TIMEOUT, 10 after the warning), not held until the pilot
    ends and then sent back uncounted. A program that ignores the warning's TERM is KILLed at the limit; its worker,
    stuck after it on its ``reason`` (again in its TERM's handler), is TERMed STOP_WAIT_S (15 s) later, KILLed 15 s
    after that (137). The first claim (two inputs, one slot) is run by the worker; the input it sends back may run in
    the script (a claim of one): stopped at its warning or its limit."""
    data = _spec(tmp_path, 2, ["/bin/sh", "-c", program, "{input}", "{output}"], walltime="00:00:12")
    data["jobs"]["pilot"].update(direct=True, input_time="1s", slots=1)
    # the warning 5 s before the input's limit (the profile's 60 s would put its end 72 s after its begin)
    (tmp_path / "warned.yaml").write_text("extends: local-test\nsignal_before_timeout: 5s\n")
    data["site"]["profile"] = "warned.yaml"
    plan = _plan(tmp_path, data)
    for job, n in ((job, n) for job in ("latelocal.00001", "latelocal.00002") for n in range(8)):   # any claim's
        run = plan / "run" / job / f"703.0.{n}"
        (run / "chains").mkdir(parents=True)
        os.mkfifo(run / stuck_on)
    qid = _enqueue(plan, 2)
    pilot = _pilot(plan, "703")
    try:
        logs = _wait(pilot, 120)
    finally:
        direct.group(pilot.pid, 9)
    results = _results(plan)
    assert sorted(results) == [f"{qid}_{i}" for i in range(2)], logs
    first = next(r for r in results.values() if r[1] == "703.0.0")   # run by the worker
    assert (first[8], first[7]) == ("TIMEOUT", rc), logs
    assert ends[0] <= float(first[6]) - float(first[5]) <= ends[1], first
    assert {r[8] for r in results.values()} <= {"TIMEOUT", "FAILED"}, logs   # counted, both
    assert "starting 1 chain(s)" in "".join(p.read_text() for p in plan.glob("run/pilots/*/claims/*.log"))


def test_a_program_the_node_cannot_start_now_is_tried_again_as_bash_retries_a_fork(tmp_path, monkeypatch):
    """posix_spawn failing for want of processes (EAGAIN) or memory (ENOMEM) is tried again after 1, 2, 4 and 8 s,
    the pid told to the agent once it started; a node that never can fails the program as not executable (126)."""
    import errno
    feed_r, feed_w = os.pipe()
    claim = direct.Claim({"env": [["HPCRUN_PLAN_DIR", str(tmp_path)]], "killed": [], "argv": [["=/bin/true"]]},
                         feed_w)
    claim.n = 0
    refusals, slept = [errno.EAGAIN, errno.ENOMEM], []
    real = os.posix_spawn

    def spawn(*a, **k):  # type: ignore[no-untyped-def]
        if refusals:
            raise OSError(refusals.pop(0), os.strerror(errno.EAGAIN))
        return real(*a, **k)

    monkeypatch.setattr(direct.os, "posix_spawn", spawn)
    monkeypatch.setattr(direct.time, "sleep", slept.append)
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    os.set_blocking(feed_r, False)
    try:
        assert claim.program(dict(os.environ), log)[0] == 0
        assert slept == [1, 2]
        told = os.read(feed_r, 100).decode().splitlines()   # the program's pid, then none running
        assert [t.split("\t")[:2] for t in told] == [["pid", "0"], ["pid", "0"]] and told[0] != told[1], told
        assert (tmp_path / "log").read_text().count("fork: retry") == 2
        refusals[:] = [errno.EAGAIN] * 5
        assert claim.program(dict(os.environ), log)[0] == 126 and slept == [1, 2, 1, 2, 4, 8]
    finally:
        for fd in (feed_r, feed_w, log):
            os.close(fd)


def test_a_cancel_stops_the_program_at_once_and_kills_it_if_it_ignores_that(tmp_path):
    """The worker's cancel (SIGUSR2, the agent's TERM to the program follows) TERMs the program itself (started since
    the agent looked) and arms its alarm for STOP_WAIT_S; the alarm KILLs the program's group. A cancel between
    inputs touches nothing."""
    import signal
    claim = direct.Claim({"env": [["HPCRUN_PLAN_DIR", str(tmp_path)]], "killed": [], "argv": []}, -1)
    claim.on_cancel()
    assert not claim.cancelled and signal.alarm(0) == 0   # no input running: nothing cancelled, no alarm
    started = tmp_path / "started"
    prog = subprocess.Popen(["/bin/sh", "-c", f'trap "" TERM; touch {started}; sleep 60 & wait'],
                            start_new_session=True)
    try:
        while not started.exists():
            time.sleep(0.01)
        claim.cid, claim.pid = "703.0.0", prog.pid
        claim.on_cancel()
        assert claim.cancelled and 29 <= signal.alarm(0) <= 30   # the KILL armed 30 s on
        time.sleep(0.2)
        assert prog.poll() is None   # TERM ignored
        claim.on_alarm()
        assert prog.wait(10) == -9
    finally:
        signal.alarm(0)
        direct.group(prog.pid, 9, False)


def _text(path: Path) -> str:
    """A queue file's text, "" if it moved meanwhile (a claim's input handed back)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_a_pilot_stopped_while_its_worker_runs_an_input_leaves_cleanly(tmp_path):
    """A direct run's claim token names its worker (never 0: the pilot's script stops the groups its tokens name
    on its way out, and "-0" is its own): a pilot TERMed mid-input stops its agent, the worker and the program,
    hands its claims back, stops its database and writes its figures, at once."""
    import signal
    started = tmp_path / "started"
    data = _spec(tmp_path, 4, ["/bin/sh", "-c", 'echo $$ > "$2.tmp"; mv "$2.tmp" "$2"; exec sleep 60', "{input}",
                               "{output}", str(started)])
    data["jobs"]["pilot"].update(direct=True, input_time="1s", slots=1)   # a claim of several: the worker
    plan = _plan(tmp_path, data)
    qid = _enqueue(plan, 4)
    pilot = _pilot(plan, "704")
    try:
        deadline, tokens = time.monotonic() + 30, []
        while not started.exists() or not any(len(t) >= 5 for t in tokens):   # the begun input's token (the
            assert time.monotonic() < deadline, "no input began"             # claim's other is empty till then)
            time.sleep(0.1)
            tokens = [_text(p).split("\t") for p in (plan / "queue" / "live" / "704").glob(f"{qid}_*")]
        token = next(t for t in tokens if len(t) >= 5)
        assert int(token[4]) > 0 and token[0].startswith("704.0."), tokens
        t0 = time.monotonic()
        os.kill(pilot.pid, signal.SIGTERM)   # as Slurm's, to the batch script
        logs = _wait(pilot, 60)
    finally:
        direct.group(pilot.pid, 9)
    assert pilot.returncode == 143 and time.monotonic() - t0 < 12, logs
    assert (plan / "run" / "pilots" / "704" / "pilot.tsv").exists(), logs
    assert not _results(plan), logs   # nothing committed: every claim back in the queue
    gone = time.monotonic() + 2   # (a zombie until its new parent reaps it)
    while os.path.exists(f"/proc/{started.read_text().strip()}") and time.monotonic() < gone:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{started.read_text().strip()}"), "the program lives on"
