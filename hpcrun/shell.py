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
    """A value that a directive line (the scheduler's or the burst buffer's) cannot carry."""


def has_control(text: str) -> bool:
    """A line break or another control character: no directive line can carry it."""
    return bool(_CONTROL.search(text))


def directive_word(text: str) -> Shell:
    """A checked directive value as one word: bare when plain, else in double quotes."""
    return Shell(text if _DIRECTIVE_SAFE.match(text) else f'"{text}"')
