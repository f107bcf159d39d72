"""The queue's protocol, written once: the moves a pilot and the supervisor make on the queue's files.

Standard library only: the plan ships this file beside the pilot's agent (``bin/hpcrun_late_layout.py``), so
a compute node runs the same rules as the supervisor without hpcrun installed. Every move is a rename(2) or
a link(2) on the shared filesystem (atomic there, no server).

The backlog keeps waiting tasks as ranges, not as a file each: ``backlog/<qid>.<k>`` holds task numbers of
submission ``qid`` (``0-1953,2001``), at most CHUNKS files a submission, so a claim costs the same few
metadata operations whatever is pending, and an enqueue writes CHUNKS files whatever its size. A claim
*splits* a chunk: renamed whole into the claimant's own directory (``.take.<chunk>``, no one else can take it
there), the rest written beside it (``.rest.<chunk>``), the taken tasks renamed out of it, the rest renamed
back into the backlog. A claimant that stops anywhere in between leaves a state ``settle`` completes (the
supervisor's, for a fenced pilot): the whole chunk back while ``.take`` is there, else the tasks taken and
the rest, each once.
"""

from __future__ import annotations

import errno
import os
import random
import stat
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

CHUNKS = 64            # backlog files a submission is cut into: a small multiple of a pilot's slots
BACKLOG_MAX = 512      # ... while the backlog holds fewer; beyond, MIN_CHUNKS (a 10^6 campaign goes in pieces)
MIN_CHUNKS = 4
TAKE, REST = ".take.", ".rest."


def entries(path: Path) -> List[str]:
    """A directory's names but its hidden ones (temporary files, a split in progress)."""
    try:
        return [n for n in os.listdir(path) if not n.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def read(path: Union[str, Path]) -> str:
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return ""


def write_new(path: Union[str, Path], text: str) -> None:
    """A file that appears whole (written under a temporary name, renamed)."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def whole(text: str) -> str:
    """A token's line as written whole (it ends with its newline), else "" (read while the commit wrote its result
    line into it, in place: as a token not begun)."""
    return text if text.endswith("\n") else ""


# -- ranges: ``0-99,105`` ------------------------------------------------------------------------------
def parse_ranges(text: str) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for part in text.strip().split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.append((int(lo), int(hi or lo)))
    return out


def format_ranges(ranges: Iterable[Tuple[int, int]]) -> str:
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def to_ranges(indices: Iterable[int]) -> List[Tuple[int, int]]:
    """Sorted task numbers -> runs of consecutive ones."""
    out: List[Tuple[int, int]] = []
    for i in sorted(set(indices)):
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def members(ranges: Iterable[Tuple[int, int]]) -> Iterator[int]:
    for lo, hi in ranges:
        yield from range(lo, hi + 1)


def chunk_count(in_backlog: int) -> int:
    """How many chunks a new submission is cut into, the backlog holding ``in_backlog`` files already: the
    backlog stays under about BACKLOG_MAX files however many pieces a large campaign is submitted in."""
    return max(MIN_CHUNKS, min(CHUNKS, BACKLOG_MAX - in_backlog))


def chunks(indices: Sequence[int], n: int = CHUNKS) -> List[str]:
    """A submission's task numbers cut into at most ``n`` range texts of about equal size."""
    ordered = sorted(set(indices))
    size = max(1, -(-len(ordered) // n))
    return [format_ranges(to_ranges(ordered[k:k + size])) for k in range(0, len(ordered), size)]


def first(ranges: List[Tuple[int, int]]) -> Tuple[int, List[Tuple[int, int]]]:
    """The first task number of a chunk, and what is left of it."""
    lo, hi = ranges[0]
    return lo, ([(lo + 1, hi)] if lo < hi else []) + ranges[1:]


# -- splitting a chunk -----------------------------------------------------------------------------------
def split(backlog: Path, name: str, hold: Path, pick: Callable[[List[Tuple[int, int]]],
          Tuple[List[int], List[Tuple[int, int]]]], dest: Callable[[str], Path]) -> Optional[List[str]]:
    """Chunk ``name`` taken from ``backlog`` into ``hold`` (a directory only its owner writes), the tasks
    ``pick`` chooses renamed to ``dest(task)``, the rest put back under the same name. The tasks moved, or
    None when the chunk was not there (taken by another, or gone). Each step leaves what ``settle`` completes."""
    ranges = take(backlog, name, hold)
    return None if ranges is None else cut(backlog, name, hold, ranges, pick, dest)


def take(backlog: Path, name: str, hold: Path) -> Optional[List[Tuple[int, int]]]:
    """A chunk renamed whole into ``hold`` (``.take.<name>``) and read there, where no one else changes it."""
    try:
        os.rename(backlog / name, hold / (TAKE + name))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return parse_ranges(read(hold / (TAKE + name)))


def cut(backlog: Path, name: str, hold: Path, ranges: List[Tuple[int, int]], pick: Callable[
        [List[Tuple[int, int]]], Tuple[List[int], List[Tuple[int, int]]]], dest: Callable[[str], Path]) -> List[str]:
    """The rest of a chunk taken (``take``) written beside it, the chosen tasks made, the chunk let go, then
    the tasks moved and the rest put back into the backlog."""
    qid = name.rsplit(".", 1)[0]
    take_path, rest = hold / (TAKE + name), hold / (REST + name)
    chosen, left = pick(ranges)
    tasks = [f"{qid}_{i}" for i in chosen]
    if left:
        with open(rest, "w") as f:
            f.write(format_ranges(left) + "\n")
    for task in tasks:          # the tasks exist only as files now: the chunk is still whole in .take
        with open(hold / task, "w"):
            pass
    os.unlink(take_path)        # from here the tasks and the rest are each in one place
    return finish(backlog, hold, name, tasks, dest)


def in_splits(directory: Path, tasks_too: bool = False) -> Dict[str, Set[int]]:
    """The tasks a split in progress holds in ``directory`` (a pilot's, or the supervisor's hold): a ``.take``
    stands for its whole chunk, else its ``.rest`` counts, and (``tasks_too``: a hold, whose task files are on
    their way out) its task files not covered by a ``.take``."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: Dict[str, Set[int]] = {}
    whole: Set[str] = set()
    for n in names:
        if n.startswith(TAKE):
            qid = n[len(TAKE):].rsplit(".", 1)[0]
            tasks = set(members(parse_ranges(read(directory / n))))
            out.setdefault(qid, set()).update(tasks)
            whole.update(f"{qid}_{i}" for i in tasks)
    for n in names:
        if n.startswith(REST) and (TAKE + n[len(REST):]) not in names:
            out.setdefault(n[len(REST):].rsplit(".", 1)[0], set()).update(members(parse_ranges(read(directory / n))))
        elif tasks_too and "_" in n and "." not in n and n not in whole:
            qid, _, i = n.rpartition("_")
            if i.isdigit():
                out.setdefault(qid, set()).add(int(i))
    return out


def finish(backlog: Path, hold: Path, name: str, tasks: Sequence[str], dest: Callable[[str], Path]) -> List[str]:
    moved = []
    for task in tasks:
        if hold / task != dest(task):
            try:
                os.rename(hold / task, dest(task))
            except FileNotFoundError:
                continue
        moved.append(task)
    try:
        os.rename(hold / (REST + name), backlog / name)
    except FileNotFoundError:
        pass
    return moved


def settle(backlog: Path, hold: Path) -> int:
    """Splits cut short in ``hold`` completed: a chunk still whole goes back (its task files, made before the
    chunk was let go, are dropped), else its rest goes back (its tasks, left in ``hold``, are the caller's to
    move). How many chunks."""
    names = os.listdir(hold) if hold.is_dir() else []
    settled = 0
    for n in names:
        if n.startswith(TAKE):
            chunk = n[len(TAKE):]
            qid = chunk.rsplit(".", 1)[0]
            for task in (f"{qid}_{i}" for i in members(parse_ranges(read(hold / n)))):
                if task in names:
                    os.unlink(hold / task)
            try:
                os.unlink(hold / (REST + chunk))
            except FileNotFoundError:
                pass
            os.rename(hold / n, backlog / chunk)
            settled += 1
        elif n.startswith(REST) and (TAKE + n[len(REST):]) not in names:
            os.rename(hold / n, backlog / n[len(REST):])
            settled += 1
    return settled


def waiting(root: Path) -> Dict[str, Set[int]]:
    """Every waiting task by submission: the backlog's chunks, ``ready/``'s single tasks, and the chunks in a
    split (a pilot's, or the supervisor's: between two places, still waiting)."""
    out: Dict[str, Set[int]] = {}
    for qid, tasks in _in_all_splits(root):
        out.setdefault(qid, set()).update(tasks)
    for name in entries(root / "backlog"):
        out.setdefault(name.rsplit(".", 1)[0], set()).update(members(parse_ranges(read(root / "backlog" / name))))
    for task in entries(root / "ready"):
        qid, _, i = task.rpartition("_")
        if i.isdigit():
            out.setdefault(qid, set()).add(int(i))
    return out


def waiting_count(root: Path) -> int:
    """How many tasks wait, counted from the backlog's ranges without listing their members (a round at 10^6
    waiting asks this): the chunks, ``ready/`` and the splits in progress (small, counted by their tasks). A task
    moving between two of them meanwhile may count twice: a figure for sizing pilots, never a task's record."""
    backlog = root / "backlog"
    count = sum(hi - lo + 1 for name in entries(backlog) for lo, hi in parse_ranges(read(backlog / name)))
    count += sum(1 for task in entries(root / "ready") if task.rpartition("_")[2].isdigit())
    return count + sum(len(tasks) for qid, tasks in _in_all_splits(root))


def _in_all_splits(root: Path) -> Iterator[Tuple[str, Set[int]]]:
    """(submission, tasks) of every split in progress: the pilots' and the supervisor's holds."""
    splits = [(root / s / p, False) for s in ("live", "fenced") for p in entries(root / s)]
    for d, tasks_too in splits + [(root / ".hold" / h, True) for h in _all(root / ".hold")]:
        yield from in_splits(d, tasks_too).items()


def _all(path: Path) -> List[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def held_in(root: Path, state: str) -> Dict[str, Set[int]]:
    """Tasks a state directory holds, as single files (``<qid>_<i>``) or range files (``<qid>.<k>``)."""
    out: Dict[str, Set[int]] = {}
    for name in entries(root / state):
        qid, _, i = name.rpartition("_")
        if i.isdigit() and "." not in name:
            out.setdefault(qid, set()).add(int(i))
        elif "." in name:
            out.setdefault(name.rsplit(".", 1)[0], set()).update(members(parse_ranges(read(root / state / name))))
    return out


def pick_first(ranges: List[Tuple[int, int]]) -> Tuple[List[int], List[Tuple[int, int]]]:
    if not ranges:
        return [], []
    i, left = first(ranges)
    return [i], left


def pick_n(n: int) -> Callable[[List[Tuple[int, int]]], Tuple[List[int], List[Tuple[int, int]]]]:
    """The first ``n`` tasks of a chunk (a claim of several inputs: one split whatever ``n``)."""
    def pick(ranges: List[Tuple[int, int]]) -> Tuple[List[int], List[Tuple[int, int]]]:
        chosen: List[int] = []
        left = list(ranges)
        while left and len(chosen) < n:
            lo, hi = left[0]
            take = min(hi, lo + n - len(chosen) - 1)
            chosen.extend(range(lo, take + 1))
            left[0:1] = [(take + 1, hi)] if take < hi else []
        return chosen, left
    return pick


def pick_in(wanted: Set[int]) -> Callable[[List[Tuple[int, int]]], Tuple[List[int], List[Tuple[int, int]]]]:
    def pick(ranges: List[Tuple[int, int]]) -> Tuple[List[int], List[Tuple[int, int]]]:
        every = list(members(ranges))
        chosen = [i for i in every if i in wanted]
        return chosen, to_ranges(i for i in every if i not in wanted)
    return pick


def shuffled(names: List[str]) -> List[str]:
    """Names tried from a random place (every pilot's slots look at once)."""
    if not names:
        return names
    k = random.randrange(len(names))
    return names[k:] + names[:k]


GONE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)   # a path that is not there: pathlib's own list


def _real_dir(path: str) -> bool:
    """A directory, not a link to one; a path that cannot be looked at for another reason (EACCES, an NFS handle gone
    stale) raises, as pathlib's is_dir did: the poll tries again later rather than mark the outputs unplaced."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError as exc:
        if exc.errno in GONE:
            return False
        raise


def move_tree(src: Union[str, Path], dest: Union[str, Path]) -> Optional[str]:
    """Every entry of ``src`` renamed into ``dest`` (a directory there already is merged into), then ``src``
    removed; None, or why a move failed (what did not move stays in ``src``). Paths joined as text: the supervisor
    places every output it records through here."""
    try:
        names = sorted(os.listdir(src))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{src}: {exc.strerror}"
    for name in names:
        s, d = os.path.join(src, name), os.path.join(dest, name)
        if _real_dir(s) and _real_dir(d):
            why = move_tree(s, d)
            if why is not None:
                return why
            continue
        try:
            os.replace(s, d)
        except FileNotFoundError:
            if not os.path.lexists(s):   # moved by another reader meanwhile
                continue
            return f"{s} -> {d}: No such file or directory"
        except OSError as exc:
            return f"{s} -> {d}: {exc.strerror}"
    try:
        os.rmdir(src)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"{src}: {exc.strerror}"
    return None
