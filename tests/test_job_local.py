"""Run the generated job of the detector-reco-local example outside Slurm, for real.

srun is replaced by tests/fakes/srun (which starts the tasks and forwards signals, as srun
does); everything else is real: bash, a MariaDB server started from a node-local copy of
the payload, the h5py chain/merge/QA programs. This exercises the job's control flow and
every failure path in seconds; tests/cluster/test_e2e.py runs the same job on real Slurm.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import pytest
import yaml

from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .conftest import REPO, readable_copy

EXAMPLE = REPO / "examples" / "detector-reco-local"   # read here; run from readable_copy
USER = os.environ.get("HPCRUN_TEST_USER", "hpcuser")
SYSTEM_PYTHON = "/usr/bin/python3"


def _requirements() -> str:
    if os.geteuid() != 0:
        return "needs root to run the job as the unprivileged test user"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"test user {USER} does not exist (created by tests/cluster/harness.py start)"
    for exe in ("/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/bin/mariadb"):
        if not os.path.exists(exe):
            return f"{exe} missing: run python3 tests/cluster/harness.py install"
    if subprocess.run([SYSTEM_PYTHON, "-c", "import h5py"], capture_output=True).returncode != 0:
        return "python3-h5py missing for /usr/bin/python3: run python3 tests/cluster/harness.py install"
    return ""


pytestmark = pytest.mark.skipif(bool(_requirements()), reason=_requirements() or "ok")


def as_user(argv, **kw):
    return subprocess.run(["runuser", "-u", USER, "--", *argv], **kw)


@pytest.fixture(scope="module")
def prepared():
    # pytest's tmp_path is private to root (0700), so the test user gets its own directory
    root = Path(tempfile.mkdtemp(prefix="hpcrun-local-job-", dir="/tmp"))
    root.chmod(0o755)
    shutil.chown(root, USER)
    pfs = root / "pfs"
    prepare = readable_copy("examples/detector-reco-local") / "prepare.py"
    as_user([SYSTEM_PYTHON, str(prepare), "--root", str(pfs), "--files", "1",
             "--events", "1200"], check=True, capture_output=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def example_spec(root: Path, chain_extra=(), **changes) -> dict:
    """The example's spec with its data under ``root/pfs``; ``section__field=value`` changes a key,
    ``section=value`` a whole section (None removes it)."""
    data = yaml.safe_load((EXAMPLE / "campaign.yaml").read_text().replace(
        "/tmp/hpcrun-test-cluster/pfs/detector-reco", str(root / "pfs")))
    data["chain"]["command"] += list(chain_extra)
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        elif value is None:
            data.pop(section, None)
        else:
            data[section] = value
    return data


def plan_case(root: Path, name: str, data: dict) -> Path:
    """Plan ``data`` in ``root/name`` and stage its inputs into ``bb/in`` as #DW stage_in would."""
    case = root / name
    case.mkdir()
    (case / "campaign.yaml").write_text(yaml.safe_dump(data))
    write_plan(load_plan(case / "campaign.yaml"), case / "plan")
    bb = case / "bb"
    (bb / "in").mkdir(parents=True)
    for raw in (root / "pfs" / "raw").glob("*.h5"):  # what #DW stage_in does on a cluster
        shutil.copy(raw, bb / "in" / raw.name)
    subprocess.run(["chown", "-R", USER, str(case)], check=True)
    return case


def _plan(root: Path, name: str, chain_extra=(), **changes) -> Path:
    return plan_case(root, name, example_spec(root, chain_extra, **changes))


def _start(case: Path, job_id: str) -> subprocess.Popen:
    env = {"PATH": f"{readable_copy('tests/fakes')}:/usr/bin:/bin", "SLURM_JOB_ID": job_id,
           "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "fakenode",
           "DW_JOB_STRIPED": f"{case / 'bb'}/", "HOME": "/tmp"}
    script = next((case / "plan" / "jobs").glob("*.sbatch"))
    return subprocess.Popen(["runuser", "-u", USER, "--", "env", "-i",
                             *[f"{k}={v}" for k, v in env.items()], "bash", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _rundir(case: Path, job_id: str) -> Path:
    return next((case / "plan" / "run").glob(f"*/{job_id}"))


def node_key(case: Path) -> str:
    """The key of this plan's node-local directories (hpcrun.<key>.<job>.<node>), as rendered:
    leftovers of another run (another plan, a killed test) are not this job's."""
    found = re.search(r"^export HPCRUN_NODE_KEY=([0-9a-f]+)$",
                      (case / "plan" / "bin" / "hpcrun-job.sh").read_text(), re.M)
    assert found, "the job script exports no HPCRUN_NODE_KEY"
    return found.group(1)


def no_server_left(case: Path, job_id: str) -> None:
    time.sleep(0.5)
    key = node_key(case)
    left = subprocess.run(["pgrep", "-f", rf"hpcrun\.{key}\.{job_id}\."], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left behind: {left.stdout}"
    assert not list(Path("/tmp").glob(f"hpcrun.{key}.{job_id}.*")), "node-local cache not removed"


def test_job_runs_end_to_end(prepared):
    case = _plan(prepared, "ok")
    proc = _start(case, "101")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    run = _rundir(case, "101")
    assert (run / "db" / "fakenode.ready").exists() and (run / "db" / "fakenode.stopped").read_text().strip() == "0"
    ready_at = float((run / "db" / "fakenode.ready").read_text())
    begins = [float(line.split()[1]) for k in range(4)
              for line in (run / "chains" / f"{k}.timeline").read_text().splitlines() if line.startswith("begin")]
    assert len(begins) == 4 and min(begins) > ready_at
    qa = (run / "qa.tsv").read_text().split()
    assert qa[:5] == ["run1000", "1200", "1200", "pass", "run1000.reco.h5"] and qa[5].endswith("/raw/run1000.h5"), qa
    output = case / "bb" / "out" / "run1000.reco.h5"
    assert output.exists()
    # what the provenance record takes from the node: the output's size and sum, the payload's identity
    name, size, summed = (run / "outputs.tsv").read_text().split()
    assert (name, int(size), summed) == ("run1000.reco.h5", output.stat().st_size, _checksum(output, "adler32"))
    payload = Path(yaml.safe_load((case / "campaign.yaml").read_text())["database"]["payload"])
    files = sorted((str(q.relative_to(payload)), q.stat().st_size) for q in payload.rglob("*") if q.is_file())
    listing = "".join(f"{rel}\t{size}\n" for rel, size in sorted(files, key=lambda f: f[0].encode()))
    assert (run / "payload.id").read_text().strip() == hashlib.sha256(listing.encode()).hexdigest()
    staged = case / "bb" / "in" / "run1000.h5"   # the checksum step read the staged copy
    assert (run / "checksums.tsv").read_text().split("\t")[0] == str(staged)
    assert "verified the adler32 checksum of 1 input(s)" in out
    assert "Shutdown complete" in (run / "db" / "fakenode.err").read_text()
    no_server_left(case, "101")


def test_chain_failure_names_the_chain(prepared):
    case = _plan(prepared, "chainfail", chain_extra=["--fail-chain", "2"])
    proc = _start(case, "102")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 7, out
    reason = (_rundir(case, "102") / "reason").read_text()
    assert "chain(s) failed: 2(rc=3)" in reason
    no_server_left(case, "102")


def test_db_never_ready_fails_fast(prepared):
    case = _plan(prepared, "notready", database__options=["--skip-grant-tables", "--no-such-option"])
    start = time.monotonic()
    proc = _start(case, "103")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 5, out
    assert time.monotonic() - start < 30
    assert "did not become ready" in (_rundir(case, "103") / "reason").read_text()
    no_server_left(case, "103")


def test_payload_copy_failure(prepared):
    case = _plan(prepared, "nopayload", database__payload=str(prepared / "pfs" / "missing"),
                 database__size="1MB")
    proc = _start(case, "104")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 4, out
    assert "payload copy" in (_rundir(case, "104") / "reason").read_text()


def test_db_killed_mid_job_is_restarted(prepared):
    case = _plan(prepared, "dbkill", chain_extra=["--cpu-seconds", "6", "--refresh", "50"])
    proc = _start(case, "105")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list((case / "plan" / "run").glob("*/105/chains/0.timeline"))
        if found and "begin" in found[0].read_text():
            break
        time.sleep(0.2)
    time.sleep(1.0)
    pattern = rf"mariadbd.*hpcrun\.[0-9a-f]+\.105\..*{case}/plan/run"   # this case's server, not a stale one
    pid = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    assert pid, "server not running during the chains"
    os.kill(int(pid[0]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    run = _rundir(case, "105")
    assert len((run / "db" / "fakenode.restarts").read_text().splitlines()) == 1
    assert (run / "qa.tsv").read_text().split()[3] == "pass"
    no_server_left(case, "105")


def test_pre_timeout_signal_stops_cleanly(prepared):
    case = _plan(prepared, "timeout", chain_extra=["--cpu-seconds", "60"])
    proc = _start(case, "106")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((case / "plan" / "run").glob("*/106/chains/*.timeline")):
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(proc.pid, 0)  # still running
    # Slurm's --signal=B:USR1 goes to the batch shell only (the oldest: the job script exec'ed the shared
    # body; its own subshells, such as launch_in_batch, carry the same command line)
    shell = subprocess.run(["pgrep", "-f", "-o", f"bash {case}/plan/bin/hpcrun-job.sh"], capture_output=True,
                           text=True).stdout.split()
    os.kill(int(shell[0]), signal.SIGUSR1)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 10, out
    run = _rundir(case, "106")
    assert "time limit" in (run / "reason").read_text()
    assert (run / "db" / "fakenode.stopped").read_text().strip() == "0"
    assert "Shutdown complete" in (run / "db" / "fakenode.err").read_text()
    no_server_left(case, "106")


def _checksum(path: Path, algo: str) -> str:
    data = path.read_bytes()
    if algo == "md5":
        return "md5:" + hashlib.md5(data).hexdigest()
    return f"adler32:{zlib.adler32(data) & 0xFFFFFFFF:08x}"


@pytest.mark.parametrize("algo, job_id", [("adler32", "107"), ("md5", "108")])
def test_corrupted_input_fails_before_anything_runs(prepared, algo, job_id):
    case = _plan(prepared, f"corrupt-{algo}", inputs__checksum=algo)
    staged = case / "bb" / "in" / "run1000.h5"
    planned = _checksum(staged, algo)
    data = bytearray(staged.read_bytes())      # one flipped byte after `hpcrun plan`
    data[len(data) // 2] ^= 0x01
    staged.write_bytes(bytes(data))
    proc = _start(case, job_id)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 11, out
    run = _rundir(case, job_id)
    assert (run / "reason").read_text().strip() == (
        f"input checksum mismatch: {staged}: expected {planned}, got {_checksum(staged, algo)}")
    assert (run / "exit_code").read_text().strip() == "11"
    assert not (run / "db").exists(), "the database was started"
    assert not list((run / "chains").glob("*")), "a chain ran"


def test_md5_untouched_input_passes(prepared):
    case = _plan(prepared, "md5ok", inputs__checksum="md5")
    proc = _start(case, "109")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "verified the md5 checksum of 1 input(s)" in out
    expected = _checksum(case / "bb" / "in" / "run1000.h5", "md5")
    assert (_rundir(case, "109") / "checksums.tsv").read_text().split() == [
        str(case / "bb" / "in" / "run1000.h5"), expected, expected]
    no_server_left(case, "109")


def test_unreadable_input_is_a_clear_checksum_failure(prepared):
    """A staged copy the job can see but not read fully (here: a directory in its place
    passes the -r check but cannot be checksummed)."""
    case = _plan(prepared, "unreadable")
    staged = case / "bb" / "in" / "run1000.h5"
    staged.unlink()
    staged.mkdir()
    subprocess.run(["chown", USER, str(staged)], check=True)
    proc = _start(case, "110")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 11, out
    reason = (_rundir(case, "110") / "reason").read_text()
    assert reason.startswith(f"input checksum could not be computed: {staged}: cannot read {staged}: "), reason
    assert "Is a directory" in reason
