"""Real XRootD servers on loopback for the tests: an origin and an XCache cache in front of it.

Debian's xrootd-server 5.5 (../shared/reference/xrootd.md), run as the unprivileged test user
from directories it owns. :func:`why_not` says what is missing so tests skip with that reason
(tests/run-all.sh installs the packages, so CI runs them).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

USER = os.environ.get("HPCRUN_TEST_USER", "hpcuser")


def why_not() -> Optional[str]:
    if os.geteuid() != 0:
        return "the XRootD test servers run as the unprivileged test user: needs root to switch to it"
    for prog, pkg in (("xrootd", "xrootd-server"), ("xrdfs", "xrootd-client"), ("xrdcp", "xrootd-client")):
        if shutil.which(prog) is None:
            return f"{prog} is not installed (apt-get install {pkg}; tests/cluster/harness.py install does it)"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"test user {USER} does not exist (created by tests/cluster/harness.py start)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One xrootd process (origin or cache) with its own directory; start, stop, restart."""

    def __init__(self, root: Path, name: str, config: str, port: int, origin: Optional[Server] = None):
        self.root, self.name, self.port, self.origin = root, name, port, origin
        self.dir = root / name
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        (self.dir / "run").mkdir(exist_ok=True)
        self.cfg = self.dir / f"{name}.cfg"
        self.config = config
        self.started = False
        self.proc: Optional[subprocess.Popen] = None

    def _write_config(self) -> None:
        origin_port = self.origin.port if self.origin is not None else 0
        self.cfg.write_text(self.config.format(dir=self.dir, port=self.port, origin_port=origin_port))

    @property
    def url(self) -> str:
        return f"root://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.log"

    def start(self, timeout: float = 20.0) -> None:
        """Start and wait for "initialization completed". A first start whose port another process
        took between :func:`free_port` and the bind (xdist workers, the cluster) tries a new port; a
        restart keeps its port, since clients come back to the same URL. A server that died of a signal at start
        (Debian's xrootd once segfaulted before its first log line, in CI) is started again on the same port."""
        for attempt in range(3):
            why, crashed = self._start_once(timeout)
            if why is None:
                self.started = True
                return
            if (self.started and not crashed) or attempt == 2:
                raise RuntimeError(f"xrootd {self.name} did not start: {why}")
            if crashed:
                print(f"xrootd {self.name} crashed at its start, started again: {why}", file=sys.stderr)
                time.sleep(0.5)
            else:
                self.port = free_port()

    def _start_once(self, timeout: float) -> Tuple[Optional[str], bool]:
        """None, or why the server did not start and whether it died of a signal."""
        self._write_config()
        subprocess.run(["chown", "-R", USER, str(self.dir)], check=True)
        stderr = self.dir / "stderr.txt"
        # in the foreground (no -b) so the test owns the process and can SIGKILL it
        with open(stderr, "wb") as err:
            self.proc = subprocess.Popen(["runuser", "-u", USER, "--", "xrootd", "-c", str(self.cfg),
                                          "-l", str(self.log), "-n", self.name], cwd=self.dir,
                                         stdout=err, stderr=err, start_new_session=True)
        deadline = time.monotonic() + timeout
        logfile = self.dir / self.name / self.log.name
        while time.monotonic() < deadline:
            text = logfile.read_text(errors="replace") if logfile.exists() else ""
            if f"xrootd {self.name}@" in text and f":{self.port} initialization completed" in text:
                return None, False
            rc = self.proc.poll()
            if "initialization failed" in text or rc is not None:
                self.kill()
                said = stderr.read_text(errors="replace")
                # died of a signal (runuser says 128 + n), not xrootd's own exit after a failed initialization
                crashed = rc is not None and (rc < 0 or rc > 128) and "initialization failed" not in text
                return f"exit {rc}; log: {text[-1500:]!r}; stderr: {said[-500:]!r}", crashed
            time.sleep(0.1)
        self.kill()
        return f"not ready after {timeout} s; log: {text[-1500:]!r}", False

    def kill(self) -> None:
        """SIGKILL, as a crash would (no goodbye to the clients)."""
        if self.proc is not None:   # the group even when its leader is gone (runuser killed, xrootd left)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self.proc = None
        # a restarted server writes a new log in the same place: start afresh
        for old in (self.dir / self.name).glob("*.log*"):
            old.unlink()


def crash_when(ready, server: Server, log: list, stop, poll: float = 0.05, down_s: float = 3.0,
               limit_s: float = 400.0) -> None:
    """A background thread's body: once ``ready()``, SIGKILL ``server`` and start it again ``down_s``
    later, logging ("killed", t) and ("restarted", t)."""
    deadline = time.monotonic() + limit_s
    while not stop.is_set() and time.monotonic() < deadline:
        if ready():
            log.append(("killed", time.time()))
            server.kill()
            time.sleep(down_s)
            server.start()
            log.append(("restarted", time.time()))
            return
        time.sleep(poll)


ORIGIN_CFG = """all.export /
oss.localroot {dir}/data
xrd.port {port}
xrootd.chksum adler32
all.adminpath {dir}/run
all.pidpath {dir}/run
xrootd.trace fs
ofs.trace open close
"""
# the traces log each file the server opens ("Xrootd_Protocol: open rt /store/a.dat"): what it read

CACHE_CFG = """all.export /
ofs.osslib libXrdPss.so
pss.cachelib libXrdPfc.so
pss.origin 127.0.0.1:{origin_port}
oss.localroot {dir}/data
pfc.ram 1g
xrd.port {port}
all.adminpath {dir}/run
all.pidpath {dir}/run
"""


class Servers:
    """An origin serving ``data`` and a cache reading from it, both on loopback."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hpcrun-xrootd-", dir="/tmp"))
        self.root.chmod(0o755)
        self.origin = Server(self.root, "origin", ORIGIN_CFG, free_port())
        self.cache = Server(self.root, "cache", CACHE_CFG, free_port(), origin=self.origin)
        self.data = self.origin.dir / "data"

    def put(self, rel: str, content: bytes) -> str:
        """Write a file the origin serves; returns its URL."""
        path = self.data / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        subprocess.run(["chown", "-R", USER, str(self.data)], check=True)
        return f"{self.origin.url}//{rel.lstrip('/')}"

    def opened(self) -> List[str]:
        """The paths the origin opened so far, from its log (one entry per open)."""
        log = self.origin.dir / self.origin.name / self.origin.log.name
        text = log.read_text(errors="replace") if log.exists() else ""
        return [line.split("open rt ", 1)[1].split()[0] for line in text.splitlines() if "open rt " in line]

    def start(self) -> Servers:
        self.origin.start()
        self.cache.start()
        return self

    def stop(self) -> None:
        self.cache.kill()
        self.origin.kill()
        shutil.rmtree(self.root, ignore_errors=True)
