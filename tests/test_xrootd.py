"""Inputs on a real XRootD server (Debian's xrootd 5.5 on loopback): plan-time sizes and checksums,
the clear errors, and the job's stage-in and streaming through a real XCache cache.

The jobs run outside Slurm as in test_job_local (tests/fakes/srun); the servers, xrdfs and
xrdcp are real. tests/cluster/test_xrootd_campaign.py runs a campaign on the test cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Dict

import pytest
import yaml

from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .conftest import readable_copy, shellcheck_cmd
from .xrootd import USER, Servers, free_port, why_not

pytestmark = pytest.mark.skipif(bool(why_not()), reason=why_not() or "ok")


def adler(data: bytes) -> str:
    return f"adler32:{zlib.adler32(data) & 0xFFFFFFFF:08x}"


@pytest.fixture(scope="module")
def servers():
    s = Servers().start()
    yield s
    s.stop()




def write_case(root: Path, inputs, xrootd: Dict[str, object] = None, chain=None, **extra) -> Path:
    """A spec (one job holding every input) and a profile layered on local-test."""
    profiles = root / "profiles"
    profiles.mkdir(exist_ok=True)
    (profiles / "xrd-test.yaml").write_text(yaml.safe_dump(
        {"name": "xrd-test", "extends": "local-test", "xrootd": xrootd or {}}))
    spec = {"name": "xrd", "site": {"profile": "xrd-test"}, "walltime": "00:10:00",
            "inputs": inputs, "jobs": {"files_per_job": 8, "chains_per_node": 1},
            "chain": {"command": chain or ["/bin/cp", "{input}", "{output}"]},
            "outputs": {"location": str(root / "out")}, **extra}
    (root / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root / "campaign.yaml"


def plan_cli(spec: Path, root: Path):
    env = dict(os.environ, HPCRUN_PROFILE_PATH=str(root / "profiles"))
    return subprocess.run(["python3", "-m", "hpcrun", "plan", str(spec), "--out", str(root / "plan")],
                          capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)


def tasks(root: Path):
    return [line.split("\t") for line in (root / "plan" / "tasks.tsv").read_text().splitlines()]


# ---- plan time -----------------------------------------------------------------------------

def test_plan_asks_the_server_for_sizes_and_checksums(servers, case):
    a, b = os.urandom(300_000), b"small file\n"
    ua, ub = servers.put("store/p/a.raw", a), servers.put("store/p/b.raw", b)
    listed = servers.put("store/p/c.raw", b"c" * 1000)
    (case / "list.txt").write_text(f"{listed} 1000\n")  # size given: only its checksum is asked
    spec = write_case(case, {"files": [ua, ub.replace("//store", "/store")], "list_file": "list.txt"})
    done = plan_cli(spec, case)
    assert done.returncode == 0, done.stderr + done.stdout
    rows = {r[3]: r for r in tasks(case)}
    assert rows[ua][7] == adler(a) and rows[listed][7] == adler(b"c" * 1000)
    assert rows[ub.replace("//store", "/store")][7] == adler(b)
    manifest = json.loads((case / "plan" / "manifest.json").read_text())
    assert manifest["totals"]["input_bytes"] == len(a) + len(b) + 1000
    assert sorted(manifest["jobs"][0]["input_sizes"]) == sorted([len(a), len(b), 1000])


def test_a_missing_file_is_refused_at_its_key(servers, case):
    ok = servers.put("store/m/ok.raw", b"x")
    missing = f"{servers.origin.url}//store/m/not-there.raw"
    spec = write_case(case, {"files": [ok, missing]})
    done = plan_cli(spec, case)
    assert done.returncode == 2, done.stderr
    assert "campaign.yaml" in done.stderr and "inputs.files.1" in done.stderr
    assert "does not exist on its server" in done.stderr and "not-there.raw" in done.stderr
    assert "Traceback" not in done.stderr and not (case / "plan").exists()


def test_an_unreachable_server_is_refused_quickly(case):
    port = free_port()  # nothing listens there
    spec = write_case(case, {"files": [f"root://127.0.0.1:{port}//store/a.raw"]})
    t0 = time.monotonic()
    done = plan_cli(spec, case)
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - t0 < 30
    assert f"cannot reach the XRootD server root://127.0.0.1:{port}" in done.stderr
    assert "inputs.files.0" in done.stderr


def test_a_bad_url_is_refused_with_what_would_be_valid(case):
    spec = write_case(case, {"files": ["root://127.0.0.1:1094//store/a b.raw"]})
    done = plan_cli(spec, case)
    assert done.returncode == 2 and "root://HOST[:PORT]//ABSOLUTE/PATH" in done.stderr, done.stderr


def test_urls_and_paths_cannot_be_mixed(servers, case):
    ok = servers.put("store/mix/ok.raw", b"x")
    spec = write_case(case, {"files": [ok, "/etc/hostname"]})
    done = plan_cli(spec, case)
    assert done.returncode == 2 and "inputs mix URLs" in done.stderr, done.stderr


# ---- the job: stage (xrdcp) and stream, for real -----------------------------------------------

def plan_job(root: Path, spec: Path) -> Path:
    os.environ["HPCRUN_PROFILE_PATH"] = str(root / "profiles")
    try:
        write_plan(load_plan(spec), root / "plan")
    finally:
        del os.environ["HPCRUN_PROFILE_PATH"]
    subprocess.run(["chown", "-R", USER, str(root)], check=True)
    return root / "plan"


def run_job(plan: Path, job_id: str, timeout: float = 180, node: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": f"{readable_copy('tests/fakes')}:/usr/bin:/bin", "SLURM_JOB_ID": job_id,
           "SLURM_JOB_NUM_NODES": "1", "HOME": "/tmp", **({"SLURMD_NODENAME": node} if node else {})}
    script = next((plan / "jobs").glob("*.sbatch"))
    return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                           "bash", str(script)], capture_output=True, text=True, timeout=timeout)


def rundir(plan: Path, job_id: str) -> Path:
    return next((plan / "run").glob(f"*/{job_id}"))


def test_job_stages_inputs_with_xrdcp_and_records_throughput(servers, case):
    data = {n: os.urandom(2_000_000 + n) for n in range(2)}
    urls = [servers.put(f"store/s/f{n}.raw", d) for n, d in data.items()]
    plan = plan_job(case, write_case(case, {"files": urls}))
    done = run_job(plan, "201")
    assert done.returncode == 0, done.stdout + done.stderr
    for n, d in data.items():
        assert (case / "out" / f"f{n}.out").read_bytes() == d
    rows = [r.split("\t") for r in (rundir(plan, "201") / "transfers.tsv").read_text().splitlines()]
    assert sorted((r[0], int(r[1]), r[3], r[4], r[6]) for r in rows) == [   # copied at once: in any order
        (urls[n], len(data[n]), "1", "0", "server") for n in range(2)]
    assert all(int(r[2]) >= 0 for r in rows)
    assert "staged 2 input(s) from XRootD into" in done.stderr + done.stdout and "(2 server" in done.stderr
    assert not list((case / "out" / ".hpcrun-work").glob("*/in/*")), "staged copies are removed at the end"


def test_staged_into_a_node_local_stage_dir_private_and_reclaimed(servers, case):
    """xrootd.stage_dir: a 0700 directory of the job's user, left by a killed job and reclaimed by the next."""
    stage = Path(tempfile.mkdtemp(prefix="hpcrun-stage-", dir="/tmp"))
    stage.chmod(0o1777)
    try:
        url = servers.put("store/s/node.raw", os.urandom(300_000))
        plan = plan_job(case, write_case(case, {"files": [url]}, xrootd={"stage_dir": str(stage)}))
        key = json.loads((plan / "manifest.json").read_text())["node_key"]
        dead = stage / f"hpcrun.{key}.77.in"      # a SIGKILLed job's staged copies, its lock free
        dead.mkdir(mode=0o700)
        (dead / "old.raw").write_bytes(b"x" * 5000)
        (dead / ".lock").write_text("")
        subprocess.run(["chown", "-R", USER, str(dead)], check=True)
        done = run_job(plan, "211")
        assert done.returncode == 0, done.stdout + done.stderr
        assert not dead.exists() and not list(stage.iterdir()), list(stage.iterdir())
        rows = (rundir(plan, "211") / "reclaimed" / "stage.tsv").read_text().split("\t")
        assert rows[0] == str(dead) and int(rows[1]) >= 5000, rows
        assert (case / "out" / "node.out").stat().st_size == 300_000
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@pytest.mark.parametrize("where", ["node-local-stage-dir", "stage-in-the-work-dir", "work-dir-after-a-merge"])
def test_a_read_only_directory_a_chain_leaves_is_removed_and_the_job_ends_well(servers, case, where):
    """A program that leaves a read-only directory (a tool's cache) among its staged inputs, or in its work
    directory that the job removes after a merge: ``rm -rf`` alone fails on it as the job's user, and under the
    job's ``set -e`` that ended a job whose steps all succeeded: with status 1 and no ``exit_code`` where the
    EXIT trap removed the node-local stage directory, with status 1 where the job's last step removed the staged
    inputs or the chains' parts. Now they are removed and the job ends with 0."""
    stage = Path(tempfile.mkdtemp(prefix="hpcrun-stage-", dir="/tmp"))
    stage.chmod(0o1777)
    n = ["node-local-stage-dir", "stage-in-the-work-dir", "work-dir-after-a-merge"].index(where)
    try:
        url = servers.put(f"store/s/ro{n}.raw", os.urandom(1000))   # a path of its own: one per case
        d = "$HPCRUN_WORKDIR" if n == 2 else "$HPCRUN_INPUT_DIR"
        chain = ["/bin/sh", "-c", f'mkdir "{d}/ro" && touch "{d}/ro/f" && chmod 500 "{d}/ro" && exec cp "$0" "$1"',
                 "{input}", "{output}"]
        extra = {"merge": {"command": ["/bin/sh", "-c", 'cat "$@" > "$0"', "{output}", "{parts}"]}} if n == 2 else {}
        xrootd = {"stage_dir": str(stage)} if n == 0 else None
        plan = plan_job(case, write_case(case, {"files": [url]}, xrootd=xrootd, chain=chain, **extra))
        done = run_job(plan, "212")
        assert done.returncode == 0, done.stdout + done.stderr
        assert (rundir(plan, "212") / "exit_code").read_text() == "0\n"
        assert not list(stage.iterdir()), list(stage.iterdir())
        left = list((case / "out" / ".hpcrun-work").glob("*"))   # the job's work directory too (its staged inputs
        assert not left, left                                      # were under it: removed first, then it)
        assert [p.stat().st_size for p in (case / "out").glob("*ro*")] == [1000]
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(stage), str(case / "out")], check=False)
        shutil.rmtree(stage, ignore_errors=True)


def test_job_through_the_cache_and_streaming(servers, case):
    d = os.urandom(1_500_000)
    url = servers.put("store/c/cached.raw", d)
    chain = ["/usr/bin/xrdcp", "--force", "--silent", "{input}", "{output}"]
    plan = plan_job(case, write_case(case, {"files": [url]}, chain=chain,
                                     xrootd={"access": "stream", "cache": servers.cache.url}))
    body = (plan / "bin" / "hpcrun-chain.sh").read_text()
    assert "XCache" in body
    done = run_job(plan, "202")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (case / "out" / "cached.out").read_bytes() == d
    assert (servers.cache.dir / "data" / "store" / "c" / "cached.raw").exists(), "read went through the cache"
    assert not (rundir(plan, "202") / "transfers.tsv").exists()


def test_a_file_corrupted_after_planning_fails_with_the_checksum_code(servers, case):
    url = servers.put("store/x/bad.raw", b"A" * 100_000)
    plan = plan_job(case, write_case(case, {"files": [url]}))
    servers.put("store/x/bad.raw", b"B" * 100_000)   # same size, other bytes
    done = run_job(plan, "203")
    assert done.returncode == 11, done.stdout + done.stderr
    reason = (rundir(plan, "203") / "reason").read_text()
    assert "checksum mismatch" in reason and "bad.raw" in reason
    assert not list(case.rglob("bad.raw*")), "no partial or corrupt copy is left behind"


def test_a_file_removed_after_planning_is_a_setup_failure(servers, case):
    url = servers.put("store/x/gone.raw", b"G" * 1000)
    plan = plan_job(case, write_case(case, {"files": [url]}))
    (servers.data / "store" / "x" / "gone.raw").unlink()
    done = run_job(plan, "204")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "does not exist on its server" in (rundir(plan, "204") / "reason").read_text()


def test_the_server_killed_mid_transfer_and_restarted(servers, case):
    d = os.urandom(12_000_000)
    url = servers.put("store/k/big.raw", d)
    # a slow copy (4 MiB/s, 256 KiB in flight: about 3 s) so that the server dies in the middle of it
    slow = "env XRD_CPCHUNKSIZE=262144 XRD_CPPARALLELCHUNKS=1 xrdcp --xrate 4m"
    plan = plan_job(case, write_case(case, {"files": [url]}, xrootd={"xrdcp": slow, "retries": 3}))
    result: Dict[str, subprocess.CompletedProcess] = {}
    job = threading.Thread(target=lambda: result.setdefault("r", run_job(plan, "205")))
    job.start()
    rundir_seen, deadline = None, time.monotonic() + 30
    while rundir_seen is None and time.monotonic() < deadline:
        rundir_seen = next((plan / "run").glob("*/205/xrdcp.log"), None) if (plan / "run").exists() else None
        time.sleep(0.05)
    time.sleep(0.8)   # xrdcp is under way
    killed = time.time()
    servers.origin.kill()
    time.sleep(2)
    servers.origin.start()
    restarted = time.time()
    job.join(timeout=240)
    done = result["r"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert (case / "out" / "big.out").read_bytes() == d
    rows = [r.split("\t") for r in (rundir(plan, "205") / "transfers.tsv").read_text().splitlines()]
    assert rows[-1][4] == "0" and int(rows[-1][1]) == len(d)
    # the copy that succeeded was under way when the server died, and ended after its restart
    began = float(rows[-1][5])
    assert began < killed and began + int(rows[-1][2]) / 1000 > restarted, (rows, killed, restarted)


def test_a_server_down_at_stage_in_is_retried_by_the_job(servers, case):
    d = os.urandom(500_000)
    url = servers.put("store/r/late.raw", d)
    plan = plan_job(case, write_case(case, {"files": [url]}, xrootd={"connection_retry": 1, "retries": 2}))
    servers.origin.kill()   # down when the job starts; back 3 s later (the job waits 5 s, then retries)
    result: Dict[str, subprocess.CompletedProcess] = {}
    job = threading.Thread(target=lambda: result.setdefault("r", run_job(plan, "206")))
    job.start()
    time.sleep(3)
    servers.origin.start()
    job.join(timeout=240)
    done = result["r"]
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [r.split("\t") for r in (rundir(plan, "206") / "transfers.tsv").read_text().splitlines()]
    assert [(r[3], r[4]) for r in rows] == [("1", "51"), ("2", "0")]
    assert (case / "out" / "late.out").read_bytes() == d


def test_a_server_that_stays_down_fails_with_the_transfer_code(servers, case):
    url = servers.put("store/r/never.raw", b"n" * 1000)
    plan = plan_job(case, write_case(case, {"files": [url]}, xrootd={"connection_retry": 1, "retries": 1}))
    servers.origin.kill()
    try:
        done = run_job(plan, "207")
    finally:
        servers.origin.start()
    assert done.returncode == 13, done.stdout + done.stderr
    reason = (rundir(plan, "207") / "reason").read_text()
    assert "could not copy" in reason and "after 2 attempt(s)" in reason and "exit 51" in reason


def test_a_container_binds_no_url_and_binds_the_stage_dir(servers, case):
    url = servers.put("store/b/in.raw", b"x" * 100)
    spec = write_case(case, {"files": [url]}, xrootd={"stage_dir": "/tmp/hpcrun-stage"},
                      container={"runtime": "apptainer", "image": "/images/reco.sif"})
    plan = plan_job(case, spec)
    text = "".join(p.read_text() for d in ("jobs", "bin") for p in (plan / d).glob("*"))
    launches = [line for line in text.splitlines() if "apptainer exec" in line]
    assert launches and all("-B /tmp/hpcrun-stage:/tmp/hpcrun-stage" in line for line in launches), launches
    assert not any("root:" in line for line in launches), launches


# ---- local redirection and parallel copies (issue 39) ---------------------------------------------

def test_inputs_the_nodes_mount_are_read_in_place(servers, case):
    """xrootd.local_paths: inputs under a mapped prefix are read where the nodes mount them (the server
    opens none of them), a local copy that is not what the server reported is copied from the server
    instead (size, or checksum), an unmapped URL goes through the server; the outputs are the same."""
    data = {f"f{n}": os.urandom(300_000 + n) for n in range(4)}
    urls = {name: servers.put(f"store/local/{name}.raw", d) for name, d in data.items()}
    other = os.urandom(200_000)
    urls["u0"] = servers.put("store/other/u0.raw", other)
    data["u0"] = other
    mount = case / "lustre"                         # the nodes' view of the server's export, another path
    (mount / "local").mkdir(parents=True)
    for name in ("f0", "f1", "f2", "f3"):
        (mount / "local" / f"{name}.raw").write_bytes(data[name])
    (mount / "local" / "f2.raw").write_bytes(bytes(len(data["f2"])))          # same size, other bytes
    (mount / "local" / "f3.raw").write_bytes(data["f3"][:-1])                 # one byte short
    spec = write_case(case, {"files": list(urls.values())},
                      xrootd={"local_paths": {f"{servers.origin.url}//store/local/": f"{mount}/local/",
                                              f"{servers.origin.url}//store/elsewhere/": "/nonexistent/ disk/"},
                              "parallel_copies": 3})
    plan = plan_job(case, spec)
    manifest = json.loads((plan / "manifest.json").read_text())
    assert any("4 of 5 input(s) are under a local path of the nodes" in n for n in manifest["notes"])
    before = len(servers.opened())
    done = run_job(plan, "211")
    assert done.returncode == 0, done.stdout + done.stderr
    for name, d in data.items():
        assert (case / "out" / f"{name}.out").read_bytes() == d                   # the outputs as without it
    rows = {Path(r[0]).stem: r for r in (line.split("\t") for line in
                                         (rundir(plan, "211") / "transfers.tsv").read_text().splitlines())}
    assert {k: r[6] for k, r in rows.items()} == {"f0": "local", "f1": "local", "f2": "server", "f3": "server",
                                                  "u0": "server"}
    opened = sorted(Path(p).stem for p in servers.opened()[before:])
    assert opened == ["f2", "f3", "u0"], opened                                  # the server read no other
    log = done.stdout + done.stderr
    assert "f2.raw is adler32:" in log and f"f3.raw has {len(data['f3']) - 1} bytes where its server" in log
    assert "(3 server, 2 local:" in log or "(2 local, 3 server:" in log, log
    scripts = [str(p) for p in sorted(plan.glob("jobs/*.sbatch")) + sorted(plan.glob("bin/*.sh"))]
    lint = subprocess.run(shellcheck_cmd() + ["-s", "bash", "-S", "warning", *scripts], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    # what the report makes of it: per input, by the way it came; the stage-in per core
    from hpcrun.report.figures import transfers_of
    from hpcrun.report.gather import _stage_jobs, _transfer_rows
    t = transfers_of(_transfer_rows(plan), _stage_jobs(plan))
    assert {via: p["inputs"] for via, p in t.by_path.items()} == {"local": 2, "server": 3}
    assert t.by_path["local"]["bytes"] == len(data["f0"]) + len(data["f1"]) and t.mb_per_s_per_core > 0


def test_a_job_copies_its_inputs_several_at_a_time(servers, case):
    """xrootd.parallel_copies: the copies of one job overlap (each slowed to ~0.5 s), every one still
    checksum-verified and renamed; a failed one fails the job with its code."""
    data = [os.urandom(1_000_000 + n) for n in range(4)]
    urls = [servers.put(f"store/par/p{n}.raw", d) for n, d in enumerate(data)]
    plan = plan_job(case, write_case(case, {"files": urls},
                                     xrootd={"parallel_copies": 4, "xrdcp": "xrdcp --xrate 2m"}))
    done = run_job(plan, "212")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("\t") for line in (rundir(plan, "212") / "transfers.tsv").read_text().splitlines()]
    spans = sorted((float(r[5]), float(r[5]) + int(r[2]) / 1000) for r in rows)
    assert len(spans) == 4 and all(r[6] == "server" and r[4] == "0" for r in rows)
    assert spans[1][0] < spans[0][1] and spans[3][0] < spans[0][1], spans        # all four at once
    for n, d in enumerate(data):
        assert (case / "out" / f"p{n}.out").read_bytes() == d

    servers.put("store/par/p2.raw", bytes(len(data[2])))                           # corrupted after planning
    done = run_job(plan, "213")
    assert done.returncode == 11, done.stdout + done.stderr
    assert "checksum mismatch" in (rundir(plan, "213") / "reason").read_text()


def test_a_mapping_this_host_cannot_see_is_a_note(servers, case):
    """Login and compute nodes may mount different things: a mapped path missing here is a note, and a
    mapping that is no URL prefix, or whose ends differ, is refused at its key."""
    url = servers.put("store/n/a.raw", b"a" * 1000)
    spec = write_case(case, {"files": [url]},
                      xrootd={"local_paths": {f"{servers.origin.url}//store/": "/nonexistent/mount/"}})
    done = plan_cli(spec, case)
    assert done.returncode == 0, done.stderr
    notes = " ".join(json.loads((case / "plan" / "manifest.json").read_text())["notes"])
    assert "1 of 1 input(s) are under a local path" in notes and "cannot be seen from this host" in notes, notes
    for bad, words in (({"se.example.org/alice/": "/lustre/"}, "not the prefix of a root:// URL"),
                       ({f"{servers.origin.url}//store/": "/lustre"}, "end both with '/'")):
        spec = write_case(case, {"files": [url]}, xrootd={"local_paths": bad})
        refused = plan_cli(spec, case)
        assert refused.returncode == 2 and words in refused.stderr and "xrootd.local_paths" in refused.stderr, \
            refused.stderr
