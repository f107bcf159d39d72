"""The built-in HDF5 merge and QA (merge.hdf5, qa.hdf5) with real h5py files: the plan's helper run
directly, and a whole job run outside Slurm (tests/fakes/srun) whose chains write HDF5 parts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .conftest import REPO, readable_copy
from .test_job_local import _requirements  # root, the test user, /usr/bin/python3 with h5py

h5py = pytest.importorskip("h5py", reason="h5py is not installed (pip install 'hpcrun[hdf5]' or the test extra)")
np = pytest.importorskip("numpy")

USER = os.environ.get("HPCRUN_TEST_USER", "hpcuser")
SYSTEM_PYTHON = "/usr/bin/python3"

# a chain program: writes its slice of the input's /events/energy (and /hits unless told not to)
CHAIN = '''import sys, h5py, numpy as np
src, out, chain, nchains = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with h5py.File(src, "r") as f:
    energy = f["/events/energy"][:]
n = len(energy)
lo, hi = chain * n // nchains, (chain + 1) * n // nchains
with h5py.File(out, "w") as o:
    o.attrs["producer"] = "reco-1"
    g = o.create_group("events")
    g.attrs["unit"] = "GeV"
    d = g.create_dataset("energy", data=energy[lo:hi] * 2)
    d.attrs["calibrated"] = True
    if "--no-hits" not in sys.argv:
        o.create_dataset("hits", data=np.arange(lo, hi, dtype="i4").repeat(4).reshape(-1, 4))
'''


def spec_of(root: Path, chain_args=(), **changes) -> Path:
    spec = {"name": "h5", "site": {"profile": "local-test"}, "walltime": "00:10:00",
            "inputs": {"files": [str(root / "in" / "a.h5")]},
            "jobs": {"files_per_job": 1, "chains_per_node": 3},
            "chain": {"command": [SYSTEM_PYTHON, str(root / "chain.py"), "{input}", "{output}", "{chain}",
                                  "{nchains}", *chain_args]},
            "merge": {"hdf5": {"datasets": ["/events/energy", "hits"]}},
            "qa": {"hdf5": {"events_dataset": "/events/energy", "require": ["/events/energy", "/hits"]}},
            "outputs": {"location": str(root / "out"), "pattern": "{stem}.reco.h5"}}
    spec.update(changes)
    path = root / f"campaign{len(list(root.glob('campaign*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="hpcrun-h5-", dir="/tmp"))
    d.chmod(0o755)
    (d / "in").mkdir()
    with h5py.File(d / "in" / "a.h5", "w") as f:
        f.create_dataset("/events/energy", data=np.linspace(0.0, 1.0, 1000))
    (d / "chain.py").write_text(CHAIN)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def helper(root: Path) -> Path:
    plan = root / "plan"
    if not plan.exists():
        write_plan(load_plan(spec_of(root)), plan)
    return plan / "bin" / "hpcrun-hdf5.py"


def run_helper(root: Path, *args: str, python: str = sys.executable, flags=()) -> subprocess.CompletedProcess:
    return subprocess.run([python, *flags, str(helper(root)), *args], capture_output=True, text=True, timeout=120)


def parts(root: Path, n: int = 3):
    paths = []
    for k in range(n):
        p = root / f"part{k}.h5"
        subprocess.run([sys.executable, str(root / "chain.py"), str(root / "in" / "a.h5"), str(p), str(k), str(n)],
                       check=True)
        paths.append(str(p))
    return paths


def test_merge_concatenates_in_chain_order_and_keeps_attributes(root):
    out = root / "merged.h5"
    done = run_helper(root, "merge", "--output", str(out), "--dataset", "/events/energy", "--dataset", "/hits",
                      *parts(root))
    assert done.returncode == 0, done.stderr
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["/events/energy"][:], np.linspace(0.0, 1.0, 1000) * 2)
        assert f["/hits"].shape == (1000, 4) and np.array_equal(f["/hits"][:, 0], np.arange(1000))
        assert f.attrs["producer"] == "reco-1" and f["/events"].attrs["unit"] == "GeV"
        assert bool(f["/events/energy"].attrs["calibrated"]) is True
    counted = run_helper(root, "count", "--dataset", "/events/energy", str(out))
    assert counted.returncode == 0 and counted.stdout.strip() == "1000"


def test_merge_refuses_parts_that_disagree_and_leaves_nothing(root):
    ps = parts(root, 2)
    with h5py.File(ps[1], "a") as f:
        del f["/hits"]
        f.create_dataset("/hits", data=np.zeros((3, 5), dtype="i4"))
    out = root / "merged.h5"
    done = run_helper(root, "merge", "--output", str(out), "--dataset", "/hits", *ps)
    assert done.returncode == 2 and "parts must agree" in done.stderr and ps[1] in done.stderr
    assert not out.exists() and not list(root.glob("merged.h5*"))


def test_check_names_missing_datasets_and_unreadable_files(root):
    p = parts(root, 1)[0]
    done = run_helper(root, "check", "--require", "/events/energy", "--require", "/calib/gain", p)
    assert done.returncode == 1 and "lacks required dataset(s): /calib/gain" in done.stderr
    bad = root / "not.h5"
    bad.write_text("plain text\n")
    done = run_helper(root, "check", str(bad))
    assert done.returncode == 2 and "does not open as HDF5" in done.stderr


def test_a_python_without_h5py_gets_a_clear_message(root):
    # -S: no site-packages, so no h5py, whatever this interpreter has installed
    done = run_helper(root, "check", str(root / "in" / "a.h5"), flags=("-S",))
    assert done.returncode == 3, done.stderr
    assert "h5py is not importable by" in done.stderr and "hpcrun[hdf5]" in done.stderr


@pytest.mark.parametrize("changes, key, words", [
    ({"merge": {"command": ["/bin/cat", "{parts}"], "hdf5": {"datasets": ["/a"]}}}, "merge",
     "either 'command' or 'hdf5'"),
    ({"merge": {"hdf5": {"datasets": ["/a/../b"]}}}, "merge.hdf5.datasets[0]", "not an HDF5 dataset path"),
    ({"qa": {"count_events": ["/bin/true", "{file}"], "hdf5": {"events_dataset": "/e"}}}, "qa", "not both"),
])
def test_bad_hdf5_settings_are_refused_at_their_key(root, changes, key, words):
    done = subprocess.run([sys.executable, "-m", "hpcrun", "plan", str(spec_of(root, **changes)), "--out",
                           str(root / "p")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and key in done.stderr and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _run_job(root: Path, spec: Path, job_id: str) -> tuple:
    plan = root / f"plan{job_id}"
    write_plan(load_plan(spec), plan)
    subprocess.run(["chown", "-R", USER, str(root)], check=True)
    env = {"PATH": f"{readable_copy('tests/fakes')}:/usr/bin:/bin", "SLURM_JOB_ID": job_id,
           "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "fakenode", "HOME": "/tmp"}
    script = next((plan / "jobs").glob("*.sbatch"))
    done = subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                           "bash", str(script)], capture_output=True, text=True, timeout=180)
    return done, next((plan / "run").glob(f"*/{job_id}"))


@pytest.mark.skipif(bool(_requirements()), reason=_requirements() or "ok")
def test_a_job_merges_and_checks_hdf5_with_no_program_of_its_own(root):
    done, run = _run_job(root, spec_of(root), "301")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (run / "qa.tsv").read_text().split()[:5] == ["a", "1000", "1000", "pass", "a.reco.h5"]
    with h5py.File(root / "out" / "a.reco.h5", "r") as f:
        assert f["/events/energy"].shape == (1000,) and f["/hits"].shape == (1000, 4)


@pytest.mark.skipif(bool(_requirements()), reason=_requirements() or "ok")
def test_a_job_whose_output_lacks_a_required_dataset_fails_qa(root):
    spec = spec_of(root, chain_args=["--no-hits"], merge={"hdf5": {"datasets": ["/events/energy"]}})
    done, run = _run_job(root, spec, "302")
    assert done.returncode == 9, done.stdout + done.stderr
    reason = (run / "reason").read_text()
    assert "hdf5 check" in reason and "lacks required dataset(s): /hits" in reason, reason
    assert (root / "out" / "qa-failed" / "a.reco.h5").exists()
