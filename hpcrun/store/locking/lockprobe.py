"""Does file locking really work where the SQLite store lives? Ask a second process.

SQLite relies on fcntl byte-range locks and the campaign locks on ``flock``. On a network
or parallel filesystem either may be missing (Lustre without ``-o flock`` fails with
ENOSYS) or silently local to one client. The only honest check is to hold both locks
here and let another process try to take them: it must be refused. A second connection
in this process would not do, since POSIX locks never conflict within one process.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

PROBE_TIMEOUT_S = 20.0
_REFUSED = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)

# run by the second process: try both locks without waiting, print one word per lock
_CHILD = """
import errno, fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
for name, take in (("fcntl", lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)),
                   ("flock", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))):
    try:
        take()
        print(name, "granted")
    except OSError as exc:
        print(name, "refused" if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
              else "error " + errno.errorcode.get(exc.errno, str(exc.errno)))
"""


def _take_here(fd: int) -> List[str]:
    """Take both locks in this process; the names of those the filesystem cannot give."""
    broken = []
    for name, take in (("fcntl", lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)),
                       ("flock", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))):
        try:
            take()
        except OSError as exc:
            broken.append(f"{name} locks fail here ({errno.errorcode.get(exc.errno or 0, exc.errno)}: "
                          f"{exc.strerror})")
    return broken


def _ask_other(path: Path) -> List[str]:
    """Let a second process try the held locks; the names of those it was granted."""
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD, str(path)], capture_output=True,
                             text=True, timeout=PROBE_TIMEOUT_S, check=False).stdout
    except subprocess.TimeoutExpired:
        return [f"a second process hung for {PROBE_TIMEOUT_S:.0f} s trying a lock"]
    answers = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    broken = []
    for name in ("fcntl", "flock"):
        said = answers.get(name, "no answer")
        if said == "granted":
            broken.append(f"a second process was granted the {name} lock this one holds")
        elif said != "refused":
            broken.append(f"a second process could not use {name} locks ({said})")
    return broken


def probe_locks(directory: Path) -> Optional[str]:
    """None when locks hold between processes in ``directory``; otherwise what is broken."""
    path = directory / f".hpcrun-lock-probe.{os.getpid()}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        return f"cannot create a file to test locking ({exc.strerror})"
    try:
        broken = _take_here(fd) or _ask_other(path)
    finally:
        os.close(fd)
        try:
            path.unlink()
        except OSError:
            pass
    return "; ".join(broken) or None
