"""Late binding's committed results folded out of ``done/``: a file per journal and process, not one per input.

A commit is the link ``live/<pilot>/<task>`` -> ``done/<task>``: one file per input, so a campaign of 10^6
inputs would leave 10^6 files in the queue (issue 56). Once a poll recorded a commit in its store and moved its
cursor past the journal line naming it, the line of ``done/<task>`` is appended to a ledger,
``folded/<journal>@<host>.<pid>``, synced, and only then ``done/<task>`` removed: a crash leaves the file,
the ledger line, or both (read the same), never neither. Each process appends to files of its own (no shared
file, no lock to trust on NFS); two processes folding the same lines both keep a copy, and the first read stands.

The link still refuses a second commit while the task can be claimed: a task is folded only after its commit
was recorded, and its token is then gone or, left by a pilot killed between its journal line and the token's
unlink, in a directory ``release`` checks against the ledgers of that pilot (``committed_by``) before it returns
anything. Readers that miss ``done/<task>`` look in the ledgers: by the journal that named it (a poll), or all of
them for the few a reader asks of by name.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import BinaryIO, Collection, Dict, Iterator, List, Optional, Set, Tuple

from hpcrun.backends.late import layout as L

FOLDED = "folded"
RELEASED = "released-"   # the journal the supervisor writes for a fenced pilot's commit it stopped before naming
FIELDS = 12              # a committed result once its outputs were placed: the only kind folded
TAIL_MAX = 1 << 16       # a ledger's last bytes read to find its last whole line (a line is ~150 bytes)


def journals_of(pilot_or_journal: str) -> Tuple[str, str]:
    """The two journals that may name a pilot's commits: its own, and the supervisor's for it."""
    pilot = pilot_or_journal[len(RELEASED):] if pilot_or_journal.startswith(RELEASED) else pilot_or_journal
    return pilot, RELEASED + pilot


class Ledgers:
    """The ``folded/`` directory of one queue: this process's files in it, and reads of all of them."""

    def __init__(self, root: Path):
        self.dir = root / FOLDED
        self.root = root
        self._names: Optional[List[str]] = None   # folded/ as listed once

    def fold(self, journal: str, start: int, end: int, skip: Collection[str] = ()) -> Optional[int]:
        """The commits that ``journal`` names between bytes ``start`` and ``end`` (recorded: the caller's cursor is
        past them) folded, but those in ``skip`` and those whose outputs are not placed yet; how many, or None
        when the ledger could not be written (every ``done/`` file of this call kept: try again)."""
        lines: List[str] = []
        paths: List[str] = []
        done = os.path.join(self.root, "done")
        for task in _names(self.root / "results" / journal, start, end):
            if task in skip:
                continue
            path = os.path.join(done, task)
            text = L.read(path)
            fields = text.rstrip("\n").split("\t")
            if not text.endswith("\n") or len(fields) != FIELDS or not _marked(fields[11]):
                continue   # gone (folded before: a crash before the cursor moved), or not placed: stays a file
            lines.append(text)
            paths.append(path)
        if not lines:
            return 0
        try:
            self._append(journal, "".join(lines))
        except OSError:
            return None
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return len(paths)

    def _append(self, journal: str, text: str) -> None:
        """Appended to this process's ledger of the journal (named by host and pid: every round of a supervisor
        appends to the same file, however many Queue objects it makes), synced; a new file's name synced too,
        before a done/ file it stands for goes. A write cut short (a quota, a full disk) is cut off again, so
        that the next append starts on a line of its own."""
        self.dir.mkdir(exist_ok=True)
        path = self.dir / f"{journal}@{socket.gethostname()}.{os.getpid()}"
        new = not path.exists()
        with open(path, "wb" if new else "r+b") as f:
            size = _whole_lines(f)
            f.truncate(size)
            f.seek(size)
            try:
                f.write(text.encode())
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                f.truncate(size)
                raise
        if new:
            _sync_dir(self.dir)
            self._names = None

    def files(self, journals: Optional[Collection[str]] = None) -> List[Path]:
        """The ledgers (of these journals only); ``folded/`` listed once for this object's life (a poll: the
        supervisor, the one process that folds, sees its own files)."""
        if self._names is None:
            self._names = sorted(n for n in L.entries(self.dir) if "@" in n)
        return [self.dir / n for n in self._names if journals is None or n.rpartition("@")[0] in journals]

    def lines(self, journals: Optional[Collection[str]] = None, tail: int = 0) -> Iterator[List[str]]:
        """Every folded result (a task folded by two processes: each copy), streamed; ``tail``: only from the
        last that many bytes of each file (the newest results: a round reads the same whatever the ledgers hold)."""
        for path in self.files(journals):
            try:
                with open(path, "rb") as f:
                    if tail:
                        size = f.seek(0, os.SEEK_END)
                        f.seek(max(0, size - tail))
                        if size > tail:
                            f.readline()   # a line cut by the seek
                    for raw in f:
                        line = raw.decode(errors="replace")
                        fields = line.rstrip("\n").split("\t")
                        if line.endswith("\n") and len(fields) == FIELDS and _marked(fields[11]):
                            yield fields
            except OSError:
                continue

    def find(self, tasks: Collection[str], journals: Optional[Collection[str]] = None,
             tail: int = 0) -> Dict[str, List[str]]:
        """The folded results of ``tasks`` (the first copy of each), looked for in the ledgers of ``journals``
        (all when None; ``tail``: in their last bytes only): one streamed read, however many are asked."""
        wanted: Set[str] = set(tasks)
        out: Dict[str, List[str]] = {}
        if not wanted:
            return out
        for fields in self.lines(journals, tail):
            if fields[0] in wanted and fields[0] not in out:
                out[fields[0]] = fields
                if len(out) == len(wanted):
                    break
        return out

    def committed_by(self, pilot: str, tasks: Collection[str]) -> Set[str]:
        """Which of ``tasks`` (tokens left in a fenced pilot's directory) that pilot committed and were folded."""
        return set(self.find(tasks, journals_of(pilot)))


def _whole_lines(f: BinaryIO) -> int:
    """Where a file's last whole line ends (a write a crash cut short leaves a tail without its newline)."""
    size = f.seek(0, os.SEEK_END)
    if not size:
        return 0
    f.seek(max(0, size - TAIL_MAX))
    tail = f.read()
    if tail.endswith(b"\n"):
        return size
    return size - len(tail) + tail.rfind(b"\n") + 1


def _names(journal: Path, start: int, end: int) -> List[str]:
    """The task names of a journal's whole lines between two offsets."""
    try:
        with open(journal, "rb") as f:
            f.seek(start)
            data = f.read(max(0, end - start))
    except OSError:
        return []
    return data[:data.rfind(b"\n") + 1].decode(errors="replace").split()


def _marked(mark: str) -> bool:
    return mark == "placed" or mark.startswith("unplaced:")


def _sync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def results(root: Path) -> Iterator[List[str]]:
    """Every committed result once, folded or not (the report, the tests): the ledgers, then ``done/`` for the
    tasks the journals name that were not folded."""
    seen: Set[str] = set()
    for fields in Ledgers(root).lines():
        if fields[0] not in seen:
            seen.add(fields[0])
            yield fields
    for journal in sorted(L.entries(root / "results")):
        for task in L.read(root / "results" / journal).split():
            text = L.read(root / "done" / task) if task not in seen else ""
            if text:
                seen.add(task)
                yield text.rstrip("\n").split("\t")
