"""The default SQLite store on a real network filesystem (sshfs over loopback), with no flag.

sshfs keeps its locks in this host's kernel only, like NFS mounted with local_lock=all:
these tests prove the store is placed, opened, written and locked correctly on a network
filesystem, not that locks hold between two hosts (nothing here can show that).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hpcrun.store.locking.mounts import check_sqlite_location
from hpcrun.store.store import StateStore
from tests import netfs


@pytest.fixture(scope="module")
def netdir(tmp_path_factory):
    reason = netfs.why_not()
    if reason:
        pytest.skip(f"no real network filesystem here: {reason}")
    mount = netfs.SshfsMount(tmp_path_factory.mktemp("sshfs"))
    try:
        yield mount
    finally:
        mount.close()


def test_default_store_on_sshfs_needs_no_flag(netdir):
    plan = netdir.mount_point / "plan-a"
    plan.mkdir()
    assert netdir.fstype().startswith("fuse.sshfs")
    placement = check_sqlite_location(plan / "state.db")   # the real mount table
    assert placement.network and placement.mount.fstype.startswith("fuse")
    with StateStore.open(plan) as store:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar().lower() == "delete"
        campaign = store.register_campaign("net", "s", "p")
        assert store.get_campaign("net").id == campaign.id
    names = sorted(p.name for p in plan.iterdir())
    assert names == ["state.db"], names          # no -wal/-shm, no probe file left behind
    assert (netdir.export / "plan-a" / "state.db").stat().st_size > 0   # it really went over SFTP


def test_a_second_writer_is_refused_on_sshfs(netdir):
    plan = netdir.mount_point / "plan-b"
    plan.mkdir()
    with StateStore.open(plan) as store:
        store.register_campaign("net", "s", "p")
        other = textwrap.dedent(f"""
            import sqlite3, sys
            c = sqlite3.connect({str(plan / 'state.db')!r}, timeout=0.2, isolation_level=None)
            try:
                c.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                print("refused:", exc); sys.exit(0)
            print("granted"); sys.exit(1)
        """)
        with store.engine.begin():    # this process holds the write lock (BEGIN IMMEDIATE) ...
            proc = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and "database is locked" in proc.stdout, proc.stdout + proc.stderr
        proc = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 1, "once the writer is done the other process may write"


def test_hpcrun_run_on_a_plan_directory_on_sshfs(netdir, tmp_path, spec_factory, fake_slurm):
    """The supervisor on a plan directory on the network filesystem: default store, no flag."""
    from hpcrun.operate.supervision.supervise import run
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan

    spec = spec_factory({"jobs": {"array": "never"}})
    plan_dir = write_plan(load_plan(spec), netdir.mount_point / "plan-run").out_dir
    report = run(plan_dir, once=True, sleep=lambda s: None)
    assert report.outcome == "once" and report.rounds[0].submitted == 3
    assert (netdir.export / "plan-run" / "state.db.supervisor-lock").exists()
    assert (netdir.export / "plan-run" / "metrics.prom").read_text().count("hpcrun_plan_jobs") >= 2
    with StateStore.open(plan_dir) as store:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar().lower() == "delete"
