"""The generated job of the detector-reco-local example with ``container: podman-hpc``, run for real
outside Slurm (tests/fakes/srun) with rootless podman: the DB supervisor and its MariaDB server,
the chains, the merge and QA each run in a podman container of the test image.

NERSC's podman-hpc is a wrapper around podman that adds site settings (and image migration to
squashfs on shared storage); its PyPI wheel does not run on its own (../shared/reference/podman.md).
The test stands in a three-line wrapper that adds what this machine needs (runc, the cgroupfs
manager), and the profile adds what podman-hpc's own defaults give (host network, keep-id).
The image is the Charliecloud test image's root filesystem (tests/cluster/image.py) imported
into the test user's podman storage.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from .cluster import image as test_image
from .conftest import REPO, readable_copy
from .test_job_local import SYSTEM_PYTHON, USER, _requirements, as_user, example_spec, plan_case

EXAMPLE = REPO / "examples" / "detector-reco-local"
WRAPPER = """#!/bin/sh
# the site part of podman-hpc on this machine: crun refuses hybrid cgroups here
exec podman --runtime=runc --cgroup-manager=cgroupfs "$@"
"""


def _podman_requirements() -> str:
    base = _requirements()
    if base:
        return base
    for prog, pkg in (("podman", "podman"), ("runc", "runc"), ("newuidmap", "uidmap")):
        if shutil.which(prog) is None and not os.path.exists(f"/usr/sbin/{prog}"):
            return f"{prog} missing: run python3 tests/cluster/harness.py install ({pkg})"
    subids = Path("/etc/subuid").read_text() if Path("/etc/subuid").exists() else ""
    if not any(line.startswith(f"{USER}:") for line in subids.splitlines()):
        return f"{USER} has no subordinate uids in /etc/subuid (rootless podman needs them)"
    return ""


pytestmark = pytest.mark.skipif(bool(_podman_requirements()), reason=_podman_requirements() or "ok")


def podman(*args: str, **kw) -> subprocess.CompletedProcess:
    return as_user(["podman", "--runtime=runc", "--cgroup-manager=cgroupfs", *args], cwd="/tmp",
                   capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def image() -> str:
    """The test image in the test user's podman storage, tagged by its build digest."""
    dest = test_image.default_dest()
    if not test_image.is_ready(dest):
        try:
            dest = test_image.build()
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"the test image could not be built: {exc}")
    tag = f"localhost/hpcrun-test:{test_image.key()}"
    if podman("image", "exists", tag).returncode != 0:
        tar = subprocess.Popen(["tar", "-C", str(dest), "-cf", "-", "."], stdout=subprocess.PIPE)
        done = subprocess.run(["runuser", "-u", USER, "--", "podman", "--runtime=runc", "--cgroup-manager=cgroupfs",
                               "import", "-", tag], stdin=tar.stdout, capture_output=True, text=True,
                              cwd="/tmp", timeout=600)
        tar.wait()
        assert done.returncode == 0, done.stderr
    return tag


@pytest.fixture(scope="module")
def prepared(image):
    root = Path(tempfile.mkdtemp(prefix="hpcrun-podman-", dir="/tmp"))
    root.chmod(0o755)
    shutil.chown(root, USER)
    prepare = readable_copy("examples/detector-reco-local") / "prepare.py"
    as_user([SYSTEM_PYTHON, str(prepare), "--root", str(root / "pfs"), "--files", "1",
             "--events", "1200"], check=True, capture_output=True)
    wrapper = root / "podman-hpc"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    (root / "site.yaml").write_text(yaml.safe_dump({
        "name": "local-test-podman", "extends": "local-test",
        "containers": {"podman-hpc": {"command": str(wrapper),
                                      "run_options": ["--network=host", "--userns=keep-id"]}}}))
    yield root, image
    shutil.rmtree(root, ignore_errors=True)


def _plan(prepared, name: str, chain_extra=()) -> Path:
    root, image = prepared
    return plan_case(root, name, example_spec(root, chain_extra, site={"profile": str(root / "site.yaml")},
                                              container={"runtime": "podman-hpc", "image": image}))


def _run(case: Path, job_id: str) -> subprocess.Popen:
    env = {"PATH": f"{readable_copy('tests/fakes')}:/usr/bin:/usr/sbin:/bin", "SLURM_JOB_ID": job_id,
           "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "fakenode", "DW_JOB_STRIPED": f"{case / 'bb'}/",
           "HOME": f"/home/{USER}",
           "USER": USER}
    script = next((case / "plan" / "jobs").glob("*.sbatch"))
    return subprocess.Popen(["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                             "bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd="/tmp")


def test_job_runs_inside_rootless_podman(prepared):
    # chains that last a few seconds, so that the `podman ps` below sees them running
    case = _plan(prepared, "ok", chain_extra=["--cpu-seconds", "4"])
    script = (case / "plan" / "bin" / "hpcrun-job.sh").read_text()
    assert f'{prepared[0] / "podman-hpc"} run --rm --network=host --userns=keep-id' in script
    proc = _run(case, "401")
    seen = set()
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and len(seen) < 2:
        # what podman is running for this job right now: the DB supervisor, then the chains
        ps = podman("ps", "--no-trunc", "--format", "{{.Command}}").stdout
        seen |= {what for what, word in (("db", "hpcrun-db.sh"), ("chain", "hpcrun-chain.sh")) if word in ps}
        time.sleep(0.3)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert seen == {"db", "chain"}, (seen, out)
    run = next((case / "plan" / "run").glob("*/401"))
    assert (run / "qa.tsv").read_text().split()[:5] == ["run1000", "1200", "1200", "pass", "run1000.reco.h5"]
    assert (case / "bb" / "out" / "run1000.reco.h5").exists()
    # the image as podman identifies it, for the outputs' provenance records
    assert (run / "image.id").read_text().strip() == podman("image", "inspect", "--format", "{{.Id}}",
                                                             prepared[1]).stdout.strip()
    logs = {p.name: p.read_text(errors="replace") for p in (run / "db").iterdir() if p.is_file()}
    assert "Shutdown complete" in "".join(logs.values()), sorted(logs)
    assert podman("ps", "-a", "--format", "{{.ID}}").stdout.strip() == "", "containers left behind"


def test_a_failing_chain_in_podman_fails_the_job_with_its_code(prepared):
    case = _plan(prepared, "chainfail", chain_extra=["--fail-chain", "1"])
    out, _ = _run(case, "402").communicate(timeout=300)
    run = next((case / "plan" / "run").glob("*/402"))
    assert "chain(s) failed: 1(rc=3)" in (run / "reason").read_text(), out
