"""The generated job of the detector-reco-local example with ``container: charliecloud``, run for
real outside Slurm (as tests/test_job_local.py does): srun is tests/fakes/srun, everything else
is real, and everything of the job runs inside real ch-run containers: the DB supervisor and
its MariaDB server, the four chains (which reach the server over the socket in the node-local
directory bound into every container), the merge and QA.

The campaign lives under /var/tmp/hpcrun-test, which the image has as a mount point and the test
profile binds (so the binds really need mount points in the read-only image; /tmp would not).
The image comes from tests/cluster/image.py (built once, then restored from its cache).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from hpcrun.errors import InputError

from .cluster import image as test_image
from .conftest import REPO, readable_copy
from .test_job_local import SYSTEM_PYTHON, USER, _requirements, as_user, example_spec, no_server_left, plan_case

EXAMPLE = REPO / "examples" / "detector-reco-local"   # read here; run from readable_copy
ROOT = Path("/var/tmp/hpcrun-test")        # a mount point in the test image (image.MOUNT_POINTS)


def _cc_requirements() -> str:
    base = _requirements()
    if base:
        return base
    if shutil.which("ch-run") is None:
        return "ch-run missing: run python3 tests/cluster/harness.py install (charliecloud-runtime)"
    return ""


pytestmark = pytest.mark.skipif(bool(_cc_requirements()), reason=_cc_requirements() or "ok")


@pytest.fixture(scope="module")
def image() -> Path:
    if test_image.is_ready(test_image.default_dest()):
        return test_image.default_dest()
    try:
        return test_image.build()
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"the Charliecloud test image could not be built: {exc}")


@pytest.fixture(scope="module")
def prepared(image):
    ROOT.mkdir(parents=True, exist_ok=True)
    ROOT.chmod(0o755)
    root = Path(tempfile.mkdtemp(prefix="cc-", dir=ROOT))
    root.chmod(0o755)
    shutil.chown(root, USER)
    prepare = readable_copy("examples/detector-reco-local") / "prepare.py"
    as_user([SYSTEM_PYTHON, str(prepare), "--root", str(root / "pfs"), "--files", "1",
             "--events", "1200"], check=True, capture_output=True)
    profile = root / "site.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "local-test-charliecloud", "extends": "local-test",
        "containers": {"charliecloud": {"command": "ch-run", "binds": [str(ROOT)],
                                        "burst_buffer_root": str(ROOT)}}}))
    yield root, image
    shutil.rmtree(root, ignore_errors=True)


def _plan(prepared, name: str, chain_extra=(), **changes) -> Path:
    root, image = prepared
    changes.setdefault("site", {"profile": str(root / "site.yaml")})
    changes.setdefault("container", {"runtime": "charliecloud", "image": str(image)})
    return plan_case(root, name, example_spec(root, chain_extra, **changes))


def _start(case: Path, job_id: str, **extra: str) -> subprocess.Popen:
    # USER is deliberately not set (the job sets it for ch-run); HOME is the host's
    env = {"PATH": f"{readable_copy('tests/fakes')}:/usr/bin:/bin", "SLURM_JOB_ID": job_id,
           "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "fakenode",
           "DW_JOB_STRIPED": f"{case / 'bb'}/", "HOME": "/tmp", **extra}
    script = next((case / "plan" / "jobs").glob("*.sbatch"))
    return subprocess.Popen(["runuser", "-u", USER, "--", "env", "-i",
                             *[f"{k}={v}" for k, v in env.items()], "bash", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _rundir(case: Path, job_id: str) -> Path:
    return next((case / "plan" / "run").glob(f"*/{job_id}"))


def _in_container(pid: int) -> bool:
    """ch-run execs its command, so a contained process has CH_RUNNING in its environment
    and its root is the image."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return any(e.startswith(b"CH_RUNNING=") for e in environ)


def _wait_for_chains(case: Path, job_id: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list((case / "plan" / "run").glob(f"*/{job_id}/chains/0.timeline"))
        if found and "begin" in found[0].read_text():
            return
        time.sleep(0.2)
    raise AssertionError("the chains did not start")


def test_plan_runs_everything_through_ch_run(prepared):
    case = _plan(prepared, "shape")
    _, image = prepared
    script = (case / "plan" / "bin" / "hpcrun-job.sh").read_text()   # the steps every job script runs
    launch = f"ch-run -b /tmp:/tmp -b {ROOT}:{ROOT} -b " + '"${HPCRUN_PLAN_DIR}":"${HPCRUN_PLAN_DIR}" ' \
        + f'--set-env=HOME="$HPCRUN_RUNDIR" {image} -- '
    assert f'{launch}bash "$HPCRUN_PLAN_DIR/bin/hpcrun-db.sh"' in script
    assert f'{launch}bash "$HPCRUN_PLAN_DIR/bin/hpcrun-chain.sh"' in script
    assert f"step {launch}/usr/bin/python3 " in script          # merge
    assert f"$({launch}/usr/bin/python3 " in script             # QA's event counts


def test_job_runs_inside_charliecloud(prepared):
    case = _plan(prepared, "ok")
    # a per-job TMPDIR as sites set it: ch-run would make it the container's /tmp, where the
    # node-local directory /tmp/hpcrun.<job>.<node> (socket, payload copy) does not exist
    tmpdir = case / "tmpdir"
    tmpdir.mkdir()
    shutil.chown(tmpdir, USER)
    proc = _start(case, "201", TMPDIR=str(tmpdir))
    seen = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(seen) < 2:
        for pattern, what in (("^/usr/sbin/mariadbd .*hpcrun[.][0-9a-f]+[.]201[.]", "server"),
                              ("^bash .*/bin/hpcrun-chain[.]sh", "chain")):
            for pid in subprocess.run(["pgrep", "-u", USER, "-f", pattern], capture_output=True,
                                      text=True).stdout.split():
                try:
                    if str(case) in Path(f"/proc/{pid}/environ").read_text(errors="replace"):
                        seen[what] = _in_container(int(pid))
                except OSError:
                    pass
        time.sleep(0.1)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert seen == {"server": True, "chain": True}, seen
    run = _rundir(case, "201")
    assert (run / "db" / "fakenode.stopped").read_text().strip() == "0"
    ready_at = float((run / "db" / "fakenode.ready").read_text())
    begins = [float(line.split()[1]) for k in range(4)
              for line in (run / "chains" / f"{k}.timeline").read_text().splitlines() if line.startswith("begin")]
    assert len(begins) == 4 and min(begins) > ready_at
    assert (run / "qa.tsv").read_text().split()[:5] == ["run1000", "1200", "1200", "pass", "run1000.reco.h5"]
    assert (case / "bb" / "out" / "run1000.reco.h5").exists()
    assert "Shutdown complete" in (run / "db" / "fakenode.err").read_text()
    # the server ran the image's MariaDB, not the host's
    assert re.search(r"/tmp/hpcrun\.[0-9a-f]{10}\.201\.fakenode/data", (run / "db" / "fakenode.log").read_text())
    no_server_left(case, "201")


def test_db_killed_mid_job_is_restarted_inside_the_container(prepared):
    case = _plan(prepared, "dbkill", chain_extra=["--cpu-seconds", "6", "--refresh", "50"])
    proc = _start(case, "202")
    _wait_for_chains(case, "202")
    time.sleep(1.0)
    pattern = rf"mariadbd.*hpcrun\.[0-9a-f]+\.202\..*{case}/plan/run"   # this case's server, not a stale one
    pid = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    assert pid, "server not running during the chains"
    assert _in_container(int(pid[0]))
    os.kill(int(pid[0]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    run = _rundir(case, "202")
    assert len((run / "db" / "fakenode.restarts").read_text().splitlines()) == 1
    assert (run / "qa.tsv").read_text().split()[3] == "pass"
    no_server_left(case, "202")


def test_time_limit_stops_the_contained_db_cleanly(prepared):
    case = _plan(prepared, "timeout", chain_extra=["--cpu-seconds", "60"])
    proc = _start(case, "203", TMPDIR="/nonexistent/tmp")   # unset by the job, or ch-run dies
    _wait_for_chains(case, "203")
    time.sleep(1.0)
    shell = subprocess.run(["pgrep", "-f", "-o", f"bash {case}/plan/bin/hpcrun-job.sh"], capture_output=True,
                           text=True).stdout.split()
    os.kill(int(shell[0]), signal.SIGUSR1)      # Slurm's --signal=B:USR1 goes to the batch shell
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 10, out
    assert "TMPDIR=/nonexistent/tmp does not exist" in out
    run = _rundir(case, "203")
    assert "time limit" in (run / "reason").read_text()
    assert (run / "db" / "fakenode.stopped").read_text().strip() == "0"
    assert "Shutdown complete" in (run / "db" / "fakenode.err").read_text()
    no_server_left(case, "203")


def test_missing_image_fails_the_job_clearly(prepared):
    case = _plan(prepared, "noimage")
    script = case / "plan" / "bin" / "hpcrun-job.sh"    # the steps every job script runs
    _, image = prepared
    script.write_text(script.read_text().replace(str(image), str(image) + "-gone"))
    proc = _start(case, "204")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    assert (_rundir(case, "204") / "reason").read_text().strip() == (
        f"the Charliecloud image {image}-gone is not a directory on {os.uname().nodename}; "
        "ch-run runs unpacked image directories")


def test_a_bind_without_mount_point_is_refused_at_plan_time(prepared):
    elsewhere = Path(tempfile.mkdtemp(prefix="hpcrun-cc-out-", dir="/var/lib"))
    try:
        with pytest.raises(InputError) as exc:
            _plan(prepared, "nomount", outputs__location=str(elsewhere), burst_buffer=None)
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
    [problem] = exc.value.problems
    assert problem.key == "outputs.location" and problem.line is not None
    assert problem.message.startswith(f"the Charliecloud image {prepared[1]} has no mount point "
                                      f"{elsewhere} for binding {elsewhere}: ch-run mounts images "
                                      "read-only and cannot create it."), problem.message
    assert f"mkdir -p {prepared[1]}{elsewhere}" in problem.message
