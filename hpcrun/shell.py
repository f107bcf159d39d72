"""Shell quoting: the renderer's default for every value that reaches a generated script.

The rule, as in HTML templating: a value interpolated into a shell template is quoted
unless it is a :class:`Shell` -- text that Python built from quoted words, or that site
staff wrote as code in a profile (trusted). Quoting uses the standard library's
:func:`shlex.quote`; control characters (newline, TAB, CR, ...) are written as ANSI-C
``$'\\n'`` words so a quoted value never spans lines: it cannot end a comment or a log
line, and it cannot start a directive.
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]*$")


class Shell(str):
    """Text that is already shell code or correctly quoted words, inserted as it is.

    Only Python code builds these (from :func:`quote`, :func:`join` or vetted constants);
    a template cannot turn a value into one.
    """

    __slots__ = ()


def _control(run: str) -> str:
    return "$'" + "".join(f"\\x{ord(c):02x}" if c not in "\n\t\r" else
                          {"\n": "\\n", "\t": "\\t", "\r": "\\r"}[c] for c in run) + "'"


def quote(value: object) -> Shell:
    """One shell word that bash reads back byte for byte, always on one line."""
    if isinstance(value, Shell):
        raise TypeError("quote() of shell text: pass the plain value, or use the Shell as it is")
    text = str(value)
    if not _CONTROL.search(text):
        return Shell(shlex.quote(text))
    out = []
    pos = 0
    for m in _CONTROL.finditer(text):
        if m.start() > pos:
            out.append(shlex.quote(text[pos:m.start()]))
        out.append(_control(m.group()))
        pos = m.end()
    if pos < len(text):
        out.append(shlex.quote(text[pos:]))
    return Shell("".join(out))


def join(words: Iterable[object]) -> Shell:
    """Shell words from plain values (each quoted) and Shell pieces (kept)."""
    return Shell(" ".join(w if isinstance(w, Shell) else quote(w) for w in words))


def comment(value: object) -> Shell:
    """Text for a ``#`` comment: printed as written, control characters escaped so the
    comment stays one line."""
    return Shell(_CONTROL.sub(lambda m: "".join(repr(c)[1:-1] for c in m.group()), str(value)))


def finalize(value: object) -> str:
    """Jinja2 ``finalize`` of shell templates: quote every value that is not :class:`Shell`."""
    if isinstance(value, Shell):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return quote(value)


class DirectiveValueError(ValueError):
    """A value that a directive line (``#SBATCH``, ``#DW``) cannot carry."""


def sbatch_value(value: object) -> Shell:
    """A value for an ``#SBATCH --opt=value`` line.

    sbatch reads a directive line as words, removing double quotes and nothing else: a
    value with blanks is written in double quotes; a double quote or a line break cannot
    be carried at all (the planner refuses such values first, with file, line and key).
    """
    text = str(value)
    why = sbatch_value_problem(text)
    if why:
        raise DirectiveValueError(f"{text!r} cannot be written into an #SBATCH line: {why}")
    return Shell(text if _DIRECTIVE_SAFE.match(text) else f'"{text}"')


def sbatch_value_problem(text: str) -> str:
    """Why ``text`` cannot be an #SBATCH value, or ''."""
    if _CONTROL.search(text):
        return "it contains a line break or another control character"
    if '"' in text:
        return "it contains a double quote, which sbatch's directive parser removes"
    return ""
