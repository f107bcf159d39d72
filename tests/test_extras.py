"""Optional parts installed by extras (plots, darshan, pandas, hdf5): without them the base install
works and each feature that needs one says which extra to install."""

from __future__ import annotations

import configparser
import subprocess
import sys

import pytest

from .conftest import REPO


def test_the_base_install_needs_none_of_the_heavy_parts():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    base = cfg["options"]["install_requires"]
    for heavy in ("matplotlib", "darshan", "pandas", "numpy", "h5py", "psycopg"):
        assert heavy not in base, heavy
    extras = cfg["options.extras_require"]
    assert "matplotlib" in extras["plots"] and "darshan" in extras["darshan"] and "psycopg" in extras["postgres"]


def test_a_report_without_matplotlib_says_which_extra(monkeypatch, tmp_path):
    from hpcrun.iotune.plot import plot
    from hpcrun.report.plots import missing

    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib now fails
    assert "pip install 'hpcrun[plots]'" in missing()
    row = {"bw_mib_mean": 1.0, "operation": "write"}
    with pytest.raises(RuntimeError, match=r"hpcrun\[plots\]"):
        plot({"results": [row]}, tmp_path / "p.png")


def test_darshan_summaries_without_pydarshan_say_which_extra():
    code = ("import sys; sys.modules['darshan'] = None; from hpcrun.iotune.readers import darshan_worker; "
            "sys.exit(darshan_worker.main(['w', '/nonexistent.darshan']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 3 and "pip install 'hpcrun[darshan]'" in done.stdout


def test_hpcrun_imports_and_plans_without_the_heavy_parts(tmp_path):
    """The CLI's plan path imports none of matplotlib, numpy, pandas or darshan."""
    code = ("import sys\nfor m in ('matplotlib', 'numpy', 'pandas', 'darshan', 'h5py'): sys.modules[m] = None\n"
            "from hpcrun.cli import main\n"
            f"sys.argv = ['hpcrun', 'plan', {str(REPO / 'examples/star-cori/campaign.yaml')!r}, '--out', "
            f"{str(tmp_path / 'p')!r}]\nmain()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
