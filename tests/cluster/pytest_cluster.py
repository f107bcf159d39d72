"""pytest plugin: the real single-node Slurm test cluster as a fixture.

Enable it with ``pytest_plugins = ["tests.cluster.pytest_cluster"]`` in
tests/conftest.py, or ``-p tests.cluster.pytest_cluster`` on the command line.

Provides the ``cluster`` marker and the session-scoped ``slurm_cluster``
fixture. The fixture reuses a running cluster in $HPCRUN_TEST_CLUSTER_DIR
(default /tmp/hpcrun-test-cluster) or starts one with tests/cluster/harness.py
(and then stops it at the end of the session, unless
HPCRUN_TEST_CLUSTER_KEEP=1). Without Slurm installed (or when not root) the
tests that use it are skipped, unless HPCRUN_REQUIRE_CLUSTER=1, which turns
that into a failure.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "harness.py"
DEFAULT_DIR = "/tmp/hpcrun-test-cluster"
INSTALL_HINT = f"sudo python3 {HARNESS.relative_to(HERE.parent.parent)} install"
FINAL_STATES_PENDING = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED",
                        "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", ""}

_current_test: dict[str, str] = {"nodeid": "session"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cluster: needs the real single-node Slurm test cluster (tests/cluster/harness.py)")


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Under pytest-xdist (tests/run-all.sh runs two workers) every test of the one shared cluster goes to
    one worker, one after another in file order: they share its queue, nodes, accounts and test user.
    The tests that need no cluster spread over the workers meanwhile."""
    for item in items:
        if item.get_closest_marker("cluster") or "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm-cluster"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current_test["nodeid"] = item.nodeid


class SbatchError(RuntimeError):
    """sbatch refused the job; .stderr holds Slurm's message."""

    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        super().__init__(f"sbatch exited {proc.returncode}: {proc.stderr.strip()}")


@dataclass
class JobResult:
    """Final accounting record of a job (array: all tasks in ``records``)."""

    jobid: str
    state: str
    exit_code: str
    records: list[dict] = field(default_factory=list)


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        parts = shlex.split(value) if value else [""]
        env[key] = parts[0] if parts else ""
    return env


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[-120:].strip("_") or "test"


class SlurmCluster:
    """Helpers around a running harness cluster. Jobs run as the test user."""

    def __init__(self, directory: Path, started_here: bool) -> None:
        self.dir = directory
        self.started_here = started_here
        self.vars = read_env_file(directory / "env")
        v = self.vars
        self.user = v["HPCRUN_TEST_USER"]
        self.uid = int(v["HPCRUN_TEST_UID"])
        self.gid = int(v["HPCRUN_TEST_GID"])
        self.slurm_conf = Path(v["SLURM_CONF"])
        self.accounting = v.get("HPCRUN_TEST_ACCOUNTING", "slurmdbd")
        self.bin = Path(v["HPCRUN_TEST_BIN"])
        self.bb_dir = Path(v["HPCRUN_TEST_BB_DIR"])
        self.bb_job_dir = Path(v["HPCRUN_TEST_BB_JOB_DIR"])
        self.bb_persistent_dir = Path(v["HPCRUN_TEST_BB_PERSISTENT_DIR"])
        self.events_log = Path(v["HPCRUN_TEST_BB_EVENTS"])
        self.containers_log = Path(v["HPCRUN_TEST_CONTAINERS_LOG"])
        self.pool = v["HPCRUN_TEST_BB_POOL"]
        self.pool_bytes = int(v["HPCRUN_TEST_BB_POOL_BYTES"])
        self.nodes = v["HPCRUN_TEST_NODES"].split(",")
        self.work_root = Path(v["HPCRUN_TEST_WORK"])
        self.pfs_root = Path(v["HPCRUN_TEST_PFS"])
        path = f"{self.bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        #: environment for root-side commands (scontrol, sacct, hpcrun ...)
        self.env = dict(os.environ)
        self.env.update(v)
        self.env["PATH"] = f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        for k in list(self.env):
            if k.startswith(("SBATCH_", "SLURM_JOB", "SLURM_STEP", "SALLOC_", "SRUN_")):
                del self.env[k]
        #: clean environment for commands run as the test user
        self.user_env = {
            "PATH": path, "HOME": f"/home/{self.user}", "USER": self.user,
            "LOGNAME": self.user, "LANG": "C.UTF-8", "SHELL": "/bin/bash",
        }
        self.user_env.update(v)
        self._dirs: dict[tuple[str, str], Path] = {}

    # -- per-test directories ------------------------------------------------

    def _fresh_dir(self, root: Path, kind: str) -> Path:
        key = (kind, _current_test["nodeid"])
        if key not in self._dirs:
            d = root / _slug(_current_test["nodeid"])
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
            os.chown(d, self.uid, self.gid)
            d.chmod(0o755)
            self._dirs[key] = d
        return self._dirs[key]

    @property
    def workdir(self) -> Path:
        """Fresh per-test directory under DIR/work, owned by the test user."""
        return self._fresh_dir(self.work_root, "work")

    @property
    def pfs(self) -> Path:
        """Fresh per-test "parallel file system" directory under DIR/pfs."""
        return self._fresh_dir(self.pfs_root, "pfs")

    def chown(self, path: Path) -> Path:
        """Give path (recursively) to the test user."""
        path = Path(path)
        os.chown(path, self.uid, self.gid)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), self.uid, self.gid,
                             follow_symlinks=False)
        return path

    def write(self, path: Path | str, text: str, mode: int = 0o644) -> Path:
        """Write a file (relative paths: in workdir) owned by the test user."""
        p = Path(path)
        if not p.is_absolute():
            p = self.workdir / p
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)
        os.chown(p, self.uid, self.gid)
        return p

    # -- running commands ----------------------------------------------------

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run a command as root with the cluster environment."""
        kw.setdefault("env", self.env)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(argv, **kw)

    def run_as_user(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run a command as the test user (cwd: this test's workdir)."""
        env = dict(self.user_env)
        env.update(kw.pop("env", None) or {})
        kw.setdefault("cwd", str(self.workdir))
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(argv, env=env, user=self.uid, group=self.gid,
                              extra_groups=[self.gid], **kw)

    def sbatch_raw(self, script: Path | str, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run_as_user(["sbatch", "--parsable", *args, str(script)], **kw)

    def sbatch(self, script: Path | str, *args: str, **kw) -> str:
        """Submit as the test user; return the job id. Raises SbatchError."""
        proc = self.sbatch_raw(script, *args, **kw)
        if proc.returncode != 0:
            raise SbatchError(proc)
        return proc.stdout.strip().split(";")[0]

    def squeue_ids(self, jobid: str) -> list[str]:
        p = self.run(["squeue", "-h", "-j", str(jobid), "-o", "%i"])
        return [x for x in p.stdout.split() if x]

    def squeue_reason(self, jobid: str) -> str:
        p = self.run(["squeue", "-h", "-j", str(jobid), "-o", "%R"])
        return p.stdout.strip()

    def scontrol_job(self, jobid: str) -> dict[str, str]:
        p = self.run(["scontrol", "-o", "show", "job", str(jobid)])
        if p.returncode != 0:
            return {}
        line = p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""
        pairs = re.findall(r"(\S+?)=(.*?)(?=\s+\S+?=|$)", line)
        return {k: v for k, v in pairs}

    def sacct(self, jobid: str, fields: str = "JobID,State,ExitCode,Start,End,Reason",
              steps: bool = False) -> list[dict]:
        argv = ["sacct", "-j", str(jobid), "-n", "-P", "-o", fields]
        if self.accounting != "slurmdbd":
            argv.insert(1, "-c")
        if not steps:
            argv.append("-X")
        p = self.run(argv)
        names = fields.split(",")
        return [dict(zip(names, line.split("|"))) for line in p.stdout.splitlines() if line]

    def wait_until(self, pred, timeout: float = 30, interval: float = 0.1,
                   what: str = "condition"):
        deadline = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)

    def wait_job(self, jobid: str, timeout: float = 60) -> JobResult:
        """Wait until the job (all array tasks) left squeue and sacct has its
        final State/ExitCode (the record lags squeue by 0.1-0.2 s)."""
        jobid = str(jobid)
        deadline = time.monotonic() + timeout
        while self.squeue_ids(jobid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} still queued after {timeout}s: "
                                   f"{self.squeue_reason(jobid)}")
            time.sleep(0.1)
        # an array's tasks: slurmctld keeps them (MinJobAge=3600); the database
        # can briefly hold only the array's first record, so wait for all
        ctl = self.run(["scontrol", "-o", "show", "job", jobid])
        tasks = [line for line in ctl.stdout.splitlines() if "ArrayTaskId=" in line]
        expected = len(tasks) if self.accounting == "slurmdbd" else 1
        while True:
            recs = self.sacct(jobid, fields="JobID,State,ExitCode,Start,End")
            if (recs and len(recs) >= max(expected, 1)
                    and (not tasks or self.accounting != "slurmdbd"
                         or all("_" in r["JobID"] for r in recs))
                    and all(r["State"].split()[0] not in FINAL_STATES_PENDING
                            for r in recs)):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no final sacct record for {jobid}: {recs}")
            time.sleep(0.1)
        main = [r for r in recs if r["JobID"] == jobid] or recs
        states = sorted({r["State"] for r in recs})
        codes = sorted({r["ExitCode"] for r in recs})
        state = main[0]["State"] if len(states) > 1 and len(main) == 1 else ",".join(states)
        code = main[0]["ExitCode"] if len(codes) > 1 and len(main) == 1 else ",".join(codes)
        return JobResult(jobid, state, code, recs)

    def restart_slurmd(self, node: str) -> None:
        """Start a node's slurmd again after a test killed it (the harness waits for the node)."""
        proc = _harness("restart-node", "--dir", str(self.dir), node)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def scancel(self, jobid: str) -> None:
        self.run(["scancel", str(jobid)])

    def bb_events(self, jobid: str | None = None) -> list[dict]:
        """Parsed lines of the emulator's events.log (for one job, if given)."""
        out = []
        try:
            lines = self.events_log.read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            parts = line.split(" ", 4)
            if len(parts) < 4:
                continue
            rec = {"epoch": int(parts[0]), "job": parts[1], "function": parts[2],
                   "status": parts[3], "message": parts[4] if len(parts) > 4 else ""}
            if jobid is None or rec["job"] == str(jobid):
                out.append(rec)
        return out

    def pool_status(self) -> dict:
        p = self.run(["scontrol", "show", "burst"])
        for line in p.stdout.splitlines():
            if "PoolName" in line and f"={self.pool} " in line + " ":
                return dict(f.split("=", 1) for f in line.split() if "=" in f)
        return {}

    def wait_pool_idle(self, timeout: float = 120) -> None:
        """Wait until no job holds space in the pool: an earlier test's job may
        still be in its teardown (stage-out, then the buffer's release)."""
        try:
            self.wait_until(lambda: self.pool_status().get("UsedSpace") in ("0", "0B", "0GiB"),
                            timeout=timeout, what="an empty burst-buffer pool")
        except TimeoutError as e:
            raise AssertionError(f"{e}: {self.run(['scontrol', 'show', 'burst']).stdout}") from None


def _harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HARNESS), *args], capture_output=True,
                          text=True, timeout=300)


def _unavailable(reason: str) -> None:
    if os.environ.get("HPCRUN_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"HPCRUN_REQUIRE_CLUSTER=1 but the Slurm test cluster is "
                    f"unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    directory = Path(os.environ.get("HPCRUN_TEST_CLUSTER_DIR") or DEFAULT_DIR)
    sbin = "/usr/sbin:/usr/bin:/sbin:/bin"
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "sacct", "munge")
               if shutil.which(b, path=sbin) is None]
    if missing:
        _unavailable(f"Slurm is not installed (missing {', '.join(missing)}); install "
                     f"it with `{INSTALL_HINT}` (Debian 12, root), then re-run")
    status = _harness("status", "--dir", str(directory))
    started_here = False
    if status.returncode != 0:
        if os.geteuid() != 0:
            _unavailable(f"no test cluster is running in {directory} and starting one "
                         f"needs root: run `sudo python3 {HARNESS} start`")
        start = _harness("start", "--dir", str(directory))
        if start.returncode != 0:
            pytest.fail(f"could not start the Slurm test cluster:\n{start.stdout}"
                        f"{start.stderr}", pytrace=False)
        started_here = True
    elif os.geteuid() != 0:
        _unavailable("the cluster tests submit jobs as the test user and need root")
    cluster = SlurmCluster(directory, started_here)
    yield cluster
    if started_here and os.environ.get("HPCRUN_TEST_CLUSTER_KEEP") != "1":
        _harness("stop", "--dir", str(directory))


@pytest.fixture
def cluster_workdir(slurm_cluster: SlurmCluster) -> Path:
    """Fresh per-test directory owned by the test user."""
    return slurm_cluster.workdir
