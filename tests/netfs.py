"""A real network filesystem on this machine: sshfs (SFTP over FUSE) from an sshd on loopback.

The kernel here has no NFS client or server (see ../shared/reference/operations.md), so the
closest real thing is sshfs: a FUSE filesystem whose every read, write and rename travels
over SFTP. Its locks are kept by this host's kernel only (like NFS with local_lock=all):
tests on it prove the store opens and runs on a network filesystem, not that locks hold
across hosts. Needs root, ``sshfs``, ``sshd`` and /dev/fuse; :func:`why_not` says what is
missing so tests skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

USER = "hpcrunfs"


def why_not() -> Optional[str]:
    if os.geteuid() != 0:
        return "mounting sshfs over loopback needs root (this runs as an ordinary user)"
    for prog, pkg in (("sshfs", "sshfs"), ("/usr/sbin/sshd", "openssh-server"), ("fusermount", "fuse3")):
        if shutil.which(prog) is None:
            return f"{prog} is not installed (apt-get install {pkg}; tests/cluster/harness.py install does it)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is absent: FUSE filesystems cannot be mounted here"
    return None


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _user_home() -> Path:
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        _run("useradd", "-m", USER)
    _run("usermod", "-p", "*", USER)   # a locked account ('!') is refused even with a key
    return Path(os.path.expanduser(f"~{USER}"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keys_file(home: Path) -> Path:
    """This process's own authorized keys: two runs at once (the suite's self-check beside it) keep theirs."""
    return home / ".ssh" / f"authorized_keys-{os.getpid()}"


def _start_sshd(work: Path, home: Path, port: int) -> subprocess.Popen:
    for name in ("hostkey", "clientkey"):
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / name))
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    keys = _keys_file(home)
    keys.write_text((work / "clientkey.pub").read_text())
    shutil.chown(ssh, USER, USER)
    shutil.chown(keys, USER, USER)
    (work / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {work / 'hostkey'}\nPidFile {work / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {keys}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nUsePAM no\nStrictModes no\n"
        "Subsystem sftp internal-sftp\n")
    os.makedirs("/run/sshd", exist_ok=True)
    return subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(work / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(work / "sshd.log", "wb"))


class SshfsMount:
    """Mount ``~hpcrunfs/export-PID`` at ``mount_point`` over SFTP; ``close`` undoes everything."""

    def __init__(self, work: Path):
        self.work = work
        self.mount_point = work / "netfs"
        home = _user_home()
        self.export = home / f"export-{os.getpid()}"
        shutil.rmtree(self.export, ignore_errors=True)
        self.export.mkdir()
        shutil.chown(self.export, USER, USER)
        self.home = home
        self.port = _free_port()
        self.sshd = _start_sshd(work, home, self.port)
        self.mount_point.mkdir()
        try:
            self._mount()
        except BaseException:
            self.sshd.kill()
            raise

    def _mount(self) -> None:
        deadline = time.monotonic() + 20
        while True:
            proc = subprocess.run(
                ["sshfs", "-p", str(self.port), "-o",
                 f"IdentityFile={self.work / 'clientkey'},StrictHostKeyChecking=no,"
                 "UserKnownHostsFile=/dev/null,allow_other,default_permissions",
                 f"{USER}@127.0.0.1:{self.export}", str(self.mount_point)],
                capture_output=True, text=True, timeout=30)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshfs mount failed: {proc.stderr.strip()} "
                                   f"(sshd log: {(self.work / 'sshd.log').read_text()[-500:]})")
            time.sleep(0.5)

    def fstype(self) -> str:
        for line in Path("/proc/mounts").read_text().splitlines():
            f = line.split()
            if len(f) > 2 and f[1] == str(self.mount_point):
                return f[2]
        return "?"

    def ssh_pids(self) -> list:
        """The ssh client processes that carry this mount (sshfs starts one; it outlives its parent)."""
        found = subprocess.run(["pgrep", "-f", f"^ssh .*-oPort={self.port} "], capture_output=True, text=True)
        return [int(p) for p in found.stdout.split()]

    def cut(self) -> None:
        """The mount cut off: its ssh client stopped (SIGSTOP), so every call on it hangs, as an NFS or Lustre
        client's does while its server fails over."""
        import signal
        pids = self.ssh_pids()
        assert pids, "no ssh process under this sshfs mount"
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self._stopped = pids

    def restore(self) -> None:
        import signal
        for pid in getattr(self, "_stopped", []):
            os.kill(pid, signal.SIGCONT)
        self._stopped = []

    def close(self) -> None:
        self.restore()
        if subprocess.run(["fusermount", "-u", str(self.mount_point)], capture_output=True).returncode:
            subprocess.run(["fusermount", "-u", "-z", str(self.mount_point)], capture_output=True)   # busy: lazily
        subprocess.run(["pkill", "-f", f"sshfs .*{self.mount_point}"], capture_output=True)
        self.sshd.kill()
        self.sshd.wait(timeout=10)
        shutil.rmtree(self.export, ignore_errors=True)
        _keys_file(self.home).unlink(missing_ok=True)
