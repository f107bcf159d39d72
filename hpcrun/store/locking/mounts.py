"""Where a SQLite store may live: the mount table, and network or parallel filesystems."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Union

from hpcrun.errors import InputError, Problem
from hpcrun.store.locking.lockprobe import probe_locks
from hpcrun.store.sql import schema

DB_NAME = "state.db"
INPUT_STATES = schema.INPUT_STATES
DEFAULT_BUSY_TIMEOUT_S = 30.0
OVERRIDE_FLAG = "allow_network_fs=True"  # Python API only: a broken lock is not a command-line choice

# SQLite's WAL needs shared memory these do not have, and their locks must be probed: https://sqlite.org/faq.html#q5
NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "glusterfs", "afs",
    "9p", "panfs", "pvfs2", "orangefs", "dvs", "wekafs", "ncpfs", "coda", "davfs", "fuse",
})
# FUSE filesystems that are known to be local (container root filesystems)
LOCAL_FUSE_TYPES = frozenset({"fuse.fuse-overlayfs", "fuse.lxcfs"})



class NetworkFilesystemWarning(UserWarning):
    """A SQLite state file where locking is broken was used on explicit request."""


# ---------------------------------------------------------------------------------------------
# mount table: is the SQLite file on a network or parallel filesystem?


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """The kernel writes space, tab, newline and backslash in mount points as octal escapes."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mount_table(text: str) -> List[Mount]:
    """Mounts from /proc/self/mountinfo or /proc/mounts text (the format is detected per line)."""
    mounts = []
    for line in text.splitlines():
        if " - " in line:  # mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
            left, right = line.split(" - ", 1)
            lf, rf = left.split(), right.split()
            if len(lf) >= 5 and rf:
                mounts.append(Mount(_unescape(lf[4]), rf[0], _unescape(rf[1]) if len(rf) > 1 else ""))
        else:  # /proc/mounts: SOURCE MOUNTPOINT FSTYPE OPTS FREQ PASSNO
            f = line.split()
            if len(f) >= 3:
                mounts.append(Mount(_unescape(f[1]), f[2], _unescape(f[0])))
    return mounts


def find_mount(path: str, mounts: Iterable[Mount]) -> Optional[Mount]:
    """The mount holding ``path``: the longest mount point that is a path prefix; the last one mounted wins."""
    best: Optional[Mount] = None
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if mp == "/" or path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/"):
                best = m
    return best


def is_network_fs(fstype: str) -> bool:
    """True for filesystems where SQLite's POSIX locks cannot be trusted."""
    t = fstype.lower()
    if t in LOCAL_FUSE_TYPES:
        return False
    return t in NETWORK_FS_TYPES or t.startswith("fuse.") or t.split(".", 1)[0] in NETWORK_FS_TYPES


def read_mount_table() -> Optional[str]:
    """This process's mount table, or None where there is no /proc (then no check is possible)."""
    for name in ("/proc/self/mountinfo", "/proc/mounts"):
        try:
            return Path(name).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            continue
    return None


@dataclass(frozen=True)
class Placement:
    """Where a SQLite file lives, and so how it must be opened."""

    mount: Optional[Mount]
    network: bool   # on a network or parallel filesystem: rollback journal, never WAL


def check_sqlite_location(db_path: Union[str, os.PathLike], *, allow_network_fs: bool = False,
                          mount_table: Optional[str] = None,
                          probe: Callable[[Path], Optional[str]] = probe_locks) -> Placement:
    """Where the SQLite file is; on a network filesystem, prove locking works there or refuse.

    Real sites keep plan directories on Lustre, GPFS or NFS, so such a location is
    accepted once a second process is refused the locks this one holds (``probe``);
    the store then uses a rollback journal, since WAL needs shared memory no network
    filesystem has. ``allow_network_fs`` opens it even when that probe fails (one
    process at a time, at the caller's risk). ``mount_table`` replaces
    /proc/self/mountinfo (tests, odd sites).
    """
    text = read_mount_table() if mount_table is None else mount_table
    mount = None if text is None else find_mount(os.path.realpath(os.fspath(db_path)), parse_mount_table(text))
    if mount is None or not is_network_fs(mount.fstype):
        return Placement(mount, False)
    broken = probe(Path(os.path.realpath(os.fspath(db_path))).parent)
    if broken is None:
        return Placement(mount, True)
    where = os.fspath(db_path)
    risk = (f"is on a {mount.fstype} filesystem (mounted at {mount.mount_point} from {mount.source or '?'}) "
            f"where file locking does not work: {broken}. Two hpcrun processes could both believe they "
            "hold the lock and corrupt the campaign state.")
    if not allow_network_fs:
        raise InputError([Problem(where, None, "", (
            f"{risk} Ask the site to mount it with working locks (Lustre: -o flock), keep the plan "
            "directory on a filesystem whose locks work, or share the state through a server database "
            "(--db postgresql+psycopg://USER@HOST/DB). To use this file anyway, and only if no two hpcrun "
            f"processes will ever run at once, open it from Python with {OVERRIDE_FLAG}."))])
    warnings.warn(f"{where} {risk} Using it anyway because {OVERRIDE_FLAG} was given: never run two hpcrun "
                  "processes on this campaign at once.", NetworkFilesystemWarning, stacklevel=3)
    return Placement(mount, True)


# ---------------------------------------------------------------------------------------------
# boundary dataclasses
