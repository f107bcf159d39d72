"""A successful run's directory folded into an append-only tar segment, so it costs no inodes.

Every job or claimed input that succeeds leaves ``run/<job>/<id>/`` with about ten entries. At 10^6 inputs
that is more files than a user's whole scratch quota (issue 56). The poll that records a run as COMPLETED,
after it read the run's QA rows and sums, folds its directory into ``run/folded/<segment>.tar`` and removes
it. Each process that folds writes its own segment (no two writers share a file, whatever the filesystem's
locks), rotated at ``SEGMENT_MAX`` bytes. Beside it ``<segment>.idx`` says where each run's members are:
``job TAB id TAB offset TAB length`` (absolute offsets of the tar's members). Operators read a segment
with plain ``tar``: ``tar -xf run/folded/S.tar -C run <job>/<id>`` gives the directory back as it was.

Order, for a crash at any point: the members are written and synced, then the index lines, then the
directories are removed. So a run is always in its directory, or in the index, or in both (readers then
take the directory). The index is the authority: a segment's bytes past the last indexed run are the
remains of a crash, never read.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import socket
import stat
import tarfile
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from hpcrun.bulk import each_at_once

FOLDED = "folded"                    # run/folded/: the segments and their indexes
SEGMENT_MAX = 1 << 30                # bytes: a segment is closed, and a new one opened, past this
END = b"\0" * 1024                   # tar's end of archive, overwritten by the next append
SCHEDULER_LOG = "scheduler.log"     # the job's log (array mode: Slurm's --output), folded with its run
RUN_ENTRIES_MAX = 10_000             # entries in one run directory: more is not a run record, it is kept
Members = List[Tuple[tarfile.TarInfo, str]]   # a run's entries as tar members, and where each one is


@dataclass(frozen=True)
class FoldedRun:
    """Where one run's members are: its segment (a path), their offset and length."""

    job: str
    run_id: str
    segment: str
    offset: int
    length: int


class Folder:
    """One process's segment. ``fold`` takes runs' directories (``run/<job>/<id>``) and removes those it
    folded; a run it could not read or write whole keeps its directory. A segment is chosen once per call
    (rotated between calls), so the runs of one call and their index lines are in one segment."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.seq = 0
        self.tar: Optional[BinaryIO] = None
        self.idx: Optional[BinaryIO] = None
        self.end = 0

    def fold(self, runs: Sequence[Tuple[str, Optional[str]]]) -> int:
        """Fold runs: each a directory (``run/<job>/<id>``) and the scheduler's log of the job, if any (kept in
        the record as ``scheduler.log``). The members of all are written and synced, then indexed, and only
        then the directories and logs removed. How many were folded; 0, every directory kept, when the
        filesystem refuses (a full quota is what this is for): never an error for the caller."""
        written: List[Tuple[str, str, int, int, str, Optional[str], Members]] = []
        opened = False
        for path, log in runs:
            job, run_id = os.path.basename(os.path.dirname(path)), os.path.basename(path)
            members = _members(path, f"{job}/{run_id}")
            if not _succeeded(path, members):
                continue   # not a run that says it succeeded (its exit_code): what operators read, kept whole
            extra = _members(log, f"{job}/{run_id}/{SCHEDULER_LOG}") if log else []
            if log and not extra:
                continue
            if not opened:   # a segment only for a run that folds (a status that folds nothing makes none)
                try:
                    self._open()
                except OSError:
                    self.close()
                    return 0
                opened = True
            try:
                start = self._append(members + extra)
            except (OSError, ValueError):   # a full disk, a name tar cannot carry: this run stays; what it wrote
                continue                     # past self.end is written over by the next, never indexed
            written.append((job, run_id, start, self.end - start, path, log, members))
        if not written or not self._sync(written):
            return 0
        each_at_once(_remove_run, [(path, log, members) for *_, path, log, members in written])
        return len(written)

    def close(self) -> None:
        """Both files closed, whatever either says (a failed flush of a full filesystem included)."""
        for f in (self.tar, self.idx):
            try:
                if f is not None:
                    f.close()
            except (OSError, ValueError):
                pass
        self.tar = self.idx = None

    def _open(self) -> None:
        if self.tar is not None and self.idx is not None and self.end < SEGMENT_MAX:
            return
        self.close()
        folded = os.path.join(self.run_dir, FOLDED)
        os.makedirs(folded, exist_ok=True)
        while True:   # a name no other process has: host, pid, time, sequence
            self.seq += 1
            name = f"{socket.gethostname()}.{os.getpid()}.{int(time.time())}.{self.seq}"
            try:
                fd = os.open(os.path.join(folded, name + ".tar"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            break
        self.tar = os.fdopen(fd, "r+b")
        self.end = 0
        self.idx = open(os.path.join(folded, name + ".idx"), "ab")
        dir_fd = os.open(folded, os.O_RDONLY)
        try:   # the new names on disk before any run they hold loses its directory
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _append(self, members: Members) -> int:
        """The members written from the current end (files copied a block at a time): where they start."""
        assert self.tar is not None
        start = self.end
        self.tar.seek(start)
        for info, path in members:
            self.tar.write(header(info))
            if info.isfile():
                _copy(path, info.size, self.tar)
        self.end = self.tar.tell()
        return start

    def _sync(self, written: Sequence[Tuple[Any, ...]]) -> bool:
        """The members on disk, then their index lines: only then may a directory go."""
        assert self.tar is not None and self.idx is not None
        indexed_to = self.idx.tell()
        try:
            self.tar.seek(self.end)
            self.tar.write(END)
            self.tar.flush()
            os.fsync(self.tar.fileno())
            self.idx.write("".join(f"{j}\t{r}\t{o}\t{n}\n" for j, r, o, n, *_ in written).encode())
            self.idx.flush()
            os.fsync(self.idx.fileno())
        except OSError:
            try:   # lines that may not be on disk are not left to be read (the directories stay)
                self.idx.truncate(indexed_to)
            except (OSError, ValueError):
                pass
            self.close()   # the next fold opens a new segment
            return False
        return True


OCTAL_MAX = 8 ** 11   # what tar's 12-byte size and mtime fields hold (11 octal digits)


def header(info: tarfile.TarInfo) -> bytes:
    """The member's header block as tarfile's PAX format writes it for a short ASCII name (a ustar block, no
    extended header), built here: tarfile takes about 0.1 ms a member, most of a fold's CPU at thousands of
    runs a minute. Any other member (a long or non-ASCII name, a size or time past the octal fields, a time
    with a fraction, an owner, a link) gets tarfile's own."""
    name = info.name + "/" if info.type == tarfile.DIRTYPE and not info.name.endswith("/") else info.name
    plain = info.type in (tarfile.REGTYPE, tarfile.DIRTYPE) and not (info.uid or info.gid or info.uname or info.gname)
    if not (plain and name.isascii() and len(name) <= 100 and 0 <= info.size < OCTAL_MAX
            and isinstance(info.mtime, int) and 0 <= info.mtime < OCTAL_MAX):
        return info.tobuf(format=tarfile.PAX_FORMAT)
    block = b"".join((name.encode("ascii").ljust(100, b"\0"), b"%07o\0" % (info.mode & 0o7777), b"0000000\0" * 2,
                      b"%011o\0" % info.size, b"%011o\0" % info.mtime, b" " * 8, info.type, b"\0" * 100,
                      tarfile.POSIX_MAGIC, b"\0" * 247))
    return block[:148] + b"%06o\0" % sum(block) + block[155:]


def _remove(path: str, members: Members) -> None:
    """A folded run's directory removed by its members: an unlink a file, a rmdir a directory, the deepest first
    (members list a directory before its entries), each relative to its directory's handle opened without
    following a link (a directory swapped for a link since the listing is not followed, as rmtree does not).
    Its exit_code goes first: a second process folding the run meanwhile sees no run that says it succeeded,
    never a part of one. rmtree's walk costs about twice the calls, each a metadata server's on Lustre, for every
    run; it still removes what is left (written after the listing), as it did alone before."""
    handles: Dict[str, int] = {}
    cut = len(path) + 1   # members' paths are path/rel
    try:
        order = sorted(reversed(members[1:]), key=lambda m: m[1][cut:] != "exit_code")
        for info, where in order:
            rel = where[cut:]
            parent, _, name = rel.rpartition("/")
            at = _handle(path, parent, handles)
            if info.isdir():
                own = handles.pop(rel, None)
                if own is not None:
                    os.close(own)
                os.rmdir(name, dir_fd=at)
            else:
                os.unlink(name, dir_fd=at)
        os.rmdir(path)   # a handle open on it does not keep it (closed below)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        for fd in handles.values():
            os.close(fd)


def _remove_run(run: Tuple[str, Optional[str], Members]) -> None:
    """A folded run's directory, its job's if that was its only run, and its scheduler's log removed."""
    path, log, members = run
    _remove(path, members)
    _quietly(os.rmdir, os.path.dirname(path))   # run/<job>/ when this was its only run
    if log:
        _quietly(os.unlink, log)


def _handle(root: str, rel: str, handles: Dict[str, int]) -> int:
    """The handle of directory ``rel`` under ``root`` (opened once, each step without following a link)."""
    if rel in handles:
        return handles[rel]
    if rel == "":
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    else:
        parent, _, name = rel.rpartition("/")
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=_handle(root, parent, handles))
    handles[rel] = fd
    return fd


def _quietly(remove: Callable[[str], None], path: str) -> None:
    try:
        remove(path)
    except OSError:
        pass


def _succeeded(path: str, members: Members) -> bool:
    """The run's own word that it succeeded: its exit_code file says 0 (a site without accounting calls a run
    with no reason COMPLETED, a node's loss included)."""
    if not members:
        return False
    try:
        with open(os.path.join(path, "exit_code"), "rb") as f:
            return f.read(16).strip() == b"0"
    except OSError:
        return False


def _copy(path: str, size: int, out: BinaryIO) -> None:
    """``size`` bytes of the file, then the tar's padding; a file that changed size since it was listed fails
    the run's fold (OSError), so its directory stays."""
    left = size
    with open(path, "rb") as f:
        while left:
            block = f.read(min(left, 1 << 20))
            if not block:
                raise OSError(f"{path} shrank while it was folded")
            out.write(block)
            left -= len(block)
    out.write(b"\0" * (-size % tarfile.BLOCKSIZE))


def _members(path: str, prefix: str) -> Members:
    """The directory's entries (or the file's) as tar members with their paths (a directory's before its
    entries); [] when it holds anything but regular files and directories, too many entries, or cannot be
    listed (then it stays)."""
    out: Members = []
    todo = [("", path)]
    while todo:
        rel, where = todo.pop()
        try:
            st = os.lstat(where)
        except OSError:
            return []
        info = tarfile.TarInfo(f"{prefix}/{rel}" if rel else prefix)
        info.mtime, info.mode = int(st.st_mtime), stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            out.append((info, where))
            try:
                names = sorted(os.listdir(where), reverse=True)
            except OSError:
                return []
            todo.extend((f"{rel}/{n}" if rel else n, os.path.join(where, n)) for n in names)
        elif stat.S_ISREG(st.st_mode):
            info.size = st.st_size
            out.append((info, where))
        else:
            return []
        if len(out) > RUN_ENTRIES_MAX:
            return []
    return out


# -- reading ------------------------------------------------------------------------------------------

def indexed(run_dir: str) -> Iterator[FoldedRun]:
    """Every folded run, segment by segment, in the order they were folded (bounded memory)."""
    folded = os.path.join(run_dir, FOLDED)
    try:
        names = sorted(n for n in os.listdir(folded) if n.endswith(".idx"))
    except OSError:
        return
    for name in names:
        segment = os.path.join(folded, name[:-4] + ".tar")
        try:
            with open(os.path.join(folded, name), "rb") as f:
                for line in f:
                    parts = line.decode("utf-8", "replace").rstrip("\n").split("\t")
                    if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                        yield FoldedRun(parts[0], parts[1], segment, int(parts[2]), int(parts[3]))
        except OSError:
            continue


def find(run_dir: str, job: str, run_id: Optional[str] = None) -> List[FoldedRun]:
    """The folded runs of one job (of one of its runs), each once (a run folded again after a failed sync: the
    last copy)."""
    found = {r.run_id: r for r in indexed(run_dir) if r.job == job and (run_id is None or r.run_id == run_id)}
    return list(found.values())


def read_run(run: FoldedRun, wanted: Optional[Iterable[str]] = None) -> Dict[str, bytes]:
    """The run's files (relative path -> bytes), only ``wanted`` ones when given; {} when its segment
    cannot be read."""
    keep = None if wanted is None else set(wanted)
    return dict(_read_members(run, lambda rel: keep is None or rel in keep))


def matching(run_dir: str, pattern: str) -> Iterator[Tuple[str, bytes]]:
    """(member name ``job/id/rel``, bytes) of every folded file whose name matches ``pattern`` (a glob as
    the report uses under run/, e.g. ``*/*/chains.tsv``). Only headers are read of the others."""
    for run in indexed(run_dir):
        where = f"{run.job}/{run.run_id}/"
        for rel, data in _read_members(run, _glob(where, pattern)):
            yield where + rel, data


def _glob(where: str, pattern: str) -> Callable[[str], bool]:
    """``pattern`` matched part by part, as glob does (a ``*`` never crosses a ``/``)."""
    parts = pattern.split("/")
    return lambda rel: _parts_match((where + rel).split("/"), parts)


def _parts_match(names: List[str], parts: List[str]) -> bool:
    return len(names) == len(parts) and all(fnmatch.fnmatchcase(n, p) for n, p in zip(names, parts))


def _read_members(run: FoldedRun, want: Callable[[str], bool]) -> List[Tuple[str, bytes]]:
    """The run's regular files ``want`` takes, read from its segment (the headers of the others only)."""
    prefix = f"{run.job}/{run.run_id}/"
    out: List[Tuple[str, bytes]] = []
    try:
        with open(run.segment, "rb") as f:
            f.seek(run.offset)
            tf = tarfile.open(fileobj=f, mode="r:")
            while True:
                m = tf.next()
                if m is None or m.offset >= run.offset + run.length:
                    break
                rel = m.name[len(prefix):] if m.name.startswith(prefix) else ""
                if rel and m.isfile() and want(rel):
                    got = tf.extractfile(m)
                    out.append((rel, got.read() if got is not None else b""))
    except (OSError, tarfile.TarError):
        return out
    return out


def fold_completed(folder: Optional[Folder], poller: Any, changes: Sequence[Any],
                   ended: Sequence[Tuple[Any, str]]) -> int:
    """After a poll recorded them: the run directories (and scheduler's logs) of the runs it saw complete,
    folded by ``folder``: the caller's, held across its polls (the supervisor, `status --wait`), else one for
    this poll alone (a `submit`, a `retry`). Failed runs keep
    theirs whole: what operators read."""
    done = {c.submission_id for c in changes if c.slurm_state == "COMPLETED"}
    mine = [(a, raw) for a, raw in ended if a.id in done and raw]
    if not mine:
        return 0
    logs = _scheduler_logs(poller, [a for a, _ in mine])
    folding = folder if folder is not None else Folder(poller.run_dir)
    try:
        return folding.fold([(poller.job_dir(a, raw), logs.get(a.id)) for a, raw in mine])
    finally:
        if folder is None:   # one poll's own: its segment closed (made only if it folded anything)
            folding.close()


def _scheduler_logs(poller: Any, subs: Sequence[Any]) -> Dict[int, str]:
    """Each submission's log in the plan's log directory (none for late binding's inputs: the pilots' logs
    hold them)."""
    by_id: Optional[Dict[str, str]] = None
    out: Dict[int, str] = {}
    for a in subs:
        sched = poller.clusters.get(a.cluster, poller.first).sched
        if getattr(sched, "job_logs", None) is None:
            continue
        by_id = logs_by_job_id(os.path.join(str(poller.plan_dir), "logs")) if by_id is None else by_id
        found = scheduler_log(by_id, sched, str(a.job_id), a.array_index)
        if found is not None:
            out[a.id] = found
    return out


def scheduler_log(by_id: Dict[str, str], sched: Any, job_id: str, array_index: Optional[int]) -> Optional[str]:
    """A job's log among the log directory's files (``logs_by_job_id``), by the names its scheduler's --output
    gives it (backends/scheduler: ``job_logs``); None when it is not there or the scheduler names none."""
    names = getattr(sched, "job_logs", None)
    for name in names("", job_id, array_index) if names is not None else ():
        if name in by_id:
            return by_id[name]
    return None


def logs_by_job_id(log_dir: str) -> Dict[str, str]:
    """The log directory's files by what follows the job's name (``-<id>[_<task>].out``): the name a job ran
    under is its submission's (a tag and, for a batch of several, its first job), not kept in the store. One
    listing: the directory holds the logs of jobs running, failed or not yet folded, not the campaign's."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return {}
    return {"-" + n.rsplit("-", 1)[1]: os.path.join(log_dir, n) for n in names if "-" in n}
