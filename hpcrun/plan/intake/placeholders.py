"""Command templates with ``{name}`` placeholders, rendered to safe shell words.

Literal text is single-quoted; each placeholder becomes a double-quoted
``${HPCRUN_...}`` expansion, so no value from YAML or from the data can inject
shell code. ``{{`` and ``}}`` stand for literal braces; ``{env:NAME}`` reads an
environment variable at run time. Unknown placeholders are errors (never silently
kept or dropped).
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from hpcrun.errors import did_you_mean
from hpcrun.shell import Shell, quote


@functools.lru_cache(maxsize=64)
def _plain(pattern: str) -> bool:
    """Only text and {stem}/{name}: no braces of any other kind."""
    rest = pattern.replace("{stem}", "").replace("{name}", "")
    return "{" not in rest and "}" not in rest


_TOKEN = re.compile(r"\{\{|\}\}|\{((?:env:)?[A-Za-z_][A-Za-z0-9_]*)\}|\{|\}")

# placeholder -> shell variable holding its value at run time
VARIABLES: Dict[str, str] = {
    "input": "HPCRUN_INPUT", "output": "HPCRUN_OUTPUT", "chain": "HPCRUN_CHAIN",
    "nchains": "HPCRUN_NCHAINS", "first_event": "HPCRUN_FIRST_EVENT",
    "last_event": "HPCRUN_LAST_EVENT", "nevents": "HPCRUN_NEVENTS",
    "db_socket": "HPCRUN_DB_SOCKET", "db_port": "HPCRUN_DB_PORT", "db_host": "HPCRUN_DB_HOST",
    "db_defaults": "HPCRUN_DB_DEFAULTS", "db_user": "HPCRUN_DB_USER",
    "workdir": "HPCRUN_WORKDIR", "release": "HPCRUN_RELEASE", "stem": "HPCRUN_STEM",
    "job": "HPCRUN_JOB", "file": "HPCRUN_FILE", "events_in": "HPCRUN_EVENTS_IN",
    "events_out": "HPCRUN_EVENTS_OUT", "nparts": "HPCRUN_NPARTS",
    "outdir": "HPCRUN_OUTDIR", "output_list": "HPCRUN_OUTPUT_LIST", "campaign": "HPCRUN_CAMPAIGN",
    "plan_dir": "HPCRUN_PLAN_DIR",
}
LIST_VARIABLES = {"parts": "HPCRUN_PARTS"}

CHAIN = {"input", "output", "chain", "nchains", "first_event", "last_event", "nevents",
         "db_socket", "db_port", "db_host", "db_defaults", "db_user", "workdir", "release", "stem", "job"}
MERGE = {"parts", "nparts", "output", "input", "stem", "workdir", "release", "job"}
COUNT = {"file", "release"}
QA = {"output", "input", "stem", "events_in", "events_out", "release", "job", "workdir"}
PATTERN = {"stem", "name"}
FINALIZE = {"outdir", "output_list", "campaign", "plan_dir", "release"}


class PlaceholderError(ValueError):
    pass


def used(args: Sequence[str]) -> Set[str]:
    return {m.group(1) for a in args for m in _TOKEN.finditer(a) if m.group(1)}


def check(args: Sequence[str], allowed: Set[str], allow_env: bool = True) -> Optional[str]:
    """An error message for the first bad placeholder, or None."""
    for arg in args:
        for m in _TOKEN.finditer(arg):
            text, name = m.group(0), m.group(1)
            if text in ("{", "}"):
                return (f"unbalanced '{text}' in argument {arg!r}; write '{{{{' or '}}}}' for a "
                        "literal brace")
            if name and name.startswith("env:"):
                if allow_env:
                    continue
                return f"{{{name}}} is not available here: this value is fixed when the plan is made"
            if name and name not in allowed:
                hint = did_you_mean(name, allowed)
                return (f"unknown placeholder {{{name}}}.{hint} Valid here: "
                        + ", ".join("{" + a + "}" for a in sorted(allowed)) + ".")
            if name in LIST_VARIABLES and arg != m.group(0):
                return f"{{{name}}} expands to several arguments and must be an argument by itself"
    return None


def _pieces(arg: str) -> List[Tuple[bool, str]]:
    """An argument (already checked) as its literal texts and variables, in order: (False, text), (True, name)."""
    pieces: List[Tuple[bool, str]] = []
    pos = 0
    literal = ""
    for m in _TOKEN.finditer(arg):
        literal += arg[pos:m.start()]
        pos = m.end()
        if m.group(0) in ("{{", "}}"):
            literal += m.group(0)[0]
            continue
        if literal:
            pieces.append((False, literal))
            literal = ""
        name = m.group(1)
        pieces.append((True, name[4:] if name.startswith("env:") else VARIABLES[name]))
    literal += arg[pos:]
    if literal or not pieces:
        pieces.append((False, literal))
    return pieces


def to_shell(args: Sequence[str]) -> Shell:
    """Render argv (already checked) as one line of shell words."""
    words: List[str] = []
    for arg in args:
        if arg in ("{" + n + "}" for n in LIST_VARIABLES):
            words.append(f'"${{{LIST_VARIABLES[arg[1:-1]]}[@]}}"')
            continue
        words.append("".join(f'"${{{text}}}"' if var else quote(text) for var, text in _pieces(arg)))
    return Shell(" ".join(words))


def to_parts(args: Sequence[str]) -> Optional[List[List[str]]]:
    """argv (already checked) as the words a program is started with, for a process that is not a shell (the pilot's
    direct runs, issue 55): each word its pieces, ``=text`` or ``$NAME`` (an environment variable's value at run
    time); None where a word stands for several (``{parts}``)."""
    if any(arg in ("{" + n + "}" for n in LIST_VARIABLES) for arg in args):
        return None
    return [[("$" if var else "=") + text for var, text in _pieces(arg)] for arg in args]


_NAME_TOKENS = re.compile(r"(\{stem\}|\{name\})")


def output_namer(pattern: str) -> Callable[[str, str], str]:
    """``expand_pattern(pattern, stem=..., name=...)`` as a function made once per plan (it runs once
    per input): a value is inserted, never searched for placeholders again."""
    if not _plain(pattern):
        return lambda stem, name: expand_pattern(pattern, stem=stem, name=name)
    parts = _NAME_TOKENS.split(pattern)
    if stem_only(pattern):
        head, tail = pattern.split("{stem}")
        return lambda stem, name: head + stem + tail
    return lambda stem, name: "".join(stem if p == "{stem}" else name if p == "{name}" else p for p in parts)


def output_names(pattern: str, stems: Sequence[str], paths: Sequence[str]) -> List[str]:
    """Each input's output name, from its stem and its path's file name."""
    if stem_only(pattern):
        head, tail = pattern.split("{stem}")
        return [head + stem + tail for stem in stems]
    return list(map(output_namer(pattern), stems, [p.rpartition("/")[2] for p in paths]))


def stem_only(pattern: str) -> bool:
    """Whether the pattern's only varying part is one {stem}: then distinct stems give distinct names."""
    if not _plain(pattern):
        return False
    parts = _NAME_TOKENS.split(pattern)
    return parts.count("{stem}") == 1 and "{name}" not in parts


def expand_pattern(pattern: str, **values: str) -> str:
    """Fill an output-name pattern at plan time (e.g. ``{stem}.MuDst.root``); called per input, so a
    pattern of plain text and ``{stem}``/``{name}`` is filled by replacement, without the regex."""
    if _plain(pattern):
        return output_namer(pattern)(values.get("stem", "{stem}"), values.get("name", "{name}"))

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        return values[m.group(1)]
    return _TOKEN.sub(sub, pattern)
