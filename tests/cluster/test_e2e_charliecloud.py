"""The detector-reco-local campaign with ``container: charliecloud`` on the real test cluster: the
per-node DB supervisor and its MariaDB server, and every chain, run inside real ch-run containers
(an image from tests/cluster/image.py, unpacked into DIR/images/reco); the chains reach the server
over the socket in the node-local directory bound into every container; the merge and QA run in
the container too; outputs are staged out through the emulated burst buffer. Then the DB-killed
and time-limit paths inside the container.

Skipped, with the reason, when ch-run is missing or the image cannot be built or restored.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from . import image as test_image
from .campaigns import Campaign
from .test_e2e import _count_events, _events

pytestmark = pytest.mark.cluster


def _node_dir(c, run: Path, node: str) -> str:
    """The job's node-local directory: /tmp/hpcrun.<the campaign's key>.<job id>.<node>."""
    key = json.loads((c.plan / "manifest.json").read_text())["node_key"]
    return f"/tmp/hpcrun.{key}.{run.name}.{node}"


@pytest.fixture(scope="module")
def cc_image(slurm_cluster) -> Path:
    if shutil.which("ch-run") is None:
        pytest.skip("ch-run is not installed: run python3 tests/cluster/harness.py install")
    dest = slurm_cluster.dir / "images" / "reco"
    try:
        return test_image.build(dest)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"the Charliecloud test image could not be built or restored: {exc}")


def _campaign(slurm_cluster, hpcrun_bin, example_root, cc_image, name, **kw) -> Campaign:
    return Campaign(slurm_cluster, hpcrun_bin, example_root, name,
                    container={"runtime": "charliecloud", "image": str(cc_image)}, **kw)


def _contained(slurm_cluster, pattern: str, plan: Path) -> list:
    """Pids of the test user's processes matching ``pattern`` that belong to this plan and run
    inside ch-run (which execs its command, so CH_RUNNING is in the process's environment)."""
    found = []
    pids = subprocess.run(["pgrep", "-u", slurm_cluster.user, "-f", pattern], capture_output=True,
                          text=True).stdout.split()
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(plan).encode() in b"\0".join(environ) and any(e.startswith(b"CH_RUNNING=") for e in environ):
            found.append(int(pid))
    return found


def test_campaign_end_to_end_in_charliecloud(slurm_cluster, hpcrun_bin, example_root, cc_image):
    c = _campaign(slurm_cluster, hpcrun_bin, example_root, cc_image, "cc-ok",
                  chain_extra=["--cpu-seconds", "4"],
                  inputs={"glob": str(example_root / "raw" / "run1001.h5")})
    [sub] = c.plan_and_submit()
    # a job with a script of its own runs the plan's shared body (bin/hpcrun-job.sh): the steps are there
    body = c.plan / "bin" / "hpcrun-job.sh"
    script = body.read_text() if body.exists() else next((c.plan / "jobs").glob("*.sbatch")).read_text()
    assert f"{cc_image} -- bash \"$HPCRUN_PLAN_DIR/bin/hpcrun-db.sh\"" in script
    assert f"{cc_image} -- bash \"$HPCRUN_PLAN_DIR/bin/hpcrun-chain.sh\"" in script
    # while it runs: the server and the chains are processes inside ch-run containers
    server = slurm_cluster.wait_until(
        lambda: _contained(slurm_cluster, f"^/usr/sbin/mariadbd .*hpcrun[.][0-9a-f]+[.]{sub['job_id']}[.]", c.plan),
        timeout=120, what="the MariaDB server inside ch-run")
    chains = slurm_cluster.wait_until(
        lambda: _contained(slurm_cluster, "^bash .*/bin/hpcrun-chain[.]sh", c.plan),
        timeout=60, what="chains inside ch-run")
    assert server and chains
    [row] = c.status()
    assert row["state"] == "COMPLETED", row
    acct = slurm_cluster.sacct(sub["job_id"], fields="State,ExitCode")[0]
    assert (acct["State"], acct["ExitCode"]) == ("COMPLETED", "0:0")
    run = c.rundir(row)
    node = c.node(row)
    assert f"{_node_dir(c, run, node)}/data" in (run / "db" / f"{node}.log").read_text()
    ready = float((run / "db" / f"{node}.ready").read_text())
    begins = [float(line.split()[1]) for k in range(4)
              for line in (run / "chains" / f"{k}.timeline").read_text().splitlines() if line.startswith("begin")]
    assert len(begins) == 4 and ready < min(begins)
    assert (run / "db" / f"{node}.stopped").read_text().strip() == "0"
    assert "Shutdown complete" in (run / "db" / f"{node}.err").read_text()
    assert not Path(_node_dir(c, run, node)).exists()
    # staged out of the burst buffer after the job, every event there, QA passed
    slurm_cluster.wait_until(lambda: "teardown" in _events(slurm_cluster, sub["job_id"]),
                             timeout=30, what="teardown")
    funcs = _events(slurm_cluster, sub["job_id"])
    assert funcs.index("data_in") < funcs.index("pre_run") < funcs.index("post_run") < funcs.index("data_out")
    assert _count_events(c.out / "run1001.reco.h5") == 1500
    assert (run / "qa.tsv").read_text().split()[:5] == ["run1001", "1500", "1500", "pass", "run1001.reco.h5"]


def test_db_killed_in_charliecloud_is_restarted(slurm_cluster, hpcrun_bin, example_root, cc_image):
    c = _campaign(slurm_cluster, hpcrun_bin, example_root, cc_image, "cc-dbkill",
                  chain_extra=["--cpu-seconds", "8", "--refresh", "50"],
                  inputs={"glob": str(example_root / "raw" / "run1000.h5")})
    [sub] = c.plan_and_submit()

    def contained_server_during_chains():
        chains = list(c.plan.glob("run/*/*/chains/0.timeline"))
        if not (chains and "begin" in chains[0].read_text()):
            return None
        return _contained(slurm_cluster, f"^/usr/sbin/mariadbd .*hpcrun[.][0-9a-f]+[.]{sub['job_id']}[.]", c.plan)
    pid = slurm_cluster.wait_until(contained_server_during_chains, timeout=120,
                                   what="chains running against the contained server")
    os.kill(pid[0], signal.SIGKILL)
    [row] = c.status()
    assert row["state"] == "COMPLETED", row
    run = c.rundir(row)
    node = c.node(row)
    assert len((run / "db" / f"{node}.restarts").read_text().splitlines()) == 1
    assert (run / "qa.tsv").read_text().split()[3] == "pass"
    assert (run / "db" / f"{node}.stopped").read_text().strip() == "0"


def test_time_limit_in_charliecloud_stops_db_cleanly(slurm_cluster, hpcrun_bin, example_root, cc_image):
    c = _campaign(slurm_cluster, hpcrun_bin, example_root, cc_image, "cc-timelimit",
                  chain_extra=["--cpu-seconds", "600"], walltime="00:02:00",
                  inputs={"glob": str(example_root / "raw" / "run1000.h5")})
    [sub] = c.plan_and_submit()
    slurm_cluster.wait_until(
        lambda: _contained(slurm_cluster, f"^/usr/sbin/mariadbd .*hpcrun[.][0-9a-f]+[.]{sub['job_id']}[.]", c.plan),
        timeout=120, what="the MariaDB server inside ch-run")
    [row] = c.status(timeout=200)
    assert row["state"] in ("FAILED", "TIMEOUT"), row
    assert "time limit" in row["reason"]
    run = c.rundir(row)
    node = c.node(row)
    assert (run / "db" / f"{node}.stopped").read_text().strip() == "0"
    assert "Shutdown complete" in (run / "db" / f"{node}.err").read_text()
    assert not Path(_node_dir(c, run, node)).exists()
    slurm_cluster.wait_until(lambda: "data_out" in _events(slurm_cluster, sub["job_id"]),
                             timeout=30, what="stage-out after the time limit")
