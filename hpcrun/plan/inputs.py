"""Expand a spec's inputs (list, glob, list file) into sized input records."""

from __future__ import annotations

import glob as globmod
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hpcrun.backends.storage import StorageError, url_problem
from hpcrun.errors import InputError, Problem
from hpcrun.model.spec import InputFile, InputsSpec
from hpcrun.model.textfile import LIST_MAX_BYTES, TextFileError, read_text
from hpcrun.model.yamlsrc import Located
from hpcrun.plan.remote import Remote, is_url
from hpcrun.units import UnitError, parse_size


@dataclass(frozen=True)
class InputItem:
    __slots__ = ("path", "size", "events", "stem")
    path: str
    size: int
    events: Optional[int]
    stem: str


def stem_of(path: str) -> str:
    name = os.path.basename(path)
    return name.split(".", 1)[0] if not name.startswith(".") else name


def expand(spec: InputsSpec, src: Located, spec_dir: Path, remote: Optional[Remote] = None) -> List[InputItem]:
    """All inputs in a stable order (explicit files, then glob, then list file). URLs without
    a size are asked of their servers, in bulk, after the local ones are checked."""
    raw: List[Tuple[str, Optional[int], Optional[int], Tuple[object, ...]]] = []
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
        raw.extend(_read_list(spec.list_file, src, spec_dir, problems))
    items: List[InputItem] = []
    seen: Dict[str, bool] = {}
    stems: Dict[str, str] = {}
    asked: List[Tuple[int, Tuple[object, ...]]] = []   # (index in items, spec location) of URLs to ask
    for path, size, events, where in raw:
        key = ".".join(str(p) for p in where)
        if path in seen:
            file, line = src.where(where)
            problems.append(Problem(file, line, key, f"input '{path}' is listed twice"))
            continue
        seen[path] = True
        if any(c in path for c in "\t\n\r\0"):
            file, line = src.where(where)
            problems.append(Problem(file, line, key, (
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
            file, line = src.where(where)
            problems.append(Problem(file, line, key, (
                f"the size of '{path}' is unknown: the file does not exist here and no size is "
                "given; give inputs.size, a size in the list file, or {path:, size:}")))
            continue
        stem = stem_of(path)
        if stem in stems:
            file, line = src.where(where)
            problems.append(Problem(file, line, key, (
                f"inputs '{stems[stem]}' and '{path}' have the same stem '{stem}', so their "
                "outputs would overwrite each other")))
            continue
        stems[stem] = path
        items.append(InputItem(path, size, events if events is not None else spec.events, stem))
        if len(problems) > 50:
            break
    if asked and not problems:
        _ask_sizes(items, asked, spec, src, remote or Remote(None, spec.checksum), problems)
    if problems:
        raise InputError(problems)
    if not items:
        file, line = src.where(("inputs",))
        raise InputError([Problem(file, line, "inputs", "no input files were found")])
    return items


def _ask_sizes(items: List[InputItem], asked: List[Tuple[int, Tuple[object, ...]]], spec: InputsSpec,
               src: Located, remote: Remote, problems: List[Problem]) -> None:
    """Fill in the sizes of URL inputs from their servers; a missing file is a problem at its key."""
    try:
        facts = remote.ask([items[i].path for i, _ in asked])
    except StorageError as exc:
        file, line = src.where(asked[0][1])
        problems.append(Problem(file, line, ".".join(str(p) for p in asked[0][1]), str(exc)))
        return
    for i, where in asked:
        item = items[i]
        fact = facts[item.path]
        size = fact.size if fact.size is not None else (None if fact.missing else spec.size)
        if size is None:
            file, line = src.where(where)
            why = "does not exist on its server" if fact.missing else f"could not be stat'ed: {fact.error}"
            problems.append(Problem(file, line, ".".join(str(p) for p in where), (
                f"input '{item.path}' {why}; remove it from the inputs or fix the URL")))
            continue
        items[i] = InputItem(item.path, size, item.events, item.stem)


def _read_list(name: str, src: Located, spec_dir: Path, problems: List[Problem]):
    path = Path(name) if os.path.isabs(name) else spec_dir / name
    lines = read_listed(path, "list file", src, "inputs.list_file", problems)
    if lines is None:
        return []
    out = []
    for n, text in enumerate(lines, 1):
        text = text.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        where = ("inputs", "list_file")
        if len(parts) > 3 or not (parts[0].startswith("/") or is_url(parts[0])):
            problems.append(Problem(str(path), n, "", (
                "each line is: ABSOLUTE_PATH-OR-URL [SIZE [EVENTS]], e.g. /data/run1.daq 5GB 2000 "
                "or root://xrd.example.org//store/run1.daq 5GB 2000")))
            continue
        why = url_problem(parts[0]) if is_url(parts[0]) else None
        if why:
            problems.append(Problem(str(path), n, "", why))
            continue
        size = events = None
        try:
            size = parse_size(parts[1]) if len(parts) > 1 else None
        except UnitError as exc:
            problems.append(Problem(str(path), n, "", f"bad size: {exc}"))
            continue
        if len(parts) > 2:
            if not parts[2].isdigit():
                problems.append(Problem(str(path), n, "", f"events must be a whole number, not '{parts[2]}'"))
                continue
            events = int(parts[2])
        out.append((parts[0], size, events, where))
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
