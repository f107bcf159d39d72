"""Expand a spec's inputs (list, glob, list file) into sized input records."""

from __future__ import annotations

import glob as globmod
import os
import re
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from hpcrun.backends.storage import StorageError, url_problem
from hpcrun.errors import InputError, Problem
from hpcrun.model.spec import InputFile, InputsSpec
from hpcrun.model.textfile import LIST_MAX_BYTES, TextFileError, read_text
from hpcrun.model.yamlsrc import Located
from hpcrun.plan.intake.remote import Remote, is_url, urls_of
from hpcrun.plan.intake.stems import stem_of
from hpcrun.units import UnitError, parse_size


class InputItem(NamedTuple):
    """One input of the campaign (a tuple: 10^5-10^6 are made)."""
    path: str
    size: int
    events: Optional[int]
    stem: str


def parent_dir(path: str) -> str:
    """``os.path.dirname`` of a str path, inline: called per input (10^5-10^6 times per plan)."""
    head = path[:path.rfind("/") + 1]
    return head.rstrip("/") if head and head != "/" * len(head) else head


def parent_dirs(paths: Iterable[str]) -> Set[str]:
    """The distinct parents of these paths (URLs left out): a parent follows from a path's text up
    to its last "/" alone, so the few distinct ones are found first, then each is made once."""
    paths = list(paths)
    urls = set(urls_of(paths))
    heads = {p[:p.rfind("/") + 1] for p in paths if p not in urls}
    return {parent_dir(h) for h in heads}


class _Sized(NamedTuple):
    """An input before its stem is known (a tuple: 10^5 are made, then one InputItem each)."""
    path: str
    size: int
    events: Optional[int]


class ListLine(NamedTuple):
    """Where an input came from when a list file named it: that file and its line (a tuple: 10^5 are made)."""
    file: str
    line: int


Where = Union[Tuple[object, ...], ListLine]   # a spec key, or a list file's line
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
_TABLE_BREAKERS = re.compile("[\t\n\r\0]")


def locate(src: Located, where: Where) -> Tuple[str, Optional[int], str]:
    """(file, line, key) of an input's origin: the list file's own line, else the spec's key."""
    if isinstance(where, ListLine):
        return where.file, where.line, ""
    file, line = src.where(where)
    return file, line, ".".join(str(p) for p in where)


def stems_of(paths: Sequence[str], mode: str) -> List[str]:
    """Each input's stem: its name up to the first dot (name), the part of its path that differs between
    the inputs joined with _ (path), or the group ``stem`` of a regular expression searched in the path."""
    if mode == "name":   # stem_of, inline (10^5-10^6 calls)
        return [n if n.startswith(".") else n.partition(".")[0] for n in [p.rpartition("/")[2] for p in paths]]
    if mode == "path":
        parts = [_path_of(p).strip("/").split("/") for p in paths]
        dirs = [q[:-1] for q in parts]
        common = len(os.path.commonprefix(dirs)) if dirs else 0
        return [_safe("_".join(q[common:-1] + [stem_of(q[-1])])) for q in parts]
    pattern = re.compile(mode)
    out = []
    for p in paths:
        m = pattern.search(p)
        out.append(_safe(m.group("stem")) if m and m.group("stem") else "")
    return out


def _path_of(path: str) -> str:
    """The path part of a URL (root://host:port//a/b -> /a/b), or the path itself."""
    return "/" + path.split("//", 2)[2].lstrip("/") if "://" in path and path.count("//") >= 2 else path


def _safe(text: str) -> str:
    """A file name: runs of anything but letters, digits and . _ + - become one _, no leading dot."""
    return _UNSAFE.sub("_", text).lstrip(".")


def expand(spec: InputsSpec, src: Located, spec_dir: Path, remote: Optional[Remote] = None) -> List[InputItem]:
    """All inputs in a stable order (explicit files, then glob, then list file). URLs without
    a size are asked of their servers, in bulk, after the local ones are checked."""
    raw: List[Tuple[str, Optional[int], Optional[int], Where]] = []
    for i, entry in enumerate(spec.files):
        if isinstance(entry, InputFile):
            raw.append((entry.path, entry.size, entry.events, ("inputs", "files", i)))
        else:
            raw.append((entry, None, None, ("inputs", "files", i)))
    problems: List[Problem] = []
    if spec.glob:
        matches = sorted(globmod.glob(spec.glob))
        if not matches:
            file, line = src.where(("inputs", "glob"))
            problems.append(Problem(file, line, "inputs.glob",
                                    f"the pattern '{spec.glob}' matches no file"))
        raw.extend((m, None, None, ("inputs", "glob")) for m in matches)
    if spec.list_file:
        file, lines = _list_lines(spec.list_file, src, spec_dir, problems)
        quick = None if raw or lines is None else _quick_list(lines, spec)
        if quick is not None:
            return quick
        raw.extend(read_list(file, lines or [], problems))
    if problems:   # a list file that cannot be read as a list: say so before looking at 10^5 paths
        raise InputError(problems)
    sized, wheres, asked = _sized(raw, spec, src, problems)
    if asked and not problems:
        _ask_sizes(sized, asked, spec, src, remote or Remote(None, spec.checksum), problems)
    items = _with_stems(sized, wheres, spec.stem, src, problems) if not problems else []
    if problems:
        raise InputError(problems)
    if not items:
        file, line = src.where(("inputs",))
        raise InputError([Problem(file, line, "inputs", "no input files were found")])
    return items


def _quick_list(lines: List[str], spec: InputsSpec) -> Optional[List[InputItem]]:
    """The inputs of a list file at C speed when nothing can be wrong with them (the usual list of
    10^5-10^6 lines ``PATH SIZE [EVENTS]``: every size given, each path once, unique stems); else None,
    and the reading line by line (``read_list``) finds and reports what is."""
    rows = [r for r in map(str.split, lines) if r and r[0][0] != "#"]
    widths = set(map(len, rows))
    if not rows or not (widths == {2} or widths == {3}):
        return None
    columns = list(zip(*rows))   # the lines' words as columns; the 10^6 small lists freed at once
    del rows
    paths: Sequence[str] = columns[0]
    if not _places_fine(paths) or len(set(paths)) != len(paths):
        return None
    known: Dict[str, int] = {}
    if not parse_sizes(columns[1], known) or (widths == {3} and not all(map(str.isdecimal, set(columns[2])))):
        return None
    stems = stems_of(paths, spec.stem)
    if len(set(stems)) != len(stems) or not all(stems):
        return None
    return item_columns(columns, widths.pop(), spec.events, known, stems)


def parse_sizes(texts: Iterable[str], known: Dict[str, int]) -> bool:
    """Each new size text parsed once into ``known`` (sizes repeat); False when one is not a size."""
    try:
        known.update({text: parse_size(text) for text in set(texts) - known.keys()})
    except UnitError:
        return False
    return True


def item_columns(columns: Sequence[Sequence[str]], width: int, default_events: Optional[int],
                 known: Dict[str, int], stems: Sequence[str]) -> List[InputItem]:
    """InputItems from a list's checked columns (PATH SIZE [EVENTS], every size in ``known``), at C speed."""
    paths, size_texts = columns[0], columns[1]
    if width == 3:
        event_texts = columns[2]
        events: Iterable[Optional[int]] = map({t: int(t) for t in set(event_texts)}.__getitem__, event_texts)
    else:
        events = repeat(default_events, len(paths))
    new = partial(tuple.__new__, InputItem)   # InputItem(...) without its Python-level __new__
    return list(map(new, zip(paths, map(known.__getitem__, size_texts), events, stems)))


def _places_fine(paths: Sequence[str]) -> bool:
    """Every path absolute or a well-formed URL, and none holds a NUL: one look at the whole text when
    all are local paths (the usual), one look per path otherwise."""
    joined = "\n" + "\n".join(paths)
    if "\0" in joined:
        return False
    if joined.count("\n/") == len(paths) and "://" not in joined:
        return True
    del joined
    for p in paths:
        url = is_url(p)
        if (url and url_problem(p)) or not (url or p.startswith("/")):
            return False
    return True


def _sized(raw: Sequence[Tuple[str, Optional[int], Optional[int], Where]], spec: InputsSpec, src: Located,
           problems: List[Problem]) -> Tuple[List[_Sized], List[Where], List[Tuple[int, Where]]]:
    """Inputs with their sizes (stat'ed, listed, or the spec's), each once; URLs to ask their servers."""
    items: List[_Sized] = []
    wheres: List[Where] = []
    seen: Dict[str, bool] = {}
    asked: List[Tuple[int, Where]] = []   # (index in items, origin) of URLs to ask
    for path, size, events, where in raw:
        if path in seen:
            problems.append(Problem(*locate(src, where), f"input '{path}' is listed twice",
                                    cause="are listed twice", subject=path, fix="list each input once"))
            continue
        seen[path] = True
        if _TABLE_BREAKERS.search(path):
            problems.append(Problem(*locate(src, where), (
                f"input path {path!r} contains a tab, newline or NUL byte; rename the file")))
            continue
        if size is None and is_url(path):
            asked.append((len(items), where))
            size = -1  # asked of its server below
        if size is None:
            try:
                size = os.stat(path).st_size
            except OSError:
                size = spec.size
        if size is None:
            problems.append(Problem(*locate(src, where), (
                f"the size of '{path}' is unknown: the file does not exist here and no size is "
                "given; give inputs.size, a size in the list file, or {path:, size:}"),
                cause="do not exist here and have no size", subject=path,
                fix="give inputs.size, a size on each list file line (PATH SIZE [EVENTS]), or {path:, size:}"))
            continue
        items.append(_Sized(path, size, events if events is not None else spec.events))
        wheres.append(where)
    return items, wheres, asked


def _with_stems(items: List[_Sized], wheres: Sequence[Where], mode: str, src: Located,
                problems: List[Problem]) -> List[InputItem]:
    """The inputs with their stems, which must be unique file names; a collision is refused with the
    setting that would make the stems unique where one does."""
    stems = stems_of([i.path for i in items], mode)
    if len(set(stems)) == len(stems) and all(stems):   # the usual answer, at C speed
        return [InputItem(i.path, i.size, i.events, stem) for i, stem in zip(items, stems)]
    first: Dict[str, str] = {}
    hint = None
    for item, stem, where in zip(items, stems, wheres):
        other = first.get(stem)
        if stem and other is None:
            first[stem] = item.path
            continue
        if hint is None:
            hint = _stem_hint(mode, [i.path for i in items])
        if not stem:
            problems.append(Problem(*locate(src, where), (
                f"inputs.stem '{mode}' gives '{item.path}' no stem (the expression does not match it)"),
                cause="get no stem from inputs.stem", subject=item.path,
                fix="change the expression so that its group (?P<stem>...) matches every input"))
            continue
        problems.append(Problem(*locate(src, where), (
            f"inputs '{other}' and '{item.path}' have the same stem '{stem}', so their outputs would "
            f"overwrite each other{hint}"), cause="share their stem with an earlier input",
            subject=f"{item.path} (stem '{stem}')", fix=(hint or "").lstrip("; ")))
    return [InputItem(i.path, i.size, i.events, stem) for i, stem in zip(items, stems)]


def _stem_hint(mode: str, paths: Sequence[str]) -> str:
    """'; set inputs.stem: path (...)' when that makes every stem unique, with the stems it gives."""
    if mode == "path":
        return ("; the paths differ only in characters a file name cannot keep: give inputs.stem a regular "
                r"expression with a group (?P<stem>...), e.g. '/AOD/(?P<stem>\d+)/'")
    stems = stems_of(paths, "path")
    if len(set(stems)) == len(stems) and all(stems):
        return (f"; set inputs.stem: path to name each input by the part of its path that differs "
                f"(here '{stems[0]}', '{stems[1] if len(stems) > 1 else stems[0]}', ...)")
    return r"; give inputs.stem a regular expression with a group (?P<stem>...) that differs between the inputs"


def _ask_sizes(items: List[_Sized], asked: List[Tuple[int, Where]], spec: InputsSpec,
               src: Located, remote: Remote, problems: List[Problem]) -> None:
    """Fill in the sizes of URL inputs from their servers; a missing file is a problem at its key."""
    try:
        facts = remote.ask([items[i].path for i, _ in asked])
    except StorageError as exc:
        problems.append(Problem(*locate(src, asked[0][1]), str(exc)))
        return
    for i, where in asked:
        item = items[i]
        fact = facts[item.path]
        size = fact.size if fact.size is not None else (None if fact.missing else spec.size)
        if size is None:
            why = "does not exist on its server" if fact.missing else f"could not be stat'ed: {fact.error}"
            problems.append(Problem(*locate(src, where), (
                f"input '{item.path}' {why}; remove it from the inputs or fix the URL"),
                cause="do not exist on their server" if fact.missing else "could not be stat'ed on their server",
                subject=item.path, fix="remove them from the inputs or fix the URLs"))
            continue
        items[i] = _Sized(item.path, size, item.events)


def _list_lines(name: str, src: Located, spec_dir: Path,
                problems: List[Problem]) -> Tuple[str, Optional[List[str]]]:
    """The list file's path and lines (None after a problem saying why it cannot be read)."""
    path = list_path(name, spec_dir)
    return path, read_listed(path, "list file", src, "inputs.list_file", problems)


def list_path(name: str, spec_dir: Path) -> str:
    """The list file's path: as given when absolute, else beside the spec."""
    return name if os.path.isabs(name) else str(spec_dir / name)


def read_list(file: str, lines: List[str], problems: List[Problem], first_line: int = 1):
    """(path, size, events, its line) of each list line; a bad line is a problem at the list file's line.
    10^5 lines in well under a second: sizes repeat (parsed once each), the file name is made once."""
    sizes: Dict[str, int] = {}
    counts: Dict[str, int] = {}   # event counts repeat too
    new_line = partial(tuple.__new__, ListLine)   # ListLine(file, n) without its Python-level __new__
    out = []
    for n, text in enumerate(lines, first_line):
        parts = text.split()
        if not parts or parts[0].startswith("#"):
            continue
        first = parts[0]
        url = is_url(first)
        if len(parts) > 3 or not (first.startswith("/") or url):
            problems.append(Problem(file, n, "", (
                "each line is: ABSOLUTE_PATH-OR-URL [SIZE [EVENTS]], e.g. /data/run1.daq 5GB 2000 "
                "or root://xrd.example.org//store/run1.daq 5GB 2000")))
            continue
        why = url_problem(first) if url else None
        if why:
            problems.append(Problem(file, n, "", why))
            continue
        size = events = None
        if len(parts) > 1:
            size = sizes.get(parts[1])
            if size is None:
                try:
                    size = sizes[parts[1]] = parse_size(parts[1])
                except UnitError as exc:
                    problems.append(Problem(file, n, "", f"bad size: {exc}"))
                    continue
        if len(parts) > 2:
            events = counts.get(parts[2])
            if events is None:
                if not parts[2].isdecimal():
                    problems.append(Problem(file, n, "", f"events must be a whole number, not '{parts[2]}'"))
                    continue
                events = counts[parts[2]] = int(parts[2])
        out.append((first, size, events, new_line((file, n))))
    return out


def read_listed(path: os.PathLike[str] | str, what: str, src: Located, key: str,
                problems: List[Problem]) -> Optional[List[str]]:
    """The lines of a file a spec key names (a list file, a catalog), or None after adding a
    problem that points at the file's bad line, else at the key."""
    try:
        return read_text(path, LIST_MAX_BYTES).splitlines()
    except TextFileError as exc:
        if exc.line is not None:
            problems.append(Problem(str(path), exc.line, "", f"cannot read the {what}: {exc.message}"))
        else:
            file, line = src.where(tuple(key.split(".")))
            problems.append(Problem(file, line, key, f"cannot read the {what} '{path}': {exc.message}"))
        return None
