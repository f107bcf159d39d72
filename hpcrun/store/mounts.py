"""Where a SQLite store may live: the mount table, and network or parallel filesystems."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Union

from hpcrun.errors import InputError, Problem
from hpcrun.store import schema

DB_NAME = "state.db"
INPUT_STATES = schema.INPUT_STATES
DEFAULT_BUSY_TIMEOUT_S = 30.0
OVERRIDE_FLAG = "--allow-network-fs"

# SQLite's locking (and WAL's shared memory) is unsafe on these: see https://sqlite.org/faq.html#q5
NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "glusterfs", "afs",
    "9p", "panfs", "pvfs2", "orangefs", "dvs", "wekafs", "ncpfs", "coda", "davfs", "fuse",
})
# FUSE filesystems that are known to be local (container root filesystems)
LOCAL_FUSE_TYPES = frozenset({"fuse.fuse-overlayfs", "fuse.lxcfs"})



class NetworkFilesystemWarning(UserWarning):
    """A SQLite state file on a network or parallel filesystem was used on explicit request."""


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


def check_sqlite_location(db_path: Union[str, os.PathLike], *, allow_network_fs: bool = False,
                          mount_table: Optional[str] = None) -> Optional[Mount]:
    """Refuse (or, when allowed, warn about) a SQLite file on a network or parallel filesystem.

    Two hpcrun processes on different nodes would each believe they hold the lock and
    could corrupt the campaign's state, so this is an error unless explicitly overridden.
    ``mount_table`` defaults to this process's /proc/self/mountinfo.
    """
    text = read_mount_table() if mount_table is None else mount_table
    if text is None:
        return None
    mount = find_mount(os.path.realpath(os.fspath(db_path)), parse_mount_table(text))
    if mount is None or not is_network_fs(mount.fstype):
        return mount
    where = os.fspath(db_path)
    risk = (f"is on a {mount.fstype} filesystem (mounted at {mount.mount_point} from {mount.source or '?'}). "
            "SQLite's file locking is not reliable there: two hpcrun processes could both believe they hold "
            "the lock and corrupt the campaign state.")
    if not allow_network_fs:
        raise InputError([Problem(where, None, "", (
            f"{risk} Keep the plan directory on a local disk, or share the state through a server database "
            "(a postgresql+psycopg:// URL). To use this file anyway, and only if no two hpcrun processes will "
            f"ever run at once, pass {OVERRIDE_FLAG}."))])
    warnings.warn(f"{where} {risk} Using it anyway because {OVERRIDE_FLAG} was given: never run two hpcrun "
                  "processes on this campaign at once.", NetworkFilesystemWarning, stacklevel=3)
    return mount


# ---------------------------------------------------------------------------------------------
# boundary dataclasses
