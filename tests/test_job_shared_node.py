"""Shared nodes and truthful chain endings (issue 24), with the generated job run for real outside
Slurm (tests/fakes/srun) as the test user, and another local user (`nobody`) trying to get in
while it runs: node-local directories 0700, the socket and the TCP port refusing that user,
leftovers of killed jobs reclaimed (only this campaign's, only unheld, only the user's own), and
a killed chain told from a failing or crashing one. tests/cluster/test_shared_nodes.py does the
same on the real cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .test_job_local import USER, _plan, _rundir, _start, prepared  # noqa: F401  (the fixture)
from .test_job_local import pytestmark as _needs  # noqa: F401

pytestmark = _needs
OTHER = "nobody"


def as_other(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", OTHER, "--", *argv], capture_output=True, text=True, timeout=30, **kw)


def _key(case: Path) -> str:
    return json.loads((case / "plan" / "manifest.json").read_text())["node_key"]


def _wait_for(path_glob, case: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list((case / "plan" / "run").glob(path_glob)):
            return
        time.sleep(0.2)
    raise AssertionError(f"{path_glob} never appeared under {case}/plan/run")


def _hold(case: Path) -> Path:
    hold = case / "hold"
    hold.write_text("")
    os.chmod(hold, 0o644)
    return hold


def _chains_held(case: Path, job_id: str, n: int = 4) -> None:
    """Every chain has connected to the DB once and now waits on the hold file."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = subprocess.run(["pgrep", "-f", f"chain.py .*{case}/"], capture_output=True, text=True).stdout.split()
        if len(pids) >= n and list((case / "plan" / "run").glob(f"*/{job_id}/db/*.ready")):
            time.sleep(1.5)   # each has read its calibration once
            return
        time.sleep(0.2)
    raise AssertionError("the chains never started")


def test_a_crashing_chain_is_a_chain_failure(prepared):  # noqa: F811
    case = _plan(prepared, "crash", chain_extra=["--crash-chain", "1"])
    proc = _start(case, "121")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 7, out
    run = _rundir(case, "121")
    endings = [line.split("\t") for line in (run / "chains.tsv").read_text().splitlines()]
    assert endings[1] == ["1", "139", "crashed"] and all(e[2] == "ok" for i, e in enumerate(endings) if i != 1), endings
    assert "chain(s) failed: 1(rc=139)" in (run / "reason").read_text()


def test_a_killed_chain_is_its_own_class(prepared):  # noqa: F811
    case = _plan(prepared, "killed", chain_extra=["--hold", str(prepared / "killed" / "hold")])
    hold = _hold(case)
    proc = _start(case, "122")
    _chains_held(case, "122")
    victim = subprocess.run(["pgrep", "-f", f"chain.py .*{case}/.* --chain 2 "], capture_output=True,
                            text=True).stdout.split()
    assert len(victim) == 1, victim
    os.kill(int(victim[0]), signal.SIGKILL)          # as the OOM killer or a health check does
    hold.unlink()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 14, out
    run = _rundir(case, "122")
    endings = [line.split("\t") for line in (run / "chains.tsv").read_text().splitlines()]
    assert endings[2] == ["2", "137", "killed"] and [e[2] for e in endings].count("ok") == 3, endings
    assert "chain(s) killed by a signal: 2(rc=137)" in (run / "reason").read_text()


def _leftover(root: Path, name: str, owner: str, size: int, lock: bool = True) -> Path:
    d = root / name
    d.mkdir(mode=0o700)
    (d / "data").mkdir()
    (d / "data" / "blob").write_bytes(b"x" * size)
    if lock:
        (d / ".lock").write_text("")
    subprocess.run(["chown", "-R", owner, str(d)], check=True)
    return d


def test_node_local_files_are_private_and_leftovers_reclaimed(prepared):  # noqa: F811
    case = _plan(prepared, "private", chain_extra=["--hold", str(prepared / "private" / "hold")])
    key = _key(case)
    tmp = Path("/tmp")
    dead = _leftover(tmp, f"hpcrun.{key}.90001.fakenode", USER, 300_000)      # a SIGKILLed job's copy
    other_campaign = _leftover(tmp, "hpcrun.0123456789.90002.fakenode", USER, 1000)
    foreign = _leftover(tmp, f"hpcrun.{key}.90003.fakenode", "root", 1000)    # not the user's: never touched
    unlocked = _leftover(tmp, f"hpcrun.{key}.90004.fakenode", USER, 1000, lock=False)  # a job without flock
    live = _leftover(tmp, f"hpcrun.{key}.90005.fakenode", USER, 1000)
    holder = subprocess.Popen(["runuser", "-u", USER, "--", "flock", str(live / ".lock"), "sleep", "300"],
                              start_new_session=True)
    hold = _hold(case)
    try:
        time.sleep(0.5)
        proc = _start(case, "123")
        _chains_held(case, "123")
        mine = tmp / f"hpcrun.{key}.123.fakenode"
        st = mine.stat()
        assert oct(st.st_mode & 0o777) == "0o700" and st.st_uid == int(
            subprocess.run(["id", "-u", USER], capture_output=True, text=True).stdout), oct(st.st_mode)
        # another user on the node: cannot list, read, or connect through the socket
        assert as_other(["ls", str(mine)]).returncode != 0
        assert as_other(["cat", str(mine / "client.cnf")]).returncode != 0
        assert as_other(["cat", str(mine / "data" / "conditions" / "calib.frm")]).returncode != 0
        probe = as_other(["mariadb", "--no-defaults", f"--socket={mine}/mysqld.sock", "-e",
                          "SELECT COUNT(*) FROM conditions.calib"])
        assert probe.returncode != 0 and "13" in probe.stderr, probe   # EACCES on the directory
        # the job's user does get in (the refusal above is about the other user)
        assert subprocess.run(["runuser", "-u", USER, "--", "mariadb", f"--defaults-file={mine}/client.cnf",
                               "-e", "SELECT COUNT(*) FROM conditions.calib"], capture_output=True).returncode == 0
        hold.unlink()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    finally:
        hold.unlink(missing_ok=True)
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert not dead.exists() and not mine.exists()
    assert other_campaign.exists() and foreign.exists() and unlocked.exists() and live.exists()
    rows = [line.split("\t") for line in (_rundir(case, "123") / "reclaimed" / "fakenode.tsv").read_text().splitlines()]
    assert len(rows) == 1 and rows[0][0] == str(dead) and int(rows[0][1]) >= 300_000, rows
    for d in (other_campaign, foreign, unlocked, live):
        subprocess.run(["rm", "-rf", str(d)], check=True)


def test_tcp_server_takes_only_the_jobs_account(prepared):  # noqa: F811
    case = _plan(prepared, "tcp", database__networking="tcp",
                 database__options=["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M"],
                 chain_extra=["--defaults", "{db_defaults}", "--hold", str(prepared / "tcp" / "hold")])
    hold = _hold(case)
    try:
        proc = _start(case, "124")
        _chains_held(case, "124")
        port = str(20000 + 124)
        mine = Path("/tmp") / f"hpcrun.{_key(case)}.124.fakenode"
        for user in ("root", "hpcrun", OTHER, ""):      # the payload's passwordless root included
            argv = ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", port, "-e", "SELECT 1"]
            probe = as_other(argv + (["-u", user] if user else []))
            assert probe.returncode != 0 and "Access denied" in probe.stderr, (user, probe)
        assert as_other(["cat", str(mine / "client.cnf")]).returncode != 0
        own = subprocess.run(["runuser", "-u", USER, "--", "mariadb", f"--defaults-file={mine}/client.cnf",
                              "-N", "-e", "SELECT CURRENT_USER()"], capture_output=True, text=True)
        assert own.returncode == 0 and own.stdout.startswith("hpcrun@"), own
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        password = [line.split("=", 1)[1] for line in (mine / "client.cnf").read_text().splitlines()
                    if line.startswith("password=")][0]
        assert len(password) == 32 and password not in ps            # never in an argument list
        hold.unlink()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    finally:
        hold.unlink(missing_ok=True)
    assert (_rundir(case, "124") / "qa.tsv").read_text().split()[3] == "pass"
    assert not mine.exists()


def test_tcp_refuses_options_that_open_the_door(prepared, capsys):  # noqa: F811
    from hpcrun.errors import InputError
    with pytest.raises(InputError) as exc:
        _plan(prepared, "tcpopen", database__networking="tcp")      # the example's --skip-grant-tables
    text = str(exc.value)
    assert "key 'database.options.0'" in text and "line " in text, text
    assert "--skip-grant-tables" in text and "networking: socket" in text, text
