"""An fio sweep job with a burst-buffer target and a scratch target, rendered and submitted
by `hpcrun iotune run --submit` as the unprivileged test user on the real Slurm test cluster
(DataWarp emulated by burst_buffer/lua), then gathered with `hpcrun iotune collect`.

hpcrun runs from the same virtualenv as test_e2e.py (DIR/venv, rebuilt when the source
changes).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster


def _submit(cluster, hpcrun_bin: str, out: Path, engine: str, *targets: str) -> tuple:
    """`iotune run --submit` as the test user: (the summary it printed, the environment it ran with)."""
    env = {"COLUMNS": "200", "HPCRUN_IOTUNE_HISTORY": str(out.parent / "history.jsonl")}
    proc = cluster.run_as_user(
        [hpcrun_bin, "iotune", "run", "--engine", engine, "--transfer-size", "64k,1m", "--writers", "1,2",
         "--block-size", "4m", "--reps", "2", *(w for t in targets for w in ("--target", t)),
         "--profile", "local-test", "--out", str(out), "--submit", "--json"], env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout), env


def test_fio_sweep_on_burst_buffer_and_scratch(slurm_cluster, hpcrun_bin):
    scratch = slurm_cluster.pfs
    out = slurm_cluster.workdir / "sweep"
    summary, env = _submit(slurm_cluster, hpcrun_bin, out, "fio", "bb", str(scratch))
    job_id = summary["job_id"]
    assert job_id and summary["targets"] == ["bb", str(scratch)]
    script = (out / "iotune.sbatch").read_text()
    assert "#DW jobdw capacity=1GiB access_mode=striped type=scratch pool=wlm_pool" in script

    # not finished yet (or just finished): collect must never report half a sweep as done
    early = slurm_cluster.run_as_user([hpcrun_bin, "iotune", "collect", str(out), "--json"], env=env)
    if early.returncode != 0:
        said = " ".join(early.stderr.split())     # rich may wrap the message
        assert early.returncode == 2 and ("has not ended yet" in said or "has not finished" in said), said

    result = slurm_cluster.wait_job(job_id, timeout=300)
    raw_files = sorted(p.name for p in (out / "raw").iterdir()) if (out / "raw").is_dir() else []
    assert result.state == "COMPLETED" and result.exit_code == "0:0", (result, raw_files)
    slurm_cluster.wait_until(lambda: "teardown" in [e["function"] for e in slurm_cluster.bb_events(job_id)],
                             timeout=30, what="burst-buffer teardown")
    events = slurm_cluster.bb_events(job_id)
    functions = [e["function"] for e in events]
    assert functions.index("setup") < functions.index("pre_run") < functions.index("teardown")
    assert all(e["status"] == "OK" for e in events), events

    proc = slurm_cluster.run_as_user([hpcrun_bin, "iotune", "collect", str(out), "--json"], env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)
    assert results["environment"]["slurm_job_id"] == job_id
    rows = results["results"]
    assert len(rows) == 2 * 2 * 2 * 2
    assert all(r["error"] is None and r["bw_mib_mean"] > 0 and r["reps"] == 2 for r in rows), rows

    # the bb points really ran under the job's burst buffer, the others under scratch
    targets = {t["name"]: t for t in results["targets"]}
    bb_path = targets["bb"]["run_path"]
    assert bb_path.startswith(str(slurm_cluster.bb_job_dir) + "/"), bb_path
    assert f"/{job_id}/" in bb_path and bb_path.endswith("/hpcrun-iotune")
    assert targets[str(scratch)]["run_path"] == f"{scratch}/hpcrun-iotune.{job_id}"
    assert not Path(bb_path).exists(), "burst buffer not torn down"
    assert list(scratch.iterdir()) == [], "the sweep left files on scratch"
    assert (out / "results.json").is_file() and (out / "bandwidth.png").stat().st_size > 1000
    assert results["recommendation"]["overall"]["recommended"]["target"] in ("bb", str(scratch))


@pytest.mark.skipif(shutil.which("ior", path="/usr/local/bin:/usr/bin:/bin") is None,
                    reason="IOR is not installed: build hpc/ior 4.0.0 from source into /usr/local/bin "
                           "(Debian's libopenmpi-dev, autoconf, automake) to run the IOR sweep job")
def test_ior_sweep_job_reports_its_points(slurm_cluster, hpcrun_bin):
    """A real IOR as a job step on the test cluster (srun launches its ranks): every point measured."""
    out = slurm_cluster.workdir / "ior-sweep"
    summary, env = _submit(slurm_cluster, hpcrun_bin, out, "ior", str(slurm_cluster.pfs))
    job_id = summary["job_id"]
    result = slurm_cluster.wait_job(job_id, timeout=300)
    errors = {p.name: p.read_text()[-400:] for p in (out / "raw").glob("*.err") if p.stat().st_size}
    assert result.state == "COMPLETED" and result.exit_code == "0:0", (result, errors)
    proc = slurm_cluster.run_as_user([hpcrun_bin, "iotune", "collect", str(out), "--json"], env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)
    assert results["engine"] == {"name": "ior", "version": "IOR-4.0.0", "binary": "ior"}, results["engine"]
    rows = results["results"]
    assert len(rows) == 2 * 2 * 2, rows                 # transfer sizes x writers x (write, read)
    assert all(r["error"] is None and r["bw_mib_mean"] > 0 for r in rows), (rows, errors)
