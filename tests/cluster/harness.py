#!/usr/bin/env python3
"""Single-host Slurm 22.05 test cluster with DataWarp emulation.

Subcommands (run as root):

    harness.py install                        apt-get install what is missing
    harness.py start  [--dir DIR] [--nodes N] [--accounting slurmdbd|filetxt]
    harness.py stop   [--dir DIR]
    harness.py status [--dir DIR]

Everything the cluster needs lives under DIR (default /tmp/hpcrun-test-cluster):
configs in DIR/etc, pid files in DIR/run, logs in DIR/log, the burst buffer in
DIR/bb, a private MariaDB in DIR/mysql. `start` writes DIR/env (KEY=VALUE lines)
for tests and users. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
EMULATOR_DIR = REPO / "contrib" / "slurm-dw-emulator"
SPANK_SRC = HERE / "spank" / "shifter_stub.c"
STANDIN_BIN = HERE / "bin"

DEFAULT_DIR = "/tmp/hpcrun-test-cluster"
TEST_USER = "hpcuser"
CLUSTER_NAME = "hpcrun"
ACCOUNT = "hpc"
PARTITION = "debug"
POOL_NAME = "wlm_pool"
POOL_BYTES = 100 * 1024**3
POOL_GRANULARITY = 1024**3
CPUS_PER_NODE = 8
REAL_MEMORY_MB = 16000
DB_PASSWORD = "hpcrun-test"

# Far from Slurm's defaults (6817-6819) and MySQL's (3306); slurmd ports count
# up from 16818, so slurmdbd sits below slurmctld to stay out of that range.
PORT_MYSQL = 16306
PORT_SLURMDBD = 16816
PORT_SLURMCTLD = 16817
PORT_SLURMD = 16818
MAX_NODES = 64

APT_PACKAGES = [
    "slurm-wlm",  # slurmctld, slurmd, client commands, plugins
    "slurmdbd",
    "slurm-wlm-mysql-plugin",
    "munge",
    "mariadb-server",
    "mariadb-client",
    "libslurm-dev",  # slurm/spank.h for the SPANK stub
    "gcc",
    "libc6-dev",
    "fio",
    "python3-h5py",  # the example workload's chain/merge/QA programs run with /usr/bin/python3
    "python3-venv",  # a venv for running hpcrun as the unprivileged test user
    "lua5.1",  # offline tests of the emulator's parser
    "util-linux",  # setpriv, runuser
    "passwd",  # useradd
    "procps",
    # real containers: ch-run only (the charliecloud metapackage would pull in docker.io and
    # buildah), and what tests/cluster/image.py builds and caches the test image with
    "charliecloud-runtime",
    # a private PostgreSQL server for the shared-store tests (tests/pg.py; started by tests/run-all.sh)
    "postgresql",
    "debootstrap",
    "zstd",
    # a real network filesystem for the state store tests (sshfs over loopback: the kernel
    # here has no NFS), and the browser the web view is tested in
    "sshfs",
    "openssh-server",
    "chromium",
    # inputs on XRootD: an origin and an XCache on loopback (tests/xrootd.py)
    "xrootd-server",
    "xrootd-client",
    # a second real container runtime: rootless podman (runc: crun refuses hybrid cgroups here)
    "podman",
    "uidmap",
    "slirp4netns",
    "fuse-overlayfs",
    "runc",
]

DAEMON_MARKER = "HPCRUN_HARNESS_DAEMON"
STOP_WAVES = [("slurmd", "slurmctld"), ("slurmdbd",), ("mariadbd", "munged")]


def log(msg: str) -> None:
    print(f"[harness] {msg}", flush=True)


class HarnessError(RuntimeError):
    pass


class Timer:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.last = self.t0
        self.phases: list[tuple[str, float]] = []

    def phase(self, name: str) -> None:
        now = time.monotonic()
        self.phases.append((name, now - self.last))
        log(f"  {name}: {now - self.last:.2f}s")
        self.last = now

    def total(self) -> float:
        return time.monotonic() - self.t0


# --------------------------------------------------------------------------
# small utilities
# --------------------------------------------------------------------------


def run(argv: list[str], check: bool = True, env: dict | None = None,
        timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                          timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise HarnessError(
            f"command failed ({proc.returncode}): {' '.join(argv)}\n"
            f"{proc.stdout}{proc.stderr}")
    return proc


def wait_for(pred: Callable[[], bool], timeout: float, what: str,
             interval: float = 0.05, hint: str = "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out after {timeout:.0f}s waiting for {what}"
                               + (f"\n{hint}" if hint else ""))
        time.sleep(interval)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return f"--- last lines of {path} ---\n" + "\n".join(text[-lines:])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except OSError:
        return False
    return True


def proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def is_installed(pkg: str) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg],
                          capture_output=True, text=True)
    return proc.returncode == 0 and "install ok installed" in proc.stdout


def ensure_user(name: str = TEST_USER) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    run(["useradd", "--create-home", "--shell", "/bin/bash",
         "--comment", "hpcrun test user", name])
    log(f"created user {name}")
    return pwd.getpwnam(name)


def write_if_changed(path: Path, content: str, mode: int = 0o644) -> bool:
    try:
        if path.read_text() == content:
            if (path.stat().st_mode & 0o777) != mode:
                path.chmod(mode)
            return False
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(content)
    tmp.chmod(mode)
    tmp.replace(path)
    return True


# --------------------------------------------------------------------------
# layout and config rendering
# --------------------------------------------------------------------------


class Layout:
    # a second cluster (twin.py) changes these; the first keeps the defaults
    cluster = CLUSTER_NAME
    ctld_port = PORT_SLURMCTLD
    slurmd_port = PORT_SLURMD
    node_prefix = "nid"
    first_job_id: int | None = None
    dbd_layout: Layout | None = None     # the cluster whose slurmdbd this one reports to

    def __init__(self, base: str | Path, nodes: int = 1, accounting: str = "slurmdbd"):
        self.dir = Path(base).resolve()
        self.nodes = nodes
        self.accounting = accounting
        d = self.dir
        self.etc = d / "etc"
        self.run = d / "run"
        self.logdir = d / "log"
        self.state = d / "state"
        self.spool = d / "spool"
        self.lib = d / "lib"
        self.bin = d / "bin"
        self.bb = d / "bb"
        self.work = d / "work"
        self.pfs = d / "pfs"
        self.mysql = d / "mysql"
        self.munge = d / "munge"
        self.slurm_conf = self.etc / "slurm.conf"
        self.env_file = d / "env"
        self.state_file = self.run / "harness.json"

    @property
    def node_names(self) -> list[str]:
        if self.nodes == 1:
            return ["localhost"]
        return [f"{self.node_prefix}{i:05d}" for i in range(1, self.nodes + 1)]

    def pidfile(self, name: str) -> Path:
        return self.run / f"{name}.harness.pid"


def munge_socket_setting(lay: Layout, private: bool) -> str:
    return f"socket={lay.munge / 'munge.socket'}," if private else ""


def render_slurm_conf(lay: Layout, private_munge: bool) -> str:
    d = lay.dir
    if lay.nodes == 1:
        node_line = (f"NodeName=localhost NodeHostname=localhost NodeAddr=127.0.0.1 "
                     f"Port={lay.slurmd_port} CPUs={CPUS_PER_NODE} "
                     f"RealMemory={REAL_MEMORY_MB} State=UNKNOWN")
    else:
        last = lay.slurmd_port + lay.nodes - 1
        node_line = (f"NodeName={lay.node_prefix}[00001-{lay.nodes:05d}] NodeHostname=localhost "
                     f"NodeAddr=127.0.0.1 Port={lay.slurmd_port}-{last} "
                     f"CPUs={CPUS_PER_NODE} RealMemory={REAL_MEMORY_MB} State=UNKNOWN")
    if lay.accounting == "slurmdbd":
        acct = (f"AccountingStorageType=accounting_storage/slurmdbd\n"
                f"AccountingStorageHost=127.0.0.1\n"
                f"AccountingStoragePort={PORT_SLURMDBD}\n"
                f"AccountingStorageTRES=bb/lua\n"
                # allocations as sites enforce them (issue 40): association limits such as GrpTRESMins
                # hold jobs only with these; usage that never decays or resets, so a test's usage stays
                "AccountingStorageEnforce=associations,limits\n"
                "PriorityType=priority/multifactor\n"
                "PriorityDecayHalfLife=0\n"
                "PriorityUsageResetPeriod=NONE\n"
                "PriorityCalcPeriod=1\n")
        if private_munge:
            # for connections to slurmdbd the munge socket comes from here
            acct += f"AccountingStoragePass={lay.munge / 'munge.socket'}\n"
    else:
        acct = "AccountingStorageType=accounting_storage/none\n"
    return f"""\
# Rendered by tests/cluster/harness.py -- do not edit, re-run `start`.
ClusterName={lay.cluster}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={lay.ctld_port}
{f"FirstJobId={lay.first_job_id}" + chr(10) if lay.first_job_id else ""}SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo={munge_socket_setting(lay, private_munge)}cred_expire=10
CredType=cred/munge
StateSaveLocation={lay.state}
SlurmdSpoolDir={lay.spool}/%n
SlurmctldPidFile={lay.run}/slurmctld.pid
SlurmdPidFile={lay.run}/slurmd-%n.pid
SlurmctldLogFile={lay.logdir}/slurmctld.log
SlurmdLogFile={lay.logdir}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
DebugFlags=BurstBuffer
PlugStackConfig={lay.etc}/plugstack.conf
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=1,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
TaskPlugin=task/none
ProctrackType=proctrack/linuxproc
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=5
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=30
MinJobAge=3600
MaxJobCount=1000000
# Slurm's own requeue stays on (its default), as on most sites: hpcrun's jobs must say --no-requeue
# (issue 37); a partition of a higher PriorityTier, created by a test, preempts by requeue
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=5
InactiveLimit=0
BurstBufferType=burst_buffer/lua
JobSubmitPlugins=lua
{acct}JobCompType=jobcomp/filetxt
JobCompLoc={lay.logdir}/jobcomp.txt
{node_line}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# harness-dir={d}
"""


def render_burst_buffer_conf(lay: Layout) -> str:
    return """\
# Rendered by tests/cluster/harness.py
Directive=DW
Flags=TeardownFailure
StageInTimeout=60
StageOutTimeout=60
OtherTimeout=60
"""


def render_emulator_conf(lay: Layout) -> str:
    return f"""\
# burst_buffer_emulator.conf rendered by tests/cluster/harness.py
base_dir = {lay.bb}
log = {lay.bb}/events.log
pool = {POOL_NAME} {POOL_BYTES // 1024**3}GiB {POOL_GRANULARITY // 1024**3}GiB
state_save_location = {lay.state}
"""


def render_slurmdbd_conf(lay: Layout, private_munge: bool) -> str:
    sock = munge_socket_setting(lay, private_munge).rstrip(",")
    auth_info = f"AuthInfo={sock}\n" if sock else ""
    return f"""\
# Rendered by tests/cluster/harness.py
AuthType=auth/munge
{auth_info}DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={PORT_SLURMDBD}
SlurmUser=root
DebugLevel=info
LogFile={lay.logdir}/slurmdbd.log
PidFile={lay.run}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={PORT_MYSQL}
StorageUser=slurm
StoragePass={DB_PASSWORD}
StorageLoc=slurm_acct_db
"""


def render_my_cnf(lay: Layout) -> str:
    return f"""\
# Private MariaDB for slurmdbd, rendered by tests/cluster/harness.py
[client]
socket={lay.run}/mysqld.sock
port={PORT_MYSQL}
user=root

[mariadbd]
user=root
datadir={lay.mysql}
socket={lay.run}/mysqld.sock
pid-file={lay.run}/mariadbd.pid
log-error={lay.logdir}/mariadbd.log
port={PORT_MYSQL}
bind-address=127.0.0.1
skip-name-resolve
skip-log-bin
innodb_buffer_pool_size=256M
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
max_connections=50
"""


def render_plugstack(lay: Layout) -> str:
    lib = (lay.dbd_layout or lay).lib     # a second cluster uses the first one's SPANK stub
    return f"required {lib}/shifter_stub.so\n"


def render_configs(lay: Layout, private_munge: bool) -> dict[str, tuple[str, int]]:
    """filename in DIR/etc -> (content, mode)"""
    job_submit = (EMULATOR_DIR / "job_submit.lua").read_text()
    emulator = (EMULATOR_DIR / "burst_buffer.lua").read_text()
    files = {
        "slurm.conf": (render_slurm_conf(lay, private_munge), 0o644),
        "burst_buffer.conf": (render_burst_buffer_conf(lay), 0o644),
        "burst_buffer.lua": (emulator, 0o644),
        "burst_buffer_emulator.conf": (render_emulator_conf(lay), 0o644),
        "job_submit.lua": (job_submit, 0o644),
        "plugstack.conf": (render_plugstack(lay), 0o644),
    }
    if lay.accounting == "slurmdbd":
        files["slurmdbd.conf"] = (render_slurmdbd_conf(lay, private_munge), 0o600)
        files["my.cnf"] = (render_my_cnf(lay), 0o644)
    return files


# Files whose change requires restarting daemons (the .lua files are re-read
# by Slurm on every call, so they are simply rewritten).
RESTART_FILES = {"slurm.conf", "burst_buffer.conf", "plugstack.conf",
                 "slurmdbd.conf", "my.cnf"}


# --------------------------------------------------------------------------
# daemons
# --------------------------------------------------------------------------


def daemon_env(lay: Layout) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = str(lay.slurm_conf)
    env[DAEMON_MARKER] = str(lay.dir)
    env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def spawn(lay: Layout, name: str, argv: list[str], exe: str) -> int:
    """Start a foreground daemon in its own session; record its pid."""
    out = open(lay.logdir / f"{name}.stdout", "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT, env=daemon_env(lay),
                            start_new_session=True, cwd=str(lay.dir))
    out.close()
    lay.pidfile(name).write_text(f"{proc.pid} {exe}\n")
    return proc.pid


def read_pidfile(lay: Layout, name: str) -> int | None:
    try:
        pid_s, exe = lay.pidfile(name).read_text().split()
        pid = int(pid_s)
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    cmd = proc_cmdline(pid)
    if not cmd or os.path.basename(cmd[0]) != exe:
        return None
    return pid


def daemon_names(lay: Layout, private_munge: bool) -> list[str]:
    names = []
    if private_munge:
        names.append("munged")
    if lay.accounting == "slurmdbd":
        names += ["mariadbd", "slurmdbd"]
    names.append("slurmctld")
    names += [f"slurmd-{n}" for n in lay.node_names]
    return names


def recorded_daemons(lay: Layout) -> list[str]:
    if not lay.run.is_dir():
        return []
    return sorted(p.name[: -len(".harness.pid")] for p in lay.run.glob("*.harness.pid"))


def system_munge_works() -> bool:
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True,
                             timeout=5)
        return dec.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def private_munge_works(lay: Layout) -> bool:
    sock = str(lay.munge / "munge.socket")
    try:
        enc = subprocess.run(["munge", "-n", "-S", sock], capture_output=True, timeout=5)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(["unmunge", "-S", sock], input=enc.stdout,
                             capture_output=True, timeout=5)
        return dec.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_private_munge(lay: Layout) -> None:
    munge_pw = pwd.getpwnam("munge")
    lay.munge.mkdir(exist_ok=True)
    os.chown(lay.munge, munge_pw.pw_uid, munge_pw.pw_gid)
    lay.munge.chmod(0o755)
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key = lay.munge / "munge.key"
        if not key.exists():
            run(["mungekey", "--create", f"--keyfile={key}"])
            os.chown(key, munge_pw.pw_uid, munge_pw.pw_gid)
            key.chmod(0o600)
    argv = ["setpriv", f"--reuid={munge_pw.pw_uid}", f"--regid={munge_pw.pw_gid}",
            "--init-groups", "/usr/sbin/munged", "--foreground",
            f"--socket={lay.munge / 'munge.socket'}",
            f"--pid-file={lay.munge / 'munged.pid'}",
            f"--log-file={lay.munge / 'munged.log'}",
            f"--seed-file={lay.munge / 'munged.seed'}",
            f"--key-file={key}"]
    spawn(lay, "munged", argv, "munged")
    wait_for(lambda: private_munge_works(lay), 10, "munged",
             hint=tail(lay.munge / "munged.log"))


def mysql(lay: Layout, sql: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(["mariadb", f"--defaults-file={lay.etc / 'my.cnf'}", "-N", "-B",
                "-e", sql], check=check, timeout=30)


def start_mariadb(lay: Layout, timer: Timer) -> None:
    fresh = not (lay.mysql / "mysql").is_dir()
    if fresh:
        lay.mysql.mkdir(exist_ok=True)
        run(["mariadb-install-db", f"--defaults-file={lay.etc / 'my.cnf'}",
             "--user=root", "--auth-root-authentication-method=socket",
             "--skip-test-db"], timeout=120)
        timer.phase("mariadb-install-db")
    spawn(lay, "mariadbd", ["/usr/sbin/mariadbd", f"--defaults-file={lay.etc / 'my.cnf'}"],
          "mariadbd")
    wait_for(lambda: mysql(lay, "SELECT 1", check=False).returncode == 0, 60,
             "mariadbd", hint=tail(lay.logdir / "mariadbd.log"))
    marker = lay.mysql / ".hpcrun-dbuser"
    if not marker.exists():
        mysql(lay, "".join(
            f"CREATE USER IF NOT EXISTS 'slurm'@'{h}' IDENTIFIED BY '{DB_PASSWORD}';"
            f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{h}';"
            for h in ("127.0.0.1", "localhost")))
        marker.write_text("ok\n")
    timer.phase("mariadbd up")


def start_slurmdbd(lay: Layout, timer: Timer) -> None:
    spawn(lay, "slurmdbd", ["/usr/sbin/slurmdbd", "-D"],
          "slurmdbd")
    wait_for(lambda: port_open(PORT_SLURMDBD), 60, "slurmdbd",
             hint=tail(lay.logdir / "slurmdbd.log"))
    timer.phase("slurmdbd up")
    marker = lay.mysql / ".hpcrun-provisioned"
    if marker.exists():
        return
    env = daemon_env(lay)
    cmds = [
        ["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME],
        ["sacctmgr", "-i", "add", "account", ACCOUNT, f"Cluster={CLUSTER_NAME}",
         "Description=hpcrun tests", "Organization=hpcrun"],
        ["sacctmgr", "-i", "add", "user", f"root,{TEST_USER}", f"Account={ACCOUNT}",
         f"DefaultAccount={ACCOUNT}", f"Cluster={CLUSTER_NAME}"],
    ]
    for argv in cmds:
        proc = run(argv, check=False, env=env)
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 and "Nothing new added" not in text \
                and "already exists" not in text:
            raise HarnessError(f"{' '.join(argv)} failed:\n{text}")
    marker.write_text("ok\n")
    timer.phase("sacctmgr cluster/account/users")


def slurm_ok(lay: Layout, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=daemon_env(lay),
                          timeout=30)


def nodes_idle(lay: Layout) -> bool:
    p = slurm_ok(lay, ["sinfo", "-h", "-N", "-o", "%N %T"])
    if p.returncode != 0:
        return False
    states = {}
    for line in p.stdout.split("\n"):
        if line.strip():
            name, state = line.split()
            states[name] = state
    return (sorted(states) == sorted(lay.node_names)
            and all(s in ("idle", "mixed", "allocated") for s in states.values()))


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
    t = text.strip().replace("iB", "").replace("B", "")
    num = t.rstrip("KMGTP")
    return int(float(num) * units[t[len(num):]])


def pool_status(lay: Layout) -> dict | None:
    """Parse `scontrol show burst` for our pool: {'total','free','used'} in bytes."""
    p = slurm_ok(lay, ["scontrol", "show", "burst"])
    if p.returncode != 0:
        return None
    for line in p.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if any(k.startswith("PoolName") and v == POOL_NAME for k, v in fields.items()):
            try:
                return {k.lower().replace("space", ""): parse_size(fields[k])
                        for k in ("TotalSpace", "FreeSpace", "UsedSpace")}
            except (KeyError, ValueError):
                return None
    return None


def pool_ready(lay: Layout) -> bool:
    st = pool_status(lay)
    return bool(st and st["total"] > 0 and st["free"] > 0)


def compile_spank(lay: Layout) -> None:
    src = SPANK_SRC.read_bytes()
    digest = hashlib.sha256(src).hexdigest()
    so = lay.lib / "shifter_stub.so"
    stamp = lay.lib / "shifter_stub.sha256"
    if so.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return
    tmp = lay.lib / "shifter_stub.so.tmp"
    run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(tmp),
         str(SPANK_SRC)])
    tmp.replace(so)
    stamp.write_text(digest + "\n")


def install_standins(lay: Layout) -> None:
    lay.bin.mkdir(exist_ok=True)
    for src in STANDIN_BIN.iterdir():
        if src.is_file():
            dst = lay.bin / src.name
            write_if_changed(dst, src.read_text(), 0o755)
    link = lay.bin / "singularity"
    if not link.is_symlink():
        if link.exists():
            link.unlink()
        link.symlink_to("apptainer")


def make_layout(lay: Layout, user: pwd.struct_passwd) -> None:
    for d in (lay.dir, lay.etc, lay.run, lay.logdir, lay.state, lay.spool, lay.lib,
              lay.bb, lay.bb / "job", lay.bb / "persistent", lay.bb / "meta"):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    for d in (lay.work, lay.pfs):
        d.mkdir(exist_ok=True)
        os.chown(d, user.pw_uid, user.pw_gid)
        d.chmod(0o755)
    # node-local scratch for the shifter stand-in's perNodeCache emulation
    (lay.dir / "nodelocal").mkdir(exist_ok=True)
    (lay.dir / "nodelocal").chmod(0o1777)
    for f, mode in ((lay.bb / "events.log", 0o644),
                    (lay.logdir / "containers.log", 0o666),
                    (lay.logdir / "jobcomp.txt", 0o666)):
        f.touch(exist_ok=True)
        f.chmod(mode)


def write_env(lay: Layout, user: pwd.struct_passwd, private_munge: bool) -> None:
    values = {
        "SLURM_CONF": lay.slurm_conf,
        "HPCRUN_TEST_CLUSTER_DIR": lay.dir,
        "HPCRUN_TEST_USER": user.pw_name,
        "HPCRUN_TEST_UID": user.pw_uid,
        "HPCRUN_TEST_GID": user.pw_gid,
        "HPCRUN_TEST_ACCOUNTING": lay.accounting,
        "HPCRUN_TEST_PARTITION": PARTITION,
        "HPCRUN_TEST_NODES": ",".join(lay.node_names),
        "HPCRUN_TEST_CPUS_PER_NODE": CPUS_PER_NODE,
        "HPCRUN_TEST_WORK": lay.work,
        "HPCRUN_TEST_PFS": lay.pfs,
        "HPCRUN_TEST_BIN": lay.bin,
        "HPCRUN_TEST_BB_DIR": lay.bb,
        "HPCRUN_TEST_BB_JOB_DIR": lay.bb / "job",
        "HPCRUN_TEST_BB_PERSISTENT_DIR": lay.bb / "persistent",
        "HPCRUN_TEST_BB_EVENTS": lay.bb / "events.log",
        "HPCRUN_TEST_BB_POOL": POOL_NAME,
        "HPCRUN_TEST_BB_POOL_BYTES": POOL_BYTES,
        "HPCRUN_TEST_BB_GRANULARITY": POOL_GRANULARITY,
        "HPCRUN_TEST_CONTAINERS_LOG": lay.logdir / "containers.log",
        "HPCRUN_TEST_LOG_DIR": lay.logdir,
        "HPCRUN_TEST_MUNGE_SOCKET": (lay.munge / "munge.socket") if private_munge else "",
    }
    lines = ["# Written by tests/cluster/harness.py start; shell KEY=VALUE lines."]
    lines += [f"{k}={shlex.quote(str(v))}" for k, v in values.items()]
    write_if_changed(lay.env_file, "\n".join(lines) + "\n", 0o644)


def save_state(lay: Layout, private_munge: bool) -> None:
    lay.state_file.write_text(json.dumps({
        "nodes": lay.nodes, "accounting": lay.accounting,
        "private_munge": private_munge, "started": time.time(),
    }) + "\n")


def load_state(lay: Layout) -> dict:
    try:
        return json.loads(lay.state_file.read_text())
    except (OSError, ValueError):
        return {}


def configs_match(lay: Layout, files: dict[str, tuple[str, int]]) -> bool:
    for name, (content, _mode) in files.items():
        if name not in RESTART_FILES:
            continue
        try:
            if (lay.etc / name).read_text() != content:
                return False
        except OSError:
            return False
    return True


def check_ports(lay: Layout) -> None:
    ports = [PORT_SLURMCTLD] + [PORT_SLURMD + i for i in range(lay.nodes)]
    if lay.accounting == "slurmdbd":
        ports += [PORT_MYSQL, PORT_SLURMDBD]
    busy = [p for p in ports if port_open(p)]
    if busy:
        raise HarnessError(
            f"ports {busy} are already in use by something this harness did not "
            f"start (another cluster in a different --dir?). Stop it first.")


def link_etc(lay: Layout) -> None:
    target = Path("/etc/slurm/slurm.conf")
    backup = Path("/etc/slurm/slurm.conf.pre-harness")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() and os.readlink(target) == str(lay.slurm_conf):
        return
    if (target.exists() or target.is_symlink()) and not backup.exists():
        target.rename(backup)
    elif target.exists() or target.is_symlink():
        target.unlink()
    target.symlink_to(lay.slurm_conf)
    (lay.run / "linked-etc").write_text(f"{target}\n")


def unlink_etc(lay: Layout) -> None:
    marker = lay.run / "linked-etc"
    if not marker.exists():
        return
    target = Path("/etc/slurm/slurm.conf")
    backup = Path("/etc/slurm/slurm.conf.pre-harness")
    if target.is_symlink() and os.readlink(target) == str(lay.slurm_conf):
        target.unlink()
        if backup.exists():
            backup.rename(target)
    marker.unlink()
    log("restored /etc/slurm/slurm.conf")


# --------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------


def require_root() -> None:
    if os.geteuid() != 0:
        raise HarnessError("the harness must run as root (daemons, useradd, setpriv)")


def cmd_install(args: argparse.Namespace) -> int:
    require_root()
    t0 = time.monotonic()
    missing = [p for p in APT_PACKAGES if not is_installed(p)]
    if missing:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        log(f"installing: {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "-o", "Dpkg::Options::=--force-confdef",
                        "-o", "Dpkg::Options::=--force-confold", *missing],
                       check=True, env=env)
    else:
        log("all packages already installed")
    ensure_user()
    log(f"install done in {time.monotonic() - t0:.1f}s")
    return 0


def binaries_present() -> list[str]:
    need = ["slurmctld", "slurmd", "sbatch", "scontrol", "sacct", "munge", "gcc", "setpriv"]
    return [b for b in need if shutil.which(b, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]


def cmd_start(args: argparse.Namespace) -> int:
    require_root()
    timer = Timer()
    if not 1 <= args.nodes <= MAX_NODES:
        raise HarnessError(f"--nodes must be between 1 and {MAX_NODES}")
    missing = binaries_present()
    if args.accounting == "slurmdbd":
        missing += [b for b in ("slurmdbd", "mariadbd", "mariadb-install-db")
                    if shutil.which(b, path="/usr/sbin:/usr/bin") is None]
    if missing:
        raise HarnessError(f"missing programs {missing}: run "
                           f"`python3 {Path(__file__)} install` first")
    lay = Layout(args.dir, args.nodes, args.accounting)
    user = ensure_user()
    make_layout(lay, user)

    prev = load_state(lay)
    running = [n for n in recorded_daemons(lay) if read_pidfile(lay, n)]
    if "private_munge" in prev and running:
        private_munge = bool(prev["private_munge"])
    else:
        private_munge = not system_munge_works()
    files = render_configs(lay, private_munge)
    expected = daemon_names(lay, private_munge)

    if running:
        if (set(running) == set(expected) and configs_match(lay, files)
                and prev.get("nodes") == lay.nodes
                and prev.get("accounting") == lay.accounting):
            for name, (content, mode) in files.items():
                write_if_changed(lay.etc / name, content, mode)
            install_standins(lay)
            compile_spank(lay)
            wait_for(lambda: nodes_idle(lay) and pool_ready(lay), 60,
                     "nodes idle and burst buffer pool")
            write_env(lay, user, private_munge)
            if args.link_etc:
                link_etc(lay)
            log(f"already running with unchanged config ({timer.total():.2f}s); "
                f"env: {lay.env_file}")
            return 0
        log(f"configuration changed or partially running ({running}); restarting")
        do_stop(lay)
        private_munge = not system_munge_works()
        files = render_configs(lay, private_munge)
        expected = daemon_names(lay, private_munge)
        timer.phase("stop previous instance")

    check_ports(lay)
    for name, (content, mode) in files.items():
        write_if_changed(lay.etc / name, content, mode)
    install_standins(lay)
    compile_spank(lay)
    timer.phase("render configs, stand-ins, SPANK stub")

    if private_munge:
        start_private_munge(lay)
        timer.phase("private munged")
    else:
        log("  reusing the system munged")
    save_state(lay, private_munge)

    if lay.accounting == "slurmdbd":
        start_mariadb(lay, timer)
        start_slurmdbd(lay, timer)

    spawn(lay, "slurmctld", ["/usr/sbin/slurmctld", "-D", "-i"], "slurmctld")
    wait_for(lambda: slurm_ok(lay, ["scontrol", "ping"]).stdout.count("UP") > 0, 60,
             "slurmctld", hint=tail(lay.logdir / "slurmctld.log"))
    timer.phase("slurmctld up")
    for node in lay.node_names:
        (lay.spool / node).mkdir(exist_ok=True)
        spawn(lay, f"slurmd-{node}", ["/usr/sbin/slurmd", "-D", "-N", node], "slurmd")
    wait_for(lambda: nodes_idle(lay), 60, "nodes to become idle",
             hint=tail(lay.logdir / "slurmctld.log"))
    timer.phase("slurmd registered, nodes idle")
    wait_for(lambda: pool_ready(lay), 60, "burst buffer pool to report free space",
             hint=tail(lay.logdir / "slurmctld.log"))
    timer.phase("burst buffer pool ready")
    write_env(lay, user, private_munge)
    if args.link_etc:
        link_etc(lay)
    log(f"cluster up in {timer.total():.2f}s; env: {lay.env_file}")
    return 0


def kill_wave(lay: Layout, names: list[str], timeout: float = 20) -> list[int]:
    pids = {}
    for name in names:
        pid = read_pidfile(lay, name)
        if pid:
            os.kill(pid, signal.SIGTERM)
            pids[name] = pid
    stopped = list(pids.values())
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        for name, pid in list(pids.items()):
            if not pid_alive(pid):
                del pids[name]
        time.sleep(0.05)
    for name, pid in pids.items():
        log(f"  {name} (pid {pid}) ignored SIGTERM; sending SIGKILL")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in names:
        lay.pidfile(name).unlink(missing_ok=True)
    return stopped


def wait_reaped(pids: list[int], timeout: float = 6) -> list[int]:
    """Exited daemons are orphans of PID 1, which may reap them only after a
    while (about 1.7 s on the Firecracker VMs); until then they show up in
    `pgrep` as zombies. Wait for them to vanish from /proc."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if Path(f"/proc/{p}").exists()]
        if left:
            time.sleep(0.05)
    return left


def leftover_processes(lay: Layout) -> list[int]:
    """Processes started by our daemons (slurmstepd, burst buffer scripts),
    their descendants (the job's own processes), and any process of a job of
    this cluster (SLURM_JOB_ID set and SLURM_CONF pointing into DIR)."""
    me = os.getpid()
    protected = {me, os.getppid(), 1}
    parents: dict[int, int] = {}
    marked: set[int] = set()
    conf = str(lay.slurm_conf)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        env = proc_environ(pid)
        if env.get(DAEMON_MARKER) == str(lay.dir) or (
                env.get("SLURM_CONF") == conf and "SLURM_JOB_ID" in env):
            marked.add(pid)
    found = set(marked)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return sorted(found - protected)


def cancel_jobs(lay: Layout, timeout: float = 15) -> None:
    """Cancel (--hurry: no stage-out) every job still queued or running, so
    that no job survives as a ghost 'RUNNING' record into the next start."""
    if not read_pidfile(lay, "slurmctld"):
        return

    def queued() -> list[str]:
        p = slurm_ok(lay, ["squeue", "-h", "-o", "%i"])
        return p.stdout.split() if p.returncode == 0 else []

    jobs = queued()
    if not jobs:
        return
    t = time.monotonic()
    slurm_ok(lay, ["scancel", "--hurry", *jobs])
    try:
        wait_for(lambda: not queued(), timeout, "cancelled jobs to leave the queue",
                 interval=0.1)
    except HarnessError as e:
        log(f"  {e}")
    log(f"  cancelled {len(jobs)} queued/running job(s) in {time.monotonic() - t:.2f}s")


def _twin():
    """The second-cluster module (a sibling: imported as a package module or beside this script)."""
    try:
        from tests.cluster import twin
    except ImportError:
        import twin  # type: ignore[no-redef]
    return twin


def do_stop(lay: Layout) -> bool:
    stopped: list[int] = []
    if lay.dbd_layout is None:     # the first cluster: a second one reporting to its slurmdbd goes first
        twin = _twin()
        twin_lay = twin.layout(lay)
        if recorded_daemons(twin_lay):
            log(f"stopping the second cluster {twin_lay.cluster}")
            do_stop(twin_lay)
    recorded = recorded_daemons(lay)
    cancel_jobs(lay)
    for wave in STOP_WAVES:
        names = [n for n in recorded if n.split("-", 1)[0] in wave]
        if not names:
            continue
        alive = [n for n in names if read_pidfile(lay, n)]
        t = time.monotonic()
        stopped += kill_wave(lay, names)
        if alive:
            log(f"  stopped {', '.join(alive)} in {time.monotonic() - t:.2f}s")
    leftovers = leftover_processes(lay)
    if leftovers:
        log(f"  killing {len(leftovers)} leftover job processes: {leftovers}")
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stopped += leftovers
    unlink_etc(lay)
    if stopped:
        t = time.monotonic()
        left = wait_reaped(stopped)
        log(f"  exited processes reaped by PID 1 after {time.monotonic() - t:.2f}s"
            + (f"; still zombies: {left}" if left else ""))
    return bool(stopped)


def cmd_stop(args: argparse.Namespace) -> int:
    require_root()
    lay = Layout(args.dir)
    t0 = time.monotonic()
    if not lay.dir.is_dir():
        log(f"nothing to stop ({lay.dir} does not exist)")
        return 0
    if do_stop(lay):
        log(f"stopped in {time.monotonic() - t0:.2f}s")
    else:
        log("nothing was running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    lay = Layout(args.dir)
    prev = load_state(lay)
    if prev:
        lay = Layout(args.dir, prev.get("nodes", 1), prev.get("accounting", "slurmdbd"))
    recorded = recorded_daemons(lay)
    if not recorded:
        print(f"not running (no pid files in {lay.run})")
        return 3
    alive = 0
    for name in recorded:
        pid = read_pidfile(lay, name)
        print(f"{name:24s} {'running pid ' + str(pid) if pid else 'DEAD'}")
        alive += bool(pid)
    if alive:
        p = slurm_ok(lay, ["sinfo", "-N", "-o", "%N %T %c"])
        print(p.stdout.rstrip() or p.stderr.rstrip())
        st = pool_status(lay)
        print(f"burst buffer pool {POOL_NAME}: {st}")
        print(f"env file: {lay.env_file}")
    return 0 if alive == len(recorded) else 1


def cmd_restart_node(args: argparse.Namespace) -> int:
    """Start the slurmd of one emulated node again (after a test killed it: a node failure)."""
    lay = Layout(args.dir)
    prev = load_state(lay)
    lay = Layout(args.dir, prev.get("nodes", 1), prev.get("accounting", "slurmdbd"))
    if args.node not in lay.node_names:
        raise HarnessError(f"no node {args.node} here (nodes: {', '.join(lay.node_names)})")
    if read_pidfile(lay, f"slurmd-{args.node}"):
        log(f"slurmd of {args.node} is running")
        return 0
    spawn(lay, f"slurmd-{args.node}", ["/usr/sbin/slurmd", "-D", "-N", args.node], "slurmd")
    wait_for(lambda: args.node in slurm_ok(lay, ["sinfo", "-h", "-t", "idle,mix,alloc", "-N", "-o", "%N"]).stdout,
             120, f"{args.node} back in service", hint=tail(lay.logdir / "slurmctld.log"))
    log(f"slurmd of {args.node} started again")
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    """Stop or start the controller or the accounting daemon, as a site does (a restart from the saved
    state, an accounting outage); the rest of the cluster keeps running."""
    lay = Layout(args.dir)
    prev = load_state(lay)
    lay = Layout(args.dir, prev.get("nodes", 1), prev.get("accounting", "slurmdbd"))
    pid = read_pidfile(lay, args.name)
    if args.action == "stop":
        if pid:
            kill_wave(lay, [args.name])
        log(f"{args.name} stopped")
        return 0
    if pid:
        log(f"{args.name} is running")
        return 0
    if args.name == "slurmdbd":
        spawn(lay, "slurmdbd", ["/usr/sbin/slurmdbd", "-D"], "slurmdbd")
        wait_for(lambda: port_open(PORT_SLURMDBD), 60, "slurmdbd", hint=tail(lay.logdir / "slurmdbd.log"))
    else:   # -i, not -c: jobs are recovered from StateSaveLocation
        spawn(lay, "slurmctld", ["/usr/sbin/slurmctld", "-D", "-i"], "slurmctld")
        wait_for(lambda: slurm_ok(lay, ["scontrol", "ping"]).stdout.count("UP") > 0, 60,
                 "slurmctld", hint=tail(lay.logdir / "slurmctld.log"))
    log(f"{args.name} started again")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="apt-get install missing packages, create the test user")
    p = sub.add_parser("start", help="start (or reuse) the cluster")
    p.add_argument("--dir", default=os.environ.get("HPCRUN_TEST_CLUSTER_DIR", DEFAULT_DIR))
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--accounting", choices=("slurmdbd", "filetxt"), default="slurmdbd")
    p.add_argument("--link-etc", action="store_true",
                   help="also symlink /etc/slurm/slurm.conf (restored by stop)")
    p = sub.add_parser("twin", help="a second cluster reporting to the first one's slurmdbd")
    p.add_argument("action", choices=("start", "stop", "stop-controller", "start-controller"))
    p.add_argument("--dir", default=os.environ.get("HPCRUN_TEST_CLUSTER_DIR", DEFAULT_DIR))
    p.add_argument("--first-job-id", type=int, default=None)
    p = sub.add_parser("daemon", help="stop or start slurmctld or slurmdbd (a restart, an accounting outage)")
    p.add_argument("action", choices=("stop", "start"))
    p.add_argument("name", choices=("slurmctld", "slurmdbd"))
    p.add_argument("--dir", default=os.environ.get("HPCRUN_TEST_CLUSTER_DIR", DEFAULT_DIR))
    for name in ("stop", "status", "restart-node"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=os.environ.get("HPCRUN_TEST_CLUSTER_DIR", DEFAULT_DIR))
        if name == "restart-node":
            p.add_argument("node")
    args = ap.parse_args(argv)
    try:
        return {"install": cmd_install, "start": cmd_start, "stop": cmd_stop,
                "status": cmd_status, "restart-node": cmd_restart_node, "daemon": cmd_daemon,
                "twin": lambda a: _twin().main(a)}[args.cmd](args)
    except HarnessError as e:
        print(f"[harness] ERROR: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
