"""The test cluster itself: jobs, accounting, the Shifter SPANK stub, the
container stand-ins inside jobs, and the harness's start/stop life cycle.

The stop/start test runs last in this file: it restarts the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import harness

pytestmark = pytest.mark.cluster

HARNESS = Path(harness.__file__).resolve()


def _harness(*args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(HARNESS), *args], capture_output=True, text=True,
                       timeout=timeout)
    return p, time.monotonic() - t0


def _start_args(c) -> list[str]:
    state = json.loads((c.dir / "run" / "harness.json").read_text())
    return ["start", "--dir", str(c.dir), "--nodes", str(state["nodes"]),
            "--accounting", state["accounting"]]


def test_trivial_job_completed(slurm_cluster):
    c = slurm_cluster
    out = c.workdir / "hello.out"
    script = c.write("hello.sh", f"""#!/bin/bash
#SBATCH -o {out}
#SBATCH -J hello
echo "hello from $SLURM_JOB_ID as $(id -un) on $SLURMD_NODENAME"
""")
    t0 = time.monotonic()
    jobid = c.sbatch(script)
    res = c.wait_job(jobid, timeout=30)
    elapsed = time.monotonic() - t0
    assert (res.state, res.exit_code) == ("COMPLETED", "0:0")
    assert out.read_text() == f"hello from {jobid} as {c.user} on {c.nodes[0]}\n"
    assert elapsed < 15, f"trivial job took {elapsed:.1f}s"


def test_failed_job_exit_code_in_sacct(slurm_cluster):
    c = slurm_cluster
    script = c.write("fail.sh", "#!/bin/bash\n#SBATCH -o /dev/null\nexit 7\n")
    res = c.wait_job(c.sbatch(script))
    assert (res.state, res.exit_code) == ("FAILED", "7:0")


def test_srun_eight_tasks_and_steps_in_sacct(slurm_cluster):
    c = slurm_cluster
    out, err = c.workdir / "srun.out", c.workdir / "srun.err"
    # srun's own words go to stderr: "step creation temporarily disabled, retrying (Requested nodes are busy)"
    # while the first step's resources are still being released (seen in CI)
    script = c.write("srun.sh", f"""#!/bin/bash
#SBATCH -o {out}
#SBATCH -e {err}
#SBATCH -n 8
srun -n 8 bash -c 'echo task $SLURM_PROCID' | sort -u | wc -l
srun -n 16 --overcommit true && echo overcommit-ok
""")
    jobid = c.sbatch(script)
    res = c.wait_job(jobid)
    assert res.state == "COMPLETED", out.read_text() + err.read_text()
    assert out.read_text().split() == ["8", "overcommit-ok"], err.read_text()
    if c.accounting == "slurmdbd":
        steps = {r["JobID"] for r in c.sacct(jobid, fields="JobID,State", steps=True)}
        assert {f"{jobid}.batch", f"{jobid}.0", f"{jobid}.1"} <= steps


def test_sacct_shows_burst_buffer_tres(slurm_cluster):
    c = slurm_cluster
    if c.accounting != "slurmdbd":
        pytest.skip("ReqTRES needs slurmdbd accounting")
    script = c.write("bb.sh", "#!/bin/bash\n#SBATCH -o /dev/null\n"
                     "#DW jobdw capacity=10GB access_mode=striped type=scratch\ntrue\n")
    jobid = c.sbatch(script)
    assert c.wait_job(jobid).state == "COMPLETED"
    # for very short jobs ReqTRES reaches the database a few seconds (~4 s
    # measured) after the final State
    tres = c.wait_until(lambda: c.sacct(jobid, fields="JobID,ReqTRES")[0]["ReqTRES"],
                        timeout=20, interval=0.2, what="ReqTRES in sacct")
    assert "bb/lua=10G" in tres


def test_afterok_dependency_sees_staged_out_files(slurm_cluster):
    c = slurm_cluster
    pfs = c.pfs
    first = c.write("first.sh", f"""#!/bin/bash
#SBATCH -o /dev/null
#DW jobdw capacity=1GiB access_mode=striped type=scratch
#DW stage_out source=$DW_JOB_STRIPED/r.txt destination={pfs}/r.txt type=file
echo staged > "$DW_JOB_STRIPED/r.txt"
""")
    out = c.workdir / "second.out"
    # afterok waits for the first job's stage-out only when the dependent job also has a
    # burst buffer (hpc-reference 1.8); without one it races the stage-out
    second = c.write("second.sh", f"#!/bin/bash\n#SBATCH -o {out}\n"
                     "#DW jobdw capacity=1GiB access_mode=striped type=scratch\n"
                     f"cat {pfs}/r.txt\n")
    j1 = c.sbatch(first)
    j2 = c.sbatch(second, f"--dependency=afterok:{j1}")
    assert c.wait_job(j2).state == "COMPLETED"
    assert out.read_text() == "staged\n"


# --------------------------------------------------------------------------
# Shifter SPANK stub
# --------------------------------------------------------------------------


def test_spank_stub_accepts_image_and_pernodecache_volume(slurm_cluster):
    c = slurm_cluster
    out = c.workdir / "spank.out"
    volume = f"{c.pfs}:/mnt:perNodeCache=size=1G;{c.workdir}:/data:ro"
    script = c.write("spank.sh", f"""#!/bin/bash
#SBATCH -o {out}
#SBATCH --image=docker:x:y
#SBATCH --volume="{volume}"
#SBATCH --module=mpich
echo "batch $SHIFTER_IMAGETYPE $SHIFTER_IMAGE $SHIFTER_VOLUME $SHIFTER_MODULE"
srun bash -c 'echo "step $SHIFTER_IMAGETYPE $SHIFTER_IMAGE $SHIFTER_VOLUME"'
""")
    jobid = c.sbatch(script)
    assert c.wait_job(jobid).state == "COMPLETED"
    assert out.read_text().splitlines() == [
        f"batch docker x:y {volume} mpich",
        f"step docker x:y {volume}",
    ]


@pytest.mark.parametrize("option,message", [
    ("--image=x", "Invalid image input: must specify image type"),
    ("--image=:ubuntu", "Invalid image input: must specify image type"),
    ("--volume=/does/not/exist:/mnt", "source '/does/not/exist' does not exist"),
    ("--volume=tmp:/mnt", "must be an absolute path"),
    ("--volume=/tmp:mnt", "must be an absolute path"),
    ("--volume=/tmp:/etc/foo", "is not allowed"),
    ("--volume=/tmp:/var/lib/x", "is not allowed"),
    ("--volume=/tmp:/opt", "is not allowed"),
    ("--volume=/tmp:/opt/udiImage/x", "is not allowed"),
    ("--volume=/tmp:/mnt:perNodeCache=size=0", "Invalid size for perNodeCache"),
    ("--volume=/tmp:/mnt:perNodeCache=size=10Q", "Invalid size for perNodeCache"),
    ("--volume=/tmp:/mnt:perNodeCache=size=1G,fs=ext4", "only fs=xfs"),
    ("--volume=/tmp:/mnt:perNodeCache=size=1G,method=nbd", "only method=loop"),
    ("--volume=/tmp:/mnt:perNodeCache=bs=1M", "size= is required"),
    ("--volume=/tmp:/mnt:rw", "unknown flag 'rw'"),
    ("--volume=/tmp:/a;/nope:/b", "source '/nope' does not exist"),
])
def test_spank_stub_rejects_bad_options(slurm_cluster, option, message):
    c = slurm_cluster
    script = c.write("s.sh", "#!/bin/bash\ntrue\n")
    proc = c.sbatch_raw(script, option)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("volume", [
    "/tmp:/var/tmp/x", "/tmp:/mnt:ro", "/tmp:/mnt:perNodeCache=size=1.5g,bs=1m,fs=xfs,method=loop",
    "/tmp:/opt/data",
])
def test_spank_stub_accepts_valid_volumes(slurm_cluster, volume):
    c = slurm_cluster
    script = c.write("s.sh", "#!/bin/bash\n#SBATCH -o /dev/null\ntrue\n")
    proc = c.sbatch_raw(script, "--image=docker:ubuntu:22.04", f"--volume={volume}")
    assert proc.returncode == 0, proc.stderr
    c.wait_job(proc.stdout.strip())


def test_shifter_standin_inside_job(slurm_cluster):
    c = slurm_cluster
    out = c.workdir / "sh.out"
    script = c.write("sh.sh", f"""#!/bin/bash
#SBATCH -o {out}
#SBATCH --image=docker:ubuntu:22.04
#SBATCH --volume={c.pfs}:/mnt:perNodeCache=size=1G
srun shifter /bin/bash -c 'echo "img=$SHIFTER_IMAGETYPE:$SHIFTER_IMAGE rt=$SHIFTER_RUNTIME"; \
echo "pnc=$SHIFTER_STUB_VOLUME_MNT"; test -d "$SHIFTER_STUB_VOLUME_MNT" && echo pnc-dir-ok'
""")
    jobid = c.sbatch(script)
    assert c.wait_job(jobid).state == "COMPLETED", out.read_text()
    lines = out.read_text().splitlines()
    assert lines[0] == "img=docker:ubuntu:22.04 rt=1"
    pnc = f"{c.dir}/nodelocal/{c.nodes[0]}/job{jobid}-uid{c.uid}/MNT"
    assert lines[1] == f"pnc={pnc}"
    assert lines[2] == "pnc-dir-ok"
    calls = [json.loads(line) for line in c.containers_log.read_text().splitlines()]
    mine = [r for r in calls if r.get("job") == jobid]
    assert mine and mine[0]["tool"] == "shifter" and mine[0]["ok"]
    assert mine[0]["argv"][0] == "/bin/bash"


# --------------------------------------------------------------------------
# harness life cycle
# --------------------------------------------------------------------------


def test_status_and_env_file(slurm_cluster):
    c = slurm_cluster
    p, _ = _harness("status", "--dir", str(c.dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "slurmctld" in p.stdout and "running pid" in p.stdout
    env = c.vars
    for key in ("SLURM_CONF", "HPCRUN_TEST_CLUSTER_DIR", "HPCRUN_TEST_USER", "HPCRUN_TEST_BIN",
                "HPCRUN_TEST_BB_DIR", "HPCRUN_TEST_PFS", "HPCRUN_TEST_WORK"):
        assert env.get(key), key
    assert Path(env["HPCRUN_TEST_BIN"], "shifter").is_file()
    assert os.access(Path(env["HPCRUN_TEST_BIN"], "apptainer"), os.X_OK)
    assert Path(env["HPCRUN_TEST_WORK"]).stat().st_uid == c.uid


def test_start_is_idempotent_and_fast(slurm_cluster):
    c = slurm_cluster
    p, elapsed = _harness(*_start_args(c))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "already running" in p.stdout
    assert elapsed < 3, f"idempotent start took {elapsed:.2f}s"


def _our_processes(c) -> list[int]:
    return harness.leftover_processes(harness.Layout(c.dir))


def _run_trivial(c) -> str:
    script = c.write("again.sh", "#!/bin/bash\n#SBATCH -o /dev/null\nsrun true\n")
    return c.wait_job(c.sbatch(script), timeout=60).state


def test_stop_then_start_again(slurm_cluster):
    c = slurm_cluster
    start_args = _start_args(c)
    marker = c.workdir / "running"
    # the sleep carries a name of its own: another `sleep 300` on the machine is not this job's
    long_job = c.sbatch(c.write("long.sh", f"#!/bin/bash\n#SBATCH -o /dev/null\n"
                                f"touch {marker}\nexec -a hpcrun-harness-long-job sleep 300\n"))
    c.wait_until(marker.exists, timeout=30, what="long job running")
    p, t_stop = _harness("stop", "--dir", str(c.dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cancelled 1 queued/running job" in p.stdout
    assert not list((c.dir / "run").glob("*.harness.pid"))
    assert _our_processes(c) == []
    pg = subprocess.run(["pgrep", "-f", "hpcrun-harness-long-job"], capture_output=True, text=True)
    assert pg.stdout == "", pg.stdout
    p2, _ = _harness("stop", "--dir", str(c.dir))  # no-op when nothing runs
    assert p2.returncode == 0 and "nothing was running" in p2.stdout
    p3, _ = _harness("status", "--dir", str(c.dir))
    assert p3.returncode == 3

    # multi-node variant, then back to the original configuration
    p, _ = _harness("start", "--dir", str(c.dir), "--nodes", "2",
                    "--accounting", start_args[-1])
    assert p.returncode == 0, p.stdout + p.stderr
    out = c.workdir / "two.out"
    script = c.write("two.sh", f"#!/bin/bash\n#SBATCH -o {out}\n#SBATCH -N 2\n"
                     "srun --ntasks-per-node=1 bash -c 'echo $SLURMD_NODENAME' | sort\n")
    assert c.wait_job(c.sbatch(script), timeout=60).state == "COMPLETED"
    assert out.read_text().split() == ["nid00001", "nid00002"]

    p, t_restart = _harness(*start_args)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cluster up" in p.stdout
    assert _run_trivial(c) == "COMPLETED"
    assert c.wait_job(long_job).state.startswith("CANCELLED")
    print(f"stop {t_stop:.2f}s, restart {t_restart:.2f}s")
