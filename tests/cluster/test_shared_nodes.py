"""Shared nodes on the real test cluster (issue 24): while a job of the example campaign runs, another
local user (`nobody`) tries to get at its database and its node-local files, through the socket
(networking: socket) and through 127.0.0.1 (networking: tcp). Afterwards nothing of the campaign is
left on the nodes and nothing it wrote is world-writable."""

from __future__ import annotations

import json
import stat
import subprocess
import time
from pathlib import Path

import pytest

from .campaigns import Campaign
from .test_campaign_state import make_raw

pytestmark = pytest.mark.cluster
OTHER = "nobody"


def as_other(argv) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", OTHER, "--", *argv], capture_output=True, text=True, timeout=30)


def world_writable(root: Path) -> list:
    found = []
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & stat.S_IWOTH:
            found.append(f"{p} {oct(st.st_mode)}")
    return found


@pytest.mark.parametrize("mode", ["socket", "tcp"])
def test_another_user_cannot_reach_a_running_jobs_database_or_files(slurm_cluster, hpcrun_bin, example_root, mode):
    cluster = slurm_cluster
    glob = make_raw(cluster, example_root, cluster.pfs / "raw", 1, events=400)
    hold = cluster.write(cluster.pfs / "hold", "")
    extra = ["--hold", str(hold)]
    changes = {"burst_buffer": None, "inputs__glob": glob, "jobs": {"files_per_job": 1, "chains_per_node": 2}}
    if mode == "tcp":
        changes.update(database__networking="tcp",
                       database__options=["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M"])
        extra += ["--defaults", "{db_defaults}"]
    c = Campaign(cluster, hpcrun_bin, example_root, f"shared-{mode}", chain_extra=extra, **changes)
    [batch] = c.plan_and_submit()
    key = json.loads((c.plan / "manifest.json").read_text())["node_key"]

    # the job's chains hold (connected to the DB once) while the other user tries
    cluster.wait_until(lambda: len(subprocess.run(["pgrep", "-u", str(cluster.uid), "-f", f"chain.py .*{hold}"],
                                                  capture_output=True, text=True).stdout.split()) >= 2,
                       timeout=180, interval=1)
    time.sleep(1.5)
    [node_dir] = list(Path("/tmp").glob(f"hpcrun.{key}.*"))
    st = node_dir.stat()
    assert st.st_uid == cluster.uid and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    for target in (node_dir, node_dir / "client.cnf", node_dir / "data" / "conditions"):
        assert as_other(["ls", "-l", str(target)]).returncode != 0, target
    assert as_other(["cat", str(node_dir / "client.cnf")]).returncode != 0
    socket = as_other(["mariadb", "--no-defaults", f"--socket={node_dir}/mysqld.sock", "-e",
                       "SELECT COUNT(*) FROM conditions.calib"])
    assert socket.returncode != 0 and "(13)" in socket.stderr, socket.stderr      # EACCES: the directory
    if mode == "tcp":
        job_id = node_dir.name.split(".")[2]
        port = str(20000 + int(job_id) % 10000)
        for user in ("root", "hpcrun", OTHER):     # the payload's root has no password: locked in the copy
            tcp = as_other(["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", port, "-u", user, "-e",
                            "SELECT COUNT(*) FROM conditions.calib"])
            assert tcp.returncode != 0 and "Access denied" in tcp.stderr, (user, tcp.stderr)
        own = cluster.run_as_user(["mariadb", f"--defaults-file={node_dir}/client.cnf", "-N", "-e",
                                   "SELECT COUNT(*) FROM conditions.calib"])
        assert own.returncode == 0 and own.stdout.strip().isdigit(), own   # the job's own account does

    hold.unlink()
    [row] = c.status(timeout=240)
    assert row["status"] == "done", row
    assert not list(Path("/tmp").glob(f"hpcrun.{key}.*")), "node-local directory left behind"
    assert world_writable(c.plan) == [] and batch["job_id"]
    endings = (c.rundir(row) / "chains.tsv").read_text().split()
    assert endings.count("ok") == 2, endings
