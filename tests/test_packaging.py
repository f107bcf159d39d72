"""The wheel carries templates and site profiles, and works outside the source tree."""

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    build_dir = tmp_path_factory.mktemp("build")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-w", str(dist), str(REPO)], capture_output=True, text=True,
                          cwd=build_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [whl] = dist.glob("hpcrun-*.whl")
    return whl


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for required in ("hpcrun/templates/base.sh.j2", "hpcrun/templates/slurm.sh.j2",
                     "hpcrun/templates/hpcrun-db.sh.j2", "hpcrun/templates/hpcrun-chain.sh.j2",
                     "hpcrun/templates/hpcrun-checksum.py.j2",
                     "hpcrun/site_profiles/nersc-cori-haswell.yaml",
                     "hpcrun/site_profiles/local-test.yaml", "hpcrun/cli/__init__.py"):
        assert required in names, required
    shipped = {p.name for p in (REPO / "site-profiles").glob("*.yaml")}
    assert shipped <= {Path(n).name for n in names if n.startswith("hpcrun/site_profiles/")}
    for required in ("hpcrun/templates/iotune.sh.j2", "hpcrun/templates/_shell.j2",
                     "hpcrun/cli/iotune.py", "hpcrun/iotune/engines/fio.py"):
        assert required in names, required
    presets = {p.name for p in (REPO / "iobench").glob("*.yaml")}
    assert presets and presets <= {Path(n).name for n in names if n.startswith("hpcrun/iobench/")}


@pytest.mark.slow
def test_wheel_in_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # a fresh venv sees nothing of the caller's PYTHONPATH (the self-check sets one)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(wheel)],
                          capture_output=True, text=True, env=clean)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hpcrun = env_dir / "bin" / "hpcrun"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    listed = subprocess.run([str(hpcrun), "profiles", "list"], cwd=outside, capture_output=True, text=True,
                            env=clean)
    assert listed.returncode == 0, listed.stderr
    assert "nersc-cori-haswell" in listed.stdout and str(REPO) not in listed.stdout
    example = REPO / "examples" / "star-cori"
    for f in ("campaign.yaml", "raw-files.txt", "raw-files.md5"):
        (outside / f).write_text((example / f).read_text())
    planned = subprocess.run([str(hpcrun), "plan", "campaign.yaml", "--out", "plan"], cwd=outside,
                             capture_output=True, text=True, env=clean)
    assert planned.returncode == 0, planned.stderr
    assert (outside / "plan" / "jobs" / "job00001.sbatch").is_file()
    assert "core-hours" in planned.stdout
    _docs_site_as_a_new_user_builds_it(py, wheel, tmp_path, clean)


def _docs_site_as_a_new_user_builds_it(py: Path, wheel: Path, tmp_path: Path, env: dict) -> None:
    """After the README's install the docs build names the extra it needs; with the ``docs`` extra
    installed as the README says, the site builds (strict: a broken link or a page left out fails)."""
    build = [str(py), str(REPO / "docs" / "build_site.py"), "--out", str(tmp_path / "site")]
    without = subprocess.run(build, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert without.returncode != 0 and ".[docs]" in without.stderr, without.stdout + without.stderr
    assert "No module named" not in without.stderr and "Traceback" not in without.stderr
    extra = subprocess.run([str(py), "-m", "pip", "install", "--quiet", f"{wheel}[docs]"],
                           capture_output=True, text=True, env=env)
    assert extra.returncode == 0, extra.stdout + extra.stderr
    built = subprocess.run(build, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "decisions" / "retries.html").is_file()
