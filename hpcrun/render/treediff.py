"""``hpcrun plan --diff``: the plan directory on disk against the one just written, in bounded memory.

A small file is diffed whole, as ``diff -u`` would show it. A large one (a 10^6-job plan's manifest
is 300 MB, its task table 90 MB; both trees held as text took 1.7 GB) is first compared byte for
byte, streamed; when it differs, each line becomes a 64-bit digest (8 bytes a line), the common head
and tail are found on the digests, and only the lines between them are read again and diffed, with
their true line numbers. When more than ``MAX_SHOWN_LINES`` lines lie between, the diff says where
and how many instead of printing them all: an operator reading ``--diff`` wants to see what a spec
change did, not 10^6 changed lines.
"""

from __future__ import annotations

import difflib
import filecmp
import itertools
import os
import re
from array import array
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

WHOLE_BYTES = 4 << 20        # files up to this size (both sides) are diffed whole
MAX_SHOWN_LINES = 20000      # changed lines (both sides together) shown of a large file
CONTEXT = 2
_BLOCK = 4096                # digests compared per slice when looking for the common head and tail
_HUNK = re.compile(r"^@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def tree_files(top: Path, skip_dirs: Sequence[str], skip_top: Sequence[str]) -> Dict[str, Path]:
    """The plan's own files under ``top`` by relative path (records and the store left out)."""
    found: Dict[str, Path] = {}
    for root, _dirs, names in os.walk(top):
        rel_root = Path(root).relative_to(top)
        if rel_root.parts and rel_root.parts[0] in skip_dirs:
            continue
        for name in names:
            if not rel_root.parts and name in skip_top:
                continue
            found[str(rel_root / name) if rel_root.parts else name] = Path(root) / name
    return found


def diff_trees(old: Dict[str, Path], new: Dict[str, Path]) -> str:
    """A unified diff of every file that differs between the two trees (added and removed ones too)."""
    chunks: List[str] = []
    for rel in sorted(set(old) | set(new)):
        chunks.extend(diff_file(old.get(rel), new.get(rel), rel))
    return "".join(chunks)


def diff_file(a: Optional[Path], b: Optional[Path], rel: str) -> Iterable[str]:
    names = (f"a/{rel}" if a is not None else "/dev/null", f"b/{rel}" if b is not None else "/dev/null")
    if a is not None and b is not None and _same_bytes(a, b):
        return []
    if max(_size(a), _size(b)) <= WHOLE_BYTES:
        return difflib.unified_diff(_text(a).splitlines(keepends=True), _text(b).splitlines(keepends=True),
                                    fromfile=names[0], tofile=names[1], n=CONTEXT)
    return _large(a, b, names)


def _size(path: Optional[Path]) -> int:
    try:
        return 0 if path is None else path.stat().st_size
    except OSError:
        return 0


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _text(path: Optional[Path]) -> str:
    """A file's text; an unreadable or non-UTF-8 one as empty (as before: the diff shows it all changed)."""
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _lines(path: Optional[Path]) -> Iterator[bytes]:
    if path is None:
        return
    try:
        with open(path, "rb") as f:
            yield from f
    except OSError:
        return


def _digests(path: Optional[Path]) -> array:
    return array("q", map(hash, _lines(path)))


def _common_head(x: array, y: array) -> int:
    n = min(len(x), len(y))
    k = 0
    while k + _BLOCK <= n and x[k:k + _BLOCK] == y[k:k + _BLOCK]:
        k += _BLOCK
    while k < n and x[k] == y[k]:
        k += 1
    return k


def _common_tail(x: array, y: array, head: int) -> int:
    """Lines equal at the end of both, not reaching into the common head."""
    room = min(len(x), len(y)) - head
    k = 0
    while k + _BLOCK <= room and x[len(x) - k - _BLOCK:len(x) - k] == y[len(y) - k - _BLOCK:len(y) - k]:
        k += _BLOCK
    while k < room and x[len(x) - k - 1] == y[len(y) - k - 1]:
        k += 1
    return k


def _slice(path: Optional[Path], start: int, stop: int) -> List[str]:
    return [line.decode("utf-8", "replace") for line in itertools.islice(_lines(path), start, stop)]


def _large(a: Optional[Path], b: Optional[Path], names: Tuple[str, str]) -> List[str]:
    da, db = _digests(a), _digests(b)
    head = _common_head(da, db)
    tail = _common_tail(da, db, head)
    a_stop, b_stop = len(da) - tail, len(db) - tail
    changed = (a_stop - head) + (b_stop - head)
    start = max(0, head - CONTEXT)
    if changed > MAX_SHOWN_LINES:
        return [f"--- {names[0]}\n", f"+++ {names[1]}\n",
                f"@@ -{head + 1},{a_stop - head} +{head + 1},{b_stop - head} @@\n",
                f" [{a_stop - head} lines of the old file and {b_stop - head} of the new one differ from line "
                f"{head + 1} on: more than {MAX_SHOWN_LINES} in all, not shown; compare the files themselves]\n"]
    old = _slice(a, start, a_stop + CONTEXT)
    new = _slice(b, start, b_stop + CONTEXT)
    return [_shifted(line, start) for line in
            difflib.unified_diff(old, new, fromfile=names[0], tofile=names[1], n=CONTEXT)]


def _shifted(line: str, offset: int) -> str:
    """A hunk header of a diff of lines ``offset``.. of both files, numbered as in the whole files."""
    m = _HUNK.match(line) if offset and line.startswith("@@") else None
    if m is None:
        return line
    return (f"@@ -{int(m.group(1)) + offset}{m.group(2)} +{int(m.group(3)) + offset}{m.group(4)} @@"
            + line[m.end():])
