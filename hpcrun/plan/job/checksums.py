"""Stage-in integrity: one checksum per input, known at plan time, verified by the job.

Values are written ``<algo>:<hex>`` (``adler32:0a1b2c3d``, ``md5:<32 hex>``). They come,
first match wins, from a per-file ``checksum:`` in ``inputs.files``, from
``inputs.checksum_catalog`` (``<hex>  <path>`` lines as ``md5sum`` and ``xrdadler32`` write
them), or from reading the file at plan time. An input with none of these is not an error;
the planner lists it in a note.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from hpcrun.backends.storage import StorageError
from hpcrun.backends.storage.base import file_checksum as compute
from hpcrun.errors import Problem, dotted
from hpcrun.model.checksum import HEX_DIGITS
from hpcrun.model.spec import InputFile, InputsSpec
from hpcrun.model.yamlsrc import Located
from hpcrun.plan.intake.inputs import parent_dir, parent_dirs, read_listed
from hpcrun.plan.intake.remote import Remote, is_url, urls_of
from hpcrun.plan.job.listed import Listed

_HEX = re.compile(r"^[0-9A-Fa-f]+$")



def normalize(algo: str, hexdigits: str) -> str:
    """``adler32:0A1B2C3D`` -> ``adler32:0a1b2c3d``."""
    return f"{algo}:{hexdigits.lower()}"


@dataclass
class Assigned:
    values: List[Optional[str]]                       # parallel to the input paths
    problems: List[Problem] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def assign(spec: InputsSpec, src: Located, spec_dir: Path, paths: Sequence[str],
           readable_limit: int = 5, remote: Optional[Remote] = None) -> Assigned:
    """A checksum value (or None) for each path, and the problems and notes found. A URL's
    checksum not given in the spec or catalog is asked of its server."""
    algo = spec.checksum
    given = _per_file(spec, src, algo)
    if algo == "none":
        out = Assigned([None] * len(paths))
        if given.values or spec.checksum_catalog:
            out.notes.append("inputs.checksum is none, so the checksums given in the spec"
                             + (" and its catalog" if spec.checksum_catalog else "")
                             + " are not verified.")
        return out
    out = Assigned([], list(given.problems))
    catalog: Dict[str, str] = {}
    if spec.checksum_catalog:
        catalog = read_catalog(spec.checksum_catalog, src, spec_dir, algo, out.problems)
    unknown: List[str] = []
    dirs: Dict[str, bool] = {}  # plans made away from the data: one stat per directory
    served = _served(paths, given.values, catalog, remote or Remote(None, algo), src, out.problems)
    if not given.values and not catalog and not served and _none_here(paths):
        out.values, unknown = [None] * len(paths), list(paths)   # planned away from the data: nothing to read
        paths = ()
    for path in paths:
        value = given.values.get(path)
        if value is None and catalog:
            value = catalog.get(path if is_url(path) else os.path.normpath(path))
        if value is None and is_url(path):
            value = served.get(path)
        elif value is None:
            head = path[:path.rfind("/") + 1]   # the parent follows from this alone: stat'ed once each
            there = dirs.get(head)
            if there is None:
                there = dirs[head] = os.path.isdir(parent_dir(head))
            try:
                value = compute(path, algo) if there else None
            except OSError:
                pass
        if value is None:
            unknown.append(path)
        out.values.append(value)
    if unknown:
        out.notes.append(_unverified(len(unknown), unknown[:readable_limit + 1], readable_limit))
    return out


def _unverified(count: int, first: Sequence[str], limit: int) -> str:
    shown = ", ".join(first[:limit]) + (" ..." if count > limit else "")
    return f"{count} input(s) have no checksum and will not be verified (not readable here, none given): {shown}"


def assign_listed(spec: InputsSpec, src: Located, spec_dir: Path, listed: Listed, readable_limit: int = 5) -> Assigned:
    """What ``assign`` says of a Listed's inputs, which have no checksum (``listed.streamable``: none is
    given, there is no catalog, no input is readable here): the notes; jobs share one ``(None,)``."""
    out = assign(spec, src, spec_dir, ())
    if spec.checksum != "none":
        out.notes.append(_unverified(len(listed), [i.path for i in listed.block(0)[:readable_limit + 1]],
                                     readable_limit))
    return out


def _none_here(paths: Sequence[str]) -> bool:
    """No input is a URL and no input's directory exists here (a plan made away from the data):
    one stat per directory."""
    return not urls_of(paths) and not any(map(os.path.isdir, parent_dirs(paths)))


def _served(paths: Sequence[str], given: Dict[str, str], catalog: Dict[str, str], remote: Remote,
            src: Located, problems: List[Problem]) -> Dict[str, str]:
    """Checksums of the URL inputs neither the spec nor the catalog gives, from their servers."""
    urls = [p for p in urls_of(paths) if p not in given and p not in catalog]
    if not urls:
        return {}
    try:
        facts = remote.ask(urls)
    except StorageError as exc:
        file, line = src.where(("inputs",))
        problems.append(Problem(file, line, "inputs", str(exc)))
        return {}
    return {u: f.checksum for u, f in facts.items() if f.checksum}


@dataclass
class _Given:
    values: Dict[str, str] = field(default_factory=dict)
    problems: List[Problem] = field(default_factory=list)


def _per_file(spec: InputsSpec, src: Located, algo: str) -> _Given:
    out = _Given()
    for i, entry in enumerate(spec.files):
        if not isinstance(entry, InputFile) or entry.checksum is None:
            continue
        kind, _, digits = entry.checksum.partition(":")
        if algo != "none" and kind != algo:
            file, line = src.where(("inputs", "files", i, "checksum"))
            out.problems.append(Problem(file, line, dotted(("inputs", "files", i, "checksum")), (
                f"'{entry.checksum}' is an {kind} checksum but inputs.checksum is '{algo}'; "
                f"give {algo}:<{HEX_DIGITS[algo]} hex digits>, or set inputs.checksum: {kind}.")))
            continue
        out.values[entry.path] = normalize(kind, digits)
    return out


def read_catalog(name: str, src: Located, spec_dir: Path, algo: str,
                 problems: List[Problem]) -> Dict[str, str]:
    """``<hex>  <path>`` lines -> {absolute path: value}. Relative paths in the catalog are
    relative to the catalog's directory (as ``md5sum -c`` run there reads them)."""
    path = Path(name) if os.path.isabs(name) else spec_dir / name
    lines = read_listed(path, "checksum catalog", src, "inputs.checksum_catalog", problems)
    if lines is None:
        return {}
    digits = HEX_DIGITS[algo]
    base = path.parent
    out: Dict[str, str] = {}
    where: Dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        entry = _catalog_line(raw)
        if entry is None:
            continue
        if isinstance(entry, str):
            problems.append(Problem(str(path), n, "", entry))
            continue
        hexdigits, listed = entry
        if len(hexdigits) != digits or not _HEX.match(hexdigits):
            problems.append(Problem(str(path), n, "", (
                f"'{hexdigits}' is not an {algo} checksum ({digits} hex digits), as "
                f"inputs.checksum is '{algo}'; each line is: HEX  PATH")))
            continue
        full = listed if is_url(listed) else os.path.normpath(
            listed if listed.startswith("/") else os.path.join(base, listed))
        value = normalize(algo, hexdigits)
        if full in out and out[full] != value:
            problems.append(Problem(str(path), n, "", (
                f"'{listed}' is listed again with another checksum (first on line {where[full]})")))
            continue
        out[full] = value
        where.setdefault(full, n)
    return out


def _catalog_line(raw: str) -> Optional[Union[Tuple[str, str], str]]:
    """(hex, path), None for a blank or comment line, or an error message."""
    text = raw.rstrip("\r")
    if not text.strip() or text.lstrip().startswith("#"):
        return None
    escaped = text.startswith("\\")  # md5sum writes '\' first when the name has '\' or newline
    if escaped:
        text = text[1:]
    parts = text.split(None, 1)
    if len(parts) != 2:
        return "each line is: HEX  PATH (as md5sum or xrdadler32 write it)"
    hexdigits, listed = parts[0], parts[1].rstrip()
    if listed.startswith("*"):  # md5sum's binary-mode marker
        listed = listed[1:]
    if escaped:
        listed = listed.replace("\\n", "\n").replace("\\\\", "\\")
    return hexdigits, listed
